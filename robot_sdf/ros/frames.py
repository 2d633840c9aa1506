"""Frames of incoming messages: poses in any frame are brought into the node's world_frame.

MeshObstacle, ObstaclePose and PoseStamped messages carry a pose in ``header.frame_id``. The
node hands that pose to ``FrameResolver.pose_in_world``, which returns the pose in world_frame,
raises TransformPending when the transform is just not there yet (the stamp lies at most
tf_timeout ahead of the newest transform data: the node holds the message aside and retries, see
sdf_server.py), or raises FrameError with the reason class and the buffer's text (unknown frame,
frames not connected, extrapolation); a message whose frame cannot be resolved is rejected, never
applied in another frame. Lookups never wait here: a waiting lookup would hold the update worker.

Transforms come from a *transform buffer*, anything with

    lookup(target_frame, source_frame, stamp_ns, timeout_s) -> (7,) pose of source_frame in target_frame
        stamp_ns: int nanoseconds, or None for the latest common time; raises LookupFailed
    latest_stamp(target_frame, source_frame) -> int | None
        the latest common time [ns] of the chain (0: static only), None when no transform exists

Two live buffers ship here, both on a companion node ``<name>_tf`` spun by its own thread and
running on the node's clock (``use_sim_time`` is mirrored onto it, also when it changes):

- ``Tf2Buffer``: tf2_ros.Buffer + TransformListener. Needs a ROS install (tf2_ros is not among
  the pip wheels).
- ``TopicTransformBuffer``: the fallback where tf2_ros cannot be imported: a ``TransformCache``
  (tf2's BufferCore rules in numpy) fed from ``/tf`` and ``/tf_static`` where tf2_msgs can be
  imported, else from ``~/transforms`` (geometry_msgs/TransformStamped).

Both clear their dynamic transforms when the clock jumps back by JUMP_BACK_NS or more or the time
source changes, with tf2_ros.Buffer's rule and message, through a jump callback of their own:
tf2_ros.Buffer's own callback is absent before tf2_ros_py 0.32.2 (Humble, Iron) and raises a
TypeError from 0.32.2 until ros2/geometry2 pull request 711 (its ``time_jump_callback`` lacks ``self``), which
rclpy re-raises into whoever changed the time, so Tf2Buffer replaces it.

Static transforms given as the ``static_transforms`` parameter are inserted as static ones into
either. Poses are 7-vectors x, y, z, qw, qx, qy, qz (metres, scalar-first quaternion), as in the
core. This module imports no ROS module at import time.
"""
from __future__ import annotations

import bisect
import math
import threading
import time
from typing import Protocol

import numpy as np

from robot_sdf import geometry
from robot_sdf.ros.executors import ExecutorThread  # stops without racing its callbacks

# Reason classes of a failed lookup, the same for tf2_ros and the built-in buffer (tf2_ros's
# exception classes LookupException, ConnectivityException, ExtrapolationException,
# TimeoutException, InvalidArgumentException).
UNKNOWN_FRAME = "unknown frame"
NOT_CONNECTED = "frames not connected"
EXTRAPOLATION = "extrapolation"
TIMEOUT = "timeout"
INVALID = "invalid argument"
# How long tf2 keeps dynamic transforms (tf2::BufferCore's default cache time) [ns].
CACHE_TIME_NS = 10_000_000_000
# How far back simulated time must jump to clear the buffer (tf2_ros's Python Buffer: 1 s) [ns].
JUMP_BACK_NS = 1_000_000_000
JUMP_BACK_TEXT = "Detected jump back in time. Clearing tf buffer."


class FrameError(ValueError):
    """A message pose that cannot be brought into world_frame; the text says why."""


class TransformPending(FrameError):
    """The message's stamp lies just ahead of the newest transform data: the transform is expected
    within ``wait_s`` seconds. The text is the rejection to log if it does not come in time."""

    def __init__(self, text: str, wait_s: float) -> None:
        super().__init__(text)
        self.wait_s = float(wait_s)


