"""The robot's own body, the ROS way, for removing it from depth frames: the URDF from
``/robot_description`` (std_msgs/String, as robot_state_publisher publishes it, transient_local),
the joints from ``/joint_states`` (sensor_msgs/JointState), robot_sdf's RobotModel with the fitted
spheres of ``robot_spheres_file`` (fit_spheres' YAML), and the pose of the URDF's root link in
world_frame from the node's frames at the frame's stamp. ``spheres_at(stamp)`` gives the world
spheres (n, 4) the camera inputs drop returns within (plus ``robot_padding``).
"""
from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import numpy as np
import torch
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import JointState
from std_msgs.msg import String

from robot_sdf.types import IDENTITY_POSE

DESCRIPTION_QOS = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)


class BodyUnknown(ValueError):
    """The robot's spheres cannot be placed for a frame (no description or joints yet, a missing
    transform): the frame is skipped."""


class RobotBody:
    """Subscriptions to the robot's description and joint states on ``node`` (module docstring)."""

    def __init__(self, node, frames, spheres_file: str, reject) -> None:
        self._frames = frames
        self._spheres_file = spheres_file
        self._reject = reject
        self._lock = threading.Lock()
        self._model = None
        self._root = None
        self._positions: dict[str, float] = {}
        self._subscriptions = [
            node.create_subscription(String, "/robot_description", self.on_description, DESCRIPTION_QOS),
            node.create_subscription(JointState, "/joint_states", self.on_joint_states, 10),
        ]

    def close(self, node) -> None:
        for sub in self._subscriptions:
            node.destroy_subscription(sub)
        self._subscriptions = []

    def on_description(self, msg: String) -> None:
        from robot_sdf.robot import RobotModel

        try:
            with tempfile.TemporaryDirectory(prefix="robot_sdf_urdf_") as folder:
                path = Path(folder) / "robot.urdf"
                path.write_text(msg.data)
                model = RobotModel(path, self._spheres_file, dtype=torch.float64)
            root = model.urdf.get_root()
        except Exception as exc:  # noqa: BLE001 - any bad description is an input error, not a crash
            self._reject("/robot_description", f"cannot build the robot model: {type(exc).__name__}: {exc}")
            return
        with self._lock:
            self._model, self._root = model, root

    def on_joint_states(self, msg: JointState) -> None:
        if len(msg.position) != len(msg.name) or not np.isfinite(np.asarray(msg.position, np.float64)).all():
            self._reject("/joint_states", "names and positions differ in number, or a position is not finite")
            return
        with self._lock:
            self._positions.update(zip(msg.name, (float(p) for p in msg.position)))

    def spheres_at(self, stamp_ns: int) -> np.ndarray:
        """World spheres (n, 4) of the robot at the last joint states, its root link placed at
        ``stamp_ns``. BodyUnknown (a ValueError) when they cannot be placed."""
        with self._lock:
            model, root, positions = self._model, self._root, dict(self._positions)
        if model is None:
            raise BodyUnknown("no /robot_description received yet (the robot cannot be removed)")
        missing = [j.name for j in model.joints if j.name not in positions]
        if missing:
            raise BodyUnknown(f"no /joint_states yet for {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}")
        base = self._frames.pose_in_world(root, stamp_ns, IDENTITY_POSE)
        q = torch.tensor([positions[j.name] for j in model.joints], dtype=torch.float64)
        with torch.no_grad():
            return model.spheres(q, torch.tensor(base, dtype=torch.float64)).numpy()
