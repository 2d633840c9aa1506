"""Depth cameras and a lidar into the node's world, with nvblox's topic names: ``pointcloud``
(sensor_msgs/PointCloud2 with float32 x, y, z, organised or not; with use_lidar), and per camera i (num_cameras),
``camera_<i>/depth/image`` (sensor_msgs/Image, 32FC1 metres or 16UC1 millimetres; 0 and NaN are
no return) and ``camera_<i>/depth/camera_info`` (sensor_msgs/CameraInfo), relative to the node's
namespace so that a launch file remaps them as it remaps nvblox's. The camera's pose is that of
header.frame_id in world_frame at the image's stamp (the node's FrameResolver: tf2 or the
built-in buffer, sim time, bag loops). Each frame is fused into robot_sdf.perception.DepthFusion,
whose surface is the world mesh ``perceived`` of environment 0. With ``robot_spheres_file`` the
robot's own body is removed from each frame first (robot_sdf.ros.robot_body: /robot_description,
/joint_states, its fitted spheres padded by ``robot_padding``).

A frame that cannot be used (no camera_info yet, another size than its camera_info, an encoding
other than 32FC1/16UC1, a short data buffer, a frame without a transform at its stamp) is
skipped whole: a diagnostics entry and a log line, the world as it was. The diagnostics also
carry the frames fused, and per frame the time from its stamp until the world answered with it
(queries that start from then on see the frame) and the time its fusion took.
"""
from __future__ import annotations

import time

import numpy as np
from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from rclpy.qos import QoSProfile, qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image, PointCloud2

from robot_sdf.geometry import transform_points
from robot_sdf.perception.fusion import PERCEIVED_MESH, DepthFusion
from robot_sdf.ros.frames import FrameError, TransformPending
from robot_sdf.ros.robot_body import RobotBody
from robot_sdf.ros.update_queue import LatencyWindow
from robot_sdf.types import IDENTITY_POSE

# Sensor-data QoS (best effort) keeping only the newest message: a node slower than its sensors
# fuses the newest frame instead of working off a backlog. With sensor-data's 5 frames queued, a
# 320x240 stream at 15 Hz on a loaded 2-core CPU (fusion about 70 ms) reached the world 370 ms
# after its stamp (p50); a frame behind a newer one only delays what the robot sees.
NEWEST_FRAME_QOS = QoSProfile(depth=1, reliability=qos_profile_sensor_data.reliability,
                              durability=qos_profile_sensor_data.durability, history=qos_profile_sensor_data.history)

# encoding -> (numpy dtype, metres per unit)
DEPTH_ENCODINGS = {"32FC1": (np.float32, 1.0), "16UC1": (np.uint16, 1.0e-3)}


def depth_image(msg: Image) -> np.ndarray:
    """(H, W) float32 metres of a depth Image; ValueError naming what is wrong."""
    if msg.encoding not in DEPTH_ENCODINGS:
        raise ValueError(f"encoding '{msg.encoding}' is not a depth encoding (32FC1 metres or 16UC1 millimetres)")
    dtype, scale = DEPTH_ENCODINGS[msg.encoding]
    item = np.dtype(dtype).itemsize
    height, width, step = int(msg.height), int(msg.width), int(msg.step)
    if height == 0 or width == 0 or step < width * item or len(msg.data) < step * height:
        raise ValueError(f"image of {width}x{height}, step {step}, holds {len(msg.data)} bytes: too few")
    raw = np.frombuffer(msg.data, dtype=np.uint8, count=step * height).reshape(height, step)
    values = raw[:, :width * item].copy().view(np.dtype(dtype).newbyteorder(">" if msg.is_bigendian else "<"))
    return values.astype(np.float32) * np.float32(scale)


_FLOAT32 = 7  # sensor_msgs/PointField.FLOAT32


def cloud_points(msg: PointCloud2) -> np.ndarray:
    """(N, 3) float32 x, y, z of a PointCloud2 (organised or not; NaN rows kept: no return);
    ValueError when it has no float32 x, y and z fields or too few bytes."""
    fields = {f.name: f for f in msg.fields}
    missing = [n for n in "xyz" if n not in fields or fields[n].datatype != _FLOAT32 or fields[n].count != 1]
    if missing:
        raise ValueError(f"point cloud lacks float32 field(s) {', '.join(missing)}")
    count, step = int(msg.width) * int(msg.height), int(msg.point_step)
    if count == 0:
        return np.zeros((0, 3), np.float32)
    offsets = [int(fields[n].offset) for n in "xyz"]
    if step < 4 or max(offsets) + 4 > step or int(msg.row_step) < int(msg.width) * step \
            or len(msg.data) < int(msg.row_step) * int(msg.height):
        raise ValueError(f"point cloud of {msg.width}x{msg.height} points, point_step {step}, row_step "
                         f"{msg.row_step}, holds {len(msg.data)} bytes: inconsistent")
    rows = np.frombuffer(msg.data, dtype=np.uint8, count=int(msg.row_step) * int(msg.height))
    rows = rows.reshape(int(msg.height), int(msg.row_step))[:, :int(msg.width) * step].reshape(count, step)
    order = ">" if msg.is_bigendian else "<"
    return np.stack([rows[:, o:o + 4].copy().view(order + "f4").reshape(-1) for o in offsets], 1).astype(np.float32)


