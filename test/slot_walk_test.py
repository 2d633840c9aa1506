"""robot_sdf.kernels.slot_walk: the slots a query visits (through an environment's slot BVH: exactly
the enabled slots whose boxes meet the query's reach box; without one: every enabled slot in use;
of those, the slots whose cull spheres come within the query's reach),
the query point in each slot's mesh frame (numpy's transform of test/reference.py), each sphere's
environment, and the slot boxes the slot BVHs are built over."""
from __future__ import annotations

import numpy as np
import torch
import warp as wp

import reference as ref
from robot_sdf import MeshWorld, kernels
from robot_sdf.kernels import slot_walk

SLOTS = 12  # env 0 (a slot BVH: at least slot_index.MIN_SLOTS); env 1 holds 3 (no BVH)


@wp.kernel
def _walk_kernel(pts: wp.array(dtype=wp.vec3), reach: wp.array(dtype=float), envs: wp.array(dtype=wp.int32),
                 world: slot_walk.World, visited: wp.array2d(dtype=wp.int32),
                 p_mesh: wp.array2d(dtype=wp.vec3), rotated: wp.array2d(dtype=wp.vec3), listed: wp.array(dtype=wp.int32)):
    i = wp.tid()
    env = envs[i]
    p = pts[i]
    slots = slot_walk.env_slots(env, p, reach[i], world)
    listed[i] = slots.listed
    for k in range(slots.iterations):
        slot, q, local = slot_walk.slot_at(slots, k, env, p, world)
        if slot < 0:
            continue
        visited[i, slot] += 1
        p_mesh[i, slot] = local
        rotated[i, slot] = wp.quat_rotate(q, wp.vec3(1.0, 2.0, 3.0))


def _world() -> MeshWorld:
    rng = np.random.default_rng(17)
    world = MeshWorld(device="cpu", num_envs=2, mesh_capacity=SLOTS)
    v, t = ref.icosphere(0.05, 1)
    for env, count in ((0, SLOTS), (1, 3)):
        for j in range(count):
            pose = np.concatenate([rng.uniform(-1.0, 1.0, 3), ref.random_quaternion(rng)])
            world.add_mesh(f"m{j}", v * rng.uniform(0.5, 2.0), t, pose=pose, env=env)
    world.set_enabled("m3", False, env=0)
    world.set_enabled("m1", False, env=1)
    return world


def _as_warp(t: torch.Tensor, dtype):
    return wp.array(t.numpy(), dtype=dtype, device="cpu")


