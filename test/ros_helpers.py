"""Helpers for the ROS tests: run sdf_server as a subprocess, talk to it over real rclpy.

Every test module starts the node once (module-scoped fixture) in its own ROS domain (derived
from the pid and a per-module offset, 1..100) with DDS discovery on loopback, and stops it with
SIGINT (then SIGKILL). The test side uses its own rclpy Context spun in a background thread.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
TEST_DIR = Path(__file__).resolve().parent
if str(TEST_DIR) not in sys.path:
    sys.path.insert(0, str(TEST_DIR))

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import rclpy  # noqa: E402
from rclpy.executors import MultiThreadedExecutor  # noqa: E402
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy  # noqa: E402

import reference as ref  # noqa: E402
from robot_sdf.ros.server_process import ServerProcess, reserve_domain_id  # noqa: E402

NODE = "/sdf_server"
SERVICE_TIMEOUT_S = 60.0
MESH_QOS = QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE,
                      durability=DurabilityPolicy.TRANSIENT_LOCAL)
# what a viewer of ~/markers asks for (config/robot_sdf.rviz): the node keeps 10 messages
MARKER_QOS = QoSProfile(depth=10, reliability=ReliabilityPolicy.RELIABLE,
                        durability=DurabilityPolicy.TRANSIENT_LOCAL)


@functools.cache
def domain_id(offset: int) -> int:
    """A ROS domain id in 1..100 of this process's test module ``offset`` (the same id on every
    call), reserved on this machine (reserve_domain_id): concurrent test runs never share one."""
    return reserve_domain_id(1 + (os.getpid() * 7 + offset) % 100)


def ros_env(domain: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               PYTHONUNBUFFERED="1", RCUTILS_LOGGING_BUFFERED_STREAM="0",
               RCUTILS_COLORIZED_OUTPUT="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def write_params(path: Path, params: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump({"sdf_server": {"ros__parameters": params}}))
    return path


class NodeProcess(ServerProcess):
    """The node as a subprocess with ``params`` written to ``workdir`` and its own ROS domain."""

    def __init__(self, params: dict[str, Any], workdir: Path, domain: int) -> None:
        params_file = write_params(workdir / "sdf_server_params.yaml", params)
        super().__init__(params_file, workdir / "sdf_server.log", ros_env(domain), cwd=REPO)


class Collector:
    """Keeps every message of one subscription; wait_for() polls a predicate over them."""

    def __init__(self) -> None:
        self.messages: list = []
        self._lock = threading.Lock()

    def __call__(self, msg) -> None:
        with self._lock:
            self.messages.append(msg)

    def snapshot(self) -> list:
        with self._lock:
            return list(self.messages)

    def wait_for(self, predicate: Callable[[Any], bool], timeout: float = 60.0):
        """First message (newest first) satisfying predicate, or AssertionError after timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for msg in reversed(self.snapshot()):
                if predicate(msg):
                    return msg
            time.sleep(0.05)
        raise AssertionError(f"no matching message within {timeout} s ({len(self.messages)} received)")


