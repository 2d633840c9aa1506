"""ROS 2 node ``sdf_server``: a thin adapter between ROS messages/services and robot_sdf.MeshWorld.

Topics and services (relative to the node, ``~/`` = ``/sdf_server/``):

- subscribes ``~/mesh_obstacles`` (robot_sdf_interfaces/MeshObstacle; reliable, transient_local,
  depth 100, so meshes published before the node started reach it), ``~/obstacle_poses``
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
message stamp (robot_sdf.ros.frames: tf2, or the static_transforms parameter without tf2_ros); a
frame that cannot be resolved within tf_timeout rejects the message. REMOVE, ENABLE and DISABLE
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

import math
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

import numpy as np
import rclpy
import torch
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from geometry_msgs.msg import PoseStamped
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rcl_interfaces.msg import SetParametersResult
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from robot_sdf import MeshWorld
from robot_sdf.ros import conversions as conv
from robot_sdf.ros.frames import (FrameResolver, LookupFailed, StaticTransforms, Tf2Buffer, compose,
                                  parse_static_transforms, stamp_to_ns, tf2_available)
from robot_sdf.ros.health import HealthMonitor
from robot_sdf.ros.markers import MarkerState
from robot_sdf.ros.parameters import (DYNAMIC_PARAMETERS, PARAMETER_NAMES, ConfigError, ServerConfig, current_values,
                                      declare, validate_values, with_changes)
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance

NODE_NAME = "sdf_server"
# The same rejection (same input, same reason) is logged at most once per this period.
_REJECT_LOG_PERIOD_S = 1.0
MESH_QOS = conv.MESH_OBSTACLE_QOS
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


class RequestError(ValueError):
    """A service request that cannot be served; its text goes into response.message."""


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
        self._tf: Tf2Buffer | None = None
        self._tf_notice_logged = False
        self._active = False
        self._server_timers: dict[str, Any] = {}
        self._server_services: list = []
        self._updates_executor = None
        self.add_on_set_parameters_callback(self._on_set_parameters)
        self.add_post_set_parameters_callback(self._after_set_parameters)

    def configure_server(self) -> None:
        """Validate the parameters, build the world on its device, load the scene and warm the
        kernels up. Raises ConfigError (and leaves the node unconfigured) when any of it fails."""
        cfg = validate_values(current_values(self))
        try:
            world = MeshWorld(device=cfg.device, num_envs=cfg.num_envs,
                              mesh_capacity=cfg.mesh_capacity, sign_method=cfg.sign_method,
                              max_distance=cfg.max_distance)
        except (ValueError, RuntimeError) as exc:
            raise ConfigError(f"cannot create the mesh world on device '{cfg.device}': {exc}") from exc
        self.config, self.world = cfg, world
        try:
            self._pose_topics = self._load_scene(cfg.scene_file)
        except ConfigError:
            self.cleanup_server()
            raise
        # Counted now: once the update thread runs, topic meshes (transient_local) may join in.
        self._scene_count, self._scene_revision = self.world.mesh_count(), self.world.revision
        self._warm_up()

        self._stats = RequestStats()
        self._health = HealthMonitor(cfg.diagnostics_window_s, cfg.slow_request_ms / 1e3)
        self._rejected = 0
        self._reject_log: dict[tuple[str, str], tuple[float, int]] = {}
        self._count_lock = threading.Lock()
        self._request_lock = threading.Lock()
        self._last_request: tuple[np.ndarray, np.ndarray] | None = None
        self._request_seq = 0
        self._markers = MarkerState(self.world, cfg.num_envs, cfg.world_frame, self.last_request,
                                    max_triangles=cfg.marker_max_triangles)
        self._frames = FrameResolver(cfg.world_frame, None, cfg.tf_timeout, cfg.tf_use_latest)

    def activate_server(self) -> None:
        """Open the transform lookup, the update subscriptions, publishers, timers and services."""
        self._frames.buffer = self._open_transforms()
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
        """Release the world (its device memory goes with the last reference)."""
        self.world = None
        self._markers = None
        self._frames = None
        self.config = None

    def _open_transforms(self):
        """The transform buffer for incoming messages: tf2 (with static_transforms inserted) where
        tf2_ros is installed, else the static_transforms alone (None when there are none)."""
        static = parse_static_transforms(self.config.static_transforms)
        if tf2_available():
            self._tf = Tf2Buffer(self.get_name(), self.get_namespace(), self.context, static)
            return self._tf
        if not self._tf_notice_logged:
            self._tf_notice_logged = True
            frames = sorted(StaticTransforms(static).frames() - {self.config.world_frame})
            self.get_logger().info(
                f"tf2_ros is not installed (pip-wheel setup): messages are accepted in world_frame "
                f"'{self.config.world_frame}' and in the frames of static_transforms only "
                f"({', '.join(frames) or 'none'})")
        return StaticTransforms(static) if static else None

    def _close_transforms(self) -> None:
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
        qualified name) and applies updates as they arrive; mesh and pose updates keep separate
        callback groups so a pose never waits for a BVH build.
        """
        # Process-wide arguments (a `__node:=` remap in particular) are for this node only; the
        # companion subscribes to the names this node resolves, so topic remaps still apply.
        self._updates_node = rclpy.create_node(f"{self.get_name()}_world_updates", namespace=self.get_namespace(),
                                               context=self.context, use_global_arguments=False,
                                               start_parameter_services=False)
        self._pose_topic_count = len(pose_topics)
        mesh_group = MutuallyExclusiveCallbackGroup()
        pose_group = MutuallyExclusiveCallbackGroup()
        node = self._updates_node
        node.create_subscription(MeshObstacle, self.resolve_topic_name("~/mesh_obstacles"), self._on_mesh_obstacle,
                                 MESH_QOS, callback_group=mesh_group)
        node.create_subscription(ObstaclePose, self.resolve_topic_name("~/obstacle_poses"), self._on_obstacle_pose,
                                 POSE_QOS, callback_group=pose_group)
        for topic, targets in pose_topics.items():
            node.create_subscription(PoseStamped, self.resolve_topic_name(topic),
                                     self._pose_topic_callback(topic, targets), POSE_QOS, callback_group=pose_group)
        self._updates_executor = MultiThreadedExecutor(num_threads=2, context=self.context)
        self._updates_executor.add_node(node)
        self._updates_thread = threading.Thread(target=self._spin_world_updates, name="sdf_server_world_updates",
                                                daemon=True)
        self._updates_thread.start()

    def _spin_world_updates(self) -> None:
        try:
            self._updates_executor.spin()
        except (ExternalShutdownException, KeyboardInterrupt):
            pass

    def _stop_world_updates(self) -> None:
        updates = getattr(self, "_updates_executor", None)
        if updates is not None:
            updates.shutdown(timeout_sec=2.0)
            self._updates_thread.join(timeout=5.0)
            self._updates_node.destroy_node()
            self._updates_executor = None

    def destroy_node(self) -> None:
        self._stop_world_updates()
        if getattr(self, "_tf", None) is not None:
            self._close_transforms()
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
        static = StaticTransforms(parse_static_transforms(self.config.static_transforms))
        try:
            world_from_frame = static.lookup(world_frame, frame, None, 0.0)
        except LookupFailed as exc:
            raise ValueError(f"its frame '{frame}' is not world_frame '{world_frame}' and not connected to it "
                             f"by static_transforms: {exc}") from None
        return [dataclasses.replace(spec, pose=compose(world_from_frame, spec.pose)) for spec in specs]

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

    def _guarded(self, what: str, apply: Callable[[], str]) -> None:
        """Run one world update; log its outcome; never let an exception escape."""
        try:
            done = apply()
        except _REFUSED as exc:
            self._reject(what, _reason(exc))
        except Exception as exc:  # noqa: BLE001 - a topic callback must not kill the node
            self._reject(what, f"internal error {type(exc).__name__}: {exc}", internal=True)
        else:
            if done:
                self.get_logger().info(f"{what}: {done}")

    def _pose_in_world(self, header: Header, pose) -> np.ndarray:
        """Pose (7,) of a message given in header.frame_id at header.stamp, in world_frame.

        Raises FrameError (a ValueError) when the frame cannot be resolved within tf_timeout, so
        the message is rejected whole; ids, envs and geometry are checked by MeshWorld itself.
        """
        return self._frames.pose_in_world(header.frame_id, stamp_to_ns(header.stamp), conv.pose_to_array(pose))

    def _on_mesh_obstacle(self, msg: MeshObstacle) -> None:
        op = conv.OPERATION_NAMES.get(msg.operation)
        what = f"MeshObstacle {op or msg.operation} '{msg.id}' env {msg.env}"
        self._guarded(what, lambda: self._apply_mesh_obstacle(msg, op))

    def _apply_mesh_obstacle(self, msg: MeshObstacle, op: str | None) -> str:
        if op is None:
            raise RejectedInput(f"unknown operation {msg.operation} (expected 0..4: "
                                f"{', '.join(conv.OPERATION_NAMES.values())})")
        world, env = self.world, int(msg.env)
        if op == "ADD":
            pose = self._pose_in_world(msg.header, msg.pose)
            vertices, triangles = conv.mesh_arrays(msg)
            # ADD replaces geometry and pose (design.md 5); a DISABLEd id stays disabled.
            enabled = world.mesh_geometry(msg.id, env)[3] if world.has_mesh(msg.id, env) else True
            rev = world.add_mesh(msg.id, vertices, triangles, pose=pose, env=env, enabled=enabled)
            return f"{vertices.size // 3} vertices, {triangles.size // 3} triangles -> revision {rev}"
        if op == "REMOVE":
            rev = world.remove_mesh(msg.id, env=env)
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

        self._guarded(f"ObstaclePose '{msg.id}' env {msg.env}", apply)

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

            self._guarded(f"PoseStamped on '{topic}'", apply)

        return callback

    # ------------------------------------------------------------------ services

    def _serve(self, name: str, response, compute: Callable[[Any], None]):
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
        return response

    def _fail(self, response, message: str) -> None:
        response.success, response.message = False, message
        response.world_revision = int(self.world.revision)
        for field in ("cost", "gradient", "distance"):
            if hasattr(response, field):
                setattr(response, field, conv.float32_array(np.zeros(0)))

    def _scalar_or_default(self, value: float, default: float, name: str) -> float:
        if value <= 0:
            return default  # the contract: <= 0 means "node default"
        if not math.isfinite(value):
            raise RequestError(f"{name} must be finite, got {value}")
        return float(value)

    def _spheres(self, request) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Common cost request fields -> spheres (b,h,n,4) tensor, env_index (b,) or None.

        Checks what MeshWorld does not: sizes, the request limit and finite values (env_index
        length and range are the world's checks).
        """
        b, h, n = int(request.batch), int(request.horizon), int(request.spheres_per_step)
        count = b * h * n  # Python ints: no overflow whatever the uint32 fields hold
        if count == 0:
            raise RequestError(f"batch, horizon and spheres_per_step must be > 0, got {b}, {h}, {n}")
        if count > self.config.max_spheres_per_request:
            raise RequestError(f"batch*horizon*spheres_per_step = {count} exceeds "
                               f"max_spheres_per_request {self.config.max_spheres_per_request}")
        flat = conv.as_float32(request.spheres)
        if flat.size != 4 * count:
            raise RequestError(f"spheres has {flat.size} floats, expected "
                               f"batch*horizon*spheres_per_step*4 = {4 * count}")
        if not np.isfinite(flat).all():
            bad = np.unravel_index(int(np.flatnonzero(~np.isfinite(flat))[0]), (b, h, n, 4))
            raise RequestError(f"sphere (batch {bad[0]}, step {bad[1]}, sphere {bad[2]}) is not "
                               f"finite")
        env = conv.as_uint32(request.env_index)
        spheres = torch.from_numpy(flat.reshape(b, h, n, 4)).to(self.world.device)
        return spheres, torch.from_numpy(env.astype(np.int64)) if env.size else None

    def _fill_cost(self, response, request, spheres, cost, grad, revision: int) -> None:
        response.world_revision = int(revision)
        cost_np = cost.detach().cpu().numpy()
        response.cost = conv.float32_array(cost_np)
        if request.compute_gradient:
            response.gradient = conv.float32_array(grad.detach().cpu().numpy())
        if self.config.publish_request_markers and self.config.marker_rate_hz > 0:
            k = self.config.marker_max_spheres
            row = spheres[0].reshape(-1, 4)[:k].cpu().numpy().copy()  # not a view of the request
            with self._request_lock:
                self._last_request = (row, cost_np[0].reshape(-1)[:k].copy())
                self._request_seq += 1

    def _on_sphere_cost(self, request, response):
        def compute(resp) -> None:
            spheres, env_index = self._spheres(request)
            eta, weight = self._cost_scalars(request)
            cost, grad, rev = self.world.evaluate_sphere_cost(
                spheres, activation_distance=eta, weight=weight, env_index=env_index,
                compute_gradient=bool(request.compute_gradient), return_revision=True)
            self._fill_cost(resp, request, spheres, cost, grad, rev)

        return self._serve("evaluate_sphere_cost", response, compute)

    def _on_swept_sphere_cost(self, request, response):
        def compute(resp) -> None:
            spheres, env_index = self._spheres(request)
            eta, weight = self._cost_scalars(request)
            steps = int(request.sweep_steps)
            if steps > self.config.max_sweep_steps:
                raise RequestError(f"sweep_steps {steps} exceeds max_sweep_steps "
                                   f"{self.config.max_sweep_steps}")
            cost, grad, rev = self.world.evaluate_swept_sphere_cost(
                spheres, activation_distance=eta, weight=weight, sweep_steps=steps,
                speed_dt=float(request.speed_dt), enable_speed_metric=bool(request.enable_speed_metric), env_index=env_index,
                compute_gradient=bool(request.compute_gradient), return_revision=True)
            self._fill_cost(resp, request, spheres, cost, grad, rev)

        return self._serve("evaluate_swept_sphere_cost", response, compute)

    def _cost_scalars(self, request) -> tuple[float, float]:
        return (self._scalar_or_default(request.activation_distance,
                                        self.config.activation_distance, "activation_distance"),
                self._scalar_or_default(request.weight, self.config.weight, "weight"))

    def _on_query_signed_distance(self, request, response):
        def compute(resp) -> None:
            flat = conv.as_float32(request.points)
            if flat.size == 0:
                raise RequestError("points is empty")
            if flat.size % 3:
                raise RequestError(f"points has {flat.size} floats, not a multiple of 3")
            n = flat.size // 3
            if n > self.config.max_points_per_request:
                raise RequestError(f"{n} points exceed max_points_per_request "
                                   f"{self.config.max_points_per_request}")
            if not np.isfinite(flat).all():
                bad = int(np.flatnonzero(~np.isfinite(flat))[0]) // 3
                raise RequestError(f"point {bad} is not finite")
            max_d = self._scalar_or_default(request.max_distance, self.config.max_distance,
                                            "max_distance")
            points = torch.from_numpy(flat.reshape(n, 3)).to(self.world.device)
            dist, grad, rev = self.world.signed_distance(points, env=int(request.env), max_distance=max_d,
                                                         return_revision=True)
            resp.world_revision = int(rev)
            resp.distance = conv.float32_array(dist.detach().cpu().numpy())
            resp.gradient = conv.float32_array(grad.detach().cpu().numpy())

        return self._serve("query_signed_distance", response, compute)

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
            status = DiagnosticStatus(level=bytes([level]), name=f"{self.get_fully_qualified_name().lstrip('/')}: mesh world",
                                      hardware_id=str(self.world.device),
                                      message=problems or f"{n_mesh} meshes, revision {rev}",
                                      values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
            msg = DiagnosticArray(status=[status])
            msg.header.stamp = self.get_clock().now().to_msg()
            self._diag_pub.publish(msg)
        except Exception as exc:  # noqa: BLE001
            self.get_logger().error(f"diagnostics: {exc!r}")

    def last_request(self) -> tuple[int, tuple[np.ndarray, np.ndarray] | None]:
        """(sequence number, (spheres (k,4), cost (k,)) of batch row 0 of the last cost request)."""
        with self._request_lock:
            return self._request_seq, self._last_request


def main(args: list[str] | None = None) -> int:
    """Console script ``sdf_server``: run the node until shutdown (SIGINT: exit code 0).

    Exit code 2 when the parameters or the scene file are invalid.
    """
    rclpy.init(args=args)
    node: SdfServer | None = None
    executor: MultiThreadedExecutor | None = None
    try:
        node = SdfServer()
        executor = MultiThreadedExecutor(num_threads=4)
        executor.add_node(node)
        executor.spin()
    except ConfigError as exc:
        rclpy.logging.get_logger(NODE_NAME).error(f"invalid configuration: {exc}")
        return 2
    except (KeyboardInterrupt, ExternalShutdownException):
        pass  # SIGINT may land before spin() (rclpy then raises KeyboardInterrupt) or during it
    finally:
        if executor is not None:
            executor.shutdown()
        if node is not None:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
