"""ROS 2 node ``sdf_server``: a thin adapter between ROS messages/services and robot_sdf.MeshWorld.

Topics and services (relative to the node, ``~/`` = ``/sdf_server/``):

- subscribes ``~/mesh_obstacles`` (robot_sdf_interfaces/MeshObstacle; reliable, transient_local,
  KEEP_ALL: meshes published before the node started reach it and none is dropped; the callback
  only queues, a worker applies in order, see update_queue.py), ``~/obstacle_poses``
  (ObstaclePose) and one geometry_msgs/PoseStamped topic per scene obstacle with ``pose_topic``
  (pose inputs are best effort, depth 10: the latest pose wins, and best effort matches reliable
  and best-effort publishers alike);
- serves ``~/evaluate_sphere_cost``, ``~/evaluate_swept_sphere_cost``, ``~/query_signed_distance``;
- publishes ``~/markers`` (MarkerArray; reliable, transient_local, depth MARKER_HISTORY: a viewer
  started later receives the latest full scene and the changes after it; not built while nobody
  subscribes), ``~/distance_slice``
  (PointCloud2 x,y,z,distance, computed only while subscribed) and ``/diagnostics`` (OK, or
  WARN/ERROR with the recent problems, see robot_sdf.ros.health).

Input policy: every message is checked before the world changes; a bad one is logged with its
reason and dropped whole. A pose in a frame other than world_frame is transformed into it at the
message stamp (robot_sdf.ros.frames: tf2, or a built-in buffer with tf2's rules without tf2_ros,
on this node's clock); a message stamped just ahead of its frame's newest transform is held
aside and retried (never waited for on the update thread), any other unresolvable frame rejects
the message at once. REMOVE, ENABLE and DISABLE
carry no pose, so their frame is not used. Quaternions within 1e-3 of unit length are
renormalised, anything else (zero, NaN) is rejected. Threads: mesh and pose updates (a mesh may build a BVH) are served by a
companion node ``<name>_world_updates`` with its own executor thread, in two callback groups, so
busy services never delay them; service requests run in a reentrant group (concurrent requests
run in parallel) and the periodic publishers in another, on a MultiThreadedExecutor. MeshWorld
serialises its writers and publishes immutable snapshots, so a request reads one consistent world
state (its revision is returned) and is never queued behind a BVH build.

Parameters: the ``dynamic`` ones of robot_sdf.ros.parameters (cost defaults, marker, slice,
diagnostics and tf settings) may be set at run time; a change is validated as a whole and then
applied (timers and the slice grid are rebuilt as needed); the others are read-only.
Life cycle: ``configure_server`` (world, scene, warm-up), ``activate_server`` (subscriptions,
tf, publishers, timers, services), ``deactivate_server``, ``cleanup_server``. SdfServer runs the
first two in its constructor; robot_sdf.ros.lifecycle.ManagedSdfServer runs each on its
lifecycle transition.
"""
from __future__ import annotations

import faulthandler
import math
import signal
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import rclpy
try:  # the C entry point RcutilsLogger.log ends in (see SdfServer._log_applied)
    from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy_impl
except ImportError:  # pragma: no cover - other rclpy layouts: the ordinary logger is used
    _rclpy_impl = None
import torch
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import ClockChange, JumpThreshold
from rclpy.duration import Duration
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor, SingleThreadedExecutor
from rclpy.logging import LoggingSeverity
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rclpy.signals import SignalHandlerOptions
from rcl_interfaces.msg import SetParametersResult
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from robot_sdf import MeshWorld
from robot_sdf.memory import TrimScheduler, limit_malloc_arenas
from robot_sdf.state import SCENE_FILE, StateSaver, WorldStore, restore_world
from robot_sdf.requests import CostResult, RequestError, RequestSettings, RequestTranslator  # noqa: F401
from robot_sdf.ros import conversions as conv
from robot_sdf.ros.frames import (JUMP_BACK_NS, FrameResolver, LookupFailed, Tf2Buffer, TopicTransformBuffer,
                                  TransformCache, TransformPending, compose, parse_static_transforms, stamp_to_ns,
                                  tf2_available)
from robot_sdf.ros.health import HealthMonitor
from robot_sdf.ros.markers import MarkerState
from robot_sdf.ros.parameters import (DYNAMIC_PARAMETERS, PARAMETER_NAMES, ConfigError, ServerConfig, current_values,
                                      declare, validate_values, with_changes)
from robot_sdf.ros.update_queue import LatencyWindow, UpdateQueue
from robot_sdf.ros.world_updates import apply_add
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance

NODE_NAME = "sdf_server"
# The same rejection (same input, same reason) is logged at most once per this period.
_REJECT_LOG_PERIOD_S = 1.0
# Requests with at least this many floats (16 MB) are followed by a heap trim (robot_sdf.memory).
_TRIM_AFTER_FLOATS = 4_000_000
# Nice value added to the update worker thread (Linux). 0: measured under the soak load, +10
# made publish -> applied p99 worse (1.35 s against 0.37 s) without helping queries.
_UPDATE_WORKER_NICE = 0
# GIL switch interval of the node's process [s] (Python's default: 0.005). The update worker, the
# service threads and the middleware's Python callbacks share one GIL; a thread waiting for it
# waits up to this long behind a thread running Python code, at every wait. Under the soak
# (two clients at 50 Hz, mesh updates at 30 Hz, poses at 50 Hz) 1 ms gave publish -> applied
# p99 229/182 ms against 443/354 ms at 5 ms (docs/reliability.md).
GIL_SWITCH_INTERVAL_S = 0.001
# glibc malloc arenas of the node's process (see use_node_switch_interval).
NODE_MALLOC_ARENAS = 2
# How often updates held for a transform that is just not there yet are retried [s].
_HELD_RETRY_S = 0.005
# Update stamps kept per (env, id) (for skipping replays) before those of removed ids are pruned.
_MAX_STAMPS = 100_000
MESH_QOS = conv.MESH_OBSTACLE_QOS
# The node's side of ~/mesh_obstacles: KEEP_ALL, so the middleware never overwrites a message
# the node has not taken (the callback only queues it, see update_queue.py); reliable and
# transient_local like MESH_OBSTACLE_QOS, so every producer publishing with it matches.
MESH_SUBSCRIPTION_QOS = QoSProfile(history=HistoryPolicy.KEEP_ALL, reliability=ReliabilityPolicy.RELIABLE,
                                   durability=DurabilityPolicy.TRANSIENT_LOCAL)
