"""Frames of incoming messages: poses in any frame are brought into the node's world_frame.

MeshObstacle, ObstaclePose and PoseStamped messages carry a pose in ``header.frame_id``. The
node hands that pose to ``FrameResolver.pose_in_world``, which returns the pose in world_frame
or raises FrameError with the reason (unknown frame, no transform at that stamp within the
timeout); a message whose frame cannot be resolved is rejected, never applied in another frame.

Transforms come from a *transform buffer*, anything with

    lookup(target_frame, source_frame, stamp_ns, timeout_s) -> (7,) pose of source_frame in target_frame
        stamp_ns: int nanoseconds, or None for the latest transform; raises LookupFailed.

Two buffers ship here:

- ``Tf2Buffer``: tf2_ros.Buffer + TransformListener on a companion node with its own executor
  thread (so a lookup that waits never blocks the tf subscriptions); static transforms given
  as parameters are inserted as static transforms. Needs a ROS install (tf2_ros is not among
  the pip wheels).
- ``StaticTransforms``: a fixed tree of transforms (parameter ``static_transforms``) resolved in
  numpy, the fallback where tf2_ros cannot be imported; stamps do not matter for it.

Poses are 7-vectors x, y, z, qw, qx, qy, qz (metres, scalar-first quaternion), as in the core.
This module imports no ROS module at import time; ``Tf2Buffer`` imports tf2_ros and rclpy when
constructed.
"""
from __future__ import annotations

import math
import threading
from typing import Protocol

import numpy as np

from robot_sdf import geometry


class FrameError(ValueError):
    """A message pose that cannot be brought into world_frame; the text says why."""


class LookupFailed(Exception):
    """A transform buffer cannot provide the requested transform; the text says why."""


class TransformBuffer(Protocol):
    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray: ...


# ------------------------------------------------------------------ pose algebra


def quat_multiply(a, b) -> np.ndarray:
    """Hamilton product a * b of quaternions qw,qx,qy,qz (rotation b first, then a)."""
    aw, ax, ay, az = a
    bw, bx, by, bz = b
    return np.array([aw * bw - ax * bx - ay * by - az * bz,
                     aw * bx + ax * bw + ay * bz - az * by,
                     aw * by - ax * bz + ay * bw + az * bx,
                     aw * bz + ax * by - ay * bx + az * bw])


