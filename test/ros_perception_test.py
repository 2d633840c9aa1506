"""Depth cameras into a real sdf_server process over real rclpy: sensor_msgs/Image (32FC1 and
16UC1) and CameraInfo of a simulated camera (robot_sdf.perception.simulated_camera) that sees a
box, the camera's frame given by static_transforms; the service's signed distances against the
exact box distances, the two encodings against each other, and bad frames skipped with the world
as it was."""
from __future__ import annotations

import array

import numpy as np
import pytest
from rclpy.qos import qos_profile_sensor_data
from sensor_msgs.msg import CameraInfo, Image, PointCloud2, PointField

import reference as ref
import ros_helpers as rh
from robot_sdf.perception.fusion import PERCEIVED_MESH
from robot_sdf.perception.simulated_camera import SimulatedDepthCamera, look_at
from robot_sdf.ros.conversions import make_mesh_obstacle
from robot_sdf_interfaces.msg import MeshObstacle
from robot_sdf_interfaces.srv import QuerySignedDistance

DOMAIN = rh.domain_id(61)
BOX_V, BOX_T = ref.box((0.3, 0.3, 0.3))
CAMERA_POSE = look_at([0.7, 0.25, 0.7], [0.0, 0.0, 0.0])  # the top and +x faces at about 45 degrees
WIDTH, HEIGHT = 160, 120


def _camera_info(camera: SimulatedDepthCamera) -> CameraInfo:
    fx, fy, cx, cy = camera.intrinsics
    info = CameraInfo(width=WIDTH, height=HEIGHT)
    info.header.frame_id = "camera_optical"
    info.k = [fx, 0.0, cx, 0.0, fy, cy, 0.0, 0.0, 1.0]
    return info


def _image(depth: np.ndarray, encoding: str) -> Image:
    msg = Image(width=WIDTH, height=HEIGHT, encoding=encoding, is_bigendian=0)
    msg.header.frame_id = "camera_optical"
    if encoding == "16UC1":
        data = np.round(depth * 1000.0).astype("<u2")
    else:
        data = depth.astype("<f4")
    msg.step = WIDTH * data.itemsize
    msg.data = array.array("B", data.tobytes())
    return msg


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    pose = " ".join(f"{x:.9f}" for x in CAMERA_POSE)
    params = dict(device="cpu", max_distance=0.5, marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0,
                  num_cameras=1, use_lidar=True, voxel_size=0.02, perception_workspace_lower=[-0.4, -0.4, -0.4],
                  perception_workspace_upper=[0.4, 0.4, 0.4], static_transforms=f"world camera_optical {pose}")
    node = rh.NodeProcess(params, tmp_path_factory.mktemp("perception"), DOMAIN)
    harness = rh.RosHarness(DOMAIN, "perception_test")
    try:
        sd = harness.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        rh.wait_for_services(node, [sd])
        info_pub = harness.publisher(CameraInfo, "/camera_0/depth/camera_info", qos_profile_sensor_data)
        image_pub = harness.publisher(Image, "/camera_0/depth/image", qos_profile_sensor_data)
        cloud_pub = harness.publisher(PointCloud2, "/pointcloud", qos_profile_sensor_data)
        for pub in (info_pub, image_pub, cloud_pub):
            rh.wait_for_matched(pub)
        harness.cloud_pub = cloud_pub
        yield node, harness, sd, info_pub, image_pub
    finally:
        harness.close()
        node.stop()


def _fuse_until(rig, depth, encoding, predicate, what):
    """Publish camera_info and the frame until the service's answer satisfies ``predicate``
    (best-effort topics: a frame may be dropped, so it is sent again while waiting)."""
    node, harness, sd, info_pub, image_pub = rig
    camera = SimulatedDepthCamera(WIDTH, HEIGHT, 150.0, 150.0)

    def fused():
        info_pub.publish(_camera_info(camera))
        image_pub.publish(_image(depth, encoding))
        return predicate()

    return rh.wait_until(fused, timeout=60.0, interval=0.2, what=what)


