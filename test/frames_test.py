"""robot_sdf.ros.frames: static transform trees, and the resolver driven by a buffer of our own.

Expected transforms are built as 4x4 homogeneous matrices from test/reference.py's quaternion
matrix, independently of the module's quaternion algebra.
"""
from __future__ import annotations

import numpy as np
import pytest

import reference as ref
from robot_sdf.ros.frames import (FrameError, FrameResolver, LookupFailed, StaticTransforms, compose,
                                  parse_static_transforms)

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
    tree = StaticTransforms(parse_static_transforms(text))

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
    tree = StaticTransforms(parse_static_transforms("world map 0 0 0 1 0 0 0; base laser 0 0 0 1 0 0 0"))
    with pytest.raises(LookupFailed, match="frame 'camera' is not in static_transforms"):
        tree.lookup("world", "camera", None, 0.0)
    with pytest.raises(LookupFailed, match="not connected"):
        tree.lookup("world", "laser", None, 0.0)


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
            raise LookupFailed(f'"{source}" passed to lookupTransform argument source_frame does not exist')
        stamps = self.data[source]
        if stamp_ns is None:
            return stamps[max(stamps)]
        if stamp_ns not in stamps:
            raise LookupFailed(f"extrapolation: no transform at {stamp_ns} (have {sorted(stamps)})")
        return stamps[stamp_ns]


def test_resolver_uses_the_transform_at_the_message_stamp():
    buf = StampedBuffer()
    early, late = random_pose(), random_pose()
    buf.add("odom", 1_000, early)
    buf.add("odom", 2_000, late)
    resolver = FrameResolver("world", buf, timeout_s=0.25)
    pose = random_pose()
    same_transform(resolver.pose_in_world("odom", 1_000, pose), matrix(early) @ matrix(pose))
    assert buf.calls[-1] == ("world", "odom", 1_000, 0.25)
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
    with pytest.raises(FrameError, match=r"cannot transform header.frame_id 'camera' into world frame 'world' "
                                         r"\(stamp 0.000003000 s, timeout 0.05 s\): .*does not exist"):
        resolver.pose_in_world("camera", 3_000, random_pose())
    with pytest.raises(FrameError, match="extrapolation: no transform at 1500"):
        resolver.pose_in_world("odom", 1_500, random_pose())
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