def compose(a, b) -> np.ndarray:
    """Pose a * b (7,): b expressed in the frame that a places (a: frame B in A, b: C in B -> C in A)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    q = quat_multiply(a[3:], b[3:])
    return np.concatenate([geometry.transform_points(a, b[:3]), q / np.linalg.norm(q)])


def invert(pose) -> np.ndarray:
    """Inverse pose (7,): if pose places B in A, the result places A in B."""
    return geometry.pose_inverse(pose)


# ------------------------------------------------------------------ static transforms


def parse_static_transforms(text: str) -> list[tuple[str, str, np.ndarray]]:
    """``static_transforms`` parameter -> [(parent, child, pose (7,) of child in parent)].

    Entries are separated by ';', each "parent child x y z qw qx qy qz" (metres, unit quaternion
    within 1e-3; renormalised). Raises ValueError naming the entry for anything else, for a
    frame given two parents and for cycles.
    """
    out: list[tuple[str, str, np.ndarray]] = []
    parents: dict[str, str] = {}
    for k, entry in enumerate(e.strip() for e in text.split(";")):
        if not entry:
            continue
        fields = entry.split()
        if len(fields) != 9:
            raise ValueError(f"static transform {k} '{entry}': expected 'parent child x y z qw qx qy qz', "
                             f"got {len(fields)} fields")
        parent, child = fields[:2]
        try:
            values = [float(x) for x in fields[2:]]
            pose = geometry.validate_pose(values)
        except ValueError as exc:
            raise ValueError(f"static transform {k} '{entry}': {exc}") from None
        if parent == child:
            raise ValueError(f"static transform {k} '{entry}': parent and child are the same frame")
        if child in parents:
            raise ValueError(f"static transform {k} '{entry}': frame '{child}' already has parent "
                             f"'{parents[child]}' (a frame has one parent)")
        parents[child] = parent
        out.append((parent, child, pose))
    for frame in parents:  # a cycle would make a frame its own ancestor
        seen, f = {frame}, parents[frame]
        while f in parents:
            if f in seen:
                raise ValueError(f"static transforms form a cycle through frame '{f}'")
            seen.add(f)
            f = parents[f]
    return out


class StaticTransforms:
    """A fixed tree of frames; lookups compose the chain through the common ancestor."""

    def __init__(self, transforms: list[tuple[str, str, np.ndarray]]) -> None:
        self._parent = {child: (parent, np.asarray(pose, dtype=np.float64)) for parent, child, pose in transforms}

    def frames(self) -> set[str]:
        return set(self._parent) | {p for p, _ in self._parent.values()}

    def _to_root(self, frame: str) -> tuple[str, np.ndarray]:
        """(root frame, pose of ``frame`` in the root)."""
        pose = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
        while frame in self._parent:
            parent, p = self._parent[frame]
            pose = compose(p, pose)
            frame = parent
        return frame, pose

    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray:
        known = self.frames()
        for f in (target_frame, source_frame):
            if f not in known:
                raise LookupFailed(f"frame '{f}' is not in static_transforms "
                                   f"(known: {', '.join(sorted(known)) or 'none'})")
        root_t, target_in_root = self._to_root(target_frame)
        root_s, source_in_root = self._to_root(source_frame)
        if root_t != root_s:
            raise LookupFailed(f"frames '{source_frame}' and '{target_frame}' are not connected "
                               f"(trees rooted at '{root_s}' and '{root_t}')")
        return compose(invert(target_in_root), source_in_root)


# ------------------------------------------------------------------ tf2


def tf2_available() -> bool:
    try:
        import tf2_ros  # noqa: F401
    except ImportError:
        return False
    return True


class Tf2Buffer:
    """tf2_ros.Buffer fed by a TransformListener on a companion node ``<name>_tf`` spun by its own
    thread; ``static`` transforms are inserted as static ones. Call close() when done."""

    def __init__(self, name: str, namespace: str, context, static: list[tuple[str, str, np.ndarray]]) -> None:
        import rclpy
        import tf2_ros
        from geometry_msgs.msg import TransformStamped
        from rclpy.executors import SingleThreadedExecutor

        self._tf2 = tf2_ros
        self._node = rclpy.create_node(f"{name}_tf", namespace=namespace, context=context,
                                       use_global_arguments=False, start_parameter_services=False)
        self.buffer = tf2_ros.Buffer(node=self._node)
        self._listener = tf2_ros.TransformListener(self.buffer, self._node, spin_thread=False)
        for parent, child, pose in static:
            t = TransformStamped()
            t.header.frame_id, t.child_frame_id = parent, child
            t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in pose[:3])
            (t.transform.rotation.w, t.transform.rotation.x, t.transform.rotation.y,
             t.transform.rotation.z) = (float(v) for v in pose[3:])
            self.buffer.set_transform_static(t, "static_transforms parameter")
        self._executor = SingleThreadedExecutor(context=context)
        self._executor.add_node(self._node)
        self._thread = threading.Thread(target=self._spin, name=f"{name}_tf", daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # noqa: BLE001 - context shut down
            pass

    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray:
        from rclpy.duration import Duration
        from rclpy.time import Time

        when = Time() if stamp_ns is None else Time(nanoseconds=int(stamp_ns))
        try:
            t = self.buffer.lookup_transform(target_frame, source_frame, when,
                                             timeout=Duration(nanoseconds=int(timeout_s * 1e9)))
        except self._tf2.TransformException as exc:
            raise LookupFailed(f"{type(exc).__name__}: {exc}") from None
        tr, r = t.transform.translation, t.transform.rotation
        return np.array([tr.x, tr.y, tr.z, r.w, r.x, r.y, r.z], dtype=np.float64)

    def close(self) -> None:
        self._executor.shutdown(timeout_sec=2.0)
        self._thread.join(timeout=5.0)
        unregister = getattr(self._listener, "unregister", None)  # absent before ROS 2 Humble
        if unregister is not None:
            unregister()
        self._node.destroy_node()


# ------------------------------------------------------------------ resolver


def stamp_to_ns(stamp) -> int:
    """builtin_interfaces/Time -> int nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


class FrameResolver:
    """Poses of incoming messages -> world_frame.

    world_frame: the node's frame; buffer: a transform buffer (see the module docstring);
    timeout_s: how long a lookup may wait for a transform; use_latest: look up the latest
    transform instead of the one at the message stamp (a zero stamp always means latest, as in tf2).
    """

    def __init__(self, world_frame: str, buffer: TransformBuffer | None, timeout_s: float = 0.1,
                 use_latest: bool = False) -> None:
        self.world_frame = world_frame
        self.buffer = buffer
        self.timeout_s = float(timeout_s)
        self.use_latest = bool(use_latest)

    def pose_in_world(self, frame_id: str, stamp_ns: int, pose) -> np.ndarray:
        """Pose (7,) given in ``frame_id`` at ``stamp_ns`` -> pose (7,) in world_frame.

        The pose is validated first (finite, unit quaternion); raises FrameError (a ValueError)
        when the frame cannot be resolved, ValueError for a bad pose.
        """
        p = geometry.validate_pose(pose)
        if frame_id == self.world_frame:
            return p
        if not frame_id:
            raise FrameError(f"header.frame_id '' is empty (world_frame is '{self.world_frame}')")
        if self.buffer is None:
            raise FrameError(f"header.frame_id '{frame_id}' is not the world frame '{self.world_frame}' "
                             "and no transforms are available")
        stamp = None if self.use_latest or stamp_ns == 0 else int(stamp_ns)
        try:
            world_from_frame = self.buffer.lookup(self.world_frame, frame_id, stamp, self.timeout_s)
        except LookupFailed as exc:
            at = "latest" if stamp is None else f"stamp {stamp / 1e9:.9f} s"
            raise FrameError(f"cannot transform header.frame_id '{frame_id}' into world frame "
                             f"'{self.world_frame}' ({at}, timeout {self.timeout_s:g} s): {exc}") from None
        t = np.asarray(world_from_frame, dtype=np.float64).reshape(-1)
        if t.shape != (7,) or not np.isfinite(t).all() or not math.isclose(float(np.linalg.norm(t[3:])), 1.0,
                                                                            abs_tol=1e-3):
            raise FrameError(f"transform '{self.world_frame}' <- '{frame_id}' is invalid: {t.tolist()}")
        return compose(t, p)
