"""sdf_server over real rclpy: meshes in, the three services out, markers, slice, diagnostics.

One node process for the module. Every test works in its own region of space (regions are
metres apart, farther than max_distance + radius + eta), so the tests do not see each other's
meshes. Numbers are compared with an in-process MeshWorld holding the same meshes (the node
must be a faithful adapter) and with the brute-force numpy reference (test/reference.py) or
analytic box distances.
"""
from __future__ import annotations

import signal
import time

import numpy as np
import pytest
import rclpy
import rclpy.parameter
import torch
import trimesh
import yaml
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import Point, PoseStamped
from sensor_msgs.msg import PointCloud2, PointField
from shape_msgs.msg import Mesh, MeshTriangle
from visualization_msgs.msg import Marker, MarkerArray

import reference as ref
import ros_helpers as rh
from robot_sdf import MeshWorld
from robot_sdf.ros.conversions import float32_array, make_mesh_obstacle, make_obstacle_pose
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance

MAX_D = 0.5
ETA = 0.05
SLICE_BOX_SIZE = (0.4, 0.3, 0.2)
SLICE_BOX_POSE = np.concatenate([[0.0, 5.0, 0.5], rh.quat_about_z(0.4)])
MOVING_BOX_SIZE = (0.2, 0.2, 0.2)
MOVING_BOX_POSE = np.array([3.0, 5.0, 0.5, 1.0, 0.0, 0.0, 0.0])
SCENE_MESH_POSE = np.array([-3.0, 5.0, 0.5, 1.0, 0.0, 0.0, 0.0])
EARLY_BOX_POSE = np.array([0.0, -5.0, 0.5, 1.0, 0.0, 0.0, 0.0])
FAR_POINT = [100.0, 100.0, 100.0]


class Server:
    """The running node and the test side's endpoints."""

    def __init__(self, tmp) -> None:
        self.harness = rh.RosHarness(rh.domain_id(11))
        self.node: rh.NodeProcess | None = None
        try:
            self._start(tmp)
        except BaseException:  # never leave the node process behind
            if self.node is not None:
                self.node.stop()
            self.harness.close()
            raise

    def _start(self, tmp) -> None:
        h = self.harness
        self.mesh_pub = h.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
        # Published before the node exists: transient_local must hand it over at start.
        v, t = ref.box((0.3, 0.3, 0.3))
        self.mesh_pub.publish(make_mesh_obstacle("early_box", v, t, EARLY_BOX_POSE))
        ico = trimesh.creation.icosphere(subdivisions=2, radius=0.2)
        ico.export(tmp / "ico.stl")
        self.ico = (np.asarray(ico.vertices), np.asarray(ico.faces))
        scene = {"frame": "world", "obstacles": [
            {"id": "slice_box", "primitive": {"type": "box", "size": list(SLICE_BOX_SIZE)},
             "pose": SLICE_BOX_POSE.tolist()},
            {"id": "moving_box", "primitive": {"type": "box", "size": list(MOVING_BOX_SIZE)},
             "pose": MOVING_BOX_POSE.tolist(), "pose_topic": "/sdf_test/moving_box_pose"},
            {"id": "scene_mesh", "mesh": "ico.stl", "pose": SCENE_MESH_POSE.tolist()},
        ]}
        (tmp / "scene.yaml").write_text(yaml.safe_dump(scene))
        self.params = dict(
            world_frame="world", device="cpu", num_envs=2, mesh_capacity=4, max_distance=MAX_D,
            activation_distance=ETA, weight=1.0, sign_method="default",
            scene_file=str(tmp / "scene.yaml"), marker_rate_hz=20.0, publish_request_markers=True,
            slice_plane="xy", slice_offset=0.5, slice_center=[0.0, 5.0], slice_size=[1.6, 1.6],
            slice_resolution=0.05, slice_env=0, slice_rate_hz=10.0, diagnostics_rate_hz=10.0)
        self.node = rh.NodeProcess(self.params, tmp, rh.domain_id(11))
        self.sphere = h.client(EvaluateSphereCost, "/sdf_server/evaluate_sphere_cost")
        self.swept = h.client(EvaluateSweptSphereCost, "/sdf_server/evaluate_swept_sphere_cost")
        self.sd = h.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        rh.wait_for_services(self.node, [self.sphere, self.swept, self.sd])
        self.pose_pub = h.publisher(PoseStamped, "/sdf_test/moving_box_pose")
        self.obstacle_pose_pub = h.publisher(ObstaclePose, "/sdf_server/obstacle_poses")

    # -- service helpers
    def signed_distance(self, points, env: int = 0, max_distance: float = 0.0):
        req = QuerySignedDistance.Request(env=env, max_distance=max_distance)
        req.points = float32_array(np.asarray(points, np.float32).reshape(-1))
        resp = self.harness.call(self.sd, req)
        assert resp.success, resp.message
        return (np.frombuffer(resp.distance, np.float32).copy(),
                np.frombuffer(resp.gradient, np.float32).reshape(-1, 3).copy(), resp.world_revision)

    def revision(self) -> int:
        return self.signed_distance(FAR_POINT)[2]

    def wait_revision(self, target: int, timeout: float = 60.0) -> int:
        return rh.wait_until(lambda: self.revision() >= target and self.revision(), timeout,
                             what=f"world revision {target}")

    def publish(self, msg) -> int:
        """Publish a MeshObstacle expected to apply; return the revision it produced."""
        before = self.revision()
        self.mesh_pub.publish(msg)
        rev = self.wait_revision(before + 1)
        assert rev == before + 1
        return rev

    def cost_request(self, cls, spheres: np.ndarray, env_index=None, gradient=True, **extra):
        req = cls.Request()
        b, hh, n, _ = spheres.shape
        req.batch, req.horizon, req.spheres_per_step = b, hh, n
        req.spheres = float32_array(spheres.reshape(-1))
        if env_index is not None:
            req.env_index = np.asarray(env_index, np.uint32).tolist()
        req.activation_distance, req.weight, req.compute_gradient = ETA, 1.0, gradient
        for k, v in extra.items():
            setattr(req, k, v)
        client = self.sphere if cls is EvaluateSphereCost else self.swept
        resp = self.harness.call(client, req)
        assert resp.success, resp.message
        cost = np.frombuffer(resp.cost, np.float32).reshape(b, hh, n)
        grad = np.frombuffer(resp.gradient, np.float32).reshape(b, hh, n, 3) if gradient else None
        if not gradient:
            assert len(resp.gradient) == 0
        return cost, grad, resp.world_revision

    def close(self) -> None:
        code = self.node.stop()
        self.harness.close()
        assert code == 0, f"sdf_server exit code {code} after SIGINT:\n{self.node.log()}"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("ros_node"))
    try:
        yield s
    finally:
        s.close()


