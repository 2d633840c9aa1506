"""tf on a real robot, over a real sdf_server process: simulated time switched on at run time, a
bag played in a loop (the clock jumps back, the transforms change), a message stamped just ahead
of the newest transform (held aside, not holding other updates) and one that never resolves.

Where tf2_ros is installed the node uses it and this test publishes tf2_msgs/TFMessage on /tf;
without it (the pip wheels) the node's built-in buffer follows tf2's rules, fed from /tf when
tf2_msgs can be imported, else from ~/transforms (geometry_msgs/TransformStamped). The test
asserts what both say (the frame, the reason class), not either's wording. Expected world poses
are 4x4 matrix products in numpy, distances exact box distances.
"""
from __future__ import annotations

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TransformStamped
from rcl_interfaces.msg import Parameter, ParameterType, ParameterValue
from rcl_interfaces.srv import SetParameters
from rosgraph_msgs.msg import Clock

import reference as ref
import ros_helpers as rh
from robot_sdf.ros.conversions import make_mesh_obstacle, make_obstacle_pose
from robot_sdf.ros.frames import JUMP_BACK_TEXT, tf2_msgs_available
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import QuerySignedDistance

DOMAIN = rh.domain_id(97)
BOX = (0.3, 0.2, 0.4)
NODE_JUMP_TEXT = "the clock jumped back"
SEC = 1_000_000_000


def yaw_pose(x: float, y: float, yaw: float) -> np.ndarray:
    return np.array([x, y, 0.0, np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])


def matrix(pose) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = ref.quat_to_matrix(np.asarray(pose[3:], float))
    m[:3, 3] = pose[:3]
    return m


def stamped(msg, stamp_ns: int):
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(int(stamp_ns), SEC)
    return msg


