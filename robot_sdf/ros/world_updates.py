"""Update ingestion of the sdf_server node: mesh and pose messages into its MeshWorld.

WorldUpdates subscribes to ``~/mesh_obstacles`` (MeshObstacle; reliable, transient_local,
KEEP_ALL: meshes published before the node started reach it and none is dropped),
``~/obstacle_poses`` (ObstaclePose) and one geometry_msgs/PoseStamped topic per scene obstacle
with a ``pose_topic`` (pose inputs are best effort, depth 10: the latest pose wins, and best
effort matches reliable and best-effort publishers alike). The subscriptions live on a companion
node ``<name>_world_updates`` with a context (DDS participant) and an executor thread of its
own, so busy services never delay them and big mesh samples are reassembled off the services'
participant. A mesh message is only queued by its callback (update_queue.py) and applied, in
order per id, by the queue's worker; a pose is applied in its callback (it writes one slot).

Input policy: every message is checked before the world changes; a bad one is logged with its
reason (the same rejection at most once a second, with the number left out) and dropped whole.
A pose in a frame other than world_frame is transformed into it at the message stamp (the
node's FrameResolver); a message stamped just ahead of its frame's newest transform is held
aside and retried by a thread of its own (never waited for on the update thread), any other
unresolvable frame rejects the message at once. REMOVE, ENABLE and DISABLE carry no pose, so
their frame is not used. A stamped mesh update older than the last one applied for its id is
a replay and skipped; the stamps are forgotten when the clock jumps back.

Applying an ADD (apply_add): an ADD of an existing id whose triangles are identical to the ones
it has (or that sends vertices only, ``triangles`` empty) keeps the BVH topology: the world
refits it (MeshWorld.update_vertices, ~10-20x cheaper than a rebuild) and sets the new pose in
the same revision. Anything else replaces the geometry (a rebuild, or a cached geometry when the
content was seen before). An ADD keeps a DISABLEd id disabled (docs/design.md "Messages and
services").
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import rclpy
from geometry_msgs.msg import PoseStamped
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.clock import ClockChange
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import Header

from robot_sdf import _internals
from robot_sdf.perception.fusion import PERCEIVED_MESH
from robot_sdf.ros import conversions as conv
from robot_sdf.ros.frames import TransformPending, stamp_to_ns
from robot_sdf.ros.executors import ExecutorThread
from robot_sdf.ros.update_queue import LatencyWindow, UpdateQueue
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose

# The same rejection (same input, same reason) is logged at most once per this period.
_REJECT_LOG_PERIOD_S = 1.0
# Nice value added to the update worker thread (Linux). 0: measured under the soak load, +10
# made publish -> applied p99 worse (1.35 s against 0.37 s) without helping queries.
_UPDATE_WORKER_NICE = 0
# How often updates held for a transform that is just not there yet are retried [s].
_HELD_RETRY_S = 0.005
# Update stamps kept per (env, id) (for skipping replays) before those of removed ids are pruned.
_MAX_STAMPS = 100_000
# The node's side of ~/mesh_obstacles: KEEP_ALL, so the middleware never overwrites a message
# the node has not taken (the callback only queues it, see update_queue.py); reliable and
# transient_local like conversions.MESH_OBSTACLE_QOS, so every producer publishing with it matches.
MESH_SUBSCRIPTION_QOS = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE,
                                   durability=DurabilityPolicy.TRANSIENT_LOCAL)
POSE_QOS = QoSProfile(depth=10, history=HistoryPolicy.KEEP_LAST,
                      reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.VOLATILE)

# What MeshWorld raises for input it refuses (it validates before changing or computing
# anything): ValueError for bad values, KeyError for unknown mesh ids.
REFUSALS = (ValueError, KeyError)


def refusal_reason(exc: Exception) -> str:
    """The message of a refusal (str(KeyError) would add quotes around it)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


class RejectedInput(ValueError):
    """A topic message that is dropped; its text goes into the warning log."""


class _RetryHeld:
    """Queued in the update queue: retry the held updates of ``key`` on the worker."""

    __slots__ = ("key",)

    def __init__(self, key) -> None:
        self.key = key


class MeshTooLarge(ValueError):
    """A mesh over the node's max_vertices_per_mesh / max_triangles_per_mesh."""


