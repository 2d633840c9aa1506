"""Tf2Buffer against the tf2_ros releases whose own clock-jump callback is missing or broken.

tf2_ros is not among the pip wheels, so the node's tf2 path runs in CI only against this module's
``tf2_ros`` stand-in: a Buffer with tf2's lookup rules (robot_sdf's TransformCache, itself tested
against numpy matrices in frames_test.py) that registers, like tf2_ros_py 0.32.2 up to ros2/geometry2
pull request 711, a jump callback defined without ``self`` (every call raises TypeError, which rclpy
re-raises into whoever changed the time). The clock is real rclpy (a ROSClock driven through
use_sim_time and time overrides), no DDS traffic: the companion node never spins here.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest

import ros_helpers as rh  # noqa: F401 - sets the loopback discovery range before rclpy starts
import rclpy
from rclpy.clock import ClockType, JumpThreshold
from rclpy.duration import Duration
from rclpy.time import Time

from robot_sdf.ros import frames
from robot_sdf.ros.frames import EXTRAPOLATION, INVALID, UNKNOWN_FRAME, LookupFailed, TransformCache

SEC = 1_000_000_000


class _TransformException(Exception):
    pass


def _stand_in_tf2_ros(broken_jump_callback: bool) -> types.ModuleType:
    module = types.ModuleType("tf2_ros")
    classes = {name: type(name, (_TransformException,), {}) for name in
               ("LookupException", "ConnectivityException", "ExtrapolationException", "TimeoutException",
                "InvalidArgumentException")}
    module.TransformException = _TransformException
    module.__dict__.update(classes)
    by_reason = {UNKNOWN_FRAME: classes["LookupException"], EXTRAPOLATION: classes["ExtrapolationException"],
                 INVALID: classes["InvalidArgumentException"]}

    class Buffer:
        def __init__(self, node=None) -> None:
            self.cache = TransformCache()
            self.clears = 0
            if broken_jump_callback:
                threshold = JumpThreshold(min_forward=None, min_backward=Duration(seconds=-1), on_clock_change=True)
                self.jump_handle = node.get_clock().create_jump_callback(threshold,
                                                                         post_callback=self.time_jump_callback)

        def time_jump_callback(jump):  # noqa: N805 - the upstream defect: no self
            raise AssertionError("unreachable: calling it binds the buffer as 'jump' and raises TypeError")

        def clear(self) -> None:
            self.clears += 1
            self.cache.clear()

        def set_transform(self, t, authority: str, static: bool = False) -> None:
            tr, r = t.transform.translation, t.transform.rotation
            self.cache.set_transform(t.header.frame_id, t.child_frame_id, frames.stamp_to_ns(t.header.stamp),
                                     [tr.x, tr.y, tr.z, r.w, r.x, r.y, r.z], static=static)

        def set_transform_static(self, t, authority: str) -> None:
            self.set_transform(t, authority, static=True)

        def lookup_transform(self, target, source, time, timeout=Duration()):
            from geometry_msgs.msg import TransformStamped

            stamp = None if time.nanoseconds == 0 else time.nanoseconds
            try:
                pose = self.cache.lookup(target, source, stamp, 0.0)
            except LookupFailed as exc:
                raise by_reason.get(exc.reason, _TransformException)(str(exc)) from None
            out = TransformStamped()
            out.header.frame_id, out.child_frame_id = target, source
            if stamp is None:  # tf2 stamps a latest-time lookup with the chain's latest common time
                stamp = self.cache.latest_stamp(target, source)
            out.header.stamp.sec, out.header.stamp.nanosec = divmod(stamp, SEC)
            tr, r = out.transform.translation, out.transform.rotation
            tr.x, tr.y, tr.z, r.w, r.x, r.y, r.z = (float(v) for v in pose)
            return out

    class TransformListener:
        def __init__(self, buffer, node, spin_thread=False, **topics) -> None:
            self.unregistered = False

        def unregister(self) -> None:
            self.unregistered = True

    module.Buffer, module.TransformListener = Buffer, TransformListener
    return module


def _transform(parent: str, child: str, stamp_ns: int, x: float):
    from geometry_msgs.msg import TransformStamped

    t = TransformStamped()
    t.header.frame_id, t.child_frame_id = parent, child
    t.header.stamp.sec, t.header.stamp.nanosec = divmod(stamp_ns, SEC)
    t.transform.translation.x, t.transform.rotation.w = x, 1.0
    return t


@pytest.fixture
def context():
    ctx = rclpy.Context()
    rclpy.init(context=ctx, domain_id=rh.domain_id(29))
    try:
        yield ctx
    finally:
        rclpy.shutdown(context=ctx)


@pytest.mark.parametrize("broken_jump_callback", [True, False], ids=["tf2_ros_0.32.2_callback", "no_callback"])
def test_tf2_buffer_clears_on_time_source_change_and_jump_back(context, monkeypatch, broken_jump_callback):
    monkeypatch.setitem(sys.modules, "tf2_ros", _stand_in_tf2_ros(broken_jump_callback))
    static = [("world", "map", np.array([1.0, 0, 0, 1, 0, 0, 0]))]
    tf = frames.Tf2Buffer("sdf_server", "", context, static, use_sim_time=False)
    try:
        buffer = tf.buffer
        buffer.set_transform(_transform("map", "odom", 5 * SEC, 2.0), "test")
        np.testing.assert_allclose(tf.lookup("world", "odom", 5 * SEC, 0.0)[:3], [3.0, 0, 0])

        tf.set_use_sim_time(True)  # the time source changes: raised TypeError before, now clears
        assert buffer.clears == 1
        with pytest.raises(LookupFailed) as info:
            tf.lookup("world", "odom", 5 * SEC, 0.0)
        assert info.value.reason == UNKNOWN_FRAME
        np.testing.assert_allclose(tf.lookup("world", "map", None, 0.0)[:3], [1.0, 0, 0])  # static data stays

        clock = tf._node.get_clock()
        clock.set_ros_time_override(Time(seconds=1015, clock_type=ClockType.ROS_TIME))  # forward: kept
        buffer.set_transform(_transform("map", "odom", 1015 * SEC, 4.0), "test")
        clock.set_ros_time_override(Time(seconds=1014.5, clock_type=ClockType.ROS_TIME))  # back < 1 s: kept
        assert buffer.clears == 1
        assert tf.latest_stamp("world", "odom") == 1015 * SEC
        clock.set_ros_time_override(Time(seconds=1000, clock_type=ClockType.ROS_TIME))  # a bag loop
        assert buffer.clears == 2
        assert tf.latest_stamp("world", "odom") is None
        buffer.set_transform(_transform("map", "odom", 1000 * SEC, 6.0), "test")  # the post-jump pose lands
        np.testing.assert_allclose(tf.lookup("world", "odom", 1000 * SEC, 0.0)[:3], [7.0, 0, 0])
    finally:
        tf.close()
    assert tf._listener.unregistered


def test_frame_names_with_a_leading_slash_follow_tf2():
    """tf2 strips a leading '/' from incoming transforms and refuses it in lookups
    (InvalidArgumentException): the built-in cache gives the same reason class as tf2_ros."""
    cache = TransformCache()
    cache.set_transform("/map", "/odom", 0, [1.0, 0, 0, 1, 0, 0, 0], static=True)
    np.testing.assert_allclose(cache.lookup("map", "odom", None, 0.0)[:3], [1.0, 0, 0])
    for target, source in (("map", "/odom"), ("/map", "odom"), ("", "odom")):
        with pytest.raises(LookupFailed) as info:
            cache.lookup(target, source, None, 0.0)
        assert info.value.reason == INVALID
