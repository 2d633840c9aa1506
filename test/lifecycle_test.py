"""sdf_server_managed over real rclpy: lifecycle transitions through the lifecycle_msgs services.

configure builds the world and loads the scene (no services yet), activate opens services and
subscriptions, deactivate closes them and keeps the world, cleanup releases it, a failing
configure leaves the node unconfigured with the reason logged, shutdown finalizes.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
import yaml
from lifecycle_msgs.msg import State, Transition
from lifecycle_msgs.srv import ChangeState, GetState

import reference as ref
import ros_helpers as rh
from robot_sdf.ros.conversions import make_mesh_obstacle
from robot_sdf_interfaces.msg import MeshObstacle
from robot_sdf_interfaces.srv import QuerySignedDistance

DOMAIN = rh.domain_id(83)
BOX = (0.4, 0.4, 0.4)
SCENE_POSE = [0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0]
TOPIC_POSE = [3.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0]


class Managed:
    def __init__(self, tmp, params: dict) -> None:
        params_file = rh.write_params(tmp / "params.yaml", params)
        self.proc = rh.ServerProcess(params_file, tmp / "managed.log", rh.ros_env(DOMAIN), cwd=rh.REPO,
                                     executable=[sys.executable, "-m", "robot_sdf.ros.lifecycle"])
        self.harness = rh.RosHarness(DOMAIN, "lifecycle_test")
        h = self.harness
        self.change = h.client(ChangeState, "/sdf_server/change_state")
        self.get = h.client(GetState, "/sdf_server/get_state")
        self.sd = h.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        self.mesh_pub = h.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
        rh.wait_for_services(self.proc, [self.change, self.get])

    def state(self) -> int:
        return self.harness.call(self.get, GetState.Request()).current_state.id

    def transition(self, transition_id: int) -> bool:
        return self.harness.call(self.change, ChangeState.Request(transition=Transition(id=transition_id)),
                                 timeout=60.0).success

    def services_up(self) -> bool:
        return self.sd.service_is_ready()

    def distance(self, points) -> np.ndarray:
        return self.query(points)[0]

    def query(self, points) -> tuple[np.ndarray, int]:
        return self.harness.signed_distance(self.sd, points)

    def close(self) -> int:
        self.harness.close()
        return self.proc.stop()


def _scene(tmp) -> str:
    path = tmp / "scene.yaml"
    path.write_text(yaml.safe_dump({"frame": "world", "obstacles": [
        {"id": "scene_box", "primitive": {"type": "box", "size": list(BOX)}, "pose": SCENE_POSE}]}))
    return str(path)


def test_transitions_over_lifecycle_services(tmp_path):
    node = Managed(tmp_path, dict(device="cpu", scene_file=_scene(tmp_path), marker_rate_hz=0.0,
                                  slice_rate_hz=0.0, diagnostics_rate_hz=0.0))
    probes = np.array([[0.0, 0.0, 0.5], [0.5, 0.0, 0.5], [3.0, 0.0, 0.5], [3.3, 0.0, 0.5]])
    scene_d = rh.box_signed_distance(probes, BOX, SCENE_POSE)
    both_d = np.minimum(scene_d, rh.box_signed_distance(probes, BOX, TOPIC_POSE))
    try:
        assert node.state() == State.PRIMARY_STATE_UNCONFIGURED
        assert not node.sd.wait_for_service(timeout_sec=1.0)

        assert node.transition(Transition.TRANSITION_CONFIGURE)
        assert node.state() == State.PRIMARY_STATE_INACTIVE
        assert "configured: device=cpu, 1 scene obstacles" in node.proc.log()
        assert not node.sd.wait_for_service(timeout_sec=1.0)  # inactive: no services
        assert node.mesh_pub.get_subscription_count() == 0  # nor subscriptions

        assert node.transition(Transition.TRANSITION_ACTIVATE)
        assert node.state() == State.PRIMARY_STATE_ACTIVE
        rh.wait_for_services(node.proc, [node.sd])
        np.testing.assert_allclose(node.distance(probes), np.minimum(scene_d, 1.0), atol=1e-4)
        rh.wait_for_matched(node.mesh_pub)
        v, t = ref.box(BOX)
        node.mesh_pub.publish(make_mesh_obstacle("topic_box", v, t, TOPIC_POSE))
        rh.wait_until(lambda: np.allclose(node.distance(probes), np.minimum(both_d, 1.0), atol=1e-4), 60.0,
                      what="the topic mesh")
        assert node.query(probes)[1] == 2  # scene (1), topic_box (2)

        assert node.transition(Transition.TRANSITION_DEACTIVATE)
        assert node.state() == State.PRIMARY_STATE_INACTIVE
        rh.wait_until(lambda: not node.services_up(), 60.0, what="the services to close")
        rh.wait_until(lambda: node.mesh_pub.get_subscription_count() == 0, 60.0, what="the subscription to close")

        # the world survives deactivate/activate: the new subscription gets topic_box again from
        # the transient_local topic, which replaces it in the kept world (revision 2 -> 3)
        assert node.transition(Transition.TRANSITION_ACTIVATE)
        rh.wait_for_services(node.proc, [node.sd])
        rh.wait_until(lambda: node.query(probes)[1] == 3, 60.0, what="revision 3 of the kept world")
        np.testing.assert_allclose(node.distance(probes), np.minimum(both_d, 1.0), atol=1e-4)

        assert node.transition(Transition.TRANSITION_DEACTIVATE)
        assert node.transition(Transition.TRANSITION_CLEANUP)
        assert node.state() == State.PRIMARY_STATE_UNCONFIGURED
        # configure again: the scene is loaded anew (the topic mesh is gone with the old world,
        # and comes back from the transient_local topic once activated)
        assert node.transition(Transition.TRANSITION_CONFIGURE)
        assert node.transition(Transition.TRANSITION_ACTIVATE)
        rh.wait_for_services(node.proc, [node.sd])
        rh.wait_until(lambda: np.allclose(node.distance(probes), np.minimum(both_d, 1.0), atol=1e-4), 60.0,
                      what="the scene and the re-delivered topic mesh")
        assert node.query(probes)[1] == 2  # a new world: scene (1), topic_box (2)

        assert node.transition(Transition.TRANSITION_ACTIVE_SHUTDOWN)
        assert node.state() == State.PRIMARY_STATE_FINALIZED
    finally:
        code = node.close()
    assert code == 0, node.proc.log()


def test_failed_configure_stays_unconfigured_with_the_reason(tmp_path, capfd):
    """In-process (the transition machinery is rclpy's; the services were exercised above)."""
    import rclpy
    from rclpy.lifecycle import TransitionCallbackReturn

    from robot_sdf.ros.lifecycle import ManagedSdfServer

    ctx = rclpy.Context()
    rclpy.init(args=["--ros-args", "-p", "device:=cpu", "-p", f"scene_file:={tmp_path / 'missing.yaml'}"],
               context=ctx, domain_id=DOMAIN)
    try:
        node = ManagedSdfServer(context=ctx)
        try:
            assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
            assert node._state_machine.current_state[0] == State.PRIMARY_STATE_UNCONFIGURED
            assert node.world is None and node.config is None
            assert "configure failed: cannot load scene_file" in capfd.readouterr().err
            assert not any(name.endswith("query_signed_distance") for name, _ in
                           node.get_service_names_and_types_by_node("sdf_server", "/"))
        finally:
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=ctx)


@pytest.mark.parametrize("executable", ["sdf_server", "sdf_server_managed"])
def test_console_scripts_point_at_the_entry_points(executable):
    import ast
    import re

    tree = ast.parse((rh.REPO / "setup.py").read_text())
    scripts = {m.group(1): m.group(2) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
               for m in [re.fullmatch(r"\s*([\w-]+)\s*=\s*([\w.:]+)\s*", n.value)] if m}
    module, func = scripts[executable].split(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), func))