def check_mesh_size(msg, max_vertices: int, max_triangles: int) -> None:
    """Refuse an oversized geometry before any conversion or copy of it."""
    if len(msg.vertices) > 0:
        nv, nt = len(msg.vertices) // 3, len(msg.triangles) // 3
    else:
        nv, nt = len(msg.mesh.vertices), len(msg.mesh.triangles)
    if nv > max_vertices:
        raise MeshTooLarge(f"mesh has {nv} vertices, more than max_vertices_per_mesh {max_vertices}")
    if nt > max_triangles:
        raise MeshTooLarge(f"mesh has {nt} triangles, more than max_triangles_per_mesh {max_triangles}")


def apply_add(world, name: str, env: int, msg, config, pose) -> str:
    """Apply an ADD message whose pose (7,), already in world_frame, is ``pose``; returns the log
    line. Raises ValueError/KeyError (nothing changed)."""
    check_mesh_size(msg, config.max_vertices_per_mesh, config.max_triangles_per_mesh)
    exists = world.has_mesh(name, env) if isinstance(name, str) and name else False
    if exists and len(msg.vertices) > 0:
        vertices = conv.as_float32(msg.vertices)
        triangles = conv.as_uint32(msg.triangles)
        if triangles.size == 0 or world.same_triangles(name, triangles, env):
            rev = world.update_vertices(name, vertices, env=env, pose=pose)
            return f"{vertices.size // 3} vertices, same topology: refit -> revision {rev}"
    vertices, triangles = conv.mesh_arrays(msg)
    enabled = world.mesh_geometry(name, env)[3] if exists else True
    rev = world.add_mesh(name, vertices, triangles, pose=pose, env=env, enabled=enabled)
    return f"{vertices.size // 3} vertices, {triangles.size // 3} triangles -> revision {rev}"


