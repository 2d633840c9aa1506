"""ROS 2 node ``sdf_server``: a thin adapter between ROS messages/services and robot_sdf.MeshWorld.

Topics and services (relative to the node, ``~/`` = ``/sdf_server/``):

- subscribes ``~/mesh_obstacles`` (robot_sdf_interfaces/MeshObstacle), ``~/obstacle_poses``
  (ObstaclePose) and one geometry_msgs/PoseStamped topic per scene obstacle with ``pose_topic``:
  robot_sdf.ros.world_updates (its QoS, the input policy, held updates, stamps); with
  num_cameras > 0 the depth cameras' ``camera_<i>/depth/image`` and ``camera_<i>/depth/camera_info``
  (robot_sdf.ros.camera_inputs);
- serves ``~/evaluate_sphere_cost``, ``~/evaluate_swept_sphere_cost``, ``~/query_signed_distance``;
- publishes ``~/markers`` (MarkerArray; reliable, transient_local, depth MARKER_HISTORY: a viewer
  started later receives the latest full scene and the changes after it; not built while nobody
  subscribes), ``~/distance_slice``
  (PointCloud2 x,y,z,distance, computed only while subscribed) and ``/diagnostics`` (OK, or
  WARN/ERROR with the recent problems, see robot_sdf.ros.health).

Input policy: every message and request is checked before the world changes or is read; a bad
message is logged with its reason and dropped whole (world_updates.py), a bad request gets
success=false and the reason. A pose in a frame other than world_frame is transformed into it at
the message stamp (robot_sdf.ros.frames: tf2, or a built-in buffer with tf2's rules without
tf2_ros, on this node's clock).

Threads: mesh and pose updates (a mesh may build a BVH) are served by a companion node
``<name>_world_updates`` with its own executor thread (robot_sdf.ros.world_updates), so busy
services never delay them; service requests run in a reentrant group (concurrent requests run
in parallel) and the periodic publishers in another, on the multi-threaded executor of
robot_sdf.ros.node_process. MeshWorld serialises its writers and publishes immutable snapshots,
so a request reads one consistent world state (its revision is returned) and is never queued
behind a BVH build.

Parameters: the ``dynamic`` ones of robot_sdf.ros.parameters (cost defaults, marker, slice,
diagnostics and tf settings) may be set at run time; a change is validated as a whole and then
applied (timers and the slice grid are rebuilt as needed); the others are read-only.
Life cycle: ``configure_server`` (world, scene, warm-up), ``activate_server`` (subscriptions,
tf, publishers, timers, services), ``deactivate_server``, ``cleanup_server``. SdfServer runs the
first two in its constructor; robot_sdf.ros.lifecycle.ManagedSdfServer runs each on its
lifecycle transition. The process around it (signals, executor, process tuning):
robot_sdf.ros.node_process.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

import numpy as np
import torch
from diagnostic_msgs.msg import DiagnosticArray
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup, ReentrantCallbackGroup
from rclpy.clock import JumpThreshold
from rclpy.duration import Duration
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from rcl_interfaces.msg import SetParametersResult
from sensor_msgs.msg import PointCloud2
from std_msgs.msg import Header
from visualization_msgs.msg import MarkerArray

from robot_sdf import MeshWorld
from robot_sdf.memory import TrimScheduler
from robot_sdf.requests import CostResult, RequestError, RequestSettings, RequestTranslator  # noqa: F401
from robot_sdf.ros import conversions as conv
from robot_sdf.perception.fusion import PERCEIVED_MESH
from robot_sdf.ros.camera_inputs import CameraInputs
from robot_sdf.ros.frames import (JUMP_BACK_NS, FrameResolver, Tf2Buffer, TopicTransformBuffer, TransformCache,
                                  parse_static_transforms, tf2_available)
from robot_sdf.ros.health import HealthMonitor, RequestStats, diagnostic_status
from robot_sdf.ros.markers import MarkerState
from robot_sdf.ros.node_process import run_node, usage
from robot_sdf.ros.parameters import (DYNAMIC_PARAMETERS, PARAMETER_NAMES, ConfigError, ServerConfig, current_values,
                                      declare, validate_values, with_changes)
from robot_sdf.ros.world_setup import load_scene, restore_state, warm_up
from robot_sdf.ros.world_updates import REFUSALS, WorldUpdates, refusal_reason
from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance

NODE_NAME = "sdf_server"
# Requests with at least this many floats (16 MB) are followed by a heap trim (robot_sdf.memory).
_TRIM_AFTER_FLOATS = 4_000_000
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
        self._world_updates: WorldUpdates | None = None
        self._cameras: CameraInputs | None = None
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
        self._stats = RequestStats()
        self._health = HealthMonitor(cfg.diagnostics_window_s, cfg.slow_request_ms / 1e3)
        self._trim = TrimScheduler(mark=lambda: self.world.revision)
        self._frames = FrameResolver(cfg.world_frame, None, cfg.tf_timeout, cfg.tf_use_latest)
        self._world_updates = WorldUpdates(world, cfg, self._frames, self.get_logger(), self._health, self._trim,
                                           on_applied=self._state_changed)
        try:
            self._pose_topics = load_scene(world, cfg.scene_file, cfg.world_frame, cfg.static_transforms)
            self._saver = restore_state(world, cfg.state_dir, self.get_logger(), self._state_snapshot,
                                        self._world_updates.restore_stamps)
        except ConfigError:
            self.cleanup_server()
            raise
        # Counted now: once the update thread runs, topic meshes (transient_local) may join in.
        self._scene_count, self._scene_revision = self.world.mesh_count(), self.world.revision
        warm_up(world)

        self._request_lock = threading.Lock()
        self._last_request: tuple[np.ndarray, np.ndarray] | None = None
        self._request_seq = 0
        self._markers = MarkerState(self.world, cfg.num_envs, cfg.world_frame, self.last_request,
                                    max_triangles=cfg.marker_max_triangles,
                                    namespaces={(0, PERCEIVED_MESH): PERCEIVED_MESH} if cfg.perceives else None)

    def activate_server(self) -> None:
        """Open the transform lookup, the update subscriptions, publishers, timers and services."""
        self._frames.buffer = self._open_transforms()
        # A jump back in (simulated) time -- a bag played in a loop, a simulator reset -- makes the
        # stamps of applied updates meaningless: forget them, or every update of the next loop
        # would be skipped as a replay. tf forgets its transforms on the same event.
        threshold = JumpThreshold(min_forward=None, min_backward=Duration(nanoseconds=-JUMP_BACK_NS),
                                  on_clock_change=True)
        self._jump_handle = self.get_clock().create_jump_callback(threshold,
                                                                  post_callback=self._world_updates.on_time_jump)
        self._world_updates.start(self, self._pose_topics)
        if self.config.perceives:
            self._cameras = CameraInputs(self, self.world, self.config, self._frames, self._world_updates.reject)
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
        self._world_updates.stop()
        if self._cameras is not None:
            self._cameras.close(self)
            self._cameras = None
        self._close_transforms()
        self.get_logger().info("inactive: services, topics and tf closed; the world is kept")

    def cleanup_server(self) -> None:
        """Save pending state, then release the world (its device memory goes with the last
        reference)."""
        if self._world_updates is not None:
            self._world_updates.stop()  # nothing when deactivate_server() stopped them
        self._close_state()
        self.world = None
        self._world_updates = None
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
        self.config = self._world_updates.config = new
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
            f"({len(self._pose_topics)} pose topics), scene revision {self._scene_revision}")

    # ------------------------------------------------------------------ state and shutdown

    def _close_state(self) -> None:
        """Write what the state saver has pending and stop it; stop the heap trimmer."""
        if getattr(self, "_saver", None) is not None:
            self._saver.close()  # saves what is pending
            self._saver = None
        if getattr(self, "_trim", None) is not None:
            self._trim.close()
            self._trim = None

    def destroy_node(self) -> None:
        if getattr(self, "_world_updates", None) is not None:
            self._world_updates.stop()
        if getattr(self, "_tf", None) is not None or getattr(self, "_jump_handle", None) is not None:
            self._close_transforms()
        self._close_state()
        super().destroy_node()

    def _state_snapshot(self):
        stamps = self._world_updates.applied_stamps()  # before the world: a newer world than stamps is safe
        meshes = self.world.export_meshes()
        if self._cameras is not None:
            # What the cameras saw is not state: a restarted node sees the world anew.
            meshes = [m for m in meshes if (m[0], m[1]) != (0, PERCEIVED_MESH)]
        return meshes, stamps, self.world.revision

    def _state_changed(self) -> None:
        if self._saver is not None:
            self._saver.mark_dirty()

    # ------------------------------------------------------------------ services

    def _serve(self, name: str, request, response, compute: Callable[[Any], None]):
        """Fill ``response`` via ``compute``; turn any failure into success=false + message."""
        t0 = time.perf_counter()
        try:
            compute(response)
            response.success, response.message = True, ""
        except REFUSALS as exc:  # RequestError is a ValueError
            self._fail(response, refusal_reason(exc))
            self.get_logger().warning(f"{name}: rejected request: {refusal_reason(exc)}")
            self._health.request_failed(name, refusal_reason(exc))
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
            # Stamped before the counters are read: a reader that waits for a message stamped after
            # some moment gets counts taken after it.
            stamp = self.get_clock().now().to_msg()
            details = {**self._world_updates.diagnostics(),
                       "state_saves": str(self._saver.saves if self._saver is not None else 0),
                       "heap_trims": str(self._trim.trims),
                       "heap_trim_revision": str(-1 if self._trim.last_mark is None else self._trim.last_mark),
                       **(self._cameras.diagnostics() if self._cameras is not None else {})}
            status = diagnostic_status(f"{self.get_fully_qualified_name().lstrip('/')}: mesh world", self.world,
                                       self.config, self._stats, self._health, self._world_updates.rejected, details)
            msg = DiagnosticArray(status=[status])
            msg.header.stamp = stamp
            self._diag_pub.publish(msg)
        except Exception as exc:  # noqa: BLE001
            self.get_logger().error(f"diagnostics: {exc!r}")

    def last_request(self) -> tuple[int, tuple[np.ndarray, np.ndarray] | None]:
        """(sequence number, (spheres (k,4), cost (k,)) of batch row 0 of the last cost request)."""
        with self._request_lock:
            return self._request_seq, self._last_request


HELP = ("Runs the ROS 2 node sdf_server: collision costs of spheres against triangle meshes and signed\n"
        "distances as services (~/evaluate_sphere_cost, ~/evaluate_swept_sphere_cost,\n"
        "~/query_signed_distance), meshes and poses from topics (~/mesh_obstacles, ~/obstacle_poses).\n"
        "Runs until SIGINT or SIGTERM (exit status 0); exit status 2 on invalid parameters or scene file.")


def main(args: list[str] | None = None) -> int:
    """Console script ``sdf_server``: run the node until shutdown (SIGINT: exit code 0).

    Exit code 2 when the parameters or the scene file are invalid; -h or --help prints the usage
    and the parameters and exits 0 without starting anything.
    """
    return run_node(SdfServer, args, NODE_NAME, usage("sdf_server", HELP))


if __name__ == "__main__":
    sys.exit(main())