def test_startup_scene_and_transient_local(server):
    # 3 scene obstacles (revisions 1..3) and the mesh published before the node started (4)
    server.wait_revision(4)
    assert server.revision() == 4
    log = server.node.log()
    assert "ready: device=cpu, sign_method=default" in log
    assert "3 scene obstacles (1 pose topics)" in log
    pts = np.array([[0.0, -5.0, 0.5], [0.0, -5.0, 0.75], [0.3, 5.05, 0.5], [0.0, 5.0, 0.45],
                    [3.0, 5.0, 0.5], [3.0, 5.3, 0.5], [-3.0, 5.0, 0.5], [-3.0, 5.0, 0.85]])
    dist, grad, rev = server.signed_distance(pts)
    assert rev == 4
    exp = np.concatenate([
        rh.box_signed_distance(pts[:2], (0.3, 0.3, 0.3), EARLY_BOX_POSE),
        rh.box_signed_distance(pts[2:4], SLICE_BOX_SIZE, SLICE_BOX_POSE),
        rh.box_signed_distance(pts[4:6], MOVING_BOX_SIZE, MOVING_BOX_POSE)])
    np.testing.assert_allclose(dist[:6], exp, atol=1e-5)
    ico = ref.RefMesh(*server.ico, pose=SCENE_MESH_POSE)
    exp_ico, grad_ico = rh.union_distance(pts[6:], [ico], MAX_D)
    np.testing.assert_allclose(dist[6:], exp_ico, atol=1e-5)
    np.testing.assert_allclose(grad[6:], grad_ico, atol=1e-4)
    np.testing.assert_allclose(np.linalg.norm(grad, axis=1), 1.0, atol=1e-4)


def _region_a_meshes():
    rng = np.random.default_rng(3)
    box_v, box_t = ref.box((0.4, 0.3, 0.2))
    box_pose = np.concatenate([[0.0, 0.0, 0.5], ref.random_quaternion(rng)])
    ico_v, ico_t = ref.icosphere(0.15, 1)
    ico_pose = np.array([0.35, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])
    env1_v, env1_t = ref.box((0.5, 0.5, 0.1))
    env1_pose = np.array([0.0, 0.0, 0.4, 1.0, 0.0, 0.0, 0.0])
    return [("flat_box", box_v, box_t, box_pose, 0), ("shape_ico", ico_v, ico_t, ico_pose, 0),
            ("env1_box", env1_v, env1_t, env1_pose, 1)]