def intrinsics(msg: CameraInfo) -> tuple[float, float, float, float]:
    """(fx, fy, cx, cy) of a CameraInfo's K; ValueError when they are not usable."""
    k = np.asarray(msg.k, dtype=np.float64)
    fx, fy, cx, cy = float(k[0]), float(k[4]), float(k[2]), float(k[5])
    if not np.isfinite([fx, fy, cx, cy]).all() or fx <= 0 or fy <= 0 or msg.width == 0 or msg.height == 0:
        raise ValueError(f"camera_info K gives fx={fx}, fy={fy}, cx={cx}, cy={cy} for {msg.width}x{msg.height}")
    return fx, fy, cx, cy


class CameraInputs:
    """The subscriptions of num_cameras depth cameras on ``node`` and their fusion (module docstring)."""

    def __init__(self, node, world, config, frames, reject) -> None:
        self._frames = frames
        self._reject = reject  # (what, why): the node's rejection path (log + diagnostics)
        self.fusion = DepthFusion(world, config.perception_workspace_lower, config.perception_workspace_upper,
                                  name=PERCEIVED_MESH, voxel_size=config.voxel_size,
                                  max_weight=config.perception_max_weight, unobserved=config.perception_unobserved)
        self._info: list[tuple | None] = [None] * config.num_cameras
        self.frames_fused = 0
        self._stamp_to_world = LatencyWindow()  # a frame's stamp -> the world answering with it
        self._fuse_time = LatencyWindow()  # its integration, surface and world update
        self._padding = config.robot_padding
        self._body = RobotBody(node, frames, config.robot_spheres_file, reject) if config.robot_spheres_file else None
        group = MutuallyExclusiveCallbackGroup()  # one frame at a time into the field
        self._subscriptions = []
        if config.use_lidar:
            self._subscriptions.append(node.create_subscription(
                PointCloud2, "pointcloud", self.on_pointcloud, NEWEST_FRAME_QOS, callback_group=group))
        for i in range(config.num_cameras):
            self._subscriptions.append(node.create_subscription(
                CameraInfo, f"camera_{i}/depth/camera_info", lambda msg, i=i: self.on_camera_info(i, msg),
                NEWEST_FRAME_QOS, callback_group=group))
            self._subscriptions.append(node.create_subscription(
                Image, f"camera_{i}/depth/image", lambda msg, i=i: self.on_depth(i, msg),
                NEWEST_FRAME_QOS, callback_group=group))

    def close(self, node) -> None:
        for sub in self._subscriptions:
            node.destroy_subscription(sub)
        self._subscriptions = []
        if self._body is not None:
            self._body.close(node)

    def on_pointcloud(self, msg: PointCloud2) -> None:
        """A scan of the lidar: its returns and its origin brought into the world, fused."""
        try:
            points = cloud_points(msg)
            stamp_ns = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
            pose = self._frames.pose_in_world(msg.header.frame_id, stamp_ns, IDENTITY_POSE)
        except (ValueError, FrameError, TransformPending) as exc:
            self._reject("pointcloud", str(exc))
            return
        started = time.time()
        self.fusion.add_points(transform_points(pose, points), pose[:3])
        self._fused(stamp_ns, started)

    def on_camera_info(self, i: int, msg: CameraInfo) -> None:
        try:
            self._info[i] = (intrinsics(msg), int(msg.width), int(msg.height))
        except (ValueError, IndexError) as exc:
            self._reject(f"camera_{i}/depth/camera_info", str(exc))

    def on_depth(self, i: int, msg: Image) -> None:
        what = f"camera_{i}/depth/image"
        info = self._info[i]
        if info is None:
            self._reject(what, "no camera_info received yet for this camera")
            return
        k, width, height = info
        if (int(msg.width), int(msg.height)) != (width, height):
            self._reject(what, f"image is {msg.width}x{msg.height}, its camera_info {width}x{height}")
            return
        try:
            depth = depth_image(msg)
            stamp_ns = int(msg.header.stamp.sec) * 1_000_000_000 + int(msg.header.stamp.nanosec)
            pose = self._frames.pose_in_world(msg.header.frame_id, stamp_ns, IDENTITY_POSE)
            body = None if self._body is None else self._body.spheres_at(stamp_ns)
        except (ValueError, FrameError, TransformPending) as exc:
            self._reject(what, str(exc))
            return
        started = time.time()
        self.fusion.add_depth(depth, k, pose, body, self._padding)
        self._fused(stamp_ns, started)

    def _fused(self, stamp_ns: int, started: float) -> None:
        now = time.time()  # the stamps' clock (sim time aside: there the latency means nothing)
        self.frames_fused += 1
        self._stamp_to_world.record(now - stamp_ns * 1e-9)
        self._fuse_time.record(now - started)

    def diagnostics(self) -> dict[str, str]:
        """Frames fused; stamp -> world answering and fusion time percentiles [ms] (recent frames)."""
        p50, p99, worst = self._stamp_to_world.percentiles()
        f50, f99, f_worst = self._fuse_time.percentiles()
        return {"perception_frames_fused": str(self.frames_fused),
                "perception_stamp_to_world_p50_ms": f"{1e3 * p50:.3f}",
                "perception_stamp_to_world_p99_ms": f"{1e3 * p99:.3f}",
                "perception_stamp_to_world_max_ms": f"{1e3 * worst:.3f}",
                "perception_fuse_p50_ms": f"{1e3 * f50:.3f}", "perception_fuse_p99_ms": f"{1e3 * f99:.3f}",
                "perception_fuse_max_ms": f"{1e3 * f_worst:.3f}"}