class LookupFailed(Exception):
    """A transform buffer cannot provide the requested transform; ``reason`` is its class (one of
    UNKNOWN_FRAME, NOT_CONNECTED, EXTRAPOLATION, TIMEOUT, INVALID), the text says why."""

    def __init__(self, text: str, reason: str = INVALID) -> None:
        super().__init__(text)
        self.reason = reason


class TransformBuffer(Protocol):
    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray: ...

    def latest_stamp(self, target_frame: str, source_frame: str) -> int | None: ...


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


def interpolate(a, b, ratio: float) -> np.ndarray:
    """Pose (7,) a fraction ``ratio`` (0..1) of the way from a to b: translation linear, rotation
    along the shorter great arc (slerp), as tf2 interpolates between two stamps."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    qa, qb = a[3:], b[3:]
    dot = float(np.dot(qa, qb))
    if dot < 0.0:  # q and -q are the same rotation: take the shorter way
        qb, dot = -qb, -dot
    if dot > 0.9995:  # nearly equal: normalised lerp avoids dividing by sin(~0)
        q = qa + ratio * (qb - qa)
    else:
        theta = math.acos(dot)
        q = (math.sin((1.0 - ratio) * theta) * qa + math.sin(ratio * theta) * qb) / math.sin(theta)
    return np.concatenate([a[:3] + ratio * (b[:3] - a[:3]), q / np.linalg.norm(q)])


# ------------------------------------------------------------------ static transforms, the transform cache


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


class TransformCache:
    """tf2's BufferCore rules in numpy: a tree of frames, each with one parent, whose transforms
    are static (valid at every time) or stamped (kept CACHE_TIME_NS behind the newest one of
    their frame, linearly interpolated between stamps: translation lerp, rotation slerp).

    Lookups at a stamp outside a frame's data raise LookupFailed(EXTRAPOLATION) (no tolerance,
    as in tf2: a frame with one sample resolves at that stamp only); stamp None means the latest
    common time of the chain. Data older than the cache window of its frame is dropped and
    counted (tf2's TF_OLD_DATA). ``clear()`` forgets the stamped transforms and keeps the static
    ones. Thread-safe; ``lookup`` may wait up to its timeout for data to arrive.
    """

    def __init__(self, transforms: list[tuple[str, str, np.ndarray]] = (),
                 cache_time_ns: int = CACHE_TIME_NS) -> None:
        self._cond = threading.Condition()
        self._cache_ns = int(cache_time_ns)
        self._static: dict[str, tuple[str, np.ndarray]] = {}
        self._stamped: dict[str, tuple[list[int], list[tuple[str, np.ndarray]]]] = {}
        self._parents: set[str] = set()  # every frame named as a parent (a lookup must not scan the history)
        self.old_data_dropped = 0
        for parent, child, pose in transforms:
            self.set_transform(parent, child, 0, pose, static=True)

    def set_transform(self, parent: str, child: str, stamp_ns: int, pose, static: bool = False) -> bool:
        """Insert the pose (7,) of ``child`` in ``parent``; False when dropped as too old.
        ValueError (nothing stored) for empty or equal frame names and invalid poses."""
        parent, child = parent.lstrip("/"), child.lstrip("/")  # tf2 strips a leading slash on insertion
        if not parent or not child or parent == child:
            raise ValueError(f"transform '{parent}' -> '{child}': frames must be two non-empty, different names")
        p = geometry.validate_pose(pose)
        with self._cond:
            self._parents.add(parent)
            if static:
                self._static[child] = (parent, p)
            else:
                stamps, values = self._stamped.setdefault(child, ([], []))
                if stamps and stamp_ns < stamps[-1] - self._cache_ns:
                    self.old_data_dropped += 1
                    return False
                k = bisect.bisect_left(stamps, stamp_ns)
                if k < len(stamps) and stamps[k] == stamp_ns:
                    values[k] = (parent, p)
                else:
                    stamps.insert(k, stamp_ns)
                    values.insert(k, (parent, p))
                cut = bisect.bisect_left(stamps, stamps[-1] - self._cache_ns)
                del stamps[:cut], values[:cut]
            self._cond.notify_all()
        return True

    def clear(self) -> None:
        """Forget the stamped transforms (static ones stay, as in tf2)."""
        with self._cond:
            self._stamped.clear()
            self._parents = {parent for parent, _ in self._static.values()}

    def frames(self) -> set[str]:
        with self._cond:
            return self._frames()

    # ---------------------------------------------------------------- lookups (lock held)

    def _parent(self, frame: str) -> str | None:
        if frame in self._static:
            return self._static[frame][0]
        entry = self._stamped.get(frame)
        return entry[1][-1][0] if entry and entry[0] else None

    def _chain(self, frame: str) -> list[str]:
        """frame, its parent, ..., the root."""
        chain = [frame]
        parent = self._parent(frame)
        while parent is not None and parent not in chain:
            chain.append(parent)
            parent = self._parent(parent)
        return chain

    def _path(self, target: str, source: str) -> tuple[list[str], list[str]]:
        """Frames below the common ancestor on the source side and on the target side."""
        for name, f in (("target_frame", target), ("source_frame", source)):
            if not f or f.startswith("/"):  # tf2's validateFrameId: InvalidArgumentException
                raise LookupFailed(f"invalid {name} '{f}': a frame name must be non-empty and must not "
                                   f"start with '/'", INVALID)
            if f not in self._static and f not in self._stamped and f not in self._parents:
                raise LookupFailed(f"frame '{f}' ({name}) does not exist; known frames: "
                                   f"{', '.join(sorted(self._frames())) or 'none'}", UNKNOWN_FRAME)
        up_s, up_t = self._chain(source), self._chain(target)
        common = next((f for f in up_s if f in up_t), None)
        if common is None:
            raise LookupFailed(f"frames '{source}' and '{target}' are not connected (trees rooted at "
                               f"'{up_s[-1]}' and '{up_t[-1]}')", NOT_CONNECTED)
        return up_s[:up_s.index(common)], up_t[:up_t.index(common)]

    def _frames(self) -> set[str]:
        return set(self._static) | set(self._stamped) | self._parents

    def _latest(self, frames: list[str]) -> int:
        """Latest common time of the stamped transforms of ``frames`` (0: all static)."""
        ends = [self._stamped[f][0][-1] for f in frames if f not in self._static]
        return min(ends) if ends else 0

    def _edge(self, frame: str, stamp_ns: int) -> np.ndarray:
        """Pose of ``frame`` in its parent at ``stamp_ns``."""
        if frame in self._static:
            return self._static[frame][1]
        stamps, values = self._stamped[frame]
        if stamp_ns == stamps[-1] or stamp_ns == stamps[0]:
            return values[-1 if stamp_ns == stamps[-1] else 0][1]
        parent = values[-1][0]
        if len(stamps) == 1:
            raise LookupFailed(f"transform '{parent}' -> '{frame}' would need extrapolation: requested "
                               f"time {stamp_ns / 1e9:.9f} s but only {stamps[0] / 1e9:.9f} s is in the buffer",
                               EXTRAPOLATION)
        if stamp_ns > stamps[-1]:
            raise LookupFailed(f"transform '{parent}' -> '{frame}' would need extrapolation into the future: "
                               f"requested time {stamp_ns / 1e9:.9f} s but the latest data is at "
                               f"{stamps[-1] / 1e9:.9f} s", EXTRAPOLATION)
        if stamp_ns < stamps[0]:
            raise LookupFailed(f"transform '{parent}' -> '{frame}' would need extrapolation into the past: "
                               f"requested time {stamp_ns / 1e9:.9f} s but the earliest data is at "
                               f"{stamps[0] / 1e9:.9f} s", EXTRAPOLATION)
        k = bisect.bisect_right(stamps, stamp_ns)
        (t0, (_, a)), (t1, (_, b)) = (stamps[k - 1], values[k - 1]), (stamps[k], values[k])
        return interpolate(a, b, (stamp_ns - t0) / (t1 - t0))

    def _resolve(self, target: str, source: str, stamp_ns: int | None) -> np.ndarray:
        if target == source:
            return np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
        down_s, down_t = self._path(target, source)
        if stamp_ns is None:
            stamp_ns = self._latest(down_s + down_t)
        source_in_common = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
        for f in down_s:
            source_in_common = compose(self._edge(f, stamp_ns), source_in_common)
        target_in_common = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
        for f in down_t:
            target_in_common = compose(self._edge(f, stamp_ns), target_in_common)
        return compose(invert(target_in_common), source_in_common)

    # ---------------------------------------------------------------- the buffer interface

    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray:
        """Pose (7,) of source_frame in target_frame at stamp_ns (None: latest common time),
        waiting up to timeout_s [s] for data to arrive; raises LookupFailed."""
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        with self._cond:
            while True:
                try:
                    return self._resolve(target_frame, source_frame, stamp_ns)
                except LookupFailed:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise
                    self._cond.wait(remaining)

    def latest_stamp(self, target_frame: str, source_frame: str) -> int | None:
        with self._cond:
            if target_frame == source_frame:
                return 0
            try:
                down_s, down_t = self._path(target_frame, source_frame)
            except LookupFailed:
                return None
            return self._latest(down_s + down_t)


def tf2_available() -> bool:
    try:
        import tf2_ros  # noqa: F401
    except ImportError:
        return False
    return True


def tf2_msgs_available() -> bool:
    try:
        import tf2_msgs.msg  # noqa: F401
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ live buffers (ROS)


class _CompanionNode:
    """Node ``<name>_tf`` on ``context`` spun by its own thread, on the clock of the node it serves:
    ``use_sim_time`` is set on it at start and by ``set_use_sim_time``."""

    def __init__(self, name: str, namespace: str, context, use_sim_time: bool) -> None:
        import rclpy
        from rclpy.parameter import Parameter

        self._node = rclpy.create_node(f"{name}_tf", namespace=namespace, context=context,
                                       use_global_arguments=False, start_parameter_services=False,
                                       parameter_overrides=[Parameter("use_sim_time", value=bool(use_sim_time))])
        self._spinner = None

    def _start(self, name: str) -> None:

        self._spinner = ExecutorThread(self._node, f"{name}_tf", on_error=lambda exc: self._node.get_logger().error(
            f"transform listener stopped: {exc!r}"))

    def _watch_clock_jumps(self, clear) -> None:
        """Call ``clear()`` (and log tf2's message) when this node's clock jumps back by
        JUMP_BACK_NS or more or its time source changes: tf2_ros.Buffer's rule."""
        from rclpy.clock import JumpThreshold
        from rclpy.duration import Duration

        def on_jump(jump) -> None:
            self._node.get_logger().warning(JUMP_BACK_TEXT)
            clear()

        threshold = JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-JUMP_BACK_NS),
                                  on_clock_change=True)
        self._jump_handle = self._node.get_clock().create_jump_callback(threshold, post_callback=on_jump)

    def set_use_sim_time(self, value: bool) -> None:
        from rclpy.parameter import Parameter

        self._node.set_parameters([Parameter("use_sim_time", value=bool(value))])

    def _stop_spinning(self) -> None:
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None

    def close(self) -> None:
        self._stop_spinning()
        handle = getattr(self, "_jump_handle", None)
        if handle is not None:
            handle.unregister()
        self._node.destroy_node()


