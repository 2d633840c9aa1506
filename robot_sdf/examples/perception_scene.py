"""The world of the perception demo (robot_sdf.examples.perception_demo), as only a depth camera
knows it: a table in front of a Franka Panda, two manufacturers' robot parts from rtb-data lying
on it (a Unimation Puma 560 link and a KUKA KR120 link, scaled to 30 and 25 cm) and a box that
slides across the table through the arm's way. The camera stands behind and above the robot and
looks down at the table (the demo's camera does not render the arm: see docs/perception.md).

Also the exact distances to these meshes (``Truth``), which the demo measures the node against
and which referees the arm's clearance, and the depth frames the camera takes of them at time t:
the static meshes are ray-cast once, the box each frame, so a frame costs a 12-triangle BVH.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from robot_sdf.perception.simulated_camera import (SimulatedDepthCamera, add_sensor_error, look_at, merge_meshes,
                                                   nearest_return)

# rtb-data files (closed meshes, so exact signed distances exist), the size they are scaled to
# [m], where they lie on the table (x, y) and their turn about z [rad].
PARTS = (("xacro/unimation_puma560_description/meshes/puma560_link3.dae", 0.30, (0.88, 0.42), 0.4),
         ("xacro/kuka_description/kuka_kr120/meshes/kr120r2500pro/collision/link_5.stl", 0.25, (0.88, -0.42), -0.3))
TABLE_SIZE, TABLE_CENTRE = (0.8, 1.4, 0.04), (0.65, 0.0, -0.02)  # top face at z = 0, as config/arm_world.yaml
BOX_SIZE = (0.10, 0.14, 0.32)  # as tall as config/arm_world.yaml's crate, which the hand's straight sweep hits
BOX_X = 0.5  # where the box slides along y: the hand's sweep from start to goal crosses it
BOX_Y_RANGE = (-0.45, 0.35)  # its two turning points [m]
BOX_PERIOD_S = 8.0  # there and back, on the controller's clock
# The Panda's start and goal (config/arm_world.yaml's): the hand sweeps from y = +0.4 to -0.4.
START = (1.0, 0.35, 0.0, -2.0, 0.0, 2.35, 0.785)
GOAL = (-1.0, 0.35, 0.0, -2.0, 0.0, 2.35, 0.785)
CAMERA_POSE = look_at([-0.4, 0.0, 1.2], [0.55, 0.0, 0.1])  # optical frame in the world
CAMERA_FRAME = "camera_depth_optical_frame"
# The box the node fuses depth in: the table and what stands on it, not the robot's base.
WORKSPACE_LOWER, WORKSPACE_UPPER = (0.15, -0.72, -0.06), (1.1, 0.72, 0.6)


def box_pose(t: float) -> np.ndarray:
    """Pose (7,) of the sliding box at time t [s] since it started (before: at its first turning point)."""
    lo, hi = BOX_Y_RANGE
    phase = 0.5 - 0.5 * math.cos(2.0 * math.pi * max(t, 0.0) / BOX_PERIOD_S)
    return np.array([BOX_X, lo + (hi - lo) * phase, BOX_SIZE[2] / 2, 1.0, 0.0, 0.0, 0.0])


def _part(path: str, size: float, spot, turn: float) -> tuple[np.ndarray, np.ndarray]:
    """An rtb-data mesh scaled to ``size`` across, turned about z, lying on the table at ``spot``."""
    from robot_sdf.examples.panda import description_dir
    from robot_sdf.io import load_mesh

    vertices, triangles = load_mesh(description_dir().parents[1] / path)
    v = vertices.astype(np.float64)
    v = (v - v.mean(axis=0)) * (size / np.ptp(v, axis=0).max())
    c, s = math.cos(turn), math.sin(turn)
    v = v @ np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]]).T
    return v + [spot[0], spot[1], -v[:, 2].min()], triangles.astype(np.int64)


def static_parts() -> list[tuple[np.ndarray, np.ndarray]]:
    """The meshes that never move, world frame: the table and the two robot parts on it."""
    from robot_sdf.io import box_mesh

    v, t = box_mesh(TABLE_SIZE)
    return [(v.astype(np.float64) + TABLE_CENTRE, t.astype(np.int64))] + [_part(*p) for p in PARTS]


def box_mesh_local() -> tuple[np.ndarray, np.ndarray]:
    from robot_sdf.io import box_mesh

    v, t = box_mesh(BOX_SIZE)
    return v.astype(np.float64), t.astype(np.int64)


class Truth:
    """Exact signed distances to the true meshes (winding-number sign), the box at a given pose."""

    def __init__(self, parts: list[tuple[np.ndarray, np.ndarray]]) -> None:
        from robot_sdf import MeshWorld

        self.world = MeshWorld(device="cpu", max_distance=2.0, sign_method="winding_number")
        for k, (v, t) in enumerate(parts):
            self.world.add_mesh(f"part_{k}", v, t)
        self.world.add_mesh("box", *box_mesh_local(), box_pose(0.0))

    def signed_distance(self, points: np.ndarray, box: np.ndarray) -> np.ndarray:
        """(n,) exact signed distance [m] of world points (n, 3) with the box at pose ``box``."""
        self.world.set_pose("box", box)
        d, _ = self.world.signed_distance(torch.as_tensor(points, dtype=torch.float32), 0, 2.0)
        return d.cpu().numpy().astype(np.float64)


@dataclass
class DepthCameraScene:
    """Frames of the demo's camera: ``frame(t, rng)`` is the noisy depth image at box time t."""

    camera: SimulatedDepthCamera
    static_depth: np.ndarray
    box: tuple[np.ndarray, np.ndarray]

    @classmethod
    def build(cls, parts, width: int = 320, height: int = 240) -> "DepthCameraScene":
        camera = SimulatedDepthCamera(width, height, 0.9 * width, 0.9 * width)
        return cls(camera, camera.render(*merge_meshes(parts), CAMERA_POSE), box_mesh_local())

    def exact(self, t: float) -> np.ndarray:
        """The depth image without the sensor's error (what the camera could see)."""
        from robot_sdf.geometry import transform_points

        v, tri = self.box
        box = self.camera.render(transform_points(box_pose(t), v), tri, CAMERA_POSE)
        return nearest_return(self.static_depth, box)

    def frame(self, t: float, rng: np.random.Generator) -> np.ndarray:
        return add_sensor_error(self.exact(t), rng)

    def seen(self, points: np.ndarray, t: float, behind: float) -> np.ndarray:
        """(n,) bool: the points in the camera's view in front of the first surface it sees, or
        at most ``behind`` [m] behind it (the rest the camera never observed)."""
        from robot_sdf.geometry import pose_inverse, transform_points

        local = transform_points(pose_inverse(CAMERA_POSE), points)
        fx, fy, cx, cy = self.camera.intrinsics
        z = np.maximum(local[:, 2], 1e-9)
        u, v = np.round(fx * local[:, 0] / z + cx).astype(int), np.round(fy * local[:, 1] / z + cy).astype(int)
        inside = (local[:, 2] > 0) & (u >= 0) & (v >= 0) & (u < self.camera.width) & (v < self.camera.height)
        depth = self.exact(t)
        surface = np.where(inside, depth[v.clip(0, self.camera.height - 1), u.clip(0, self.camera.width - 1)], 0.0)
        return inside & ((surface == 0) | (local[:, 2] <= surface + behind))