def test_queries_visit_the_slots_whose_boxes_they_reach_in_their_mesh_frames():
    world = _world()
    rng = np.random.default_rng(5)
    n = 3000
    pts = rng.uniform(-1.3, 1.3, size=(n, 3)).astype(np.float32)
    reach = rng.uniform(0.0, 0.6, size=n).astype(np.float32)
    envs = (np.arange(n) % 2).astype(np.int32)
    with world.reading() as snap:
        bvh = snap.slot_bvh()
        assert bvh is not None and int(bvh[0]) != 0 and int(bvh[1]) == 0  # env 0 has a slot BVH, env 1 none
        mesh_idx, pose_inv = snap.mesh_idx.numpy(), snap.mesh_pose_inverse.numpy().astype(np.float64)
        # The first points sit on the mesh origins of their env's slots, with a negative reach (a
        # negative max_dist): that reaches as far as 0 does, so each still visits its slot.
        for i in range(2 * SLOTS):
            pts[i] = ref.transform_points(ref.pose_inverse(pose_inv[i % 2, i // 2, :7]), np.zeros((1, 3)))[0]
            reach[i] = -0.2
        enable, counts = snap.mesh_enable.numpy(), snap.n_env_mesh.numpy()
        visited = wp.zeros((n, SLOTS), dtype=wp.int32, device="cpu")
        p_mesh = wp.zeros((n, SLOTS), dtype=wp.vec3, device="cpu")
        rotated = wp.zeros((n, SLOTS), dtype=wp.vec3, device="cpu")
        listed = wp.zeros(n, dtype=wp.int32, device="cpu")
        # The World struct as Warp's public API fills it (the package fills its C value directly:
        # robot_sdf.launch.WorldValue).
        world_arg = slot_walk.World()
        world_arg.mesh_idx = _as_warp(snap.mesh_idx, wp.int64)
        world_arg.pose_inv = _as_warp(snap.mesh_pose_inverse, wp.float32)
        world_arg.mesh_enable = _as_warp(snap.mesh_enable, wp.uint8)
        world_arg.n_env_mesh = _as_warp(snap.n_env_mesh, wp.int32)
        world_arg.sign_method = int(kernels.SIGN_PER_SLOT)
        world_arg.slot_sign = _as_warp(snap.sign_methods, wp.uint8)
        world_arg.slot_bvh = _as_warp(bvh, wp.uint64)
        wp.launch(_walk_kernel, n, [wp.array(pts, dtype=wp.vec3, device="cpu"), wp.array(reach, dtype=float, device="cpu"),
                                    wp.array(envs, dtype=wp.int32, device="cpu"), world_arg, visited, p_mesh,
                                    rotated, listed], device="cpu")
    visited, p_mesh, rotated, listed = visited.numpy(), p_mesh.numpy(), rotated.numpy(), listed.numpy()
    assert visited.max() == 1  # no slot twice
    np.testing.assert_array_equal(listed, (envs == 0).astype(np.int32))
    in_use = (np.arange(SLOTS)[None] < counts[:, None]) & (enable != 0) & (mesh_idx != 0)  # (env, slot)
    # Slot boxes: the cube of half-size the cull radius around the mesh origin's world position.
    centres = np.empty((2, SLOTS, 3))
    for e in range(2):
        for j in range(SLOTS):
            centres[e, j] = ref.transform_points(ref.pose_inverse(pose_inv[e, j, :7]), np.zeros((1, 3)))[0]
    half = pose_inv[..., 7]
    reach = np.maximum(reach, 0.0)
    reached = np.all(np.abs(pts[:, None, :] - centres[envs]) <= (half[envs] + reach[:, None])[..., None], axis=2)
    # Of those, the slots whose cull sphere (radius half) comes within the reach, a relative 1e-5
    # wider (points within 1e-5 m of that edge left out: float32 decides them).
    gap = np.linalg.norm(pts[:, None, :] - centres[envs], axis=2) - half[envs] - (reach[:, None] * 1.00001 + 1e-6)
    want = np.where(envs[:, None] == 0, reached, True) & in_use[envs] & (gap <= 0.0)
    clear = np.abs(gap) > 1e-5
    assert 0 < want[envs == 0].sum() < 0.5 * in_use[0].sum() * (envs == 0).sum()  # the BVH leaves slots out
    assert np.sum(np.where(envs[:, None] == 0, reached, True) & in_use[envs] & ~want) > 100  # spheres cull more
    np.testing.assert_array_equal(visited.astype(bool)[clear], want[clear])
    for e in range(2):
        for j in np.flatnonzero(in_use[e]):
            rows = np.flatnonzero(visited[:, j].astype(bool) & (envs == e))
            local = ref.transform_points(pose_inv[e, j, :7], pts[rows].astype(np.float64))
            np.testing.assert_allclose(p_mesh[rows, j], local, atol=2e-6)
            turned = ref.quat_to_matrix(pose_inv[e, j, 3:7]) @ np.array([1.0, 2.0, 3.0])
            np.testing.assert_allclose(rotated[rows, j], np.broadcast_to(turned, (len(rows), 3)), atol=2e-6)


@wp.kernel
def _env_kernel(spheres_per_batch: int, use_env_query: int, env_query: wp.array(dtype=wp.int32), n_envs: int,
                out: wp.array(dtype=wp.int32)):
    i = wp.tid()
    out[i] = slot_walk.query_env(i, spheres_per_batch, use_env_query, env_query, n_envs)


def test_each_sphere_takes_its_batch_rows_environment():
    rows = np.array([0, 2, 1, -1, 3, 2], np.int32)  # two unknown environments: -1 and 3 of 3
    out = wp.zeros(6 * 5, dtype=wp.int32, device="cpu")
    for use in (1, 0):
        wp.launch(_env_kernel, 30, [5, use, wp.array(rows, dtype=wp.int32, device="cpu"), 3, out], device="cpu")
        want = np.repeat(np.where((rows >= 0) & (rows < 3), rows, -1), 5) if use else np.zeros(30, np.int32)
        np.testing.assert_array_equal(out.numpy(), want)


def test_slot_boxes_are_cubes_around_the_mesh_origins():
    rng = np.random.default_rng(8)
    poses = np.concatenate([rng.uniform(-2, 2, (3, 4, 3)), ref.random_quaternion(rng, 12).reshape(3, 4, 4)], 2)
    pose_inv = np.zeros((3, 4, 8), np.float32)
    for e in range(3):
        for j in range(4):
            pose_inv[e, j, :7] = ref.pose_inverse(poses[e, j])
    pose_inv[..., 7] = rng.uniform(0.1, 1.0, (3, 4))
    lowers = wp.zeros((3, 4), dtype=wp.vec3, device="cpu")
    uppers = wp.zeros((3, 4), dtype=wp.vec3, device="cpu")
    envs = np.array([2, 0], np.int32)  # env 1 untouched
    wp.launch(slot_walk.slot_boxes_kernel, (2, 4), [wp.array(pose_inv, dtype=wp.float32, device="cpu"),
                                                   wp.array(envs, dtype=wp.int32, device="cpu"), lowers, uppers],
              device="cpu")
    lowers, uppers = lowers.numpy(), uppers.numpy()
    half = pose_inv[..., 7:8]
    for e in envs:
        np.testing.assert_allclose(lowers[e], poses[e, :, :3] - half[e], atol=1e-5)
        np.testing.assert_allclose(uppers[e], poses[e, :, :3] + half[e], atol=1e-5)
    assert np.all(lowers[1] == 0) and np.all(uppers[1] == 0)