class RosHarness:
    """A test-side rclpy context + node spun in a background thread."""

    def __init__(self, domain: int, name: str = "sdf_test") -> None:
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node(f"{name}_{os.getpid()}", context=self.context)
        self.executor = MultiThreadedExecutor(num_threads=2, context=self.context)
        self.executor.add_node(self.node)
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - context shut down at teardown
            pass

    def publisher(self, msg_type, topic: str, qos=10):
        return self.node.create_publisher(msg_type, topic, qos)

    def subscribe(self, msg_type, topic: str, qos=10) -> Collector:
        collector = Collector()
        self.node.create_subscription(msg_type, topic, collector, qos)
        return collector

    def client(self, srv_type, name: str):
        return self.node.create_client(srv_type, name)

    def call(self, client, request, timeout: float = 60.0, resend_after: float | None = None):
        """The service's response to ``request``, or AssertionError after ``timeout`` s. With
        ``resend_after`` (read-only requests only) the request is sent again each time that many
        seconds pass unanswered: a response can be lost while the server's response writer has not
        yet matched this client's reader (Fast DDS waits 100 ms for it, then drops the response:
        ros2/rmw_fastrtps#390, #467), which a loaded machine makes likely right after the service
        appeared."""
        deadline = time.monotonic() + timeout
        while True:
            event = threading.Event()
            future = client.call_async(request)
            future.add_done_callback(lambda _: event.set())
            left = deadline - time.monotonic()
            if event.wait(left if resend_after is None else min(left, resend_after)):
                return future.result()
            client.remove_pending_request(future)
            if time.monotonic() >= deadline:
                raise AssertionError(f"{client.service_name}: no response within {timeout} s")

    def signed_distance(self, client, points, max_distance: float = 1.0) -> tuple[np.ndarray, int]:
        """query_signed_distance of world points (n,3) through ``client``: (distance (n,), world
        revision); asserts success."""
        from robot_sdf.ros.conversions import float32_array
        from robot_sdf_interfaces.srv import QuerySignedDistance

        request = QuerySignedDistance.Request(max_distance=float(max_distance))
        request.points = float32_array(np.asarray(points, np.float32).reshape(-1))
        response = self.call(client, request, resend_after=10.0)
        assert response.success, response.message
        return np.frombuffer(response.distance, np.float32).copy(), response.world_revision

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        rclpy.try_shutdown(context=self.context)
        self._thread.join(timeout=5.0)


def wait_until(predicate: Callable[[], Any], timeout: float = 60.0, interval: float = 0.05,
               what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; return it or raise AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_for_matched(publisher, timeout: float = 60.0) -> None:
    wait_until(lambda: publisher.get_subscription_count() > 0, timeout, what="a matched subscriber")


def wait_for_services(node_proc: NodeProcess, clients: list, timeout: float = SERVICE_TIMEOUT_S) -> None:
    """Wait for every service; fail early with the node's log if the process died."""
    deadline = time.monotonic() + timeout
    for client in clients:
        while not client.wait_for_service(timeout_sec=0.2):
            if not node_proc.alive():
                raise AssertionError(f"sdf_server exited with {node_proc.proc.returncode}:\n{node_proc.log()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"service {client.service_name} not available:\n{node_proc.log()}")


def count_in_log(node_proc: NodeProcess, text: str) -> int:
    return node_proc.log().count(text)


# ---------------------------------------------------------------------------- geometry


def box_signed_distance(points: np.ndarray, size, pose) -> np.ndarray:
    """Exact signed distance (N,) of world points (N,3) to a solid box of ``size`` at ``pose`` (7,)."""
    local = ref.transform_points(ref.pose_inverse(np.asarray(pose, float)), np.asarray(points, float))
    q = np.abs(local) - 0.5 * np.asarray(size, float)
    outside = np.linalg.norm(np.maximum(q, 0.0), axis=1)
    inside = np.minimum(q.max(axis=1), 0.0)
    return outside + inside


def union_distance(points: np.ndarray, meshes: list, max_distance: float) -> tuple[np.ndarray, np.ndarray]:
    """Brute-force signed distance to the union of reference meshes, clamped at max_distance.

    Returns distance (N,) and gradient (N,3) (of the closest mesh; unspecified where clamped).
    """
    pts = np.asarray(points, float).reshape(-1, 3)
    best = np.full(len(pts), np.inf)
    grad = np.zeros((len(pts), 3))
    for m in meshes:
        if not m.enabled:
            continue
        sd, g = m.signed_distance_world(pts)
        closer = sd < best
        best[closer], grad[closer] = sd[closer], g[closer]
    return np.minimum(best, max_distance), grad


def quat_about_z(angle: float) -> np.ndarray:
    return np.array([np.cos(angle / 2), 0.0, 0.0, np.sin(angle / 2)])