def _shape_msgs_add(name, v, t, pose, env) -> MeshObstacle:
    msg = make_mesh_obstacle(name, None, None, pose, env=env)
    msg.mesh = Mesh(vertices=[Point(x=float(a), y=float(b), z=float(c)) for a, b, c in v],
                    triangles=[MeshTriangle(vertex_indices=np.asarray(tri, np.uint32)) for tri in t])
    return msg


def test_services_match_core_and_reference(server):
    meshes = _region_a_meshes()
    world = MeshWorld(device="cpu", num_envs=2, sign_method="default", max_distance=MAX_D)
    envs: list[list[ref.RefMesh]] = [[], []]
    for name, v, t, pose, env in meshes:
        if name == "shape_ico":
            msg = _shape_msgs_add(name, v, t, pose, env)
            assert len(msg.vertices) == 0
        else:
            msg = make_mesh_obstacle(name, v, t, pose, env=env)
        server.publish(msg)
        world.add_mesh(name, v, t, pose, env=env)
        envs[env].append(ref.RefMesh(v, t, pose))

    rng = np.random.default_rng(7)
    b, hh, n = 2, 5, 6
    spheres = np.empty((b, hh, n, 4), np.float32)
    spheres[..., 0] = rng.uniform(-0.35, 0.6, (b, hh, n))
    spheres[..., 1] = rng.uniform(-0.3, 0.3, (b, hh, n))
    spheres[..., 2] = rng.uniform(0.25, 0.75, (b, hh, n))
    spheres[..., 3] = rng.uniform(0.02, 0.08, (b, hh, n))
    spheres[0, 1, 2, 3] = -1.0  # sphere off
    env_index = [0, 1]
    st = torch.from_numpy(spheres)
    et = torch.tensor(env_index, dtype=torch.int32)

    cost, grad, rev = server.cost_request(EvaluateSphereCost, spheres, env_index)
    assert rev == world.revision + 4  # the node also holds 3 scene meshes and early_box
    core_cost, core_grad = world.evaluate_sphere_cost(st, ETA, 1.0, env_index=et)
    np.testing.assert_allclose(cost, core_cost.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grad, core_grad.numpy(), rtol=1e-5, atol=1e-6)
    ref_cost, ref_grad = ref.sphere_cost(spheres, envs, ETA, 1.0, MAX_D, env_index)
    assert (ref_cost > 0).sum() >= 10 and (ref_cost == 0).sum() >= 10  # both regimes exercised
    np.testing.assert_allclose(cost, ref_cost, atol=2e-4)
    np.testing.assert_allclose(grad, ref_grad, atol=2e-3)
    assert cost[0, 1, 2] == 0 and not grad[0, 1, 2].any()

    no_grad_cost, _, _ = server.cost_request(EvaluateSphereCost, spheres, env_index, gradient=False)
    np.testing.assert_array_equal(no_grad_cost, cost)

    # row 1 in env 1 differs from evaluating it in env 0
    cost_env0, _, _ = server.cost_request(EvaluateSphereCost, spheres, [0, 0])
    assert not np.allclose(cost_env0[1], cost[1])
    np.testing.assert_allclose(cost_env0[0], cost[0], atol=1e-7)

    # swept cost with the speed metric, against the core and the reference
    traj = spheres.copy()
    traj[..., :3] = np.linspace([-0.4, -0.1, 0.5], [0.6, 0.1, 0.5], hh)[None, :, None, :] + \
        rng.normal(0, 0.02, (b, hh, n, 3))
    sw_cost, sw_grad, _ = server.cost_request(EvaluateSweptSphereCost, traj, env_index,
                                              sweep_steps=3, speed_dt=0.1, enable_speed_metric=True)
    core_sw, core_sw_grad = world.evaluate_swept_sphere_cost(
        torch.from_numpy(traj), ETA, 1.0, sweep_steps=3, speed_dt=0.1, enable_speed_metric=True,
        env_index=et)
    np.testing.assert_allclose(sw_cost, core_sw.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sw_grad, core_sw_grad.numpy(), rtol=1e-5, atol=1e-5)
    ref_sw, ref_sw_grad = ref.swept_sphere_cost(traj, envs, ETA, 1.0, MAX_D, 3, 0.1, True, env_index)
    assert (ref_sw > 0).sum() >= 10
    np.testing.assert_allclose(sw_cost, ref_sw, rtol=1e-3, atol=1e-3)
    np.testing.assert_allclose(sw_grad, ref_sw_grad, rtol=1e-3, atol=2e-2)

    # signed distance in both environments, default and explicit max_distance
    pts = np.column_stack([rng.uniform(-0.9, 1.1, 300), rng.uniform(-0.8, 0.8, 300),
                           rng.uniform(-0.3, 1.3, 300)]).astype(np.float32)
    for env in (0, 1):
        for max_d in (0.0, 0.2):
            dist, g, _ = server.signed_distance(pts, env=env, max_distance=max_d)
            eff = max_d if max_d > 0 else MAX_D
            core_d, core_g = world.signed_distance(torch.from_numpy(pts), env=env, max_distance=eff)
            np.testing.assert_allclose(dist, core_d.numpy(), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(g, core_g.numpy(), atol=1e-5)
            ref_d, ref_g = rh.union_distance(pts, envs[env], eff)
            np.testing.assert_allclose(dist, ref_d, atol=1e-5)
            near = ref_d < eff - 1e-3
            assert near.sum() > 20 and (~near).sum() > 5
            np.testing.assert_allclose(g[near], ref_g[near], atol=1e-3)

    for name, *_, env in meshes:
        server.publish(make_mesh_obstacle(name, None, None, env=env, operation=MeshObstacle.REMOVE))
    assert server.signed_distance([[0.0, 0.0, 0.5]])[0][0] == pytest.approx(MAX_D)


def test_operations_change_results_and_revisions(server):
    v, t = ref.box((0.2, 0.2, 0.2))
    pose = np.array([5.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])
    probe = np.array([[5.0, 0.0, 0.5], [5.4, 0.0, 0.5]])

    r_add = server.publish(make_mesh_obstacle("op_box", v, t, pose))
    d, _, rev = server.signed_distance(probe)
    assert rev == r_add
    np.testing.assert_allclose(d, [-0.1, 0.3], atol=1e-5)

    moved = pose.copy()
    moved[0] = 5.2
    r_move = server.publish(make_mesh_obstacle("op_box", None, None, moved, operation=MeshObstacle.MOVE))
    assert r_move == r_add + 1
    np.testing.assert_allclose(server.signed_distance(probe)[0], [0.1, 0.1], atol=1e-5)

    # spheres 0.05 m off the moved box's +x face: d = r + eta - 0.05 = r, cost from docs/design.md "Cost definition"
    spheres = np.array([[[[5.35, 0.0, 0.5, 0.03], [5.35, 0.0, 0.5, 0.08]]]], np.float32)
    cost, grad, rev = server.cost_request(EvaluateSphereCost, spheres)
    assert rev == r_move
    np.testing.assert_allclose(cost[0, 0], [0.03**2 / (2 * ETA), 0.08 - ETA / 2], rtol=1e-3)
    np.testing.assert_allclose(grad[0, 0], [[-0.03 / ETA, 0, 0], [-1.0, 0, 0]], atol=1e-4)

    r_dis = server.publish(make_mesh_obstacle("op_box", None, None, operation=MeshObstacle.DISABLE))
    d, _, rev = server.signed_distance(probe)
    assert rev == r_dis == r_move + 1
    np.testing.assert_allclose(d, [MAX_D, MAX_D])
    assert not server.cost_request(EvaluateSphereCost, spheres)[0].any()

    r_en = server.publish(make_mesh_obstacle("op_box", None, None, operation=MeshObstacle.ENABLE))
    assert r_en == r_dis + 1
    np.testing.assert_allclose(server.signed_distance(probe)[0], [0.1, 0.1], atol=1e-5)

    # a quaternion within 1e-3 of unit length is renormalised, not rejected
    slightly_long = np.concatenate([[5.2, 0.0, 0.5], 1.0008 * rh.quat_about_z(0.5)])
    r_q = server.publish(make_mesh_obstacle("op_box", None, None, slightly_long, operation=MeshObstacle.MOVE))
    assert r_q == r_en + 1
    unit = np.concatenate([[5.2, 0.0, 0.5], rh.quat_about_z(0.5)])
    np.testing.assert_allclose(server.signed_distance(probe)[0],
                               rh.box_signed_distance(probe, (0.2, 0.2, 0.2), unit), atol=1e-5)

    # ADD of an existing id replaces geometry and pose
    v2, t2 = ref.box((0.4, 0.4, 0.4))
    r_rep = server.publish(make_mesh_obstacle("op_box", v2, t2, pose))
    np.testing.assert_allclose(server.signed_distance(probe)[0], [-0.2, 0.2], atol=1e-5)

    # ObstaclePose (best effort: repeat until it lands)
    target = np.concatenate([[5.0, 0.3, 0.5], rh.quat_about_z(0.3)])
    rh.wait_for_matched(server.obstacle_pose_pub)

    def moved_by_pose_msg():
        server.obstacle_pose_pub.publish(make_obstacle_pose("op_box", target))
        time.sleep(0.1)
        return server.revision() > r_rep

    rh.wait_until(moved_by_pose_msg, 60.0, what="ObstaclePose applied")
    d, _, _ = server.signed_distance(probe)
    np.testing.assert_allclose(d, rh.box_signed_distance(probe, (0.4, 0.4, 0.4), target), atol=1e-5)

    r_before = server.revision()
    r_rm = server.publish(make_mesh_obstacle("op_box", None, None, operation=MeshObstacle.REMOVE))
    assert r_rm == r_before + 1
    np.testing.assert_allclose(server.signed_distance(probe)[0], [MAX_D, MAX_D])


def test_pose_topic_moves_scene_obstacle(server):
    target = np.concatenate([[3.0, 5.3, 0.6], rh.quat_about_z(0.7)])
    probe = np.array([[3.0, 5.3, 0.6], [3.0, 5.0, 0.5], [3.12, 5.3, 0.6]])
    rh.wait_for_matched(server.pose_pub)
    before = server.revision()

    def send(pose):
        msg = PoseStamped()
        msg.header.frame_id = "world"
        p = msg.pose
        p.position.x, p.position.y, p.position.z = (float(x) for x in pose[:3])
        p.orientation.w, p.orientation.x, p.orientation.y, p.orientation.z = (float(x) for x in pose[3:])
        server.pose_pub.publish(msg)
        time.sleep(0.1)

    rh.wait_until(lambda: send(target) or server.revision() > before, 60.0, what="pose topic")
    d, _, _ = server.signed_distance(probe)
    np.testing.assert_allclose(d, rh.box_signed_distance(probe, MOVING_BOX_SIZE, target), atol=1e-5)
    assert d[0] == pytest.approx(-0.1, abs=1e-5)
    # a PoseStamped in another frame is rejected and logged
    wrong = PoseStamped()
    wrong.header.frame_id = "map"
    wrong.pose.orientation.w = 1.0
    server.pose_pub.publish(wrong)
    rh.wait_until(lambda: "rejected PoseStamped on '/sdf_test/moving_box_pose': cannot transform header.frame_id "
                          "'map' into world frame 'world': unknown frame: " in server.node.log(), 60.0,
                  what="rejection log")
    np.testing.assert_allclose(server.signed_distance(probe)[0], d)
    after = server.revision()
    rh.wait_until(lambda: send(MOVING_BOX_POSE) or server.revision() > after, 60.0, what="restore")
    np.testing.assert_allclose(server.signed_distance(probe[:1])[0],
                               rh.box_signed_distance(probe[:1], MOVING_BOX_SIZE, MOVING_BOX_POSE), atol=1e-5)


def test_markers(server):
    # as rviz does with config/robot_sdf.rviz: transient_local, so the history reaches us
    markers = server.harness.subscribe(MarkerArray, "/sdf_server/markers", rh.MARKER_QOS)
    v, t = ref.box((0.2, 0.2, 0.2))
    pose = np.array([-5.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])

    def mesh_marker(name):
        def find(arr):
            return next((m for m in arr.markers if m.text == name and m.action == Marker.ADD), None)
        return find

    # a subscriber that comes late gets every mesh, scene ones included, from the topic history
    arr = markers.wait_for(lambda a: mesh_marker("slice_box")(a) is not None, 60.0)
    m = mesh_marker("slice_box")(arr)
    assert m.type == Marker.TRIANGLE_LIST and m.ns == "env_0" and m.header.frame_id == "world"
    assert len(m.points) == 36  # 12 triangles
    np.testing.assert_allclose([m.pose.position.x, m.pose.position.y, m.pose.position.z,
                                m.pose.orientation.w, m.pose.orientation.z],
                               SLICE_BOX_POSE[[0, 1, 2, 3, 6]], atol=1e-6)
    corners = np.array([[p.x, p.y, p.z] for p in m.points])
    np.testing.assert_allclose(np.abs(corners), np.broadcast_to(np.array(SLICE_BOX_SIZE) / 2, corners.shape),
                               atol=1e-6)

    server.publish(make_mesh_obstacle("marker_box", v, t, pose))
    arr = markers.wait_for(lambda a: mesh_marker("marker_box")(a) is not None, 60.0)
    added = mesh_marker("marker_box")(arr)
    assert added.pose.position.x == pytest.approx(-5.0)

    spheres = np.array([[[[-5.0, 0.0, 0.5, 0.05], [-5.0, 0.12, 0.5, 0.03], [-5.0, 2.0, 0.5, 0.05]]]], np.float32)
    cost, _, _ = server.cost_request(EvaluateSphereCost, spheres)
    assert cost[0, 0, 0] > cost[0, 0, 1] > 0 and cost[0, 0, 2] == 0
    arr = markers.wait_for(lambda a: any(m.ns == "request_spheres" and m.points and m.points[0].x == -5.0
                                         for m in a.markers), 60.0)
    lists = [m for m in arr.markers if m.ns == "request_spheres" and m.action == Marker.ADD]
    assert all(m.type == Marker.SPHERE_LIST for m in lists)
    pts = {(round(p.x, 3), round(p.y, 3)): (c, m.scale.x) for m in lists for p, c in zip(m.points, m.colors)}
    assert len(pts) == 3
    top, diam = pts[(-5.0, 0.0)]
    assert (top.r, top.g) == (pytest.approx(1.0), pytest.approx(0.0)) and diam == pytest.approx(0.1)
    free, _ = pts[(-5.0, 2.0)]
    assert (free.r, free.g) == (pytest.approx(0.0), pytest.approx(1.0))
    mid, diam_mid = pts[(-5.0, 0.12)]
    assert 0 < mid.r < 1 and diam_mid == pytest.approx(0.06)

    # later updates carry only what changed: a MOVE re-sends that mesh alone, with its new pose
    # (or, every MARKER_HISTORY-th update, every mesh: a full update)
    moved = pose.copy()
    moved[1] = 0.25
    server.publish(make_mesh_obstacle("marker_box", None, None, moved, operation=MeshObstacle.MOVE))
    arr = markers.wait_for(lambda a: (m := mesh_marker("marker_box")(a)) is not None
                           and m.pose.position.y == pytest.approx(0.25), 10.0)
    sent = [m.text for m in arr.markers if m.type == Marker.TRIANGLE_LIST]
    assert sent == ["marker_box"] or (len(sent) > 3 and "marker_box" in sent), sent  # change or full update
    assert mesh_marker("marker_box")(arr).id == added.id
    server.publish(make_mesh_obstacle("marker_box", None, None, operation=MeshObstacle.DISABLE))
    arr = markers.wait_for(lambda a: (m := mesh_marker("marker_box")(a)) is not None and m.color.a < 0.5, 60.0)

    server.publish(make_mesh_obstacle("marker_box", None, None, operation=MeshObstacle.REMOVE))
    gone = markers.wait_for(lambda a: any(m.action == Marker.DELETE and m.ns == added.ns and m.id == added.id
                                          for m in a.markers), 60.0)
    assert mesh_marker("marker_box")(gone) is None


def _cloud(msg: PointCloud2) -> dict[str, np.ndarray]:
    """Parse an unorganised float32 cloud by its field offsets (independent of the node's packer)."""
    raw = np.frombuffer(bytes(msg.data), np.uint8).reshape(msg.height * msg.width, msg.point_step)
    out = {}
    for f in msg.fields:
        assert f.datatype == PointField.FLOAT32 and f.count == 1
        out[f.name] = raw[:, f.offset:f.offset + 4].copy().view(np.float32).reshape(-1)
    return out


def test_distance_slice(server):
    clouds = server.harness.subscribe(PointCloud2, "/sdf_server/distance_slice")
    msg = clouds.wait_for(lambda m: True, 60.0)
    assert msg.header.frame_id == "world"
    assert [f.name for f in msg.fields] == ["x", "y", "z", "distance"]
    c = _cloud(msg)
    assert len(c["x"]) == 33 * 33
    np.testing.assert_allclose(c["z"], 0.5)
    assert c["x"].min() == pytest.approx(-0.8) and c["x"].max() == pytest.approx(0.8)
    assert c["y"].min() == pytest.approx(4.2) and c["y"].max() == pytest.approx(5.8)
    pts = np.column_stack([c["x"], c["y"], c["z"]])
    expected = np.minimum(rh.box_signed_distance(pts, SLICE_BOX_SIZE, SLICE_BOX_POSE), MAX_D)
    assert (expected < 0).sum() > 10 and (expected == MAX_D).sum() > 10
    np.testing.assert_allclose(c["distance"], expected, atol=1e-5)


def test_diagnostics(server):
    diags = server.harness.subscribe(DiagnosticArray, "/diagnostics")
    server.cost_request(EvaluateSphereCost, np.zeros((1, 1, 1, 4), np.float32))
    rev = server.revision()

    def ours(arr):
        return next((s for s in arr.status if s.name == "sdf_server: mesh world"), None)

    arr = diags.wait_for(lambda a: ours(a) is not None
                         and {kv.key: kv.value for kv in ours(a).values}.get("revision") == str(rev), 60.0)
    values = {kv.key: kv.value for kv in ours(arr).values}
    assert values["device"] == "cpu" and values["sign_method"] == "default"
    assert int(values["mesh_count"]) == 4  # 3 scene obstacles + early_box; the tests removed theirs
    assert int(values["requests_total"]) > 0
    p50, p95 = float(values["latency_p50_ms"]), float(values["latency_p95_ms"])
    assert 0 < p50 <= p95
    assert float(values["request_rate_hz"]) >= 0


def _inprocess_node(server, namespace: str):
    """(an SdfServer in this process on the harness's context, CPU world, no timers; events
    (entered, release) and the node's original add_mesh): its world's add_mesh is held at entry
    until ``release`` is set, as a long BVH build would hold it."""
    import threading

    from robot_sdf.ros.sdf_server import SdfServer

    node = SdfServer(context=server.harness.context, namespace=namespace, parameter_overrides=[
        rclpy.parameter.Parameter(k, value=v) for k, v in dict(
            device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0).items()])
    entered, release = threading.Event(), threading.Event()
    add_mesh = node.world.add_mesh

    def held_add_mesh(*args, **kwargs):
        entered.set()
        assert release.wait(120.0)
        return add_mesh(*args, **kwargs)

    node.world.add_mesh = held_add_mesh
    return node, entered, release, add_mesh


def test_queries_are_not_queued_behind_a_mesh_update(server):
    """A mesh update that takes long (here: held inside MeshWorld.add_mesh, as a big BVH build
    would be) must not delay service requests: the node's callback groups and executor threads
    let the query run meanwhile, against the previous world state."""
    import threading

    from rclpy.executors import MultiThreadedExecutor

    node, entered, release, _ = _inprocess_node(server, "/inproc")
    executor = MultiThreadedExecutor(num_threads=4, context=server.harness.context)
    executor.add_node(node)
    spin = threading.Thread(target=executor.spin, daemon=True)
    spin.start()
    try:
        pub = server.harness.publisher(MeshObstacle, "/inproc/sdf_server/mesh_obstacles", rh.MESH_QOS)
        client = server.harness.client(QuerySignedDistance, "/inproc/sdf_server/query_signed_distance")
        assert client.wait_for_service(timeout_sec=60.0)
        v, t = ref.box((0.2, 0.2, 0.2))
        pub.publish(make_mesh_obstacle("slow", v, t))
        assert entered.wait(60.0), "the mesh update never started"
        req = QuerySignedDistance.Request(points=float32_array([0.0, 0.0, 0.0]))
        resp = server.harness.call(client, req, timeout=60.0)
        # answered while the update is still held inside add_mesh: not queued behind it
        assert resp.success and resp.world_revision == 0 and resp.distance[0] == pytest.approx(MAX_D)
        assert not release.is_set()
        release.set()
        rh.wait_until(lambda: server.harness.call(client, req).world_revision == 1, 60.0, what="the slow mesh")
        assert server.harness.call(client, req).distance[0] == pytest.approx(-0.1, abs=1e-5)
    finally:
        release.set()
        executor.shutdown(timeout_sec=2.0)
        node.destroy_node()
        spin.join(timeout=5.0)


def test_add_of_a_disabled_id_replaces_geometry_and_keeps_it_disabled(server):
    v, t = ref.box((0.2, 0.2, 0.2))
    pose = np.array([6.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])
    probe = np.array([[6.0, 0.0, 0.5], [6.4, 0.0, 0.5]])
    server.publish(make_mesh_obstacle("dis_box", v, t, pose))
    server.publish(make_mesh_obstacle("dis_box", None, None, operation=MeshObstacle.DISABLE))
    v2, t2 = ref.box((0.4, 0.4, 0.4))
    server.publish(make_mesh_obstacle("dis_box", v2, t2, pose))  # ADD = new geometry and pose only
    np.testing.assert_allclose(server.signed_distance(probe)[0], [MAX_D, MAX_D])
    server.publish(make_mesh_obstacle("dis_box", None, None, operation=MeshObstacle.ENABLE))
    np.testing.assert_allclose(server.signed_distance(probe)[0], [-0.2, 0.2], atol=1e-5)
    server.publish(make_mesh_obstacle("dis_box", None, None, operation=MeshObstacle.REMOVE))


def test_failed_requests_carry_the_world_revision(server):
    current = server.revision()
    assert current > 0
    req = QuerySignedDistance.Request(points=float32_array([0.0, 0.0]))  # not a multiple of 3
    resp = server.harness.call(server.sd, req)
    assert not resp.success and resp.message
    assert resp.world_revision == current



def test_sigusr1_writes_every_thread_stack_and_the_node_serves_on(server):
    """The supervisor's diagnosis before a kill (ServerProcess.stop): SIGUSR1 puts every
    thread's Python stack in the log; the node keeps answering."""
    server.node.proc.send_signal(signal.SIGUSR1)
    log = rh.wait_until(lambda: "Current thread" in server.node.log() and server.node.log(), 60.0,
                        what="the stack dump in the log")
    dump = log[log.index("Thread 0x") if "Thread 0x" in log else log.index("Current thread"):]
    # the executor's worker threads and the world-update thread besides the main one
    assert dump.count("Thread 0x") + dump.count("Current thread 0x") >= 3, dump
    assert 'File "' in dump and "sdf_server.py" in dump, dump
    assert server.node.alive()
    req = QuerySignedDistance.Request(points=float32_array([5.0, 5.0, 5.0]))
    resp = server.harness.call(server.sd, req)
    assert resp.success, resp.message

def test_world_update_node_follows_remaps():
    """A `__node:=` remap in the process arguments renames the server only (no duplicate node
    names), and a remap of ~/mesh_obstacles moves the update subscription with it."""
    from rclpy.context import Context

    from robot_sdf.ros.sdf_server import SdfServer

    ctx = Context()
    rclpy.init(context=ctx, args=["--ros-args", "-r", "__node:=renamed_server",
                                  "-r", "~/mesh_obstacles:=/custom_meshes",
                                  "-p", "device:=cpu", "-p", "marker_rate_hz:=0.0",
                                  "-p", "slice_rate_hz:=0.0", "-p", "diagnostics_rate_hz:=0.0"],
               domain_id=rh.domain_id(60))
    try:
        node = SdfServer(context=ctx)
        try:
            assert node.get_name() == "renamed_server"
            updates = node._world_updates.companion_node
            assert updates.get_name() == "renamed_server_world_updates"
            topics = sorted(s.topic_name for s in updates.subscriptions)
            assert topics == ["/custom_meshes", "/renamed_server/obstacle_poses"]
        finally:
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=ctx)


