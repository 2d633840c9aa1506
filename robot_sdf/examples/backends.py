"""Where the demo's collision costs come from: the sdf_server services, or a MeshWorld in-process.

Both backends expose the same four things to the MPC loop:

- ``collision(spheres (b,h,n,4), compute_gradient) -> CollisionEval`` (swept sphere cost);
- ``move(obstacle_id, pose (7,), env)``: move an obstacle (ObstaclePose message / world.set_pose);
- ``sync()``: the world revision that includes every move so far; every later ``collision``
  answer is computed against it (the ROS path repeats a request that overtook its pose
  messages, so the run does not depend on message timing and both paths see the same world at
  every step);
- ``device`` (where the costs are computed) and ``close()``.

Only ServiceBackend imports ROS, and only when it is constructed.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from robot_sdf.examples.mppi import CollisionEval

REPO_CONFIG = Path(__file__).resolve().parents[2] / "config"


def config_path(name: str) -> Path:
    """A file of the package's config/ directory: the source checkout first, else the installed
    share directory (ament index). Raises FileNotFoundError naming both places."""
    local = REPO_CONFIG / name
    if local.exists():
        return local
    try:
        from ament_index_python.packages import get_package_share_directory

        shared = Path(get_package_share_directory("robot_sdf")) / "config" / name
        if shared.exists():
            return shared
    except Exception:  # noqa: BLE001 - ament index absent or package not installed
        shared = None
    raise FileNotFoundError(f"config file {name!r} not found in {REPO_CONFIG}"
                            + (f" nor {shared}" if shared else ""))


def read_node_params(path: str | Path) -> dict[str, Any]:
    """The ``sdf_server: ros__parameters:`` mapping of a node parameter file (``/**`` accepted)."""
    p = Path(path)
    data = yaml.safe_load(p.read_text()) or {}
    for key in ("sdf_server", "/sdf_server", "/**"):
        section = data.get(key) if isinstance(data, dict) else None
        if isinstance(section, dict) and isinstance(section.get("ros__parameters"), dict):
            return dict(section["ros__parameters"])
    raise ValueError(f"{p}: expected 'sdf_server: ros__parameters:' with the node parameters")


def resolve_scene_file(params: dict[str, Any], params_file: str | Path) -> Path | None:
    """Absolute scene_file of node params: as given, else relative to the working directory,
    the parameter file's directory or its parent (the package root of config/...)."""
    scene = str(params.get("scene_file", "") or "")
    if not scene:
        return None
    p = Path(scene)
    if p.is_absolute():
        return p
    base = Path(params_file).resolve().parent
    for candidate in (Path.cwd() / p, base / p, base.parent / p):
        if candidate.exists():
            return candidate.resolve()
    raise FileNotFoundError(f"scene_file {scene!r} of {params_file} not found (tried the working "
                            f"directory, {base} and {base.parent})")


class _Common:
    """Request settings shared by both backends (the numbers must match exactly)."""

    def __init__(self, activation_distance: float, sweep_steps: int, speed_dt: float) -> None:
        self.activation_distance = float(activation_distance)
        self.sweep_steps = int(sweep_steps)
        self.speed_dt = float(speed_dt)
        # Weight 1 in the request; the MPC scales the cost itself (collision_weight).
        self.weight = 1.0


class InProcessBackend(_Common):
    """MeshWorld built from the scene with the node's parameters (device, sign_method, ...)."""

    def __init__(self, obstacles, params: dict[str, Any], activation_distance: float,
                 sweep_steps: int, speed_dt: float) -> None:
        super().__init__(activation_distance, sweep_steps, speed_dt)
        from robot_sdf import MeshWorld
        from robot_sdf.scene import apply_scene

        self.world = MeshWorld(device=str(params.get("device", "auto")),
                               num_envs=int(params.get("num_envs", 1)),
                               mesh_capacity=int(params.get("mesh_capacity", 16)),
                               sign_method=str(params.get("sign_method", "default")),
                               max_distance=float(params.get("max_distance", 0.5)))
        apply_scene(self.world, obstacles)
        self.device = str(self.world.device)

    def collision(self, spheres: torch.Tensor, compute_gradient: bool) -> CollisionEval:
        t0 = time.perf_counter()
        cost, grad, rev = self.world.evaluate_swept_sphere_cost(
            spheres, activation_distance=self.activation_distance, weight=self.weight,
            sweep_steps=self.sweep_steps, speed_dt=self.speed_dt, enable_speed_metric=False,
            compute_gradient=compute_gradient, return_revision=True)
        cost = cost.cpu()
        grad = grad.cpu() if grad is not None else None
        return CollisionEval(cost, grad, int(rev), time.perf_counter() - t0)

    def move(self, obstacle_id: str, pose: np.ndarray, env: int = 0) -> None:
        self.world.set_pose(obstacle_id, pose, env=env)

    def sync(self) -> int:
        return self.world.revision

    def publish_markers(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to show without ROS."""

    def close(self) -> None:
        pass


class ServiceBackend(_Common):
    """The sdf_server node's services through robot_sdf.ros.client.SdfClient.

    server: the node's name ("/sdf_server"); frame: world frame of the pose messages;
    timeout_s: how long to wait for the services and for each response.
    """

    def __init__(self, server: str, frame: str, activation_distance: float, sweep_steps: int,
                 speed_dt: float, timeout_s: float = 30.0, markers_topic: str = "/mpc_demo/markers",
                 initial_poses: dict[tuple[str, int], np.ndarray] | None = None) -> None:
        super().__init__(activation_distance, sweep_steps, speed_dt)
        from robot_sdf.geometry import validate_pose

        # The poses the node holds, as MeshWorld stores them: a pose equal to the current one is
        # not a change there (no new revision), so it is neither sent nor waited for.
        self._poses = {key: validate_pose(p) for key, p in (initial_poses or {}).items()}
        from diagnostic_msgs.msg import DiagnosticArray
        from visualization_msgs.msg import MarkerArray

        from robot_sdf.ros.client import SdfClient
        from robot_sdf_interfaces.msg import ObstaclePose

        self.server = server.rstrip("/")
        self.frame = frame
        self.timeout_s = float(timeout_s)
        self.client = SdfClient(server=self.server, timeout_s=self.timeout_s)
        self.device = "unknown"
        node = self.client.node
        self._pose_pub = node.create_publisher(ObstaclePose, f"{self.server}/obstacle_poses", 10)
        self._marker_pub = node.create_publisher(MarkerArray, markers_topic, 10)
        self._diag_sub = node.create_subscription(DiagnosticArray, "/diagnostics", self._on_diagnostics, 10)
        if not self.client.wait_for_services(self.timeout_s):
            self.client.close()
            raise RuntimeError(f"the services of {self.server} did not appear within {self.timeout_s:.0f} s "
                               "(is the node running, in this ROS_DOMAIN_ID?)")
        deadline = time.monotonic() + self.timeout_s
        # A pose published before the node's subscription is matched would be lost.
        while self._pose_pub.get_subscription_count() == 0:
            if time.monotonic() > deadline:
                self.client.close()
                raise RuntimeError(f"{self.server}/obstacle_poses has no subscriber")
            time.sleep(0.02)
        self._expected = self._revision()
        self._pending: list[Any] = []
        self.stale_requests = 0  # requests repeated because they overtook a pose message

    def _on_diagnostics(self, msg) -> None:
        for status in msg.status:
            if status.name.startswith(self.server.lstrip("/")) and status.hardware_id:
                self.device = status.hardware_id

    def _revision(self) -> int:
        """World revision of the node, via a one-point signed distance query."""
        return int(self.client.signed_distance(torch.zeros((1, 3))).world_revision)

    def collision(self, spheres: torch.Tensor, compute_gradient: bool) -> CollisionEval:
        """One swept-cost request, answered for a world that includes every pose sent so far.

        A request that overtook the pose messages (the node serves requests and pose updates
        in different callback groups) is repeated, so results never depend on message timing.
        """
        deadline = time.monotonic() + self.timeout_s
        resend = time.monotonic() + 1.0
        while True:
            res = self.client.swept_sphere_cost(
                spheres, sweep_steps=self.sweep_steps, speed_dt=self.speed_dt, enable_speed_metric=False,
                activation_distance=self.activation_distance, weight=self.weight,
                compute_gradient=compute_gradient)
            if res.world_revision >= self._expected:
                self._pending.clear()
                self._expected = int(res.world_revision)
                return CollisionEval(res.cost, res.gradient, int(res.world_revision), float(res.latency_s))
            now = time.monotonic()
            if now > deadline:
                raise RuntimeError(f"{self.server} did not apply the obstacle poses within {self.timeout_s:.0f} s "
                                   f"(revision {res.world_revision}, expected {self._expected})")
            if now > resend:  # best-effort input: re-send once a second if one got lost
                for msg in self._pending:
                    self._pose_pub.publish(msg)
                resend = now + 1.0
            self.stale_requests += 1
            time.sleep(0.001)

    def move(self, obstacle_id: str, pose: np.ndarray, env: int = 0) -> None:
        from robot_sdf.ros.conversions import make_obstacle_pose

        from robot_sdf.geometry import validate_pose

        stored = validate_pose(pose)
        current = self._poses.get((obstacle_id, env))
        if current is not None and np.array_equal(current, stored):
            return
        self._poses[(obstacle_id, env)] = stored
        msg = make_obstacle_pose(obstacle_id, pose, env=env, frame_id=self.frame,
                                 stamp=self.client.node.get_clock().now().to_msg())
        self._pose_pub.publish(msg)
        self._pending.append(msg)
        self._expected += 1

    def sync(self) -> int:
        """The revision the next requests must see (collision() waits for the node to reach it)."""
        return self._expected

    def publish_markers(self, spheres: np.ndarray, plan: np.ndarray, path: np.ndarray,
                        goal: np.ndarray, height: float) -> None:
        """Robot spheres, planned and executed paths and the goal as a MarkerArray for rviz."""
        from robot_sdf.examples.markers import demo_markers

        stamp = self.client.node.get_clock().now().to_msg()
        self._marker_pub.publish(demo_markers(self.frame, stamp, spheres, plan, path, goal, height))

    def close(self) -> None:
        self.client.close()