def _transform_msg_pose(t) -> np.ndarray:
    tr, r = t.transform.translation, t.transform.rotation
    return np.array([tr.x, tr.y, tr.z, r.w, r.x, r.y, r.z], dtype=np.float64)


class Tf2Buffer(_CompanionNode):
    """tf2_ros.Buffer fed by a TransformListener on ``tf_topic`` and ``tf_static_topic``; ``static``
    transforms are inserted as static ones. Call close() when done."""

    def __init__(self, name: str, namespace: str, context, static: list[tuple[str, str, np.ndarray]],
                 use_sim_time: bool = False, tf_topic: str = "/tf", tf_static_topic: str = "/tf_static") -> None:
        import tf2_ros
        from geometry_msgs.msg import TransformStamped

        super().__init__(name, namespace, context, use_sim_time)
        self._tf2 = tf2_ros
        classes = (("LookupException", UNKNOWN_FRAME), ("ConnectivityException", NOT_CONNECTED),
                   ("ExtrapolationException", EXTRAPOLATION), ("TimeoutException", TIMEOUT))
        self._reasons = tuple((getattr(tf2_ros, name), reason) for name, reason in classes if hasattr(tf2_ros, name))
        self.buffer = tf2_ros.Buffer(node=self._node)
        own = getattr(self.buffer, "jump_handle", None)  # see the module docstring: replaced by ours
        if own is not None:
            own.unregister()
        self._watch_clock_jumps(self.buffer.clear)
        try:
            self._listener = tf2_ros.TransformListener(self.buffer, self._node, spin_thread=False,
                                                       tf_topic=tf_topic, tf_static_topic=tf_static_topic)
            self.topics = (tf_topic, tf_static_topic)
        except TypeError:  # tf2_ros before the topic arguments: the fixed names
            self._listener = tf2_ros.TransformListener(self.buffer, self._node, spin_thread=False)
            self.topics = ("/tf", "/tf_static")
        for parent, child, pose in static:
            t = TransformStamped()
            t.header.frame_id, t.child_frame_id = parent, child
            t.transform.translation.x, t.transform.translation.y, t.transform.translation.z = (float(v) for v in pose[:3])
            (t.transform.rotation.w, t.transform.rotation.x, t.transform.rotation.y,
             t.transform.rotation.z) = (float(v) for v in pose[3:])
            self.buffer.set_transform_static(t, "static_transforms parameter")
        self._start(name)

    def _lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None, timeout_s: float):
        from rclpy.duration import Duration
        from rclpy.time import Time

        when = Time() if stamp_ns is None else Time(nanoseconds=int(stamp_ns))
        try:
            return self.buffer.lookup_transform(target_frame, source_frame, when,
                                                timeout=Duration(nanoseconds=int(timeout_s * 1e9)))
        except self._tf2.TransformException as exc:
            reason = next((r for cls, r in self._reasons if isinstance(exc, cls)), INVALID)
            raise LookupFailed(f"{type(exc).__name__}: {exc}", reason) from None

    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray:
        return _transform_msg_pose(self._lookup(target_frame, source_frame, stamp_ns, timeout_s))

    def latest_stamp(self, target_frame: str, source_frame: str) -> int | None:
        try:
            t = self._lookup(target_frame, source_frame, None, 0.0)
        except LookupFailed:
            return None
        return stamp_to_ns(t.header.stamp)

    def close(self) -> None:
        self._stop_spinning()
        unregister = getattr(self._listener, "unregister", None)  # absent before ROS 2 Humble
        if unregister is not None:
            unregister()
        super().close()