def test_depth_frames_become_obstacles_of_the_services(rig):
    """A 32FC1 frame, then a 16UC1 frame of the same view: points 2 cm behind the seen faces read
    inside, points in front of them read their distance to the box (exact), and the two
    encodings give the same answers (1 mm apart at most: the millimetre quantisation)."""
    node, harness, sd, _, _ = rig
    camera = SimulatedDepthCamera(WIDTH, HEIGHT, 150.0, 150.0)
    depth = camera.render(BOX_V, BOX_T, CAMERA_POSE)
    behind = np.array([[0.13, 0.0, 0.0], [0.0, 0.0, 0.13], [0.1, 0.0, 0.13]])
    front = np.array([[0.25, 0.0, 0.0], [0.0, 0.0, 0.25], [0.22, 0.05, 0.22]])
    points = np.concatenate([behind, front])
    _fuse_until(rig, depth, "32FC1", lambda: harness.signed_distance(sd, points, 0.5)[0][0] < 0.0,
                "the first frame in the world")
    first, _ = harness.signed_distance(sd, points, 0.5)
    assert (first[:3] < 0.0).all()
    truth = ref.signed_distance(front, BOX_V, BOX_T)[0]
    np.testing.assert_allclose(first[3:], truth, atol=0.012)
    node_before = rh.count_in_log(node, "camera_0/depth/image")
    _fuse_until(rig, depth, "16UC1", lambda: True, "a 16UC1 frame")
    def converged():
        d = harness.signed_distance(sd, points, 0.5)[0]
        return [d] if np.abs(d - first).max() < 2e-3 else None

    again = rh.wait_until(converged, timeout=30.0, what="the 16UC1 frames' answers")[0]
    assert np.abs(again - first).max() < 2e-3
    assert rh.count_in_log(node, "camera_0/depth/image") == node_before  # nothing rejected


@pytest.mark.parametrize("bad, reason", [
    ("rgb8", "is not a depth encoding"),
    ("size", "camera_info"),
    ("frame", "camera_nowhere"),
])
def test_bad_frames_are_skipped_and_reported(rig, bad, reason):
    """Each bad frame is rejected with its reason in the log (and diagnostics) and the world stays
    as it was. Frames of one camera are handled in order, so once the first bad frame is reported
    every frame sent before it has been handled: the world is read then, and again after more
    bad frames were reported."""
    node, harness, sd, info_pub, image_pub = rig
    camera = SimulatedDepthCamera(WIDTH, HEIGHT, 150.0, 150.0)
    points = np.array([[0.13, 0.0, 0.0], [0.0, 0.0, -0.3], [0.3, 0.3, 0.3]])
    msg = _image(camera.render(BOX_V * 0.5, BOX_T, CAMERA_POSE), "32FC1")
    if bad == "rgb8":
        msg.encoding = "rgb8"
    elif bad == "size":
        msg.width, msg.height = WIDTH // 2, HEIGHT
    else:
        msg.header.frame_id = "camera_nowhere"

    def reported(count):
        def check():
            info_pub.publish(_camera_info(camera))
            image_pub.publish(msg)
            return rh.count_in_log(node, reason) >= count
        return check

    rh.wait_until(reported(1), timeout=60.0, interval=0.2, what=f"the node to report '{reason}'")
    before, revision = harness.signed_distance(sd, points, 0.5)
    seen = rh.count_in_log(node, reason)
    rh.wait_until(reported(seen + 2), timeout=60.0, interval=0.2, what="two more reports")
    assert node.alive()
    after, revision_after = harness.signed_distance(sd, points, 0.5)
    assert revision_after == revision
    np.testing.assert_array_equal(after, before)


