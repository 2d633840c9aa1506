"""ScenePublisher: a producer's side of ``~/mesh_obstacles`` that survives node restarts.

transient_local hands a late-joining node the last N messages of each publisher, not the last
state of each obstacle: after more than N messages the early obstacles are gone from the
history. A ScenePublisher keeps the latest state per obstacle (geometry, pose, enable flag) and
re-sends the whole scene whenever a new subscriber matches (a node started or restarted), and
once more a second later, so a node that appears at any time ends with this producer's scene.

Every message is stamped. sdf_server skips a stamped message older than the last one it
applied for the same id, so re-sent or replayed messages never roll an obstacle back, and a
node restored from its state_dir does not redo work it already has.

Usage (an rclpy node ``node``):

    scene = ScenePublisher(node)                        # topic /sdf_server/mesh_obstacles
    scene.add("table", vertices, triangles, pose)       # (V,3) m, (T,3), (7,) x,y,z,qw,qx,qy,qz
    scene.move("table", new_pose)
    scene.disable("table"); scene.enable("table")
    scene.remove("table")
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rclpy.node import Node

from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, array_to_pose, make_mesh_obstacle
from robot_sdf_interfaces.msg import MeshObstacle

DEFAULT_TOPIC = "/sdf_server/mesh_obstacles"
_SECOND_RESEND_S = 1.0


@dataclass
class _Obstacle:
    add: MeshObstacle  # the latest ADD, its pose and stamp kept current by MOVEs
    enabled: bool


class ScenePublisher:
    """Publishes MeshObstacle updates and re-sends the scene to every newly matched subscriber.

    node: the producer's rclpy node; topic: the node's ``~/mesh_obstacles``; frame_id: the
    server's world_frame; poll_period_s: how often the matched-subscriber count is checked
    (a rise re-sends the scene).
    """

    def __init__(self, node: Node, topic: str = DEFAULT_TOPIC, frame_id: str = "world",
                 poll_period_s: float = 0.2) -> None:
        self._node = node
        self._frame = frame_id
        self._lock = threading.RLock()
        self._scene: dict[tuple[int, str], _Obstacle] = {}
        self._publisher = node.create_publisher(MeshObstacle, topic, MESH_OBSTACLE_QOS)
        self._matched = 0
        self._resend_at: float | None = None
        self.resends = 0
        self._timer = node.create_timer(poll_period_s, self._check_matches)

    # -------------------------------------------------------------- updates
    def add(self, id: str, vertices, triangles, pose=None, env: int = 0) -> None:
        """Add or replace an obstacle (an ADD of the same triangles refits on the node)."""
        msg = make_mesh_obstacle(id, vertices, triangles, pose, env=env, frame_id=self._frame,
                                 stamp=self._now())
        with self._lock:
            old = self._scene.get((int(env), id))
            self._scene[(int(env), id)] = _Obstacle(msg, old.enabled if old else True)
            self._publisher.publish(msg)

    def move(self, id: str, pose, env: int = 0) -> None:
        self._send(id, env, MeshObstacle.MOVE, pose)

    def enable(self, id: str, env: int = 0) -> None:
        self._send(id, env, MeshObstacle.ENABLE)

    def disable(self, id: str, env: int = 0) -> None:
        self._send(id, env, MeshObstacle.DISABLE)

    def remove(self, id: str, env: int = 0) -> None:
        self._send(id, env, MeshObstacle.REMOVE)

    def ids(self) -> list[tuple[int, str]]:
        """(env, id) of every obstacle this publisher holds."""
        with self._lock:
            return sorted(self._scene)

    def resend(self) -> None:
        """Publish the whole scene again: per obstacle its ADD (current pose) and, if disabled,
        a DISABLE, both with the obstacle's latest stamp."""
        with self._lock:
            for entry in self._scene.values():
                self._publisher.publish(entry.add)
                if not entry.enabled:
                    self._publisher.publish(self._message(entry.add.id, entry.add.env, MeshObstacle.DISABLE,
                                                          stamp=entry.add.header.stamp))
            self.resends += 1

    def destroy(self) -> None:
        self._node.destroy_timer(self._timer)
        self._node.destroy_publisher(self._publisher)

    # -------------------------------------------------------------- internals
    def _now(self):
        return self._node.get_clock().now().to_msg()

    def _message(self, id: str, env: int, operation: int, pose=None, stamp=None) -> MeshObstacle:
        return make_mesh_obstacle(id, None, None, pose, env=env, operation=operation, frame_id=self._frame,
                                  stamp=stamp if stamp is not None else self._now())

    def _send(self, id: str, env: int, operation: int, pose=None) -> None:
        key = (int(env), id)
        with self._lock:
            entry = self._scene.get(key)
            if entry is None:
                raise KeyError(f"no obstacle {id!r} in env {env} was added through this ScenePublisher")
            msg = self._message(id, env, operation, pose)
            if operation == MeshObstacle.REMOVE:
                del self._scene[key]
            else:
                entry.add.header.stamp = msg.header.stamp  # a re-send carries the latest stamp
                if operation == MeshObstacle.MOVE:
                    entry.add.pose = array_to_pose(pose)
                else:
                    entry.enabled = operation == MeshObstacle.ENABLE
            self._publisher.publish(msg)

    def _check_matches(self) -> None:
        count = self._publisher.get_subscription_count()
        now = time.monotonic()
        with self._lock:
            grew = count > self._matched
            self._matched = count
            # The writer sees a new reader before that reader has matched the writer; what is sent
            # in between arrives only through transient_local (the last 100 messages). A second
            # re-send a moment later covers a scene larger than that; stamped duplicates cost
            # the node no rebuild (same content).
            again = self._resend_at is not None and now >= self._resend_at
            if grew:
                self._resend_at = now + _SECOND_RESEND_S
            elif again:
                self._resend_at = None
        if (grew or again) and self._scene:
            self.resend()


__all__ = ["DEFAULT_TOPIC", "ScenePublisher"]
