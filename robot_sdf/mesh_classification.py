"""The ``auto`` choice of a geometry's sign method, and the facts it rests on: closed,
consistently oriented, shells, self-intersections (one Warp kernel over the mesh's BVH) and,
for several shells, whether they bound one solid (numpy winding numbers).

Runs once per geometry when it is added (MeshWorld) or adopted (adopt_meshes), never per query.
The rule is the design contract's (docs/design.md, sign method 4): ``normal`` for one closed, consistently
and outward oriented shell without self-intersections, ``winding_number`` for anything else.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import warp as wp

from robot_sdf import mesh_analysis
from robot_sdf.mesh_topology import (GIL_CHUNK, connected_components, edge_keys, sorted_unique, surface_facts, weld,
                                     winding_numbers)
from robot_sdf.types import SignMethod

# The self-intersection test differentiates nothing: no adjoint code.
wp.set_module_options({"enable_backward": False})


@dataclass
class MeshClass:
    """What ``auto`` found out about a geometry, and what it chose."""

    method: SignMethod
    reason: str
    closed: bool
    consistently_oriented: bool
    shells: int
    self_intersections: int
    degenerate_triangles: int
    volume: float
    seconds: float = 0.0
    details: dict = field(default_factory=dict)
    # The boundary of a solid (classify): the pseudo-normal sign is exact at any distance.
    solid: bool = False

    def as_dict(self) -> dict:
        return {"sign_method": self.method.name.lower(), "reason": self.reason, "closed": self.closed,
                "consistently_oriented": self.consistently_oriented, "shells": self.shells, "solid": self.solid,
                "self_intersections": self.self_intersections, "degenerate_triangles": self.degenerate_triangles,
                "volume": self.volume, "classify_seconds": self.seconds}


@wp.func
def _segment_hits_triangle(p: wp.vec3, q: wp.vec3, a: wp.vec3, b: wp.vec3, c: wp.vec3) -> int:
    """1 if the closed segment pq crosses the triangle abc (not coplanar), else 0."""
    e1 = b - a
    e2 = c - a
    d = q - p
    h = wp.cross(d, e2)
    det = wp.dot(e1, h)
    scale = wp.length(e1) * wp.length(e2) * wp.length(d)
    if wp.abs(det) <= 1.0e-7 * scale:
        return 0
    inv = 1.0 / det
    s = p - a
    bu = inv * wp.dot(s, h)
    qv = wp.cross(s, e1)
    bv = inv * wp.dot(d, qv)
    t = inv * wp.dot(e2, qv)
    eps = float(1.0e-6)
    if bu < -eps or bv < -eps or bu + bv > 1.0 + eps or t < -eps or t > 1.0 + eps:
        return 0
    return 1


# In the Warp module of every build-time kernel, robot_sdf.mesh_analysis's: compiled and loaded
# with it, once per device (robot_sdf.launch.warp_device).
@wp.kernel(module=mesh_analysis.__name__)
def self_intersection_kernel(
    mesh: wp.uint64,
    points: wp.array(dtype=wp.vec3),
    edges: wp.array2d(dtype=wp.int32),
    welded_triangles: wp.array2d(dtype=wp.int32),
    out_count: wp.array(dtype=wp.int32),
):
    """Count (edge, triangle) crossings, each edge a bounded segment queried against the BVH;
    triangles that share a (welded) vertex with the edge are adjacent, not intersecting."""
    i = wp.tid()
    u = edges[i, 0]
    v = edges[i, 1]
    wu = edges[i, 2]
    wv = edges[i, 3]
    p = points[u]
    q = points[v]
    pad = wp.vec3(1.0e-6, 1.0e-6, 1.0e-6)
    query = wp.mesh_query_aabb(mesh, wp.min(p, q) - pad, wp.max(p, q) + pad)
    face = int(0)
    hits = int(0)
    m = wp.mesh_get(mesh)
    while wp.mesh_query_aabb_next(query, face):
        w0 = welded_triangles[face, 0]
        w1 = welded_triangles[face, 1]
        w2 = welded_triangles[face, 2]
        if w0 == wu or w1 == wu or w2 == wu or w0 == wv or w1 == wv or w2 == wv:
            continue
        a = m.points[m.indices[face * 3 + 0]]
        b = m.points[m.indices[face * 3 + 1]]
        c = m.points[m.indices[face * 3 + 2]]
        hits += _segment_hits_triangle(p, q, a, b, c)
    if hits > 0:
        wp.atomic_add(out_count, 0, hits)


def count_self_intersections(mesh: wp.Mesh, vertices: np.ndarray, triangles: np.ndarray, welded: np.ndarray) -> int:
    """Edge-triangle crossings of a mesh with itself (0 for a clean surface); ``mesh`` is the
    Warp mesh of ``vertices``/``triangles``, on any device."""
    wt = welded[np.asarray(triangles, np.int64)]
    tri = np.asarray(triangles, np.int64)
    ok = (wt[:, 0] != wt[:, 1]) & (wt[:, 1] != wt[:, 2]) & (wt[:, 2] != wt[:, 0])
    keys = edge_keys(wt[ok], welded.shape[0]).reshape(-1)
    ends = np.stack([tri[ok], np.roll(tri[ok], -1, axis=1)], axis=-1).reshape(-1, 2)
    _, first = sorted_unique(keys, return_index=True)
    ends = ends[first]
    edges = np.concatenate([ends, welded[ends]], axis=1).astype(np.int32)
    if edges.shape[0] == 0:
        return 0
    dev = mesh.points.device
    count = wp.zeros(1, dtype=wp.int32, device=dev)
    wp.launch(self_intersection_kernel, dim=edges.shape[0],
              inputs=[mesh.id, mesh.points, wp.array(edges, dtype=wp.int32, device=dev),
                      wp.array(wt.astype(np.int32), dtype=wp.int32, device=dev)],
              outputs=[count], device=dev)
    return int(count.numpy()[0])


# Nesting of several shells is checked by winding numbers in numpy: at most this many shells,
# and this many (triangle, point) evaluations; beyond, the mesh keeps the winding-number sign.
MAX_SOLID_SHELLS = 2048
MAX_NESTING_EVALUATIONS = 20_000_000


def classify(vertices: np.ndarray, triangles: np.ndarray, welded: np.ndarray | None = None,
             mesh_factory=None, facts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[MeshClass, wp.Mesh | None]:
    """The ``auto`` decision: ``normal`` for one closed, consistently and outward oriented shell
    without self-intersections; ``winding_number`` for anything else (the design contract fixes it).

    ``solid`` in the result: the mesh is the boundary of a solid, i.e. closed, consistently
    oriented shells without self-intersections, each with the solid on its back side (one shell
    facing outward; or several: separate bodies facing outward, cavities facing inward, bodies
    in cavities: the winding number is 0 or 1 everywhere). For such a boundary the pseudo-normal
    sign is exact and equals the winding number's, and a ray from a point meets a front face
    first iff the point is outside: what the kernels' closed-shell paths rely on, so a solid of
    several shells (``winding_number`` by this rule) is evaluated by them too (the sign data's
    closed-shell flag).

    The topology checks run first (numpy); only a mesh that passes them needs a BVH for the
    self-intersection test: ``mesh_factory()`` builds the Warp mesh of vertices/triangles, and it
    is returned for reuse (None when no BVH was needed). ``facts``: surface_facts of the mesh,
    when already known.
    """
    t0 = time.perf_counter()
    v64 = np.asarray(vertices, np.float64)
    tri = np.asarray(triangles, np.int64)
    w = weld(vertices) if welded is None else welded
    wt = w[tri]
    flat, _ = surface_facts(v64, tri, wt) if facts is None else facts
    degenerate = int(np.count_nonzero(flat))
    good = wt[~flat]
    n = np.int64(v64.shape[0])
    directed = np.stack([good, np.roll(good, -1, axis=1)], axis=-1).reshape(-1, 2)
    forward = directed[:, 0] * n + directed[:, 1]
    backward = directed[:, 1] * n + directed[:, 0]
    _, directed_counts = sorted_unique(forward, return_counts=True)
    undirected, undirected_counts = sorted_unique(np.minimum(forward, backward), return_counts=True)
    # Closed: every edge has exactly two triangles; consistently oriented: they use it in
    # opposite directions (then no directed edge appears twice).
    closed = bool(undirected_counts.size and np.all(undirected_counts == 2))
    oriented = closed and bool(np.all(directed_counts == 1))
    used = sorted_unique(good)
    labels = connected_components(int(n), np.stack([undirected // n, undirected % n], axis=1))
    shells = int(sorted_unique(labels[used]).shape[0]) if used.size else 0
    a, b, c = v64[tri[:, 0]], v64[tri[:, 1]], v64[tri[:, 2]]
    centre = v64.mean(axis=0)
    volume = float(np.einsum("ij,ij->i", a - centre, np.cross(b - centre, c - centre)).sum() / 6.0)
    crossings = 0
    mesh = None
    solid = False
    if not closed:
        reason = "open surface (some edge has one triangle or more than two)"
    elif not oriented:
        reason = "triangles not consistently oriented"
    elif volume <= 0.0:
        reason = "inside out (negative volume)"
    elif shells > MAX_SOLID_SHELLS:
        reason = f"{shells} shells (more than {MAX_SOLID_SHELLS} to check for nesting)"
    else:
        # Several shells: nesting first (numpy, cheap), so that overlapping bodies, whose corners
        # lie in each other, are mostly told before a BVH is built; shells that cross each
        # other without that are caught by the self-intersection test.
        nesting = "" if shells == 1 else _shells_bound_one_solid(v64, tri[~flat], labels[good[:, 0]])
        if nesting is None:
            reason = f"{shells} shells (too many nested boxes to check for nesting)"
        elif nesting:
            reason = nesting
        else:
            mesh = mesh_factory() if mesh_factory is not None else wp.Mesh(
                points=wp.array(np.asarray(vertices, np.float32), dtype=wp.vec3),
                indices=wp.array(np.asarray(triangles, np.int32).reshape(-1), dtype=wp.int32))
            crossings = count_self_intersections(mesh, vertices, triangles, w)
            if crossings:
                reason = f"self-intersecting ({crossings} edge-triangle crossings)"
            elif shells == 1:
                reason = "one closed, consistently oriented shell without self-intersections"
                solid = True
            else:
                reason = (f"{shells} closed, consistently oriented shells without self-intersections "
                          "bounding one solid (winding number 0 or 1: evaluated by the pseudo-normal sign, "
                          "which equals it there)")
                solid = True
    method = SignMethod.NORMAL if solid and shells == 1 else SignMethod.WINDING_NUMBER
    return (MeshClass(method, reason, closed, oriented, shells, crossings, degenerate, volume,
                      time.perf_counter() - t0, solid=solid), mesh)


def _shells_bound_one_solid(v64: np.ndarray, tri: np.ndarray, shell_of: np.ndarray) -> str | None:
    """Of closed, consistently oriented shells (``tri`` (T,3) the non-flat triangles, ``shell_of``
    (T,) their shell labels): "" when, if they do not intersect, they bound one solid, else why
    not (nested, inside out, or crossing each other; None: too much work to tell).

    Across a shell the winding number steps by one, from the side its normals face to its back;
    a solid's boundary has 0 in front and 1 behind. Shell i's own step is +1 (faces outward,
    volume > 0) or -1 (faces inward: a cavity), so the winding number W_i of the other shells at
    a point of shell i (an integer: they are closed and do not touch it) must be 0 or 1 in turn;
    a value far from it, integer or not, rules the mesh out either way.
    Shell j contributes only at points inside its box."""
    labels, shell_idx = sorted_unique(shell_of, return_inverse=True)
    count = labels.shape[0]
    corners = v64[tri]  # (T,3,3)
    centre = 0.5 * (v64.min(axis=0) + v64.max(axis=0))
    a, b, c = (corners[:, k] - centre for k in range(3))
    vol = np.bincount(shell_idx, weights=np.einsum("ij,ij->i", a, np.cross(b, c)) / 6.0, minlength=count)
    order = np.argsort(shell_idx, kind="stable")
    first = np.searchsorted(shell_idx[order], np.arange(count))
    sizes = np.diff(np.append(first, order.shape[0]))
    lo = np.minimum.reduceat(corners.min(axis=1)[order], first, axis=0)
    hi = np.maximum.reduceat(corners.max(axis=1)[order], first, axis=0)
    point = corners[order[first], 0]  # a corner of each shell
    # holds[i, j]: shell j's box holds shell i's point
    holds = np.all((lo[None] <= point[:, None]) & (point[:, None] <= hi[None]), axis=2)
    np.fill_diagonal(holds, False)
    pairs_i, pairs_j = np.nonzero(holds)
    if int(sizes[pairs_j].sum()) > MAX_NESTING_EVALUATIONS:
        return None
    winding = np.zeros(count)
    for j in sorted_unique(pairs_j):
        held = pairs_i[pairs_j == j]
        shell_j = corners[order[first[j]:first[j] + sizes[j]]]
        step = max(1, GIL_CHUNK // held.shape[0])
        for k in range(0, shell_j.shape[0], step):
            winding[held] += winding_numbers(point[held], shell_j[k:k + step])
    expected = np.where(vol > 0.0, 0.0, 1.0)
    wrong = np.flatnonzero((np.abs(winding - expected) > 0.25) | (vol == 0.0))
    if wrong.size == 0:
        return ""
    i = int(wrong[0])
    return (f"{count} shells, not one solid's boundary (shell {i} of {count}: winding number "
            f"{winding[i]:.2f} of the others on it, volume {vol[i]:.3g}: nested, overlapping or inside-out bodies)")
