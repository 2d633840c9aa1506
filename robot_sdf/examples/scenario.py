"""The demo scenario: scene obstacles (robot_sdf.scene) plus the ``demo:`` section of the same file.

The scene loader and the node only read ``frame`` and ``obstacles``; the ``demo:`` mapping adds
what only the demo needs (start, goal, and the motion of the moving obstacles)::

    demo:
      start: [x, y, yaw]          # m, m, rad
      goal: [x, y]                # m
      goal_tolerance: 0.1         # m
      moving:
        - id: slider              # an obstacle of the list above
          axis: [0.0, 1.0, 0.0]   # direction of travel (normalised here)
          amplitude: 0.9          # m: pose = base pose + amplitude * sin(2 pi t / period + phase) * axis
          period: 10.0            # s
          phase: 0.0              # rad

Motion is a pure function of the demo's simulated time, so runs are reproducible and the ROS and
in-process paths move the obstacle identically.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from robot_sdf.scene import ObstacleSpec, load_scene


@dataclass(frozen=True)
class MovingObstacle:
    """Sinusoidal translation of one scene obstacle around its scene pose."""

    id: str
    base_pose: np.ndarray  # (7,) scene pose
    axis: np.ndarray  # (3,) unit
    amplitude: float  # m
    period: float  # s
    phase: float  # rad
    env: int = 0

    def pose(self, t: float) -> np.ndarray:
        """(7,) x, y, z, qw, qx, qy, qz at simulated time t [s]."""
        pose = np.array(self.base_pose, dtype=np.float64)
        pose[:3] += self.amplitude * math.sin(2.0 * math.pi * t / self.period + self.phase) * self.axis
        return pose


@dataclass
class Scenario:
    """Everything the demo needs to know about the world file."""

    path: Path
    frame: str
    obstacles: list[ObstacleSpec]
    start: np.ndarray  # (3,) x, y, yaw
    goal: np.ndarray  # (2,) x, y
    goal_tolerance: float
    moving: list[MovingObstacle] = field(default_factory=list)

    def obstacle(self, oid: str) -> ObstacleSpec:
        for spec in self.obstacles:
            if spec.id == oid:
                return spec
        raise KeyError(oid)

    def poses_at(self, t: float) -> dict[str, np.ndarray]:
        """Pose (7,) of every moving obstacle at simulated time t [s]."""
        return {m.id: m.pose(t) for m in self.moving}

    def bounds(self, margin: float = 0.3) -> tuple[float, float, float, float]:
        """xmin, xmax, ymin, ymax [m] of all obstacles (over their whole motion), start and goal."""
        pts = [self.start[None, :2], self.goal[None, :2]]
        moving = {m.id: m for m in self.moving}
        for spec in self.obstacles:
            poses = [spec.pose]
            if spec.id in moving:
                m = moving[spec.id]
                poses = [m.pose(m.period * k / 4.0) for k in range(4)]
            for pose in poses:
                pts.append(transform(pose, spec.vertices)[:, :2])
        allp = np.concatenate(pts)
        lo, hi = allp.min(axis=0) - margin, allp.max(axis=0) + margin
        return float(lo[0]), float(hi[0]), float(lo[1]), float(hi[1])


def quat_matrix(q) -> np.ndarray:
    """Rotation matrix (3,3) of a quaternion w, x, y, z."""
    w, x, y, z = np.asarray(q, dtype=np.float64) / np.linalg.norm(q)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                     [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                     [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])


def transform(pose, points: np.ndarray) -> np.ndarray:
    """Points (N,3) of a mesh frame -> world frame, pose (7,) x, y, z, qw, qx, qy, qz."""
    pose = np.asarray(pose, dtype=np.float64)
    return np.asarray(points, dtype=np.float64) @ quat_matrix(pose[3:]).T + pose[:3]


def _vector(value, n: int, what: str) -> np.ndarray:
    a = np.asarray(value, dtype=np.float64).reshape(-1)
    if a.shape != (n,) or not np.all(np.isfinite(a)):
        raise ValueError(f"demo.{what} must be {n} finite numbers, got {value!r}")
    return a


def load_scenario(path: str | Path) -> Scenario:
    """Read obstacles and the ``demo:`` section; ValueError names what is wrong."""
    p = Path(path)
    specs = load_scene(p)
    data = yaml.safe_load(p.read_text()) or {}
    demo = data.get("demo")
    if not isinstance(demo, dict):
        raise ValueError(f"{p}: no 'demo:' section (start, goal, moving) for the MPC demo")
    start = _vector(demo.get("start"), 3, "start")
    goal = _vector(demo.get("goal"), 2, "goal")
    tol = float(demo.get("goal_tolerance", 0.1))
    if not tol > 0:
        raise ValueError(f"{p}: demo.goal_tolerance must be > 0, got {tol}")
    moving = parse_moving(demo.get("moving"), specs, f"{p}: demo")
    return Scenario(p, str(data.get("frame", "world")), specs, start, goal, tol, moving)


def parse_moving(entries, specs: list[ObstacleSpec], where: str) -> list[MovingObstacle]:
    """MovingObstacle list of a ``moving:`` list (format in the module doc) over scene ``specs``;
    ValueError names the entry (``where`` prefixes the message)."""
    ids = {s.id: s for s in specs}
    moving = []
    for i, entry in enumerate(entries or []):
        oid = entry.get("id") if isinstance(entry, dict) else None
        if oid not in ids:
            raise ValueError(f"{where}.moving[{i}] names unknown obstacle {oid!r}")
        axis = _vector(entry.get("axis", [0.0, 1.0, 0.0]), 3, f"moving[{i}].axis")
        if np.linalg.norm(axis) == 0:
            raise ValueError(f"{where}.moving[{i}].axis must not be zero")
        period = float(entry.get("period", 10.0))
        if not period > 0:
            raise ValueError(f"{where}.moving[{i}].period must be > 0")
        moving.append(MovingObstacle(oid, ids[oid].pose.copy(), axis / np.linalg.norm(axis),
                                     float(entry.get("amplitude", 0.5)), period,
                                     float(entry.get("phase", 0.0)), ids[oid].env))
    return moving