def test_the_perceived_mesh_id_is_reserved(rig):
    """While cameras are on, a MeshObstacle naming the fused frames' mesh is rejected with its
    reason and changes nothing; the same box under another id joins the world."""
    node, harness, sd, _, _ = rig
    pub = harness.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
    rh.wait_for_matched(pub)
    corner = np.array([[0.3, 0.3, 0.3]])
    before, revision = harness.signed_distance(sd, corner, 0.5)
    assert before[0] > 0.0
    pub.publish(make_mesh_obstacle(PERCEIVED_MESH, BOX_V * 0.5, BOX_T, [0.3, 0.3, 0.3, 1.0, 0.0, 0.0, 0.0]))
    rh.wait_until(lambda: rh.count_in_log(node, f"mesh id '{PERCEIVED_MESH}' is the fused") >= 1, timeout=60.0,
                  what="the node to reject the reserved id")
    pub.publish(make_mesh_obstacle("box_in_the_corner", BOX_V * 0.5, BOX_T, [0.3, 0.3, 0.3, 1.0, 0.0, 0.0, 0.0]))
    rh.wait_until(lambda: harness.signed_distance(sd, corner, 0.5)[0][0] < 0.0, timeout=60.0,
                  what="the box under its own id in the world")
    assert node.alive()
    pub.publish(make_mesh_obstacle("box_in_the_corner", None, None, operation=MeshObstacle.REMOVE))
    rh.wait_until(lambda: harness.signed_distance(sd, corner, 0.5)[0][0] > 0.0, timeout=60.0,
                  what="the box removed again")


ARM_URDF = """<?xml version="1.0"?>
<robot name="post">
  <link name="base"/>
  <link name="arm"><collision><origin xyz="0 0 0.15"/><geometry><box size="0.1 0.1 0.3"/></geometry></collision></link>
  <joint name="j1" type="revolute"><parent link="base"/><child link="arm"/><axis xyz="0 0 1"/>
    <limit lower="-3" upper="3" velocity="1" effort="1"/></joint>
</robot>
"""
ARM_SPHERES = {"spheres": {"arm": [[0.0, 0.0, z, 0.08] for z in (0.05, 0.15, 0.25)]}}
ARM_BASE = np.array([0.0, -0.25, -0.15, 1.0, 0.0, 0.0, 0.0])  # the arm stands beside the box


def test_the_robot_is_removed_from_the_frames(tmp_path):
    """A node with robot_spheres_file, given /robot_description and /joint_states: a post-like arm
    beside the box, both in view, is left out of the world (at its centre the nearest surface is
    the box's, 10 cm away), the box is fused (a point behind its seen face reads inside)."""
    import yaml
    from sensor_msgs.msg import JointState
    from std_msgs.msg import String

    from robot_sdf.perception.simulated_camera import SimulatedDepthCamera

    domain = rh.domain_id(62)
    (tmp_path / "arm_spheres.yaml").write_text(yaml.safe_dump(ARM_SPHERES))
    camera_pose = " ".join(f"{x:.9f}" for x in CAMERA_POSE)
    base_pose = " ".join(f"{x:.9f}" for x in ARM_BASE)
    params = dict(device="cpu", max_distance=0.5, marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0,
                  num_cameras=1, perception_workspace_lower=[-0.4, -0.45, -0.4],
                  perception_workspace_upper=[0.4, 0.4, 0.4], robot_spheres_file=str(tmp_path / "arm_spheres.yaml"),
                  static_transforms=f"world camera_optical {camera_pose}; world base {base_pose}")
    node = rh.NodeProcess(params, tmp_path, domain)
    harness = rh.RosHarness(domain, "robot_filter_test")
    try:
        sd = harness.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        rh.wait_for_services(node, [sd])
        description = harness.publisher(String, "/robot_description", rh.MESH_QOS)
        joints = harness.publisher(JointState, "/joint_states", 10)
        info_pub = harness.publisher(CameraInfo, "/camera_0/depth/camera_info", qos_profile_sensor_data)
        image_pub = harness.publisher(Image, "/camera_0/depth/image", qos_profile_sensor_data)
        for pub in (description, joints, info_pub, image_pub):
            rh.wait_for_matched(pub)
        description.publish(String(data=ARM_URDF))
        arm_v, arm_t = ref.box((0.1, 0.1, 0.3))
        arm_v = arm_v + ARM_BASE[:3] + [0.0, 0.0, 0.15]
        scene = (np.concatenate([BOX_V, arm_v]), np.concatenate([BOX_T, arm_t + len(BOX_V)]))
        camera = SimulatedDepthCamera(WIDTH, HEIGHT, 150.0, 150.0)
        depth = camera.render(*scene, CAMERA_POSE)
        assert (camera.render(arm_v, arm_t, CAMERA_POSE) > 0).mean() > 0.03  # the arm is in view
        points = np.array([[0.13, 0.0, 0.0], ARM_BASE[:3] + [0.0, 0.0, 0.15]])

        def fused():
            joints.publish(JointState(name=["j1"], position=[0.0]))
            info_pub.publish(_camera_info(camera))
            image_pub.publish(_image(depth, "32FC1"))
            return harness.signed_distance(sd, points, 0.5)[0][0] < 0.0

        rh.wait_until(fused, timeout=60.0, interval=0.2, what="the box in the world")
        distance, _ = harness.signed_distance(sd, points, 0.5)
        # The arm's centre: 10 cm from the box; with the arm fused it would be 6 mm from its surface.
        assert distance[0] < 0.0 and distance[1] > 0.05, distance
    finally:
        harness.close()
        node.stop()


