"""robot_sdf.ros.frames: the transform cache (tf2's lookup rules), and the resolver driven by a buffer of our own.

Expected transforms are built as 4x4 homogeneous matrices from test/reference.py's quaternion
matrix, independently of the module's quaternion algebra.
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import reference as ref
from robot_sdf.ros.frames import (EXTRAPOLATION, NOT_CONNECTED, UNKNOWN_FRAME, FrameError, FrameResolver,
                                  LookupFailed, TransformCache, TransformPending, compose, parse_static_transforms)

rng = np.random.default_rng(7)


def random_pose() -> np.ndarray:
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    return np.concatenate([rng.uniform(-2, 2, 3), q])


def matrix(pose) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = ref.quat_to_matrix(np.asarray(pose[3:], float))
    m[:3, 3] = pose[:3]
    return m


def same_transform(pose, m, atol=1e-9) -> None:
    """pose (7,) and 4x4 matrix m describe the same rigid transform (q and -q alike)."""
    np.testing.assert_allclose(matrix(pose), m, atol=atol)


def entry(parent, child, pose) -> str:
    return f"{parent} {child} " + " ".join(repr(float(x)) for x in pose)


# ------------------------------------------------------------------ static transforms


def test_static_chains_through_the_common_ancestor():
    # world -> map -> odom -> base ; world -> camera -> optical
    poses = {k: random_pose() for k in ("map", "odom", "base", "camera", "optical")}
    parent = {"map": "world", "odom": "map", "base": "odom", "camera": "world", "optical": "camera"}
    text = "; ".join(entry(parent[c], c, poses[c]) for c in ("base", "map", "optical", "odom", "camera"))
    tree = TransformCache(parse_static_transforms(text))

    def in_world(frame):
        m = np.eye(4)
        while frame != "world":
            m = matrix(poses[frame]) @ m
            frame = parent[frame]
        return m

    for target, source in (("world", "base"), ("world", "optical"), ("optical", "base"), ("base", "world"),
                           ("odom", "map"), ("camera", "camera")):
        got = tree.lookup(target, source, None, 0.0)
        same_transform(got, np.linalg.inv(in_world(target)) @ in_world(source))


@pytest.mark.parametrize("text, why", [
    ("world map 1 2 3", "expected 'parent child x y z qw qx qy qz', got 5 fields"),
    ("world map 0 0 0 1 0 0 x", "could not convert"),
    ("world map 0 0 0 2 0 0 0", "unit length"),
    ("world map 0 0 nan 1 0 0 0", "not finite"),
    ("map map 0 0 0 1 0 0 0", "parent and child are the same frame"),
    ("world map 0 0 0 1 0 0 0; odom map 0 0 0 1 0 0 0", "already has parent 'world'"),
    ("a b 0 0 0 1 0 0 0; b c 0 0 0 1 0 0 0; c a 0 0 0 1 0 0 0", "cycle"),
])
def test_bad_static_transforms_are_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why.replace("(", r"\(").replace(")", r"\)")):
        parse_static_transforms(text)


def test_empty_entries_and_renormalised_quaternions():
    (t,) = parse_static_transforms(" ; world map 1 0 0 1.0004 0 0 0 ;")
    assert t[0] == "world" and t[1] == "map"
    np.testing.assert_allclose(t[2], [1, 0, 0, 1, 0, 0, 0])
    assert parse_static_transforms("") == []


def test_unknown_and_unconnected_frames_fail_the_lookup():
    tree = TransformCache(parse_static_transforms("world map 0 0 0 1 0 0 0; base laser 0 0 0 1 0 0 0"))
    with pytest.raises(LookupFailed, match="frame 'camera'") as info:
        tree.lookup("world", "camera", None, 0.0)
    assert info.value.reason == UNKNOWN_FRAME
    with pytest.raises(LookupFailed, match="not connected") as info:
        tree.lookup("world", "laser", None, 0.0)
    assert info.value.reason == NOT_CONNECTED
    assert tree.latest_stamp("world", "laser") is None and tree.latest_stamp("world", "map") == 0


# ------------------------------------------------------------------ resolver over a buffer of our own


class StampedBuffer:
    """Transforms world <- frame known at exact stamps (ns); 'latest' is the newest one.

    Records every lookup so tests can check which stamp and timeout the resolver asked for.
    """

    def __init__(self) -> None:
        self.data: dict[str, dict[int, np.ndarray]] = {}
        self.calls: list[tuple[str, str, int | None, float]] = []

    def add(self, frame: str, stamp_ns: int, pose) -> None:
        self.data.setdefault(frame, {})[stamp_ns] = np.asarray(pose, float)

    def lookup(self, target, source, stamp_ns, timeout_s):
        self.calls.append((target, source, stamp_ns, timeout_s))
        assert target == "world"
        if source not in self.data:
            raise LookupFailed(f'"{source}" passed to lookupTransform argument source_frame does not exist',
                               UNKNOWN_FRAME)
        stamps = self.data[source]
        if stamp_ns is None:
            return stamps[max(stamps)]
        if stamp_ns not in stamps:
            raise LookupFailed(f"no transform at {stamp_ns} (have {sorted(stamps)})", EXTRAPOLATION)
        return stamps[stamp_ns]

    def latest_stamp(self, target, source):
        return max(self.data[source]) if source in self.data else None


def test_resolver_uses_the_transform_at_the_message_stamp():
    buf = StampedBuffer()
    early, late = random_pose(), random_pose()
    buf.add("odom", 1_000, early)
    buf.add("odom", 2_000, late)
    resolver = FrameResolver("world", buf, timeout_s=0.25)
    pose = random_pose()
    same_transform(resolver.pose_in_world("odom", 1_000, pose), matrix(early) @ matrix(pose))
    assert buf.calls[-1] == ("world", "odom", 1_000, 0.0)  # lookups never wait (see TransformPending)
    same_transform(resolver.pose_in_world("odom", 2_000, pose), matrix(late) @ matrix(pose))
    # a zero stamp means "latest", as in tf2
    same_transform(resolver.pose_in_world("odom", 0, pose), matrix(late) @ matrix(pose))
    assert buf.calls[-1][2] is None
    # use_latest ignores the stamp
    resolver.use_latest = True
    same_transform(resolver.pose_in_world("odom", 1_000, pose), matrix(late) @ matrix(pose))
    assert buf.calls[-1][2] is None


def test_world_frame_poses_need_no_buffer_and_are_validated():
    buf = StampedBuffer()
    resolver = FrameResolver("world", buf)
    pose = random_pose()
    np.testing.assert_allclose(resolver.pose_in_world("world", 5, pose), pose)
    assert buf.calls == []
    with pytest.raises(ValueError, match="unit length"):
        resolver.pose_in_world("world", 0, [0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="not finite"):
        resolver.pose_in_world("odom", 0, [np.nan, 0, 0, 1, 0, 0, 0])
    assert buf.calls == []  # a bad pose is refused before any lookup


def test_missing_transforms_are_rejected_with_the_reason():
    buf = StampedBuffer()
    buf.add("odom", 1_000, random_pose())
    resolver = FrameResolver("world", buf, timeout_s=0.05)
    with pytest.raises(FrameError, match=r"cannot transform header.frame_id 'camera' into world frame 'world'"
                                         r": unknown frame: .*does not exist"):
        resolver.pose_in_world("camera", 3_000, random_pose())
    with pytest.raises(FrameError, match="extrapolation: no transform at 1500") as info:
        resolver.pose_in_world("odom", 1_500, random_pose())
    assert isinstance(info.value, TransformPending)  # 500 ns ahead of the newest data: worth holding
    with pytest.raises(FrameError, match="header.frame_id '' is empty"):
        resolver.pose_in_world("", 0, random_pose())
    buf.add("broken", 1, [0, 0, 0, 0, 0, 0, 0])
    with pytest.raises(FrameError, match="transform 'world' <- 'broken' is invalid"):
        resolver.pose_in_world("broken", 1, random_pose())
    with pytest.raises(FrameError, match="no transforms are available"):
        FrameResolver("world", None).pose_in_world("odom", 0, random_pose())


def test_a_rejected_frame_leaves_the_world_as_it_was():
    """The node computes the world pose before it touches the world: a failed lookup changes nothing."""
    from robot_sdf import MeshWorld

    world = MeshWorld(device="cpu")
    v, t = ref.box((0.2, 0.2, 0.2))
    world.add_mesh("a", v, t)
    before = (world.revision, world.mesh_geometry("a")[2].copy())
    resolver = FrameResolver("world", StampedBuffer())
    with pytest.raises(FrameError):
        world.set_pose("a", resolver.pose_in_world("camera", 0, random_pose()))
    with pytest.raises(FrameError):
        world.add_mesh("b", v, t, pose=resolver.pose_in_world("camera", 0, random_pose()))
    assert world.revision == before[0] and world.mesh_names() == ["a"]
    np.testing.assert_array_equal(world.mesh_geometry("a")[2], before[1])


def test_compose_matches_matrix_products():
    for _ in range(20):
        a, b = random_pose(), random_pose()
        same_transform(compose(a, b), matrix(a) @ matrix(b))


# ------------------------------------------------------------------ the transform cache (tf2's rules)


def yaw_pose(x: float, yaw: float) -> np.ndarray:
    return np.array([x, 0.0, 0.0, np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])


def yaw_matrix(x: float, yaw: float) -> np.ndarray:
    m = np.eye(4)
    m[:2, :2] = [[np.cos(yaw), -np.sin(yaw)], [np.sin(yaw), np.cos(yaw)]]
    m[0, 3] = x
    return m


def test_cache_interpolates_between_stamps_and_chains_static_and_stamped_frames():
    map_in_world = random_pose()
    cache = TransformCache([("world", "map", map_in_world)])
    # odom in map: x 0 -> 2 m and yaw 0 -> 1.2 rad between 1 s and 3 s; one axis, so the rotation
    # at a fraction r of the way is the yaw r * 1.2 (what slerp must give)
    cache.set_transform("map", "odom", 1_000_000_000, yaw_pose(0.0, 0.0))
    cache.set_transform("map", "odom", 3_000_000_000, yaw_pose(2.0, 1.2))
    for stamp, r in ((1_000_000_000, 0.0), (1_500_000_000, 0.25), (2_000_000_000, 0.5), (3_000_000_000, 1.0)):
        same_transform(cache.lookup("world", "odom", stamp, 0.0), matrix(map_in_world) @ yaw_matrix(2.0 * r, 1.2 * r))
        same_transform(cache.lookup("odom", "world", stamp, 0.0),
                       np.linalg.inv(matrix(map_in_world) @ yaw_matrix(2.0 * r, 1.2 * r)))
    # latest = the latest common time of the chain (the static edge holds at every time)
    assert cache.latest_stamp("world", "odom") == 3_000_000_000
    same_transform(cache.lookup("world", "odom", None, 0.0), matrix(map_in_world) @ yaw_matrix(2.0, 1.2))
    # a second stamped frame with older data bounds the common time
    cache.set_transform("odom", "base", 2_000_000_000, yaw_pose(1.0, 0.0))
    assert cache.latest_stamp("world", "base") == 2_000_000_000
    same_transform(cache.lookup("world", "base", None, 0.0),
                   matrix(map_in_world) @ yaw_matrix(1.0, 0.6) @ yaw_matrix(1.0, 0.0))


def test_cache_extrapolation_old_data_and_clear_follow_tf2():
    cache = TransformCache([("world", "map", yaw_pose(1.0, 0.0))])
    cache.set_transform("map", "odom", 5_000_000_000, yaw_pose(0.0, 0.0))
    # one sample: only its own stamp resolves (tf2 does not extrapolate a single sample)
    cache.lookup("world", "odom", 5_000_000_000, 0.0)
    with pytest.raises(LookupFailed, match="only 5.000000000 s is in the buffer") as info:
        cache.lookup("world", "odom", 5_000_000_001, 0.0)
    assert info.value.reason == EXTRAPOLATION
    cache.set_transform("map", "odom", 18_000_000_000, yaw_pose(1.0, 0.0))
    cache.set_transform("map", "odom", 20_000_000_000, yaw_pose(1.0, 0.0))
    # the buffer keeps 10 s behind the newest sample of a frame: the 5 s sample is gone
    for stamp, why in ((9_000_000_000, "into the past"), (21_000_000_000, "into the future")):
        with pytest.raises(LookupFailed, match=why) as info:
            cache.lookup("world", "odom", stamp, 0.0)
        assert info.value.reason == EXTRAPOLATION
    # data older than the window is dropped (tf2's TF_OLD_DATA), newer data inside it is kept
    assert not cache.set_transform("map", "odom", 9_000_000_000, yaw_pose(5.0, 0.0))
    assert cache.old_data_dropped == 1
    assert cache.set_transform("map", "odom", 15_000_000_000, yaw_pose(3.0, 0.0))
    same_transform(cache.lookup("world", "odom", 15_000_000_000, 0.0), yaw_matrix(1.0, 0.0) @ yaw_matrix(3.0, 0.0))
    # clear() forgets the stamped transforms, the static ones stay; afterwards old stamps are accepted
    cache.clear()
    with pytest.raises(LookupFailed) as info:
        cache.lookup("world", "odom", 15_000_000_000, 0.0)
    assert info.value.reason == UNKNOWN_FRAME
    same_transform(cache.lookup("world", "map", 123, 0.0), yaw_matrix(1.0, 0.0))
    assert cache.set_transform("map", "odom", 1_000_000_000, yaw_pose(-1.0, 0.0))
    same_transform(cache.lookup("world", "odom", 1_000_000_000, 0.0), yaw_matrix(0.0, 0.0))
    with pytest.raises(ValueError, match="unit length"):
        cache.set_transform("map", "odom", 2, [0, 0, 0, 0, 0, 0, 0])


def test_cache_lookup_waits_for_data_up_to_its_timeout():
    cache = TransformCache([("world", "map", yaw_pose(0.0, 0.0))])
    t0 = time.monotonic()
    with pytest.raises(LookupFailed):
        cache.lookup("world", "odom", 1, 0.05)
    assert time.monotonic() - t0 >= 0.05
    feeder = threading.Thread(target=cache.set_transform, args=("map", "odom", 7, yaw_pose(2.0, 0.0)))
    feeder.start()
    same_transform(cache.lookup("world", "odom", 7, 30.0), yaw_matrix(2.0, 0.0))  # returns once the data came
    feeder.join()


def test_resolver_holds_only_stamps_just_ahead_of_the_data():
    cache = TransformCache([("world", "map", yaw_pose(1.0, 0.0))])
    cache.set_transform("map", "odom", 1_000_000_000, yaw_pose(0.0, 0.0))
    cache.set_transform("map", "odom", 2_000_000_000, yaw_pose(1.0, 0.0))
    resolver = FrameResolver("world", cache, timeout_s=0.1)
    pose = random_pose()
    with pytest.raises(TransformPending, match="into the future") as info:  # 50 ms ahead: wait for it
        resolver.pose_in_world("odom", 2_050_000_000, pose)
    assert info.value.wait_s == 0.1
    for frame, stamp in (("odom", 2_200_000_000), ("odom", 500_000_000), ("lidar", 2_050_000_000)):
        with pytest.raises(FrameError) as info:  # too far ahead, behind the data, unknown frame: at once
            resolver.pose_in_world(frame, stamp, pose)
        assert not isinstance(info.value, TransformPending)
    resolver.timeout_s = 0.0
    with pytest.raises(FrameError) as info:
        resolver.pose_in_world("odom", 2_050_000_000, pose)
    assert not isinstance(info.value, TransformPending)
    # once the transform is there, the same message resolves (interpolated)
    cache.set_transform("map", "odom", 2_100_000_000, yaw_pose(2.0, 0.0))
    same_transform(resolver.pose_in_world("odom", 2_050_000_000, pose),
                   yaw_matrix(1.0, 0.0) @ yaw_matrix(1.5, 0.0) @ matrix(pose))