def test_an_update_applied_across_a_clock_jump_back_records_no_stamp(server):
    """An ADD applied while the clock jumps back (a bag loop) must not leave its stamp behind
    the jump's forgetting: the loop's next update, stamped earlier, applies (it was skipped as
    stale when the worker recorded the stamp just after the jump cleared the stamps)."""
    import threading
    from types import SimpleNamespace

    from rclpy.clock import ClockChange
    from rclpy.duration import Duration

    node, entered, release, add_mesh = _inprocess_node(server, "/jump")
    try:
        v, t = ref.box((0.2, 0.2, 0.2))
        add = make_mesh_obstacle("jump_box", v, t, np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
        add.header.stamp.sec = 1010
        worker = threading.Thread(target=node._world_updates.apply_mesh_update, args=(add,))
        worker.start()
        assert entered.wait(60.0), "the ADD never started"
        node._world_updates.on_time_jump(SimpleNamespace(clock_change=ClockChange.ROS_TIME_NO_CHANGE,
                                                         delta=Duration(nanoseconds=-15 * 10**9)))
        release.set()
        worker.join(60.0)
        assert not worker.is_alive()
        node.world.add_mesh = add_mesh
        probe = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])  # the box's centre before / after the MOVE
        assert float(node.world.signed_distance(probe)[0][0]) == pytest.approx(-0.1, abs=1e-5)
        move = make_mesh_obstacle("jump_box", None, None, np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]),
                                  operation=MeshObstacle.MOVE)
        move.header.stamp.sec = 1001
        node._world_updates.apply_mesh_update(move)
        assert float(node.world.signed_distance(probe)[0][1]) == pytest.approx(-0.1, abs=1e-5)
    finally:
        release.set()
        node.destroy_node()