class WorldUpdates:
    """Mesh and pose updates of one sdf_server node into its world (see the module docstring).

    world: the node's MeshWorld; config: its ServerConfig (the node assigns a new one on a
    parameter change); frames: its FrameResolver (poses into world_frame); logger: its logger;
    health: its HealthMonitor (rejections, internal errors); trim: its TrimScheduler (asked for a
    heap trim after a REMOVE); on_applied: called after every applied update (the state saver).
    Counters for the diagnostics: ``rejected``, ``stale_skipped`` and diagnostics().
    start() opens the subscriptions and threads, stop() closes them; the stamps stay in between.
    """

    def __init__(self, world, config, frames, logger, health, trim, on_applied: Callable[[], None]) -> None:
        self.world, self.config = world, config
        self._frames = frames
        self._logger = logger
        self._health = health
        self._trim = trim
        self._on_applied = on_applied
        caller = WorldUpdates._log_applied.__code__
        self._log_info = _internals.info_logger(logger, caller.co_name, caller.co_filename, caller.co_firstlineno)
        self._count_lock = threading.Lock()
        self._stamps: dict[tuple[int, str], tuple[int, int]] = {}
        self.stale_skipped = 0
        # Counts the clock's jumps back: an update checked before a jump records no stamp after it
        # (its stamp belongs to the timeline the jump left).
        self._stamp_epoch = 0
        self.rejected = 0
        self._reject_log: dict[tuple[str, str], tuple[float, int]] = {}
        self._reset_latencies()
        self._spinner: ExecutorThread | None = None

    def _reset_latencies(self) -> None:
        """New latency windows (at construction and at each start(), as the queue's counters)."""
        self._applied_latency = LatencyWindow()  # stamp -> applied
        self._received_latency = LatencyWindow()  # stamp -> subscription callback (DDS + executor)
        self._apply_duration = LatencyWindow()  # the worker's time per update (validation to publish)

    # ------------------------------------------------------------------ stamps

    def restore_stamps(self, stamps: dict[tuple[int, str], tuple[int, int]]) -> None:
        """The stamps of a restored world (robot_sdf.state), before start()."""
        with self._count_lock:
            self._stamps.update(stamps)

    def applied_stamps(self) -> dict[tuple[int, str], tuple[int, int]]:
        """(env, id) -> (sec, nanosec) of the last stamped update applied, a copy."""
        with self._count_lock:
            return dict(self._stamps)

    def on_time_jump(self, jump) -> None:
        """Clock jump callback of the node: forget the stamps (a bag loop, a simulator reset)."""
        with self._count_lock:
            forgotten = len(self._stamps)
            self._stamps.clear()
            self._stamp_epoch += 1
        if jump.clock_change in (ClockChange.ROS_TIME_ACTIVATED, ClockChange.ROS_TIME_DEACTIVATED):
            event = "the clock changed its time source (use_sim_time)"
        else:
            event = f"the clock jumped back by {-jump.delta.nanoseconds / 1e9:.3f} s (a bag loop, a simulator reset?)"
        self._logger.warning(f"{event}: forgot the stamps of {forgotten} applied updates, so updates "
                             "stamped earlier apply again")

    def _forget_removed_stamps(self) -> None:
        """Bound the stamp table: drop the oldest half of the stamps of ids no longer in the world."""
        gone = sorted((v, k) for k, v in self._stamps.items()
                      if not (0 <= k[0] < self.world.num_envs and self.world.has_mesh(k[1], k[0])))
        for _, k in gone[:max(1, len(gone) // 2)]:
            del self._stamps[k]

    # ------------------------------------------------------------------ start and stop

    def start(self, node, pose_topics: dict[str, list[tuple[str, int]]]) -> None:
        """Subscribe to the update topics of ``node`` on a companion node spun by its own thread.

        rclpy's executor dispatches from one Python loop; while clients call the services
        continuously, a subscription served by that loop waits behind the request callbacks
        (measured: a 10k-triangle ADD applied 50-60 ms after publishing instead of 13 ms). The
        companion keeps the ``~/`` topic names of ``node`` (absolute names built from its fully
        qualified name) and hands updates to the world as they arrive: a mesh update is queued for
        the update worker (update_queue.py), so a pose never waits for a BVH build.
        """
        # Process-wide arguments (a `__node:=` remap in particular) are for the node only; the
        # companion subscribes to the names the node resolves, so topic remaps still apply.
        # A context (DDS participant) of its own: a big mesh sample is received and reassembled by
        # that participant's transport threads, so service requests and responses of the node
        # do not queue behind its fragments (measured: a 1M-triangle ADD delayed queries by up
        # to 1.8 s when both shared one participant).
        self._context = rclpy.Context()
        rclpy.init(context=self._context, domain_id=node.context.get_domain_id())
        self.companion_node = rclpy.create_node(f"{node.get_name()}_world_updates", namespace=node.get_namespace(),
                                                context=self._context, use_global_arguments=False,
                                                start_parameter_services=False)
        mesh_group = MutuallyExclusiveCallbackGroup()
        pose_group = MutuallyExclusiveCallbackGroup()
        companion = self.companion_node
        self._reset_latencies()
        self._mesh_updates = UpdateQueue(self._apply_queued_mesh_obstacle, self._on_update_error,
                                         max_pending_bytes=self.config.max_pending_update_mb * 2**20,
                                         nice=_UPDATE_WORKER_NICE)
        self._start_held_retries()
        companion.create_subscription(MeshObstacle, node.resolve_topic_name("~/mesh_obstacles"),
                                      self._on_mesh_obstacle, MESH_SUBSCRIPTION_QOS, callback_group=mesh_group)
        companion.create_subscription(ObstaclePose, node.resolve_topic_name("~/obstacle_poses"),
                                      self._on_obstacle_pose, POSE_QOS, callback_group=pose_group)
        for topic, targets in pose_topics.items():
            companion.create_subscription(PoseStamped, node.resolve_topic_name(topic),
                                          self._pose_topic_callback(topic, targets), POSE_QOS,
                                          callback_group=pose_group)
        # One thread: the callbacks are short (a mesh update only enqueues, a pose writes one
        # slot). A MultiThreadedExecutor here cost ~55 % of a core under the load soak, its
        # dispatch loop waking again and again while a callback was in flight, and that time
        # (and the GIL) was taken from the update worker and the services.
        self._spinner = ExecutorThread(companion, "sdf_server_world_updates")

    def stop(self) -> None:
        """Close the subscriptions and the companion's context, stop the held-update retries and
        the update worker (what it has queued is applied first). Nothing if not started."""
        if self._spinner is None:
            return
        self._spinner.stop()
        self._spinner = None
        self.companion_node.destroy_node()
        rclpy.try_shutdown(context=self._context)
        self._stop_held_retries()
        self._mesh_updates.close(timeout=5.0)

    # ------------------------------------------------------------------ outcome of one update

    def reject(self, what: str, why: str) -> None:
        """Count, log (folded as _reject folds) and report a rejected input of another source
        (the node's depth cameras)."""
        self._reject(what, why)

    def _reject(self, what: str, why: str, internal: bool = False) -> None:
        """Count and log a rejected input; the same rejection repeated within a second (a pose
        stream for a removed obstacle, say) is logged once, with the number left out. ``internal``:
        the input failed on an internal error (an ERROR in the diagnostics, not a WARN)."""
        if internal:
            self._health.internal_error(what, why)
        else:
            self._health.rejected(what, why)
        now = time.monotonic()
        key = (what, why)
        with self._count_lock:
            self.rejected += 1
            last, suppressed = self._reject_log.get(key, (-math.inf, 0))
            if now - last < _REJECT_LOG_PERIOD_S:
                self._reject_log[key] = (last, suppressed + 1)
                return
            self._reject_log[key] = (now, 0)
            if len(self._reject_log) > 1000:  # forget old keys; bounded memory under any input
                self._reject_log = {k: v for k, v in self._reject_log.items() if now - v[0] < _REJECT_LOG_PERIOD_S}
        repeats = f" ({suppressed} identical rejections not logged)" if suppressed else ""
        self._logger.warning(f"rejected {what}: {why}{repeats}")

    def _guarded(self, what: str, apply: Callable[[], str]) -> bool:
        """Run one world update; log its outcome; never let an exception escape. True if applied."""
        try:
            done = apply()
        except TransformPending:
            raise  # the caller holds the update and retries it
        except REFUSALS as exc:
            self._reject(what, refusal_reason(exc))
        except Exception as exc:  # noqa: BLE001 - a topic callback must not kill the node
            self._reject(what, f"internal error {type(exc).__name__}: {exc}", internal=True)
        else:
            if done:
                self._log_applied(f"{what}: {done}")
            self._on_applied()
            return True
        return False

    def _log_applied(self, line: str) -> None:
        """INFO line for an applied update, reported as logged from here without rclpy's per-call
        caller lookup (robot_sdf._internals.info_logger: ~20 % of the worker's time otherwise)."""
        self._log_info(line)

    def _on_update_error(self, msg, exc: BaseException) -> None:
        self._reject(f"MeshObstacle '{getattr(msg, 'id', '?')}'", f"internal error {type(exc).__name__}: {exc}")

    def _pose_in_world(self, header: Header, pose) -> np.ndarray:
        """Pose (7,) of a message given in header.frame_id at header.stamp, in world_frame.

        Raises FrameError (a ValueError) when the frame cannot be resolved within tf_timeout, so
        the message is rejected whole; ids, envs and geometry are checked by MeshWorld itself.
        """
        return self._frames.pose_in_world(header.frame_id, stamp_to_ns(header.stamp), conv.pose_to_array(pose))

    # ------------------------------------------------------------------ mesh updates

    def _on_mesh_obstacle(self, msg: MeshObstacle) -> None:
        """Subscription callback: O(1), only queues (the worker applies, see update_queue.py)."""
        nbytes = 4 * (len(msg.vertices) + len(msg.triangles)) + 48 * (len(msg.mesh.vertices) + len(msg.mesh.triangles))
        stamp = (int(msg.header.stamp.sec), int(msg.header.stamp.nanosec))
        if stamp != (0, 0):
            self._received_latency.record(time.time() - (stamp[0] + 1e-9 * stamp[1]))
        self._mesh_updates.put((int(msg.env), msg.id), msg, supersedable=msg.operation == MeshObstacle.ADD,
                               nbytes=nbytes, version=stamp if stamp != (0, 0) else None)

    # Updates whose stamp lies just ahead of the newest transform data (FrameResolver raises
    # TransformPending) are held aside instead of holding the update worker in a waiting lookup:
    # a mesh update holds its id (later updates of that id queue behind it, so each id keeps its
    # order) until its transform arrives or tf_timeout passes; a pose is held as the latest of its
    # target (a newer pose replaces it). A thread retries them every _HELD_RETRY_S, mesh updates
    # through the update queue (the worker applies them; these retries count in the queue's
    # enqueued/applied counters), poses directly. Frames tf does not know, or stamps farther ahead
    # or behind the data, are rejected at once.

    def _start_held_retries(self) -> None:
        self._held: dict[tuple[int, str], deque] = {}  # (env, id) -> [[msg, deadline or None], ...]
        self._held_poses: dict[Any, tuple[str, Callable[[], str], float]] = {}
        self._held_lock = threading.Lock()
        self._pose_lock = threading.Lock()
        self._retry_queued: set[tuple[int, str]] = set()
        self._retry_wake = threading.Event()
        self._retry_stop = False
        self._retry_thread = threading.Thread(target=self._retry_held_loop, name="sdf_server_held_updates",
                                              daemon=True)
        self._retry_thread.start()

    def _stop_held_retries(self) -> None:
        self._retry_stop = True
        self._retry_wake.set()
        self._retry_thread.join(timeout=5.0)

    def _retry_held_loop(self) -> None:
        while not self._retry_stop:
            with self._held_lock:
                keys = [k for k in self._held if k not in self._retry_queued]
                self._retry_queued.update(keys)
                idle = not self._held and not self._held_poses
            if idle:
                self._retry_wake.wait()
                self._retry_wake.clear()
                continue
            for key in keys:
                if not self._mesh_updates.put(key, _RetryHeld(key), timeout=0.1):  # full or closing: next round
                    with self._held_lock:
                        self._retry_queued.discard(key)
            self._retry_held_poses()
            time.sleep(_HELD_RETRY_S)

    def _apply_queued_mesh_obstacle(self, item) -> None:
        """Worker side: apply one queued MeshObstacle (or retry the held updates of one id)."""
        if isinstance(item, _RetryHeld):
            self._retry_held(item.key)
            return
        key = (int(item.env), item.id)
        with self._held_lock:
            held = self._held.get(key)
            if held is not None:  # an earlier update of this id waits for its transform
                held.append([item, None])
                return
        try:
            self.apply_mesh_update(item)
        except TransformPending as pending:
            with self._held_lock:
                self._held[key] = deque([[item, time.monotonic() + pending.wait_s]])
            self._retry_wake.set()

    def held_count(self) -> int:
        """Updates held now for a transform that is not there yet (mesh updates and poses)."""
        with self._held_lock:
            return sum(len(q) for q in self._held.values()) + len(self._held_poses)

    def _retry_held(self, key: tuple[int, str]) -> None:
        """Worker side: apply the held updates of one id in order, up to the first still pending."""
        with self._held_lock:
            self._retry_queued.discard(key)
            held = self._held.get(key)
        while held:
            entry = held[0]
            try:
                self.apply_mesh_update(entry[0])
            except TransformPending as pending:
                now = time.monotonic()
                if entry[1] is None:
                    entry[1] = now + pending.wait_s
                if now < entry[1]:
                    return
                self._reject(self._describe(entry[0]), str(pending))
            with self._held_lock:
                held.popleft()
                if not held:
                    del self._held[key]

    def _describe(self, msg: MeshObstacle) -> str:
        op = conv.OPERATION_NAMES.get(msg.operation)
        return f"MeshObstacle {op or msg.operation} '{msg.id}' env {msg.env}"

    def apply_mesh_update(self, msg: MeshObstacle) -> None:
        """Apply one MeshObstacle, log its outcome, record stamp -> applied latency; raises
        TransformPending (nothing applied or recorded) when its transform is not there yet.

        A stamped message older than the last one applied for its id is skipped (counted): it is
        a replay (transient_local history, a ScenePublisher re-send) of something this world
        already moved past, e.g. after a restart from state_dir."""
        op = conv.OPERATION_NAMES.get(msg.operation)
        what = self._describe(msg)
        stamp = (int(msg.header.stamp.sec), int(msg.header.stamp.nanosec))
        key = (int(msg.env), msg.id)
        with self._count_lock:
            epoch = self._stamp_epoch
            if stamp != (0, 0):
                last = self._stamps.get(key)
                if last is not None and stamp < last:
                    self.stale_skipped += 1
                    return
        started = time.perf_counter()
        applied = self._guarded(what, lambda: self._apply_mesh_obstacle(msg, op))
        self._apply_duration.record(time.perf_counter() - started)
        if applied and stamp != (0, 0):
            with self._count_lock:
                # Unless the clock jumped back while this update was applied: the next loop's
                # updates, stamped earlier, must not be skipped as older than it.
                if epoch == self._stamp_epoch:
                    self._stamps[key] = stamp
                    if len(self._stamps) > _MAX_STAMPS:
                        self._forget_removed_stamps()
        if stamp != (0, 0):
            self._applied_latency.record(time.time() - (stamp[0] + 1e-9 * stamp[1]))

    def _apply_mesh_obstacle(self, msg: MeshObstacle, op: str | None) -> str:
        if op is None:
            raise RejectedInput(f"unknown operation {msg.operation} (expected 0..4: "
                                f"{', '.join(conv.OPERATION_NAMES.values())})")
        world, env = self.world, int(msg.env)
        if self.config.perceives and env == 0 and msg.id == PERCEIVED_MESH:
            raise RejectedInput(f"mesh id '{PERCEIVED_MESH}' is the fused depth frames' while cameras or a lidar "
                                "are on; give the obstacle another id")
        if op == "ADD":
            return apply_add(world, msg.id, env, msg, self.config, self._pose_in_world(msg.header, msg.pose))
        if op == "REMOVE":
            rev = world.remove_mesh(msg.id, env=env)
            self._trim.request()  # a removed geometry may have freed a lot (or sits in the cache)
        elif op == "MOVE":
            world.set_pose(msg.id, self._pose_in_world(msg.header, msg.pose), env=env)
            return ""  # poses may stream at high rate: not logged
        else:
            rev = world.set_enabled(msg.id, op == "ENABLE", env=env)
        return f"revision {rev}"

    # ------------------------------------------------------------------ pose updates

    def _pose_update(self, key, what: str, apply: Callable[[], str]) -> None:
        """Apply one pose message now, or hold it (the latest of ``key``) until its transform comes."""
        with self._pose_lock:
            self._held_poses.pop(key, None)  # a newer pose of the same target replaces a held one
            try:
                self._guarded(what, apply)
            except TransformPending as pending:
                self._held_poses[key] = (what, apply, time.monotonic() + pending.wait_s)
                self._retry_wake.set()

    def _retry_held_poses(self) -> None:
        with self._pose_lock:
            for key, (what, apply, deadline) in list(self._held_poses.items()):
                try:
                    self._guarded(what, apply)
                except TransformPending as pending:
                    if time.monotonic() < deadline:
                        continue
                    self._reject(what, str(pending))
                del self._held_poses[key]

    def _on_obstacle_pose(self, msg: ObstaclePose) -> None:
        def apply() -> str:
            self.world.set_pose(msg.id, self._pose_in_world(msg.header, msg.pose), env=int(msg.env))
            return ""

        self._pose_update(("pose", int(msg.env), msg.id), f"ObstaclePose '{msg.id}' env {msg.env}", apply)

    def _pose_topic_callback(self, topic: str, targets: list[tuple[str, int]]):
        def callback(msg: PoseStamped) -> None:
            def apply() -> str:
                pose = self._pose_in_world(msg.header, msg.pose)
                # all targets or none: a scene obstacle may have been REMOVEd meanwhile
                for obstacle_id, env in targets:
                    if not self.world.has_mesh(obstacle_id, env):
                        raise RejectedInput(f"obstacle '{obstacle_id}' (env {env}) was removed")
                for obstacle_id, env in targets:
                    self.world.set_pose(obstacle_id, pose, env=env)
                return ""

            self._pose_update(("topic", topic), f"PoseStamped on '{topic}'", apply)

        return callback

    # ------------------------------------------------------------------ diagnostics

    def diagnostics(self) -> dict[str, str]:
        """Counters of the mesh update queue and stamp -> applied latency percentiles [ms]."""
        q = self._mesh_updates.stats()
        p50, p99, worst = self._applied_latency.percentiles()
        r50, r99, r_worst = self._received_latency.percentiles()
        a50, a99, a_worst = self._apply_duration.percentiles()
        return {"updates_enqueued": str(q.enqueued), "updates_applied": str(q.applied),
                "updates_coalesced": str(q.coalesced), "updates_pending": str(q.pending),
                "updates_pending_bytes": str(q.pending_bytes), "updates_blocked": str(q.blocked),
                "update_applied_p50_ms": f"{1e3 * p50:.3f}", "update_applied_p99_ms": f"{1e3 * p99:.3f}",
                "update_applied_max_ms": f"{1e3 * worst:.3f}", "update_received_p50_ms": f"{1e3 * r50:.3f}",
                "update_received_p99_ms": f"{1e3 * r99:.3f}", "update_received_max_ms": f"{1e3 * r_worst:.3f}",
                "update_apply_p50_ms": f"{1e3 * a50:.3f}", "update_apply_p99_ms": f"{1e3 * a99:.3f}",
                "update_apply_max_ms": f"{1e3 * a_worst:.3f}", "updates_stale_skipped": str(self.stale_skipped),
                "updates_held": str(self.held_count())}