class TopicTransformBuffer(_CompanionNode):
    """The fallback without tf2_ros: a TransformCache fed from ``/tf`` + ``/tf_static``
    (tf2_msgs/TFMessage, where tf2_msgs can be imported) or from ``transforms_topic``
    (geometry_msgs/TransformStamped, one transform per message), plus the ``static`` transforms.
    Clears its stamped transforms when the clock jumps back by more than JUMP_BACK_NS or the time
    source changes, as tf2_ros.Buffer does. Call close() when done."""

    def __init__(self, name: str, namespace: str, context, static: list[tuple[str, str, np.ndarray]],
                 use_sim_time: bool = False, transforms_topic: str = "~/transforms",
                 tf_topic: str = "/tf", tf_static_topic: str = "/tf_static") -> None:
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile

        super().__init__(name, namespace, context, use_sim_time)
        self.cache = TransformCache(static)
        self._logger = self._node.get_logger()
        volatile = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST, durability=DurabilityPolicy.VOLATILE)
        latched = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST, durability=DurabilityPolicy.TRANSIENT_LOCAL)
        if tf2_msgs_available():
            from tf2_msgs.msg import TFMessage

            self._node.create_subscription(TFMessage, tf_topic, lambda m: self._insert(m.transforms, False), volatile)
            self._node.create_subscription(TFMessage, tf_static_topic, lambda m: self._insert(m.transforms, True),
                                           latched)
            self.topics = (tf_topic, tf_static_topic)
        else:
            from geometry_msgs.msg import TransformStamped

            self._node.create_subscription(TransformStamped, transforms_topic, lambda m: self._insert((m,), False),
                                           volatile)
            self.topics = (transforms_topic,)
        self._watch_clock_jumps(self.cache.clear)
        self._start(name)

    def _insert(self, transforms, static: bool) -> None:
        for t in transforms:
            try:
                if not self.cache.set_transform(t.header.frame_id, t.child_frame_id, stamp_to_ns(t.header.stamp),
                                                _transform_msg_pose(t), static=static):
                    self._logger.warning(f"ignoring transform '{t.header.frame_id}' -> '{t.child_frame_id}' "
                                         f"at {stamp_to_ns(t.header.stamp) / 1e9:.9f} s: older than the "
                                         f"{CACHE_TIME_NS / 1e9:g} s the buffer keeps (TF_OLD_DATA)",
                                         throttle_duration_sec=1.0)
            except ValueError as exc:
                self._logger.warning(f"ignoring transform: {exc}", throttle_duration_sec=1.0)

    def lookup(self, target_frame: str, source_frame: str, stamp_ns: int | None,
               timeout_s: float) -> np.ndarray:
        return self.cache.lookup(target_frame, source_frame, stamp_ns, timeout_s)

    def latest_stamp(self, target_frame: str, source_frame: str) -> int | None:
        return self.cache.latest_stamp(target_frame, source_frame)