class TfRig:
    def __init__(self, tmp) -> None:
        self.harness = rh.RosHarness(DOMAIN, "tf_test")
        self.node = rh.NodeProcess(dict(device="cpu", max_distance=0.5, marker_rate_hz=0.0, slice_rate_hz=0.0,
                                        diagnostics_rate_hz=20.0, tf_timeout=5.0), tmp, DOMAIN)
        try:
            h = self.harness
            self.mesh_pub = h.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
            self.pose_pub = h.publisher(ObstaclePose, "/sdf_server/obstacle_poses")
            self.clock_pub = h.publisher(Clock, "/clock")
            if tf2_msgs_available():
                from tf2_msgs.msg import TFMessage

                self.tf_pub = h.publisher(TFMessage, "/tf", 100)
                self._wrap = lambda t: TFMessage(transforms=[t])
            else:
                self.tf_pub = h.publisher(TransformStamped, "/sdf_server/transforms", 100)
                self._wrap = lambda t: t
            self.sd = h.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
            self.set_params = h.client(SetParameters, "/sdf_server/set_parameters")
            rh.wait_for_services(self.node, [self.sd, self.set_params])
            self.diagnostics = h.subscribe(DiagnosticArray, "/diagnostics")
            rh.wait_for_matched(self.tf_pub)
        except BaseException:
            self.close()
            raise

    def set_parameter(self, name: str, value) -> None:
        kind, field = ((ParameterType.PARAMETER_BOOL, "bool_value") if isinstance(value, bool)
                       else (ParameterType.PARAMETER_DOUBLE, "double_value"))
        request = SetParameters.Request(parameters=[Parameter(name=name, value=ParameterValue(type=kind,
                                                                                              **{field: value}))])
        (result,) = self.harness.call(self.set_params, request).results
        assert result.successful, result.reason

    def transform(self, parent: str, child: str, stamp_ns: int, pose) -> None:
        t = stamped(TransformStamped(), stamp_ns)
        t.header.frame_id, t.child_frame_id = parent, child
        tr, r = t.transform.translation, t.transform.rotation
        tr.x, tr.y, tr.z = (float(v) for v in pose[:3])
        r.w, r.x, r.y, r.z = (float(v) for v in pose[3:])
        self.tf_pub.publish(self._wrap(t))

    def clock(self, stamp_ns: int) -> None:
        msg = Clock()
        msg.clock.sec, msg.clock.nanosec = divmod(int(stamp_ns), SEC)
        self.clock_pub.publish(msg)

    def run_clock_until_seen(self, stamp_ns: int) -> None:
        """Tick the clock on from ``stamp_ns`` (50 ms steps) until the node's diagnostics, which its
        timer publishes on the node's clock, carry a stamp at or after it."""
        ticks = iter(range(int(stamp_ns), int(stamp_ns) + 600 * SEC, SEC // 20))

        def seen():
            self.clock(next(ticks))
            return any(a.header.stamp.sec * SEC + a.header.stamp.nanosec >= stamp_ns
                       for a in self.diagnostics.snapshot()[-5:])

        rh.wait_until(seen, 15.0, what=f"the node's clock at {stamp_ns / SEC:g} s")

    def diag(self, key: str, predicate, what: str) -> None:
        """Wait for a diagnostics message (from now on) whose stamp/value satisfies predicate."""
        start = len(self.diagnostics.snapshot())

        def found():
            for arr in self.diagnostics.snapshot()[start:]:
                for s in arr.status:
                    values = {kv.key: kv.value for kv in s.values}
                    if key in values and predicate(arr, values[key]):
                        return True
            return False

        rh.wait_until(found, 15.0, what=what)

    def held_until(self, count: int, action=lambda: None) -> None:
        """Repeat ``action`` until the diagnostics report ``count`` held updates."""
        def held():
            action()
            last = self.diagnostics.snapshot()[-1:]
            values = {kv.key: kv.value for arr in last for s in arr.status for kv in s.values}
            return values.get("updates_held") == str(count)

        rh.wait_until(held, 15.0, interval=0.1, what=f"{count} held updates")

    def distance(self, points) -> tuple[np.ndarray, int]:
        return self.harness.signed_distance(self.sd, points)

    def revision(self) -> int:
        return self.distance([[100.0, 100.0, 100.0]])[1]

    def publish_until(self, msg, predicate, what: str) -> None:
        rh.wait_until(lambda: self.mesh_pub.publish(msg) or predicate(), 15.0, interval=0.2, what=what)

    def lands_at(self, box_in_world: np.ndarray) -> bool:
        probes = box_in_world[:3, 3] + np.array([[0, 0, 0], [0.3, 0, 0], [0, 0.25, 0.1]])
        local = (np.linalg.inv(box_in_world) @ np.c_[probes, np.ones(len(probes))].T).T[:, :3]
        expected = rh.box_signed_distance(local, BOX, np.array([0, 0, 0, 1.0, 0, 0, 0]))
        return bool(np.allclose(self.distance(probes)[0], expected, atol=2e-4))

    def close(self) -> None:
        code = self.node.stop()
        self.harness.close()
        assert code == 0, self.node.log()


@pytest.fixture(scope="module")
def rig(tmp_path_factory):
    r = TfRig(tmp_path_factory.mktemp("tf"))
    try:
        yield r
    finally:
        r.close()


def test_bag_loop_lands_the_obstacle_at_the_pose_after_the_jump(rig):
    # simulated time switched on at run time: the tf listener must follow (or it never sees the jump)
    rig.set_parameter("use_sim_time", True)
    rh.wait_for_matched(rig.clock_pub)  # only a node on simulated time subscribes to /clock
    odom_a, odom_b = yaw_pose(1.0, 2.0, 0.3), yaw_pose(-3.0, 1.0, -0.8)  # odom in world, before / after
    box_in_odom = yaw_pose(0.5, -0.2, 0.4)
    v, t = ref.box(BOX)

    # first pass of the bag: 1000 -> 1015 s, odom at A
    for k in range(31):
        rig.transform("world", "odom", 1000 * SEC + k * SEC // 2, odom_a)
    for k in range(31):
        rig.clock(1000 * SEC + k * SEC // 2)
    rig.run_clock_until_seen(1015 * SEC)
    add = stamped(make_mesh_obstacle("loop_box", v, t, box_in_odom, frame_id="odom"), 1010 * SEC)
    rig.publish_until(add, lambda: rig.lands_at(matrix(odom_a) @ matrix(box_in_odom)), "the box at A")

    # the bag loops: the clock jumps back to 1000 s; tf and the node forget what they had
    jumps_tf, jumps_node = rig.node.log().count(JUMP_BACK_TEXT), rig.node.log().count(NODE_JUMP_TEXT)
    rh.wait_until(lambda: rig.clock(1000 * SEC) or (rig.node.log().count(JUMP_BACK_TEXT) > jumps_tf and
                                                   rig.node.log().count(NODE_JUMP_TEXT) > jumps_node),
                  15.0, interval=0.1, what="the jump back in time to clear tf and the update stamps")
    # second pass: odom at B; the box, stamped 1001.5 s (before its last stamp, 1010 s), moves
    for k in range(7):
        rig.transform("world", "odom", 1000 * SEC + k * SEC // 2, odom_b)
    move = stamped(make_mesh_obstacle("loop_box", None, None, box_in_odom, operation=MeshObstacle.MOVE,
                                      frame_id="odom"), 1001 * SEC + SEC // 2)
    rig.publish_until(move, lambda: rig.lands_at(matrix(odom_b) @ matrix(box_in_odom)), "the box at B")
    assert "TF_OLD_DATA" not in rig.node.log()


def test_a_transform_just_ahead_is_waited_for_without_holding_other_updates(rig):
    v, t = ref.box(BOX)
    odom_b, odom_c = yaw_pose(-3.0, 1.0, -0.8), yaw_pose(-2.0, 3.0, 0.6)
    box_in_odom = yaw_pose(0.0, 0.5, 1.0)
    # back to the system clock (the node's timers run again): a change of time source clears tf too
    clears = rig.node.log().count(JUMP_BACK_TEXT)
    rig.set_parameter("use_sim_time", False)
    rh.wait_until(lambda: rig.node.log().count(JUMP_BACK_TEXT) > clears, 10.0, what="tf cleared on the change")
    for k in range(7):  # lookups use the message stamps, whatever the clock
        rig.transform("world", "odom", 1000 * SEC + k * SEC // 2, odom_b)
    rig.diag("updates_held", lambda arr, value: value == "0", "nothing held")
    before = rig.revision()
    # stamped 50 ms after the newest odom data: held (tf_timeout is 5 s), the world does not change
    rig.mesh_pub.publish(stamped(make_mesh_obstacle("ahead_box", v, t, box_in_odom, frame_id="odom"),
                                 1003 * SEC + SEC // 20))
    rig.diag("updates_held", lambda arr, value: value == "1", "the ADD held for its transform")
    assert rig.revision() == before
    # meanwhile other ids are applied
    rig.publish_until(make_mesh_obstacle("free_box", v, t, [20.0, 0.0, 0.0, 1, 0, 0, 0]),
                      lambda: rig.lands_at(matrix([20.0, 0.0, 0.0, 1, 0, 0, 0])), "another id while one is held")
    rig.diag("updates_held", lambda arr, value: value == "1", "the ADD still held")
    # a held id keeps its order: a MOVE (resolvable at once) queues behind its held ADD
    rig.mesh_pub.publish(stamped(make_mesh_obstacle("order_box", v, t, yaw_pose(1.0, -1.0, 0.0), frame_id="odom"),
                                 1003 * SEC + SEC // 20))
    moved = np.array([25.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    rig.mesh_pub.publish(make_mesh_obstacle("order_box", None, None, moved, operation=MeshObstacle.MOVE))
    # a pose just ahead is held too (the latest of its target; re-sent copies replace it)
    pose_in_odom = yaw_pose(-1.0, 0.0, 0.3)
    held_pose = stamped(make_obstacle_pose("free_box", pose_in_odom, frame_id="odom"), 1003 * SEC + SEC // 20)
    rig.held_until(4, lambda: rig.pose_pub.publish(held_pose))
    assert rig.lands_at(matrix([20.0, 0.0, 0.0, 1, 0, 0, 0]))  # the held pose changed nothing yet
    # the transform at 1003.1 s arrives: the held ADD and pose land at the pose interpolated halfway
    # from B to C, and the MOVE applies after its ADD
    rig.transform("world", "odom", 1003 * SEC + SEC // 10, odom_c)
    half = np.array([-2.5, 2.0, 0.0, np.cos(-0.1 / 2), 0.0, 0.0, np.sin(-0.1 / 2)])  # x, y halfway; yaw -0.8 -> 0.6
    rh.wait_until(lambda: rig.lands_at(matrix(half) @ matrix(box_in_odom)), 15.0, what="the held ADD applied")
    rh.wait_until(lambda: rig.lands_at(matrix(half) @ matrix(pose_in_odom)), 15.0, what="the held pose applied")
    rh.wait_until(lambda: rig.lands_at(matrix(moved)), 15.0, what="the MOVE after its held ADD")
    rig.held_until(0)


def test_unresolvable_frames_are_rejected_with_the_reason_class(rig):
    v, t = ref.box(BOX)
    rig.set_parameter("tf_timeout", 0.3)
    try:
        before = rig.revision()
        # a frame tf does not know: rejected at once
        rig.mesh_pub.publish(stamped(make_mesh_obstacle("cam_box", v, t, frame_id="camera"), 1003 * SEC))
        # just ahead of odom's data, but nothing comes within tf_timeout: rejected as extrapolation
        rig.mesh_pub.publish(stamped(make_mesh_obstacle("late_box", v, t, frame_id="odom"), 1003 * SEC + SEC // 5))
        # behind the data kept (tf keeps 10 s; none before 1000 s): rejected at once
        rig.mesh_pub.publish(stamped(make_mesh_obstacle("past_box", v, t, frame_id="odom"), 990 * SEC))

        def rejection(name: str) -> str | None:
            return next((ln for ln in rig.node.log().splitlines()
                         if f"rejected MeshObstacle ADD '{name}'" in ln), None)

        lines = rh.wait_until(lambda: all(rejection(n) for n in ("cam_box", "late_box", "past_box"))
                              and [rejection(n) for n in ("cam_box", "late_box", "past_box")], 15.0,
                              what="three rejections")
        for line, frame, reason in zip(lines, ("camera", "odom", "odom"),
                                       ("unknown frame: ", "extrapolation: ", "extrapolation: ")):
            assert f"cannot transform header.frame_id '{frame}' into world frame 'world'" in line, line
            assert reason in line, line
        assert rig.revision() == before
    finally:
        rig.set_parameter("tf_timeout", 5.0)