def _cloud(points: np.ndarray, frame_id: str, organised: bool) -> PointCloud2:
    """A PointCloud2 of float32 x, y, z and a float32 intensity between them and the next point."""
    n = len(points)
    data = np.zeros((n, 4), "<f4")
    data[:, :3] = points
    msg = PointCloud2(height=4 if organised else 1, width=n // 4 if organised else n, point_step=16,
                      is_bigendian=False, is_dense=False)
    msg.row_step = msg.width * 16
    msg.header.frame_id = frame_id
    msg.fields = [PointField(name=name, offset=4 * k, datatype=PointField.FLOAT32, count=1)
                  for k, name in enumerate(("x", "y", "z", "intensity"))]
    msg.data = array.array("B", data[:msg.width * msg.height].tobytes())
    return msg


@pytest.mark.parametrize("organised", [False, True])
def test_a_lidar_cloud_joins_the_same_world(rig, organised):
    """A PointCloud2 (organised or not) of a second box, returns in the sensor's frame (the
    camera's, by static_transforms, so the rays run from there): a point 2 cm below its top reads
    inside, one 10 cm above it reads 10 cm (to 2 cm); the first box, fused from the camera, stays."""
    node, harness, sd, _, _ = rig
    other_v = BOX_V * [2.0 / 3.0, 2.0 / 3.0, 0.5] + [0.05, 0.28, -0.075]  # 20 x 20 x 15 cm, top at z = 0
    scene = (np.concatenate([BOX_V, other_v]), np.concatenate([BOX_T, BOX_T + len(BOX_V)]))
    camera = SimulatedDepthCamera(WIDTH, HEIGHT, 150.0, 150.0)
    in_sensor_frame = camera.points(camera.render(*scene, CAMERA_POSE), [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    msg = _cloud(in_sensor_frame[:len(in_sensor_frame) // 4 * 4], "camera_optical", organised)
    probe = np.array([[0.05, 0.28, -0.02], [0.05, 0.28, 0.10], [0.13, 0.0, 0.0]])

    def fused():
        harness.cloud_pub.publish(msg)
        return harness.signed_distance(sd, probe, 0.5)[0][0] < 0.0

    rh.wait_until(fused, timeout=60.0, interval=0.2, what="the cloud in the world")
    distance, _ = harness.signed_distance(sd, probe, 0.5)
    assert distance[0] < 0.0 and abs(distance[1] - 0.1) < 0.02 and distance[2] < 0.0, distance


def test_a_cloud_without_xyz_is_skipped_and_reported(rig):
    node, harness, sd, _, _ = rig
    msg = _cloud(np.zeros((8, 3), np.float32), "camera_optical", False)
    msg.fields = msg.fields[:2]  # x and y only
    points = np.array([[0.13, 0.0, 0.0], [0.3, 0.3, 0.3]])

    def reported(count):
        def check():
            harness.cloud_pub.publish(msg)
            return rh.count_in_log(node, "lacks float32 field(s) z") >= count
        return check

    rh.wait_until(reported(1), timeout=60.0, interval=0.2, what="the node to report the cloud")
    before, revision = harness.signed_distance(sd, points, 0.5)
    rh.wait_until(reported(rh.count_in_log(node, "lacks float32 field(s) z") + 1), timeout=60.0, interval=0.2,
                  what="one more report")
    after, revision_after = harness.signed_distance(sd, points, 0.5)
    assert node.alive() and revision_after == revision
    np.testing.assert_array_equal(after, before)