# ------------------------------------------------------------------ resolver


def stamp_to_ns(stamp) -> int:
    """builtin_interfaces/Time -> int nanoseconds."""
    return int(stamp.sec) * 1_000_000_000 + int(stamp.nanosec)


class FrameResolver:
    """Poses of incoming messages -> world_frame.

    world_frame: the node's frame; buffer: a transform buffer (see the module docstring);
    timeout_s: how far [s] a stamp may lie ahead of the newest transform data and still be waited
    for (TransformPending; 0: never); use_latest: look up the latest transform instead of the one
    at the message stamp (a zero stamp always means latest, as in tf2).
    """

    def __init__(self, world_frame: str, buffer: TransformBuffer | None, timeout_s: float = 0.1,
                 use_latest: bool = False) -> None:
        self.world_frame = world_frame
        self.buffer = buffer
        self.timeout_s = float(timeout_s)
        self.use_latest = bool(use_latest)

    def pose_in_world(self, frame_id: str, stamp_ns: int, pose) -> np.ndarray:
        """Pose (7,) given in ``frame_id`` at ``stamp_ns`` -> pose (7,) in world_frame.

        The pose is validated first (finite, unit quaternion). Never waits: raises
        TransformPending when the stamp lies at most timeout_s ahead of the newest data of a
        resolvable chain (retry until then), FrameError (a ValueError) when the frame cannot be
        resolved, ValueError for a bad pose.
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
            world_from_frame = self.buffer.lookup(self.world_frame, frame_id, stamp, 0.0)
        except LookupFailed as exc:
            # the stamp only where it matters: the same unknown frame then reads the same each time
            # (the node folds identical rejections in its log)
            at = ""
            if exc.reason == EXTRAPOLATION:
                at = " (latest)" if stamp is None else f" (stamp {stamp / 1e9:.9f} s)"
            text = (f"cannot transform header.frame_id '{frame_id}' into world frame '{self.world_frame}'"
                    f"{at}: {exc.reason}: {exc}")
            if stamp is not None and exc.reason == EXTRAPOLATION and self.timeout_s > 0:
                latest = self.buffer.latest_stamp(self.world_frame, frame_id)
                if latest and 0 < stamp - latest <= self.timeout_s * 1e9:
                    raise TransformPending(f"{text} (no newer transform within tf_timeout {self.timeout_s:g} s)",
                                           self.timeout_s) from None
            raise FrameError(text) from None
        t = np.asarray(world_from_frame, dtype=np.float64).reshape(-1)
        if t.shape != (7,) or not np.isfinite(t).all() or not math.isclose(float(np.linalg.norm(t[3:])), 1.0,
                                                                            abs_tol=1e-3):
            raise FrameError(f"transform '{self.world_frame}' <- '{frame_id}' is invalid: {t.tolist()}")
        return compose(t, p)
