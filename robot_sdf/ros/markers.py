"""rviz markers of the sdf_server world: meshes as TRIANGLE_LISTs, request spheres by cost.

MarkerState remembers what ``~/markers`` last showed so an update sends only what changed:
a mesh marker when its pose, enable flag or geometry changed, DELETE markers for removed meshes,
and the spheres of the last cost request; a full update sends every marker (see MarkerState).
Marker ids are stable per (env, mesh id) for the node's lifetime; the namespace is ``env_<n>``
(or one of its own, such as the perceived mesh's ``perceived``) and the mesh id is in ``text``.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker

from robot_sdf.ros.conversions import array_to_pose

REQUEST_NS = "request_spheres"
_ENABLED_COLOR = ColorRGBA(r=0.9, g=0.55, b=0.15, a=0.9)
_DISABLED_COLOR = ColorRGBA(r=0.5, g=0.5, b=0.5, a=0.3)


def cost_colors(cost: np.ndarray) -> np.ndarray:
    """Cost (N,) -> RGBA (N,4): green at 0 to red at the highest cost of the set."""
    c = np.asarray(cost, dtype=np.float64)
    top = float(c.max()) if c.size else 0.0
    t = np.clip(c / top, 0.0, 1.0) if top > 0 else np.zeros_like(c)
    rgba = np.empty((c.size, 4))
    rgba[:, 0], rgba[:, 1], rgba[:, 2], rgba[:, 3] = t, 1.0 - t, 0.0, 0.8
    return rgba


def triangle_points(vertices: np.ndarray, triangles: np.ndarray) -> list[Point]:
    """Corners of every triangle (3T Points) for a TRIANGLE_LIST marker, in the mesh frame."""
    corners = np.asarray(vertices, dtype=np.float64)[np.asarray(triangles).reshape(-1)]
    return [Point(x=x, y=y, z=z) for x, y, z in corners.tolist()]


# The 12 triangles of a box over its corners (bit i of a corner index = upper bound on axis i),
# counter-clockwise seen from outside.
_BOX_TRIANGLES = np.array([[0, 2, 3], [0, 3, 1], [4, 5, 7], [4, 7, 6], [0, 1, 5], [0, 5, 4],
                           [2, 6, 7], [2, 7, 3], [0, 4, 6], [0, 6, 2], [1, 3, 7], [1, 7, 5]])


def display_points(vertices: np.ndarray, triangles: np.ndarray, max_triangles: int) -> list[Point]:
    """triangle_points() of the mesh, or of its axis-aligned bounding box (mesh frame) when it has
    more than ``max_triangles`` triangles."""
    if len(triangles) <= max_triangles:
        return triangle_points(vertices, triangles)
    v = np.asarray(vertices, dtype=np.float64)
    lo, hi = v.min(axis=0), v.max(axis=0)
    corners = np.array([[(hi if (i >> k) & 1 else lo)[k] for k in range(3)] for i in range(8)])
    return triangle_points(corners, _BOX_TRIANGLES)


def mesh_marker(ns: str, marker_id: int, frame_id: str, points: list[Point], pose,
                enabled: bool, name: str = "") -> Marker:
    """TRIANGLE_LIST marker of one mesh: ``points`` from triangle_points(), ``pose`` (7,) places them.

    Enabled meshes are drawn opaque orange, disabled ones translucent grey. ``name`` (the
    obstacle id) goes into ``text``, which rviz ignores for triangle lists.
    """
    m = Marker(ns=ns, id=int(marker_id), type=Marker.TRIANGLE_LIST, action=Marker.ADD, text=name)
    m.header.frame_id = frame_id
    m.pose = array_to_pose(pose)
    m.scale.x = m.scale.y = m.scale.z = 1.0
    m.color = _ENABLED_COLOR if enabled else _DISABLED_COLOR
    m.points = points
    return m


def delete_marker(ns: str, marker_id: int, frame_id: str) -> Marker:
    """DELETE marker for (ns, id)."""
    m = Marker(ns=ns, id=int(marker_id), action=Marker.DELETE)
    m.header.frame_id = frame_id
    return m


def sphere_markers(ns: str, frame_id: str, spheres: np.ndarray, cost: np.ndarray,
                   radius_quantum: float = 0.005) -> list[Marker]:
    """SPHERE_LIST markers of spheres (N,4) x,y,z,r [m] coloured by cost (N,).

    A SPHERE_LIST has one size, so spheres are grouped by radius rounded to ``radius_quantum``
    metres, one marker per group (ids 0..k-1). Spheres with radius < 0 (off) are left out.
    """
    s = np.asarray(spheres, dtype=np.float64).reshape(-1, 4)
    c = np.asarray(cost, dtype=np.float64).reshape(-1)
    on = s[:, 3] >= 0
    s, c = s[on], c[on]
    rgba = cost_colors(c)
    groups = np.round(s[:, 3] / radius_quantum).astype(np.int64)
    out = []
    for k, g in enumerate(np.unique(groups)):
        sel = groups == g
        m = Marker(ns=ns, id=k, type=Marker.SPHERE_LIST, action=Marker.ADD)
        m.header.frame_id = frame_id
        m.pose.orientation.w = 1.0
        m.scale.x = m.scale.y = m.scale.z = max(2.0 * g * radius_quantum, 1e-3)
        m.points = [Point(x=x, y=y, z=z) for x, y, z in s[sel, :3].tolist()]
        m.colors = [ColorRGBA(r=r, g=gg, b=b, a=a) for r, gg, b, a in rgba[sel].tolist()]
        out.append(m)
    return out


class _Shown:
    """One mesh as last published: the geometry arrays it was built from, its points, pose, flag."""

    __slots__ = ("vertices", "triangles", "points", "pose", "enabled")

    def __init__(self, vertices, triangles, points, pose, enabled) -> None:
        self.vertices, self.triangles, self.points = vertices, triangles, points
        self.pose, self.enabled = pose, enabled


class MarkerState:
    """Incremental ~/markers updates for one world.

    world: a MeshWorld; num_envs: its environments; frame_id: marker frame;
    last_request: returns (sequence number, (spheres (k,4), cost (k,)) or None);
    max_triangles: meshes above it are drawn as their bounding box (may be changed at run time).

    ``update(full)`` returns nothing when neither the world nor the last request changed since
    the previous update; otherwise the changed markers, or with ``full`` every marker (all meshes,
    the request spheres, DELETEs of what disappeared). The node publishes them on a
    transient_local topic and sends a full update at least every few updates, so a viewer that
    subscribes late receives, from the topic's history, a full state and the changes after it.
    """

    def __init__(self, world, num_envs: int, frame_id: str,
                 last_request: Callable[[], tuple[int, Any]], max_triangles: int = 20000,
                 namespaces: dict[tuple[int, str], str] | None = None) -> None:
        self._world, self._num_envs, self._frame = world, num_envs, frame_id
        # (env, mesh id) -> a namespace of its own (the perceived mesh), instead of env_<n>
        self._namespaces = dict(namespaces or {})
        self.max_triangles = int(max_triangles)
        self._last_request = last_request
        self._revision = -1
        self._request_seq = 0
        self._sphere_markers = 0
        self._ids: dict[tuple[int, str], int] = {}
        self._shown: dict[tuple[int, str], _Shown] = {}

    def redraw(self, max_triangles: int | None = None) -> None:
        """Forget what was shown (optionally with a new max_triangles): the next update sends every mesh."""
        if max_triangles is not None:
            self.max_triangles = int(max_triangles)
        self._shown = {}
        self._revision = -1

    def update(self, full: bool = False) -> list[Marker]:
        """Markers to publish now: [] when nothing changed, else the changes (all with ``full``)."""
        rev = self._world.revision
        seq, last = self._last_request()
        if rev == self._revision and seq == self._request_seq:
            return []
        out: list[Marker] = []
        if full or rev != self._revision:
            self._revision = rev
            out += self._meshes(full)
        if (full or seq != self._request_seq) and last is not None:
            self._request_seq = seq
            spheres = sphere_markers(REQUEST_NS, self._frame, *last)
            out += spheres
            out += [delete_marker(REQUEST_NS, k, self._frame)
                    for k in range(len(spheres), self._sphere_markers)]
            self._sphere_markers = len(spheres)
        self._request_seq = seq
        return out

    def _namespace(self, key: tuple[int, str]) -> str:
        return self._namespaces.get(key, f"env_{key[0]}")

    def _meshes(self, everything: bool) -> list[Marker]:
        world, out, now = self._world, [], {}
        for env in range(self._num_envs):
            for name in world.mesh_names(env):
                key = (env, name)
                try:
                    vertices, triangles, pose, enabled = world.mesh_geometry(name, env)
                except KeyError:  # removed since mesh_names(): the next update deletes it
                    continue
                old = self._shown.get(key)
                # MeshWorld hands out its stored arrays, so identity tells a new geometry apart.
                same_geometry = old is not None and old.vertices is vertices and old.triangles is triangles
                points = old.points if same_geometry else display_points(vertices, triangles,
                                                                         self.max_triangles)
                pose_t = tuple(float(x) for x in pose)
                now[key] = _Shown(vertices, triangles, points, pose_t, enabled)
                if everything or not same_geometry or old.pose != pose_t or old.enabled != enabled:
                    marker_id = self._ids.setdefault(key, len(self._ids))
                    out.append(mesh_marker(self._namespace(key), marker_id, self._frame, points, pose, enabled, name))
        for key in self._shown.keys() - now.keys():
            out.append(delete_marker(self._namespace(key), self._ids[key], self._frame))
        self._shown = now
        return out