POSE_QOS = QoSProfile(depth=10, history=HistoryPolicy.KEEP_LAST,
                      reliability=ReliabilityPolicy.BEST_EFFORT,
                      durability=DurabilityPolicy.VOLATILE)
# ~/markers keeps its last MARKER_HISTORY messages for late subscribers (rviz started after the
# node: its MarkerArray display must ask for transient_local, as config/robot_sdf.rviz does), and
# at least every MARKER_HISTORY-th message is a full update, so that history always holds a full
# scene followed by the changes since.
MARKER_HISTORY = 10
MARKER_QOS = QoSProfile(depth=MARKER_HISTORY, history=HistoryPolicy.KEEP_LAST,
                        reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL)
# run-time parameter -> the periodic publisher whose timer it sets
_RATE_PARAMETERS = {"marker_rate_hz": "markers", "slice_rate_hz": "slice", "diagnostics_rate_hz": "diagnostics"}


class _RetryHeld:
    """Queued in the update queue: retry the held updates of ``key`` on the worker."""

    __slots__ = ("key",)

    def __init__(self, key) -> None:
        self.key = key


class RejectedInput(ValueError):
    """A topic message that is dropped; its text goes into the warning log."""


# What MeshWorld raises for input it refuses (it validates before changing or computing
# anything): ValueError for bad values, KeyError for unknown mesh ids.
_REFUSED = (ValueError, KeyError)


def _reason(exc: Exception) -> str:
    """The message of a refusal (str(KeyError) would add quotes around it)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


class RequestStats:
    """Thread-safe request counters and latency percentiles for the diagnostics."""

    def __init__(self, window: int = 1000) -> None:
        self._lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=window)
        self.total = 0
        self.failed = 0
        self._since_report = 0
        self._last_report = time.monotonic()

    def record(self, latency_s: float, ok: bool) -> None:
        with self._lock:
            self.total += 1
            self._since_report += 1
            self.failed += 0 if ok else 1
            if ok:
                self._latencies.append(latency_s)

    def report(self) -> tuple[float, float, float]:
        """Request rate [Hz] since the last report, latency p50 and p95 [s] over the window."""
        with self._lock:
            now = time.monotonic()
            rate = self._since_report / max(now - self._last_report, 1e-9)
            self._since_report, self._last_report = 0, now
            lat = np.array(self._latencies) if self._latencies else np.zeros(1)
        return rate, float(np.percentile(lat, 50)), float(np.percentile(lat, 95))


def _resolve_scene_path(path: str):
    """A relative scene_file that does not exist from the working directory is looked up in the
    installed package's share directory (so `config/...` works under `ros2 launch` anywhere)."""
    from pathlib import Path

    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    try:
        from ament_index_python.packages import get_package_share_directory

        candidate = Path(get_package_share_directory("robot_sdf")) / p
        if candidate.exists():
            return candidate
    except (ImportError, LookupError, OSError):  # no ament index (plain venv)
        pass
    return p


def _slice_grid(config: ServerConfig) -> np.ndarray:
    """World points (N,3) float32 of the distance slice plane (row-major over its two axes)."""
    axes = {"xy": (0, 1, 2), "xz": (0, 2, 1), "yz": (1, 2, 0)}[config.slice_plane]
    nu, nv = config.slice_shape()
    u = config.slice_center[0] + (np.arange(nu) * config.slice_resolution - 0.5 * config.slice_size[0])
    v = config.slice_center[1] + (np.arange(nv) * config.slice_resolution - 0.5 * config.slice_size[1])
    uu, vv = np.meshgrid(u, v, indexing="ij")
    pts = np.empty((uu.size, 3), dtype=np.float32)
    pts[:, axes[0]] = uu.reshape(-1)
    pts[:, axes[1]] = vv.reshape(-1)
    pts[:, axes[2]] = config.slice_offset
    return pts


def _request_settings(cfg: ServerConfig) -> RequestSettings:
    """The request translator's defaults and limits from the node's configuration."""
    return RequestSettings(
        activation_distance=cfg.activation_distance, weight=cfg.weight, max_distance=cfg.max_distance,
        max_spheres_per_request=cfg.max_spheres_per_request, max_points_per_request=cfg.max_points_per_request,
        max_sweep_steps=cfg.max_sweep_steps, max_coordinate=cfg.max_coordinate, max_length=cfg.max_length)


