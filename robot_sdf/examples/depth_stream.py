"""A simulated depth camera on a node's camera topics (the perception demo and
bench/perception_bench.py), and the node's own account of them.

``DepthStream`` publishes sensor_msgs/CameraInfo and a 32FC1 sensor_msgs/Image on
``camera_0/depth/camera_info`` and ``camera_0/depth/image`` (nvblox's names) at a fixed rate on
a thread of its own, stamped with the system clock (the node's clock without sim time), in a
frame the node resolves (its ``static_transforms``).

``NodeDiagnostics`` reads the node's /diagnostics: frames fused, and per frame the time from its
stamp until the world answered with it. The node measures that itself because only it knows
which frames it fused: under load it keeps only the newest frame and drops the others, so a
client cannot tell which frame a new world revision came from.
"""
from __future__ import annotations

import array
import threading
import time
from typing import Callable

import numpy as np


def _stamp(msg, stamp_ns: int) -> None:
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp_ns), 1_000_000_000)


def camera_info_msg(camera, frame_id: str, stamp_ns: int):
    """sensor_msgs/CameraInfo of a SimulatedDepthCamera (K from its intrinsics, no distortion)."""
    from sensor_msgs.msg import CameraInfo

    fx, fy, cx, cy = camera.intrinsics
    msg = CameraInfo(width=camera.width, height=camera.height, distortion_model="plumb_bob")
    msg.header.frame_id = frame_id
    _stamp(msg, stamp_ns)
    msg.k = [fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0]
    msg.p = [fx, 0.0, cx, 0.0, 0.0, fy, cy, 0.0, 0.0, 0.0, 1.0, 0.0]
    return msg


def depth_image_msg(depth: np.ndarray, frame_id: str, stamp_ns: int):
    """sensor_msgs/Image, 32FC1 metres, of an (H, W) depth image (0: no return)."""
    from sensor_msgs.msg import Image

    data = np.ascontiguousarray(depth, dtype="<f4")
    msg = Image(height=data.shape[0], width=data.shape[1], encoding="32FC1", is_bigendian=0, step=data.shape[1] * 4)
    msg.header.frame_id = frame_id
    _stamp(msg, stamp_ns)
    msg.data = array.array("B", data.tobytes())
    return msg


class NodeDiagnostics:
    """The latest key values of the node's /diagnostics status (the node's own latency figures:
    perception_stamp_to_world_p50_ms, ..., perception_frames_fused), with their stamp."""

    def __init__(self, node) -> None:
        from diagnostic_msgs.msg import DiagnosticArray

        self.values: dict[str, str] = {}
        self.stamp_ns = -1
        self._lock = threading.Lock()
        self._subscription = node.create_subscription(DiagnosticArray, "/diagnostics", self._on_message, 10)

    def _on_message(self, msg) -> None:
        if not msg.status:
            return
        with self._lock:
            self.values = {kv.key: kv.value for kv in msg.status[0].values}
            self.stamp_ns = msg.header.stamp.sec * 1_000_000_000 + msg.header.stamp.nanosec

    def after(self, stamp_ns: int, timeout_s: float = 10.0) -> dict[str, str]:
        """The values of the first status stamped after ``stamp_ns`` (the node reads its counters
        after stamping), waiting for it up to ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                if self.stamp_ns > stamp_ns:
                    return dict(self.values)
            if time.monotonic() > deadline:
                raise RuntimeError(f"no diagnostics from the node within {timeout_s:.0f} s")
            time.sleep(0.05)


class DepthStream:
    """Publishes ``frame(stamp_ns)`` (an (H, W) depth image) with the camera's CameraInfo at
    ``rate_hz`` from a thread of its own (start / stop). ``node``: an rclpy node that something
    spins (SdfClient's)."""

    def __init__(self, node, camera, frame: Callable[[int], np.ndarray], frame_id: str, rate_hz: float) -> None:
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import CameraInfo, Image

        self.camera, self.frame, self.frame_id, self.rate_hz = camera, frame, frame_id, float(rate_hz)
        self.info_pub = node.create_publisher(CameraInfo, "camera_0/depth/camera_info", qos_profile_sensor_data)
        self.image_pub = node.create_publisher(Image, "camera_0/depth/image", qos_profile_sensor_data)
        self.published = 0
        self.late = 0  # frames that missed their slot (the thread was behind the rate)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def wait_for_node(self, timeout_s: float) -> None:
        """Until the node's subscriptions are matched (a frame published before is lost)."""
        deadline = time.monotonic() + timeout_s
        while min(self.info_pub.get_subscription_count(), self.image_pub.get_subscription_count()) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("no node subscribes to camera_0/depth/image and camera_info")
            time.sleep(0.02)

    def publish_one(self) -> int:
        """CameraInfo, then the frame, stamped now; returns the stamp [ns]."""
        stamp_ns = time.time_ns()
        depth = self.frame(stamp_ns)
        self.info_pub.publish(camera_info_msg(self.camera, self.frame_id, stamp_ns))
        self.image_pub.publish(depth_image_msg(depth, self.frame_id, stamp_ns))
        self.published += 1
        return stamp_ns

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="depth_stream", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10.0)
            self._thread = None

    def _run(self) -> None:
        period = 1.0 / self.rate_hz
        next_slot = time.monotonic()
        while not self._stop.is_set():
            self.publish_one()
            next_slot += period
            if next_slot < time.monotonic():  # behind: skip the missed slots instead of bursting
                self.late += 1
                next_slot = time.monotonic()
            self._stop.wait(max(0.0, next_slot - time.monotonic()))


def fuse_first_frame(stream: DepthStream, revision: Callable[[], int], resend_s: float = 2.0,
                     timeout_s: float = 120.0) -> int:
    """Publish single frames until the world shows one (the first may arrive before its
    CameraInfo, or while the node loads its kernels); returns the world revision then."""
    before = revision()
    deadline = time.monotonic() + timeout_s
    while True:
        stream.publish_one()
        resend = time.monotonic() + resend_s
        while time.monotonic() < resend:
            now = revision()
            if now != before:
                return now
            time.sleep(0.01)
        if time.monotonic() > deadline:
            raise RuntimeError(f"the node fused no depth frame within {timeout_s:.0f} s")
