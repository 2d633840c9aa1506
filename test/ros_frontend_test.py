"""What an integrator meets first, over a real sdf_server process and real rclpy: frames,
rviz (late viewers, the shipped rviz config), diagnostics levels and run-time parameters.

The node runs with static transforms world -> map -> camera (the pip-wheel setup has no
tf2_ros); expected world poses are 4x4 matrix products in numpy, distances exact box distances.
Tests work in separate regions of space.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import yaml
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from geometry_msgs.msg import PoseStamped
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rclpy.qos import DurabilityPolicy
from sensor_msgs.msg import PointCloud2
from visualization_msgs.msg import Marker, MarkerArray

import reference as ref
import ros_helpers as rh
from robot_sdf.ros.conversions import array_to_pose, float32_array, make_mesh_obstacle, make_obstacle_pose
from robot_sdf.ros.frames import tf2_available
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import EvaluateSphereCost, QuerySignedDistance

DOMAIN = rh.domain_id(71)
WINDOW_S = 1.5
BOX = (0.3, 0.2, 0.4)
MAP_IN_WORLD = np.array([1.0, 2.0, 0.0, np.cos(0.3), 0.0, 0.0, np.sin(0.3)])
CAMERA_IN_MAP = np.array([0.5, -0.2, 1.2, *(np.array([0.9, 0.1, 0.3, -0.2]) / np.linalg.norm([0.9, 0.1, 0.3, -0.2]))])
TRACKED_POSE = np.array([-6.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])
IDENTITY = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def matrix(pose) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = ref.quat_to_matrix(np.asarray(pose[3:], float))
    m[:3, 3] = pose[:3]
    return m


def box_distance(points: np.ndarray, box_in_world: np.ndarray) -> np.ndarray:
    """Exact signed distance of world points to BOX placed by the 4x4 matrix box_in_world."""
    local = (np.linalg.inv(box_in_world) @ np.c_[points, np.ones(len(points))].T).T[:, :3]
    return rh.box_signed_distance(local, BOX, IDENTITY)


def transform_entry(parent: str, child: str, pose) -> str:
    return f"{parent} {child} " + " ".join(repr(float(x)) for x in pose)


class Frontend:
    def __init__(self, tmp) -> None:
        scene = {"frame": "world", "obstacles": [
            {"id": "tracked", "primitive": {"type": "box", "size": list(BOX)}, "pose": TRACKED_POSE.tolist(),
             "pose_topic": "/frontend_test/tracked_pose"}]}
        (tmp / "scene.yaml").write_text(yaml.safe_dump(scene))
        self.params = dict(
            device="cpu", max_distance=0.5, activation_distance=0.05, weight=1.0, scene_file=str(tmp / "scene.yaml"),
            marker_rate_hz=20.0, publish_request_markers=False, slice_rate_hz=2.0, diagnostics_rate_hz=20.0,
            diagnostics_window_s=WINDOW_S, slow_request_ms=0.0, tf_timeout=0.05,
            static_transforms="; ".join([transform_entry("world", "map", MAP_IN_WORLD),
                                         transform_entry("map", "camera", CAMERA_IN_MAP)]))
        self.harness = rh.RosHarness(DOMAIN, "frontend_test")
        self.node = rh.NodeProcess(self.params, tmp, DOMAIN)
        try:
            h = self.harness
            self.mesh_pub = h.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
            self.pose_pub = h.publisher(ObstaclePose, "/sdf_server/obstacle_poses")
            self.tracked_pub = h.publisher(PoseStamped, "/frontend_test/tracked_pose")
            self.sd = h.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
            self.cost = h.client(EvaluateSphereCost, "/sdf_server/evaluate_sphere_cost")
            self.set_params = h.client(SetParameters, "/sdf_server/set_parameters")
            rh.wait_for_services(self.node, [self.sd, self.cost, self.set_params])
            self.diagnostics = h.subscribe(DiagnosticArray, "/diagnostics")
        except BaseException:
            self.close()
            raise

    def distance(self, points) -> tuple[np.ndarray, int]:
        return self.harness.signed_distance(self.sd, points)

    def revision(self) -> int:
        return self.distance([[100.0, 100.0, 100.0]])[1]

    def publish_until_applied(self, publisher, msg) -> int:
        """Publish ``msg`` every 0.1 s until the world revision moves (discovery may drop the first).

        Mesh updates are queued and every copy is applied in order, so copies sent while the first
        was still being applied would land after a later pose message and undo it: for the mesh
        topic, also wait until the node has received every copy sent and its queue is empty."""
        mesh = publisher is self.mesh_pub
        if mesh:
            base = int(_values(self.status(lambda s: True, timeout=60.0))["updates_enqueued"])
        before, sent = self.revision(), [0]

        def send():
            publisher.publish(msg)
            sent[0] += 1

        applied = rh.wait_until(lambda: send() or (self.revision() > before and self.revision()),
                                60.0, interval=0.1, what="the update to apply")
        if mesh:
            def drained(status):
                v = _values(status)
                enqueued = int(v["updates_enqueued"])
                return enqueued >= base + sent[0] and v["updates_pending"] == "0" \
                    and enqueued == int(v["updates_applied"]) + int(v["updates_coalesced"])

            self.status(drained, timeout=60.0)
            applied = self.revision()
        return applied

    def set_parameter(self, name: str, value) -> tuple[bool, str]:
        kind = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
                float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING}[type(value)]
        field = {bool: "bool_value", int: "integer_value", float: "double_value", str: "string_value"}[type(value)]
        pv = ParameterValue(type=kind, **{field: value})
        resp = self.harness.call(self.set_params, SetParameters.Request(parameters=[Parameter(name=name, value=pv)]))
        (result,) = resp.results
        return result.successful, result.reason

    def status(self, predicate, timeout=60.0) -> DiagnosticStatus:
        """The first status of this node, published from now on, that satisfies predicate."""
        def ours(arr):
            return next((s for s in arr.status if s.name == "sdf_server: mesh world"), None)

        start = len(self.diagnostics.snapshot())

        def found():
            for arr in self.diagnostics.snapshot()[start:]:
                s = ours(arr)
                if s is not None and predicate(s):
                    return s
            return None

        return rh.wait_until(found, timeout, what="a matching diagnostics status")

    def close(self) -> None:
        code = self.node.stop()
        self.harness.close()
        assert code == 0, self.node.log()


@pytest.fixture(scope="module")
def frontend(tmp_path_factory):
    f = Frontend(tmp_path_factory.mktemp("frontend"))
    try:
        yield f
    finally:
        f.close()


# ------------------------------------------------------------------ frames


def test_the_transform_source_is_said_once_at_start(frontend):
    (line,) = [ln for ln in frontend.node.log().splitlines() if "transforms: " in ln]
    assert "static_transforms: camera, map;" in line and "clock: system" in line
    if tf2_available():
        assert "tf2 (tf2_ros) from /tf and /tf_static" in line
    else:
        assert "tf2_ros is not installed" in line and "fed from" in line


def test_meshes_and_poses_in_other_frames_land_in_world_frame(frontend):
    world_from_camera = matrix(MAP_IN_WORLD) @ matrix(CAMERA_IN_MAP)
    box_in_camera = np.array([0.3, 0.1, 2.0, *(np.array([0.8, -0.2, 0.4, 0.4]) / np.linalg.norm([0.8, -0.2, 0.4, 0.4]))])
    v, t = ref.box(BOX)
    frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle("cam_box", v, t, box_in_camera,
                                                                          frame_id="camera"))
    expected = world_from_camera @ matrix(box_in_camera)
    centre = expected[:3, 3]
    probes = centre + np.array([[0, 0, 0], [0.3, 0, 0], [0, 0.25, 0], [0, 0, -0.35], [0.1, 0.1, 0.1]])
    np.testing.assert_allclose(frontend.distance(probes)[0], box_distance(probes, expected), atol=2e-4)

    # ObstaclePose in 'map' (one hop) at a nonzero stamp: static transforms hold at every stamp
    pose_in_map = np.array([-1.0, 0.5, 0.3, np.cos(0.6), 0.0, np.sin(0.6), 0.0])
    msg = make_obstacle_pose("cam_box", pose_in_map, frame_id="map")
    msg.header.stamp.sec = 12345
    frontend.publish_until_applied(frontend.pose_pub, msg)
    expected = matrix(MAP_IN_WORLD) @ matrix(pose_in_map)
    probes = expected[:3, 3] + np.array([[0, 0, 0], [0.2, 0, 0], [0, -0.2, 0.1]])
    np.testing.assert_allclose(frontend.distance(probes)[0], box_distance(probes, expected), atol=2e-4)

    # the scene obstacle's PoseStamped topic, in 'camera'
    stamped = PoseStamped()
    stamped.header.frame_id = "camera"
    tracked_in_camera = np.array([0.0, 0.0, 3.0, 1.0, 0.0, 0.0, 0.0])
    stamped.pose = array_to_pose(tracked_in_camera)
    frontend.publish_until_applied(frontend.tracked_pub, stamped)
    expected = world_from_camera @ matrix(tracked_in_camera)
    probes = expected[:3, 3] + np.array([[0, 0, 0], [0.0, 0.3, 0.0]])
    np.testing.assert_allclose(frontend.distance(probes)[0], box_distance(probes, expected), atol=2e-4)


def test_unresolvable_frames_are_rejected_and_change_nothing(frontend):
    v, t = ref.box(BOX)
    frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle("fixed_box", v, t, [6.0, 0.0, 0.5, 1, 0, 0, 0]))
    probes = np.array([[6.0, 0.0, 0.5], [6.3, 0.0, 0.5]])
    before_d, before_rev = frontend.distance(probes)
    for msg, text in (
        (make_mesh_obstacle("fixed_box", None, None, [9.0, 0.0, 0.5, 1, 0, 0, 0], operation=MeshObstacle.MOVE,
                            frame_id="lidar"), "rejected MeshObstacle MOVE 'fixed_box' env 0: cannot transform "
                                                "header.frame_id 'lidar' into world frame 'world'"),
        (make_mesh_obstacle("lidar_box", v, t, frame_id="lidar"), "rejected MeshObstacle ADD 'lidar_box' env 0: "
                                                                   "cannot transform header.frame_id 'lidar'"),
    ):
        frontend.mesh_pub.publish(msg)
        rh.wait_until(lambda: text in frontend.node.log(), 60.0, what=f"rejection '{text}'")
    # tf2_ros and the built-in buffer word it differently; both name the frame and the reason class
    lines = [ln for ln in frontend.node.log().splitlines() if "cannot transform header.frame_id 'lidar'" in ln]
    assert lines and all("unknown frame: " in ln and "lidar" in ln.split("unknown frame: ", 1)[1]
                         for ln in lines), lines
    after_d, after_rev = frontend.distance(probes)
    assert after_rev == before_rev
    np.testing.assert_array_equal(after_d, before_d)


# ------------------------------------------------------------------ rviz


RVIZ_CLASSES = {"rviz_default_plugins/MarkerArray": "visualization_msgs/msg/MarkerArray",
                "rviz_default_plugins/PointCloud2": "sensor_msgs/msg/PointCloud2"}


def test_rviz_config_names_only_topics_the_node_publishes(frontend):
    data = yaml.safe_load((rh.REPO / "config" / "robot_sdf.rviz").read_text())
    displays = [d for d in data["Visualization Manager"]["Displays"] if "Topic" in d]
    assert len(displays) == 2
    node = frontend.harness.node
    published = rh.wait_until(lambda: dict(node.get_publisher_names_and_types_by_node("sdf_server", "/")), 60.0)
    for d in displays:
        topic = d["Topic"]["Value"]
        assert topic in published, f"rviz shows {topic}, the node publishes {sorted(published)}"
        assert RVIZ_CLASSES[d["Class"]] in published[topic]
        # a Transient Local display matches only a transient_local publisher (polled: discovery
        # data may lag, and another test process may share the ROS domain)
        if d["Topic"]["Durability Policy"] == "Transient Local":
            rh.wait_until(lambda: any(i.qos_profile.durability == DurabilityPolicy.TRANSIENT_LOCAL
                                      for i in node.get_publishers_info_by_topic(topic)), 60.0,
                          what=f"a transient_local publisher of {topic}")
        else:
            assert d["Topic"]["Durability Policy"] == "Volatile"
    markers = next(d for d in displays if d["Topic"]["Value"] == "/sdf_server/markers")
    # late viewers need the history: Transient Local, and a depth that holds all of it
    assert markers["Topic"]["Durability Policy"] == "Transient Local" and markers["Topic"]["Depth"] >= 10


def _values(status: DiagnosticStatus) -> dict[str, str]:
    return {kv.key: kv.value for kv in status.values}


def _replay(arrays: list[MarkerArray]) -> dict[tuple[str, int], Marker]:
    """What a viewer shows after applying the MarkerArrays in order (ADD replaces, DELETE removes)."""
    shown: dict[tuple[str, int], Marker] = {}
    for arr in arrays:
        for m in arr.markers:
            if m.action == Marker.DELETE:
                shown.pop((m.ns, m.id), None)
            elif m.action == Marker.ADD:
                shown[(m.ns, m.id)] = m
    return shown


def test_a_viewer_started_later_receives_the_whole_scene(frontend):
    """An rviz restart while another viewer runs: the newcomer gets the topic history only."""
    first_viewer = frontend.harness.subscribe(MarkerArray, "/sdf_server/markers", rh.MARKER_QOS)
    rh.wait_until(lambda: first_viewer.snapshot(), 60.0, what="the first viewer's markers")
    v, t = ref.box(BOX)
    frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle("late_a", v, t, [0.0, 6.0, 0.5, 1, 0, 0, 0]))
    frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle("late_b", v, t, [1.0, 6.0, 0.5, 1, 0, 0, 0]))
    frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle("late_b", None, None,
                                                                          operation=MeshObstacle.REMOVE))
    # more marker updates than the topic keeps: each MOVE is its own update (20 Hz timer)
    def first_viewer_shows(y):
        state = {m.text: m for m in _replay(first_viewer.snapshot()).values() if m.type == Marker.TRIANGLE_LIST}
        return "late_a" in state and abs(state["late_a"].pose.position.y - y) < 1e-6

    for k in range(15):
        y = 6.0 + 0.01 * (k + 1)
        frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle(
            "late_a", None, None, [0.0, y, 0.5, 1, 0, 0, 0], operation=MeshObstacle.MOVE))
        # its own marker update: the next MOVE only once this one has been published
        rh.wait_until(lambda: first_viewer_shows(y), 60.0, what=f"the marker of MOVE {k}")
    viewer = frontend.harness.subscribe(MarkerArray, "/sdf_server/markers", rh.MARKER_QOS)

    def late_state():
        state = {m.text: m for m in _replay(viewer.snapshot()).values() if m.type == Marker.TRIANGLE_LIST}
        late_a = state.get("late_a")
        return state if late_a is not None and late_a.pose.position.y == pytest.approx(6.15) else None

    # the history arrives at once; under load the last MOVE may still be on its way, live
    shown = rh.wait_until(late_state, 60.0, what="the late viewer's scene")
    first = {m.text: m for m in _replay(first_viewer.snapshot()).values() if m.type == Marker.TRIANGLE_LIST}
    assert set(first) == set(shown)  # both viewers show the same scene
    # 'tracked' (scene) was last sent long before: only a full update in the history carries it
    assert {"tracked", "late_a"} <= set(shown) and "late_b" not in shown and "lidar_box" not in shown
    assert shown["late_a"].pose.position.y == pytest.approx(6.15)


# ------------------------------------------------------------------ diagnostics and parameters


def test_diagnostics_report_problems_with_reasons_and_recover(frontend):
    ok = frontend.status(lambda s: s.level == DiagnosticStatus.OK, timeout=WINDOW_S + 60)
    assert "meshes, revision" in ok.message
    frontend.mesh_pub.publish(make_mesh_obstacle("bad", np.full((4, 3), np.nan), [[0, 1, 2]]))
    warn = frontend.status(lambda s: s.level == DiagnosticStatus.WARN and "rejected message" in s.message)
    assert "MeshObstacle ADD 'bad' env 0: vertices: vertex 0 is not finite" in warn.message
    assert {kv.key: kv.value for kv in warn.values}["recent_rejected_messages"] == "1"
    frontend.status(lambda s: s.level == DiagnosticStatus.OK, timeout=WINDOW_S + 60)

    # a refused request
    req = EvaluateSphereCost.Request(batch=0, horizon=1, spheres_per_step=1)
    assert not frontend.harness.call(frontend.cost, req).success
    warn = frontend.status(lambda s: s.level == DiagnosticStatus.WARN and "failed request" in s.message)
    assert "evaluate_sphere_cost: batch, horizon and spheres_per_step must be > 0" in warn.message
    frontend.status(lambda s: s.level == DiagnosticStatus.OK, timeout=WINDOW_S + 60)

    # slow requests, with the threshold set at run time
    assert frontend.set_parameter("slow_request_ms", 1e-3) == (True, "")
    try:
        frontend.distance([[0.0, 0.0, 0.0]])
        warn = frontend.status(lambda s: s.level == DiagnosticStatus.WARN and "slow request" in s.message)
        assert "query_signed_distance:" in warn.message and "> 0.0 ms" in warn.message
    finally:
        assert frontend.set_parameter("slow_request_ms", 0.0) == (True, "")
    frontend.status(lambda s: s.level == DiagnosticStatus.OK, timeout=WINDOW_S + 60)


def _cost(frontend, weight: float) -> float:
    req = EvaluateSphereCost.Request(batch=1, horizon=1, spheres_per_step=1, weight=weight,
                                     activation_distance=0.05)
    req.spheres = float32_array(np.array([0.0, -6.0, 0.75, 0.1], np.float32))  # 0.05 above param_box, r 0.1
    resp = frontend.harness.call(frontend.cost, req)
    assert resp.success, resp.message
    return float(np.frombuffer(resp.cost, np.float32)[0])


def test_run_time_parameters(frontend):
    v, t = ref.box(BOX)  # top face at z = 0.5 + 0.2
    frontend.publish_until_applied(frontend.mesh_pub, make_mesh_obstacle("param_box", v, t, [0.0, -6.0, 0.5, 1, 0, 0, 0]))
    # penetration d = r + eta - sd = 0.1 + 0.05 - 0.05 = 0.1 > eta: cost = d - eta/2 = 0.075 per unit weight
    assert _cost(frontend, 1.0) == pytest.approx(0.075, abs=1e-4)
    assert _cost(frontend, 0.0) == pytest.approx(0.075, abs=1e-4)  # node default weight 1.0
    ok, reason = frontend.set_parameter("weight", 3.0)
    assert ok, reason
    assert _cost(frontend, 0.0) == pytest.approx(3 * 0.075, abs=3e-4)  # the next request uses it
    assert _cost(frontend, 1.0) == pytest.approx(0.075, abs=1e-4)  # an explicit weight still wins
    assert frontend.set_parameter("weight", 1.0)[0]

    ok, reason = frontend.set_parameter("device", "cuda:0")
    assert not ok and "read-only" in reason
    ok, reason = frontend.set_parameter("static_transforms", "")
    assert not ok and "read-only" in reason
    ok, reason = frontend.set_parameter("activation_distance", -1.0)
    assert not ok
    ok, reason = frontend.set_parameter("slice_resolution", 1e-4)  # 20001^2 points > max_points_per_request
    assert not ok and "max_points_per_request" in reason
    ok, reason = frontend.set_parameter("weight", 2)  # wrong type
    assert not ok
    assert _cost(frontend, 0.0) == pytest.approx(0.075, abs=1e-4)  # refused changes changed nothing
    assert "parameters set: weight=3.0" in frontend.node.log()


def test_slice_settings_change_at_run_time(frontend):
    """The distance slice is on demand (a subscriber) and follows slice_* parameters set at run time."""
    clouds = frontend.harness.subscribe(PointCloud2, "/sdf_server/distance_slice")

    def z_values(msg):
        raw = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.width * msg.height, msg.point_step)
        z = next(f for f in msg.fields if f.name == "z")
        return raw[:, z.offset:z.offset + 4].copy().view(np.float32)

    clouds.wait_for(lambda m: np.allclose(z_values(m), 0.0), 60.0)
    assert frontend.set_parameter("slice_offset", 0.7) == (True, "")
    assert frontend.set_parameter("slice_resolution", 0.5) == (True, "")
    msg = clouds.wait_for(lambda m: np.allclose(z_values(m), 0.7) and m.width == 25, 60.0)  # 2 m / 0.5 m + 1 = 5 per side
    assert msg.header.frame_id == "world"


def test_scene_file_in_a_static_frame(tmp_path):
    """A scene declared in 'camera' is placed through static_transforms at start (in-process node)."""
    import rclpy

    from robot_sdf.ros.parameters import ConfigError
    from robot_sdf.ros.sdf_server import SdfServer

    pose_in_camera = np.array([0.2, -0.1, 1.5, 1.0, 0.0, 0.0, 0.0])
    scene = tmp_path / "scene.yaml"
    scene.write_text(yaml.safe_dump({"frame": "camera", "obstacles": [
        {"id": "seen", "primitive": {"type": "box", "size": list(BOX)}, "pose": pose_in_camera.tolist()}]}))
    transforms = "; ".join([transform_entry("world", "map", MAP_IN_WORLD), transform_entry("map", "camera", CAMERA_IN_MAP)])
    for static, error in ((transforms, None), ("world map 0 0 0 1 0 0 0", "frame 'camera' is not world_frame")):
        ctx = rclpy.Context()
        rclpy.init(args=["--ros-args", "-p", "device:=cpu", "-p", f"scene_file:={scene}", "-p",
                         f"static_transforms:={static}", "-p", "marker_rate_hz:=0.0", "-p", "slice_rate_hz:=0.0",
                         "-p", "diagnostics_rate_hz:=0.0"], context=ctx, domain_id=DOMAIN)
        try:
            if error:
                with pytest.raises(ConfigError, match=error):
                    SdfServer(context=ctx)
                continue
            node = SdfServer(context=ctx)
            try:
                expected = matrix(MAP_IN_WORLD) @ matrix(CAMERA_IN_MAP) @ matrix(pose_in_camera)
                np.testing.assert_allclose(matrix(node.world.mesh_geometry("seen")[2]), expected, atol=1e-9)
            finally:
                node.destroy_node()
        finally:
            rclpy.try_shutdown(context=ctx)