class SdfServer(Node):
    """The sdf_server node. Raises ConfigError from the constructor on bad parameters or scene."""

    def __init__(self, **node_kwargs: Any) -> None:
        super().__init__(NODE_NAME, **node_kwargs)
        self._init_parameters()
        self.configure_server()
        try:
            self.activate_server()
        except BaseException:
            self.destroy_node()
            raise

    # ------------------------------------------------------------------ life cycle

    def _init_parameters(self) -> None:
        """Declare the parameters (ConfigError for wrong types) and install the run-time change
        callbacks. Nothing else exists yet: configure_server() builds the rest."""
        declare(self)
        self.config: ServerConfig | None = None
        self.world: MeshWorld | None = None
        self._frames: FrameResolver | None = None
        self._tf: Tf2Buffer | TopicTransformBuffer | None = None
        self._jump_handle = None
        self._active = False
        self._server_timers: dict[str, Any] = {}
        self._server_services: list = []
        self._updates_executor = None
        self._saver = None
        self._trim = None
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

    def configure_server(self) -> None:
        """Validate the parameters, build the world on its device, load the scene, restore the
        saved state and warm the kernels up. Raises ConfigError (and leaves the node
        unconfigured) when any of it fails."""
        cfg = validate_values(current_values(self))
        try:
            world = MeshWorld(device=cfg.device, num_envs=cfg.num_envs,
                              mesh_capacity=cfg.mesh_capacity, sign_method=cfg.sign_method,
                              max_distance=cfg.max_distance, geometry_cache_bytes=cfg.geometry_cache_mb * 2**20)
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"cannot create the mesh world on device '{cfg.device}': {exc}") from exc
        self.config, self.world = cfg, world
        self._requests = RequestTranslator(world, _request_settings(cfg))
        self._count_lock = threading.Lock()
        self._stamps: dict[tuple[int, str], tuple[int, int]] = {}
        self._stale_skipped = 0
        # Counts the clock's jumps back: an update checked before a jump records no stamp after it
        # (its stamp belongs to the timeline the jump left).
        self._stamp_epoch = 0
        try:
            self._pose_topics = self._load_scene(cfg.scene_file)
            self._saver = self._restore_state(cfg.state_dir)
        except ConfigError:
            self.cleanup_server()
            raise
        # Counted now: once the update thread runs, topic meshes (transient_local) may join in.
        self._scene_count, self._scene_revision = self.world.mesh_count(), self.world.revision
        self._warm_up()

        self._stats = RequestStats()
        self._health = HealthMonitor(cfg.diagnostics_window_s, cfg.slow_request_ms / 1e3)
        self._trim = TrimScheduler(mark=lambda: self.world.revision)
        self._rejected = 0
        self._reject_log: dict[tuple[str, str], tuple[float, int]] = {}
        self._request_lock = threading.Lock()
        self._last_request: tuple[np.ndarray, np.ndarray] | None = None
        self._request_seq = 0
        self._markers = MarkerState(self.world, cfg.num_envs, cfg.world_frame, self.last_request,
                                    max_triangles=cfg.marker_max_triangles)
        self._frames = FrameResolver(cfg.world_frame, None, cfg.tf_timeout, cfg.tf_use_latest)

    def activate_server(self) -> None:
        """Open the transform lookup, the update subscriptions, publishers, timers and services."""
        self._frames.buffer = self._open_transforms()
        # A jump back in (simulated) time -- a bag played in a loop, a simulator reset -- makes the
        # stamps of applied updates meaningless: forget them, or every update of the next loop
        # would be skipped as a replay. tf forgets its transforms on the same event.
        threshold = JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-JUMP_BACK_NS),
                                  on_clock_change=True)
        self._jump_handle = self.get_clock().create_jump_callback(threshold, post_callback=self._on_time_jump)
        self._start_world_updates(self._pose_topics)
        self._create_outputs_and_services()
        self._active = True

    def deactivate_server(self) -> None:
        """Close services, timers, publishers, update subscriptions and tf; the world stays."""
        self._active = False
        for service in self._server_services:
            self.destroy_service(service)
        self._server_services = []
        for timer in self._server_timers.values():
            self.destroy_timer(timer)
        self._server_timers = {}
        for pub in (self._markers_pub, self._slice_pub, self._diag_pub):
            self.destroy_publisher(pub)
        self._stop_world_updates()
        self._close_transforms()
        self.get_logger().info("inactive: services, topics and tf closed; the world is kept")

    def cleanup_server(self) -> None:
        """Save pending state, then release the world (its device memory goes with the last
        reference)."""
        self._close_state()
        self.world = None
        self._markers = None
        self._frames = None
        self.config = None

    def _open_transforms(self):
        """The transform buffer for incoming messages, on this node's clock: tf2 where tf2_ros is
        installed, else the built-in TopicTransformBuffer; static_transforms are inserted into
        either. Says at start which source is in use."""
        static = parse_static_transforms(self.config.static_transforms)
        use_sim_time = bool(self.get_parameter("use_sim_time").value)
        topics = {"tf_topic": self.resolve_topic_name("/tf"), "tf_static_topic": self.resolve_topic_name("/tf_static")}
        if tf2_available():
            self._tf = Tf2Buffer(self.get_name(), self.get_namespace(), self.context, static, use_sim_time, **topics)
            source = f"tf2 (tf2_ros) from {' and '.join(self._tf.topics)}"
        else:
            self._tf = TopicTransformBuffer(self.get_name(), self.get_namespace(), self.context, static,
                                            use_sim_time, transforms_topic=self.resolve_topic_name("~/transforms"),
                                            **topics)
            source = (f"tf2_ros is not installed (pip-wheel setup): a built-in buffer with tf2's lookup rules, "
                      f"fed from {' and '.join(self._tf.topics)}")
        frames = sorted(TransformCache(static).frames() - {self.config.world_frame})
        self.get_logger().info(
            f"transforms: {source}; static_transforms: {', '.join(frames) or 'none'}; "
            f"clock: {'simulated (use_sim_time)' if use_sim_time else 'system'}")
        return self._tf

    def _on_time_jump(self, jump) -> None:
        with self._count_lock:
            forgotten = len(self._stamps)
            self._stamps.clear()
            self._stamp_epoch += 1
        if jump.clock_change in (ClockChange.ROS_TIME_ACTIVATED, ClockChange.ROS_TIME_DEACTIVATED):
            event = "the clock changed its time source (use_sim_time)"
        else:
            event = f"the clock jumped back by {-jump.delta.nanoseconds / 1e9:.3f} s (a bag loop, a simulator reset?)"
        self.get_logger().warning(f"{event}: forgot the stamps of {forgotten} applied updates, so updates "
                                  "stamped earlier apply again")

    def _close_transforms(self) -> None:
        if self._jump_handle is not None:
            self._jump_handle.unregister()
            self._jump_handle = None
        if self._tf is not None:
            self._tf.close()
            self._tf = None
        if self._frames is not None:
            self._frames.buffer = None

    # ------------------------------------------------------------------ parameters at run time

    def _on_set_parameters(self, params) -> SetParametersResult:
        """Accept a change of dynamic parameters only if the whole configuration stays valid."""
        changes = {p.name: p.value for p in params if p.name in PARAMETER_NAMES}
        fixed = sorted(n for n in changes if n not in DYNAMIC_PARAMETERS)
        if fixed:  # rclpy refuses read-only parameters itself; this keeps the rule in one place
            return SetParametersResult(successful=False, reason=f"read-only parameter(s): {', '.join(fixed)}")
        if changes:
            try:
                values = current_values(self)
                values.update(changes)
                validate_values(values)
            except ConfigError as exc:
                return SetParametersResult(successful=False, reason=str(exc))
        return SetParametersResult(successful=True)

    def _after_set_parameters(self, params) -> None:
        for p in params:
            if p.name == "use_sim_time" and self._tf is not None:  # the tf listener follows this node's clock
                try:
                    self._tf.set_use_sim_time(bool(p.value))
                except Exception as exc:  # noqa: BLE001 - a parameter service must not die
                    self.get_logger().error(f"the transform listener could not follow use_sim_time: {exc!r}")
        changes = {p.name: p.value for p in params if p.name in DYNAMIC_PARAMETERS}
        if not changes or self.config is None:
            return  # an unconfigured node reads every value in configure_server()
        try:
            self._apply_config(with_changes(self.config, changes), set(changes))
        except Exception as exc:  # noqa: BLE001 - validated before; a parameter service must not die
            self.get_logger().error(f"applying parameters {sorted(changes)} failed: {exc!r}")
            self._health.internal_error("parameters", f"{type(exc).__name__}: {exc}")
            return
        self.get_logger().info("parameters set: " + ", ".join(f"{k}={v!r}" for k, v in sorted(changes.items())))

    def _apply_config(self, new: ServerConfig, changed: set[str]) -> None:
        """Switch to ``new`` (validated): requests read self.config, so one assignment applies the
        cost defaults; the rest is rebuilt only where it changed."""
        self.config = new
        self._requests.settings = _request_settings(new)
        self._frames.timeout_s, self._frames.use_latest = new.tf_timeout, new.tf_use_latest
        self._health.window_s, self._health.slow_request_s = new.diagnostics_window_s, new.slow_request_ms / 1e3
        if any(name.startswith("slice_") for name in changed):
            self._slice_points = _slice_grid(new) if new.slice_rate_hz > 0 else None
        if "marker_max_triangles" in changed:
            self._markers.redraw(new.marker_max_triangles)
        if self._active:
            for name in changed & _RATE_PARAMETERS.keys():
                self._restart_timer(_RATE_PARAMETERS[name])

    def _restart_timer(self, kind: str) -> None:
        """(Re)create the timer of one periodic publisher at its configured rate (none at rate 0)."""
        rate, callback = {"markers": (self.config.marker_rate_hz, self._publish_markers),
                          "slice": (self.config.slice_rate_hz, self._publish_slice),
                          "diagnostics": (self.config.diagnostics_rate_hz, self._publish_diagnostics)}[kind]
        old = self._server_timers.pop(kind, None)
        if old is not None:
            self.destroy_timer(old)
        if rate > 0:
            self._server_timers[kind] = self.create_timer(1.0 / rate, callback, callback_group=self._timer_group)

    def _create_outputs_and_services(self) -> None:
        cfg = self.config
        query_group = ReentrantCallbackGroup()
        self._timer_group = MutuallyExclusiveCallbackGroup()

        self._markers_pub = self.create_publisher(MarkerArray, "~/markers", MARKER_QOS)
        self._slice_pub = self.create_publisher(PointCloud2, "~/distance_slice", 10)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self._slice_points = _slice_grid(cfg) if cfg.slice_rate_hz > 0 else None
        # a new publisher has an empty history: its first marker update is a full one
        self._markers.redraw()
        self._marker_updates_since_full = MARKER_HISTORY - 1
        self._markers_stale = False
        for kind in ("markers", "slice", "diagnostics"):
            self._restart_timer(kind)

        self._server_services = [
            self.create_service(EvaluateSphereCost, "~/evaluate_sphere_cost", self._on_sphere_cost,
                                callback_group=query_group),
            self.create_service(EvaluateSweptSphereCost, "~/evaluate_swept_sphere_cost",
                                self._on_swept_sphere_cost, callback_group=query_group),
            self.create_service(QuerySignedDistance, "~/query_signed_distance",
                                self._on_query_signed_distance, callback_group=query_group),
        ]
        self.get_logger().info(
            f"ready: device={self.world.device}, sign_method={cfg.sign_method}, "
            f"num_envs={cfg.num_envs}, world_frame='{cfg.world_frame}', "
            f"max_distance={cfg.max_distance} m, {self._scene_count} scene obstacles "
            f"({self._pose_topic_count} pose topics), scene revision {self._scene_revision}")

    # ------------------------------------------------------------------ start-up

    def _start_world_updates(self, pose_topics: dict[str, list[tuple[str, int]]]) -> None:
        """Subscribe to mesh and pose updates on a companion node spun by its own executor thread.

        rclpy's executor dispatches from one Python loop; while clients call the services
        continuously, a subscription served by that loop waits behind the request callbacks
        (measured: a 10k-triangle ADD applied 50-60 ms after publishing instead of 13 ms). The
        companion keeps the ``~/`` topic names of this node (absolute names built from its fully
        qualified name) and hands updates to the world as they arrive: a mesh update is queued for
        the update worker (update_queue.py), so a pose never waits for a BVH build.
        """
        # Process-wide arguments (a `__node:=` remap in particular) are for this node only; the
        # companion subscribes to the names this node resolves, so topic remaps still apply.
        # A context (DDS participant) of its own: a big mesh sample is received and reassembled by
        # that participant's transport threads, so service requests and responses of this node
        # do not queue behind its fragments (measured: a 1M-triangle ADD delayed queries by up
        # to 1.8 s when both shared one participant).
        self._updates_context = rclpy.Context()
        rclpy.init(context=self._updates_context, domain_id=self.context.get_domain_id())
        self._updates_node = rclpy.create_node(f"{self.get_name()}_world_updates", namespace=self.get_namespace(),
                                               context=self._updates_context, use_global_arguments=False,
                                               start_parameter_services=False)
        self._pose_topic_count = len(pose_topics)
        mesh_group = MutuallyExclusiveCallbackGroup()
        pose_group = MutuallyExclusiveCallbackGroup()
        node = self._updates_node
        self._applied_latency = LatencyWindow()
        self._received_latency = LatencyWindow()  # stamp -> subscription callback (DDS + executor)
        self._apply_duration = LatencyWindow()  # the worker's time per update (validation to publish)
        self._mesh_updates = UpdateQueue(self._apply_queued_mesh_obstacle, self._on_update_error,
                                         max_pending_bytes=self.config.max_pending_update_mb * 2**20,
                                         nice=_UPDATE_WORKER_NICE)
        self._start_held_retries()
        node.create_subscription(MeshObstacle, self.resolve_topic_name("~/mesh_obstacles"), self._on_mesh_obstacle,
                                 MESH_SUBSCRIPTION_QOS, callback_group=mesh_group)
        node.create_subscription(ObstaclePose, self.resolve_topic_name("~/obstacle_poses"), self._on_obstacle_pose,
                                 POSE_QOS, callback_group=pose_group)
        for topic, targets in pose_topics.items():
            node.create_subscription(PoseStamped, self.resolve_topic_name(topic),
                                     self._pose_topic_callback(topic, targets), POSE_QOS, callback_group=pose_group)
        # One thread: the callbacks are short (a mesh update only enqueues, a pose writes one
        # slot). A MultiThreadedExecutor here cost ~55 % of a core under the load soak, its
        # dispatch loop waking again and again while a callback was in flight, and that time
        # (and the GIL) was taken from the update worker and the services.
        self._updates_executor = SingleThreadedExecutor(context=self._updates_context)
        self._updates_executor.add_node(node)
        self._updates_thread = threading.Thread(target=self._spin_world_updates, name="sdf_server_world_updates",
                                                daemon=True)
        self._updates_thread.start()

    def _spin_world_updates(self) -> None:
        try:
            self._updates_executor.spin()
        except (ExternalShutdownException, KeyboardInterrupt):
            pass
        except Exception:  # noqa: BLE001 - rclpy raises RCLError when SIGINT shut the context down
            if self.context.ok() and self._updates_context.ok():
                raise

    def _on_update_error(self, msg, exc: BaseException) -> None:
        self._reject(f"MeshObstacle '{getattr(msg, 'id', '?')}'", f"internal error {type(exc).__name__}: {exc}")

    def _stop_world_updates(self) -> None:
        updates = getattr(self, "_updates_executor", None)
        if updates is not None:
            updates.shutdown(timeout_sec=2.0)
            self._updates_thread.join(timeout=5.0)
            self._updates_node.destroy_node()
            rclpy.try_shutdown(context=self._updates_context)
            self._updates_executor = None
            self._stop_held_retries()
            self._mesh_updates.close(timeout=5.0)

    def _close_state(self) -> None:
        """Write what the state saver has pending and stop it; stop the heap trimmer."""
        if getattr(self, "_saver", None) is not None:
            self._saver.close()  # saves what is pending
            self._saver = None
        if getattr(self, "_trim", None) is not None:
            self._trim.close()
            self._trim = None

    def destroy_node(self) -> None:
        self._stop_world_updates()
        if getattr(self, "_tf", None) is not None or getattr(self, "_jump_handle", None) is not None:
            self._close_transforms()
        self._close_state()
        super().destroy_node()

    def _load_scene(self, path: str) -> dict[str, list[tuple[str, int]]]:
        """Load the scene file into the world; return pose topic -> [(obstacle id, env)]."""
        if not path:
            return {}
        from robot_sdf.scene import apply_scene, load_scene, scene_frame

        path = str(_resolve_scene_path(path))
        try:
            specs = load_scene(path)
            frame = scene_frame(path)
            if frame != self.config.world_frame:
                specs = self._scene_in_world(specs, frame)
            apply_scene(self.world, specs)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"cannot load scene_file '{path}': {exc}") from exc
        topics: dict[str, list[tuple[str, int]]] = {}
        for spec in specs:
            if spec.pose_topic:
                topics.setdefault(spec.pose_topic, []).append((spec.id, spec.env))
        return topics

    def _scene_in_world(self, specs: list, frame: str) -> list:
        """Scene obstacles declared in ``frame`` -> in world_frame, through static_transforms (the
        scene is loaded at configure time, before any tf data can arrive). ValueError otherwise."""
        import dataclasses

        world_frame = self.config.world_frame
        static = TransformCache(parse_static_transforms(self.config.static_transforms))
        try:
            world_from_frame = static.lookup(world_frame, frame, None, 0.0)
        except LookupFailed as exc:
            raise ValueError(f"its frame '{frame}' is not world_frame '{world_frame}' and not connected to it "
                             f"by static_transforms: {exc}") from None
        return [dataclasses.replace(spec, pose=compose(world_from_frame, spec.pose)) for spec in specs]

    def _restore_state(self, state_dir: str):
        """Restore the world saved in ``state_dir`` (if any) and return its StateSaver, or None.

        A state that cannot be read is moved aside (``scene.json.unreadable-<time>``) and the node
        starts from its scene file: a bad file must not keep the node from starting.
        """
        if not state_dir:
            return None
        try:
            store = WorldStore(state_dir)
        except OSError as exc:
            raise ConfigError(f"state_dir '{state_dir}' cannot be used: {exc}") from exc
        try:
            saved = store.load()
        except ValueError as exc:
            aside = store.root / f"{SCENE_FILE}.unreadable-{int(time.time())}"
            (store.root / SCENE_FILE).replace(aside)
            self.get_logger().error(f"{exc}; moved it to {aside}, starting from the scene file")
            saved = None
        if saved is not None:
            for warning in restore_world(self.world, saved):
                self.get_logger().warning(warning)
            self._stamps.update(saved.stamps)
            self.get_logger().info(f"restored {len(saved.meshes)} meshes from {store.root} "
                                   f"(saved at revision {saved.revision})")
        saver = StateSaver(store, self._state_snapshot,
                           on_error=lambda exc: self.get_logger().error(f"saving the world failed: {exc!r}"))
        saver.mark_dirty()
        return saver

    def _state_snapshot(self):
        with self._count_lock:
            stamps = dict(self._stamps)  # before the world: a newer world than stamps is safe
        return self.world.export_meshes(), stamps, self.world.revision

    def _state_changed(self) -> None:
        if self._saver is not None:
            self._saver.mark_dirty()

    def _warm_up(self) -> None:
        """Run each query once so the Warp kernels are loaded before the services appear."""
        dev = self.world.device
        spheres = torch.tensor([[[[0.0, 0.0, 0.0, 0.1]], [[0.1, 0.0, 0.0, 0.1]]]], device=dev)
        self.world.evaluate_sphere_cost(spheres, compute_gradient=True)
        self.world.evaluate_swept_sphere_cost(spheres, sweep_steps=1, compute_gradient=True)
        self.world.signed_distance(torch.zeros((1, 3), device=dev))

    # ------------------------------------------------------------------ world updates

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
            self._rejected += 1
            last, suppressed = self._reject_log.get(key, (-math.inf, 0))
            if now - last < _REJECT_LOG_PERIOD_S:
                self._reject_log[key] = (last, suppressed + 1)
                return
            self._reject_log[key] = (now, 0)
            if len(self._reject_log) > 1000:  # forget old keys; bounded memory under any input
                self._reject_log = {k: v for k, v in self._reject_log.items() if now - v[0] < _REJECT_LOG_PERIOD_S}
        repeats = f" ({suppressed} identical rejections not logged)" if suppressed else ""
        self.get_logger().warning(f"rejected {what}: {why}{repeats}")

    def _guarded(self, what: str, apply: Callable[[], str]) -> bool:
        """Run one world update; log its outcome; never let an exception escape. True if applied."""
        try:
            done = apply()
        except TransformPending:
            raise  # the caller holds the update and retries it
        except _REFUSED as exc:
            self._reject(what, _reason(exc))
        except Exception as exc:  # noqa: BLE001 - a topic callback must not kill the node
            self._reject(what, f"internal error {type(exc).__name__}: {exc}", internal=True)
        else:
            if done:
                self._log_applied(f"{what}: {done}")
            self._state_changed()
            return True
        return False

    def _log_applied(self, line: str) -> None:
        """INFO line for an applied update, without rclpy's per-call caller lookup.

        RcutilsLogger.log resolves its caller with inspect.getframeinfo on every call (reading
        and stat-ing source files): profiled under the soak, that was ~20 % of the update worker's
        time, holding the GIL. The caller here is fixed, so it is passed once; rclpy versions
        without that entry point get the ordinary logger."""
        logger = self.get_logger()
        try:
            if logger.is_enabled_for(LoggingSeverity.INFO):
                _rclpy_impl.rclpy_logging_rcutils_log(LoggingSeverity.INFO, logger.name, line,
                                                      "_log_applied", __file__, _LOG_APPLIED_LINE)
        except AttributeError:
            logger.info(line)

    def _pose_in_world(self, header: Header, pose) -> np.ndarray:
        """Pose (7,) of a message given in header.frame_id at header.stamp, in world_frame.

        Raises FrameError (a ValueError) when the frame cannot be resolved within tf_timeout, so
        the message is rejected whole; ids, envs and geometry are checked by MeshWorld itself.
        """
        return self._frames.pose_in_world(header.frame_id, stamp_to_ns(header.stamp), conv.pose_to_array(pose))

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
            self._apply_mesh_update(item)
        except TransformPending as pending:
            with self._held_lock:
                self._held[key] = deque([[item, time.monotonic() + pending.wait_s]])
            self._retry_wake.set()

    def _held_count(self) -> int:
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
                self._apply_mesh_update(entry[0])
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

    def _apply_mesh_update(self, msg: MeshObstacle) -> None:
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
                    self._stale_skipped += 1
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

    def _forget_removed_stamps(self) -> None:
        """Bound the stamp table: drop the oldest half of the stamps of ids no longer in the world."""
        gone = sorted((v, k) for k, v in self._stamps.items()
                      if not (0 <= k[0] < self.world.num_envs and self.world.has_mesh(k[1], k[0])))
        for _, k in gone[:max(1, len(gone) // 2)]:
            del self._stamps[k]

    def _apply_mesh_obstacle(self, msg: MeshObstacle, op: str | None) -> str:
        if op is None:
            raise RejectedInput(f"unknown operation {msg.operation} (expected 0..4: "
                                f"{', '.join(conv.OPERATION_NAMES.values())})")
        world, env = self.world, int(msg.env)
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

    # ------------------------------------------------------------------ services

    def _serve(self, name: str, request, response, compute: Callable[[Any], None]):
        """Fill ``response`` via ``compute``; turn any failure into success=false + message."""
        t0 = time.perf_counter()
        try:
            compute(response)
            response.success, response.message = True, ""
        except _REFUSED as exc:  # RequestError is a ValueError
            self._fail(response, _reason(exc))
            self.get_logger().warning(f"{name}: rejected request: {_reason(exc)}")
            self._health.request_failed(name, _reason(exc))
        except Exception as exc:  # noqa: BLE001 - a service callback must not kill the node
            # not the caller's fault: a device error (CUDA out of memory, a failed launch) or a bug
            self._fail(response, f"internal error {type(exc).__name__}: {exc}")
            self.get_logger().error(f"{name}: internal error: {exc!r}")
            self._health.internal_error(name, f"{type(exc).__name__}: {exc}")
        latency = time.perf_counter() - t0
        self._stats.record(latency, response.success)
        if response.success:
            self._health.request_done(name, latency)
        if len(getattr(request, "spheres", getattr(request, "points", ()))) >= _TRIM_AFTER_FLOATS:
            self._trim.request()  # the request's buffers are freed once this callback returned
        return response

    def _fail(self, response, message: str) -> None:
        response.success, response.message = False, message
        response.world_revision = int(self.world.revision)
        for field in ("cost", "gradient", "distance"):
            if hasattr(response, field):
                setattr(response, field, conv.float32_array(np.zeros(0)))

    def _fill_cost(self, response, result: CostResult, compute_gradient: bool) -> None:
        response.world_revision = result.world_revision
        response.cost = conv.float32_array(result.cost)
        if compute_gradient:
            response.gradient = conv.float32_array(result.gradient)
        if self.config.publish_request_markers and self.config.marker_rate_hz > 0:
            k = self.config.marker_max_spheres
            row = result.spheres[0].reshape(-1, 4)[:k].copy()  # not a view of the request
            cost_row = result.cost[:result.spheres[0].size // 4][:k].copy()
            with self._request_lock:
                self._last_request = (row, cost_row)
                self._request_seq += 1

    def _on_sphere_cost(self, request, response):
        def compute(resp) -> None:
            result = self._requests.sphere_cost(
                request.batch, request.horizon, request.spheres_per_step, conv.as_float32(request.spheres),
                conv.as_uint32(request.env_index), request.activation_distance, request.weight,
                bool(request.compute_gradient))
            self._fill_cost(resp, result, bool(request.compute_gradient))

        return self._serve("evaluate_sphere_cost", request, response, compute)

    def _on_swept_sphere_cost(self, request, response):
        def compute(resp) -> None:
            result = self._requests.swept_sphere_cost(
                request.batch, request.horizon, request.spheres_per_step, conv.as_float32(request.spheres),
                conv.as_uint32(request.env_index), request.activation_distance, request.weight,
                bool(request.compute_gradient), request.sweep_steps, request.speed_dt,
                bool(request.enable_speed_metric))
            self._fill_cost(resp, result, bool(request.compute_gradient))

        return self._serve("evaluate_swept_sphere_cost", request, response, compute)

    def _on_query_signed_distance(self, request, response):
        def compute(resp) -> None:
            result = self._requests.signed_distance(conv.as_float32(request.points), int(request.env),
                                                    request.max_distance)
            resp.world_revision = result.world_revision
            resp.distance = conv.float32_array(result.distance)
            resp.gradient = conv.float32_array(result.gradient)

        return self._serve("query_signed_distance", request, response, compute)

    # ------------------------------------------------------------------ publishers

    def _publisher_failed(self, what: str, exc: Exception) -> None:
        self.get_logger().error(f"{what}: {exc!r}")
        self._health.internal_error(what, f"{type(exc).__name__}: {exc}")

    def _publish_markers(self) -> None:
        if self._markers_pub.get_subscription_count() == 0:
            # Nobody watches: skip the work (a 20k-triangle marker takes ~100 ms to build and
            # send). A viewer that subscribes meanwhile first gets the older history, then, at the
            # next tick, a full update; viewers that stay subscribed (an rviz restart while another
            # one runs, say) rely on the history alone.
            self._markers_stale = True
            return
        try:
            full = self._markers_stale or self._marker_updates_since_full >= MARKER_HISTORY - 1
            markers = self._markers.update(full=full)
            self._markers_stale = False  # [] means nothing changed since the last message sent
            if markers:
                stamp = self.get_clock().now().to_msg()
                for m in markers:
                    m.header.stamp = stamp
                self._markers_pub.publish(MarkerArray(markers=markers))
                self._marker_updates_since_full = 0 if full else self._marker_updates_since_full + 1
        except Exception as exc:  # noqa: BLE001 - visualisation must never take the node down
            self._publisher_failed("markers", exc)

    def _publish_slice(self) -> None:
        points_np = self._slice_points
        if points_np is None or self._slice_pub.get_subscription_count() == 0:
            return  # on demand: computed only while someone subscribes
        try:
            cfg = self.config
            points = torch.from_numpy(points_np).to(self.world.device)
            with torch.no_grad():
                dist, _ = self.world.signed_distance(points, env=cfg.slice_env)
            header = Header(frame_id=cfg.world_frame, stamp=self.get_clock().now().to_msg())
            self._slice_pub.publish(conv.make_distance_cloud(points_np, dist.detach().cpu().numpy(), header))
        except Exception as exc:  # noqa: BLE001
            self._publisher_failed("distance slice", exc)

    def _publish_diagnostics(self) -> None:
        try:
            rate, p50, p95 = self._stats.report()
            level, problems, recent = self._health.status()
            n_mesh = self.world.mesh_count()
            rev = self.world.revision
            values = {
                "device": str(self.world.device), "sign_method": self.config.sign_method,
                "num_envs": self.config.num_envs, "mesh_count": n_mesh, "revision": rev,
                "requests_total": self._stats.total, "requests_failed": self._stats.failed,
                "request_rate_hz": f"{rate:.3f}", "latency_p50_ms": f"{1e3 * p50:.3f}",
                "latency_p95_ms": f"{1e3 * p95:.3f}", "rejected_messages": self._rejected,
                "window_s": f"{self._health.window_s:g}",
                **{f"recent_{kind}": n for kind, n in recent.items()},
            }
            values.update(self._update_diagnostics())
            status = DiagnosticStatus(level=bytes([level]), name=f"{self.get_fully_qualified_name().lstrip('/')}: mesh world",
                                      hardware_id=str(self.world.device),
                                      message=problems or f"{n_mesh} meshes, revision {rev}",
                                      values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
            msg = DiagnosticArray(status=[status])
            msg.header.stamp = self.get_clock().now().to_msg()
            self._diag_pub.publish(msg)
        except Exception as exc:  # noqa: BLE001
            self.get_logger().error(f"diagnostics: {exc!r}")

    def _update_diagnostics(self) -> dict[str, str]:
        """Counters of the mesh update queue and stamp -> applied latency percentiles."""
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
                "update_apply_max_ms": f"{1e3 * a_worst:.3f}", "updates_stale_skipped": str(self._stale_skipped),
                "updates_held": str(self._held_count()),
                "state_saves": str(self._saver.saves if self._saver is not None else 0),
                "heap_trims": str(self._trim.trims),
                "heap_trim_revision": str(-1 if self._trim.last_mark is None else self._trim.last_mark)}

    def last_request(self) -> tuple[int, tuple[np.ndarray, np.ndarray] | None]:
        """(sequence number, (spheres (k,4), cost (k,)) of batch row 0 of the last cost request)."""
        with self._request_lock:
            return self._request_seq, self._last_request


def use_node_switch_interval() -> None:
    """Set the interpreter's GIL switch interval to GIL_SWITCH_INTERVAL_S and limit glibc to
    NODE_MALLOC_ARENAS arenas (process-wide, before any thread starts; the console scripts call
    it, a process embedding the node decides for itself). The faster thread interleaving made
    glibc spread the heap over more arenas, which kept memory after REMOVEs (robot_sdf.memory)."""
    limit_malloc_arenas(NODE_MALLOC_ARENAS)
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


# The line reported as the caller of applied-update log lines (see SdfServer._log_applied).
_LOG_APPLIED_LINE = SdfServer._log_applied.__code__.co_firstlineno


# Longest wait of the node's main executor before it looks at its context again [s].
SPIN_POLL_S = 0.25


def run_node(node_class: type[Node], args: list[str] | None = None) -> int:
    """Run ``node_class()`` on a multi-threaded executor until SIGINT or SIGTERM (exit code 0).

    Exit code 2 when its constructor raises ConfigError (invalid parameters or scene file).
    Shared by the ``sdf_server`` and ``sdf_server_managed`` console scripts.

    SIGINT and SIGTERM are handled here, not by rclpy: rclpy's handler shuts every context down
    from its own thread at once, while the node's executors (this one, the world-update and
    transform threads on their own contexts) are still waiting on them; under load that race
    ended the process with a segmentation fault at shutdown (seen twice in stressed test runs,
    the crashing thread a native one). Here a signal only asks the main loop to stop; the
    executors, the node (which stops its own threads and contexts) and the contexts are then
    shut down in that order, from this thread.
    """
    use_node_switch_interval()
    # A crash in native code (rclpy, Warp, torch) then leaves the Python stacks of every thread in
    # the node's log instead of a bare exit status -11.
    faulthandler.enable()
    # SIGUSR1 writes every thread's Python stack to the log and the node runs on: a supervisor
    # (robot_sdf.ros.server_process) asks for it before killing a node that did not stop.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    stop = threading.Event()
    rclpy.init(args=args, signal_handler_options=SignalHandlerOptions.NO)
    previous = {sig: signal.signal(sig, lambda signum, frame: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    node: Node | None = None
    executor: MultiThreadedExecutor | None = None
    try:
        node = node_class()
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        # Not executor.spin(): each wait ends after SPIN_POLL_S at the latest, so a stop request
        # (a Python signal handler runs between waits) or a context shut down elsewhere is seen
        # within that.
        while not stop.is_set() and node.context.ok():
            try:
                executor.spin_once(timeout_sec=SPIN_POLL_S)
            except Exception:  # noqa: BLE001 - the context was shut down during the call (rclpy then
                # fails to create the wait's timeout timer: RCLError); anything else with the
                # context still up is a real error
                if node.context.ok():
                    raise
    except ConfigError as exc:
        rclpy.logging.get_logger(NODE_NAME).error(f"invalid configuration: {exc}")
        return 2
    except ExternalShutdownException:
        pass
    finally:
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def main(args: list[str] | None = None) -> int:
    """Console script ``sdf_server``: run the node until shutdown (SIGINT: exit code 0).

    Exit code 2 when the parameters or the scene file are invalid.
    """
    return run_node(SdfServer, args)


if __name__ == "__main__":
    sys.exit(main())
