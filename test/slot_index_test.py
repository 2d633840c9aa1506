"""Slot BVHs (robot_sdf.slot_index): evaluations that visit only the slots near a sphere equal the
per-slot loop and the brute-force numpy reference, on random multi-environment worlds with
rotated poses, disabled slots, replaced and removed meshes, after refits and rebuilds."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from robot_sdf import MeshWorld
from robot_sdf import slot_index
from robot_sdf.warp_primitives import Query

ETA = 0.05
MAX_DIST = 0.2
N_ENVS = 3


def _random_world(device: str, rng: np.random.Generator):
    """A MeshWorld and its reference: per env a list of (name, RefMesh), 10-16 small shapes each
    (above slot_index.MIN_SLOTS, so every env gets a tree)."""
    world = MeshWorld(device=device, num_envs=N_ENVS, mesh_capacity=4, max_distance=MAX_DIST)
    shapes = [ref.box((0.12, 0.2, 0.08)), ref.icosphere(0.09, 1), ref.box((0.3, 0.05, 0.05))]
    refs: list[dict[str, ref.RefMesh]] = [dict() for _ in range(N_ENVS)]
    for env in range(N_ENVS):
        for i in range(int(rng.integers(10, 17))):
            v, t = shapes[int(rng.integers(len(shapes)))]
            pose = np.concatenate([rng.uniform(-0.8, 0.8, 3), ref.random_quaternion(rng)])
            enabled = bool(rng.random() > 0.2)
            world.add_mesh(f"m{i}", v, t, pose=pose, env=env, enabled=enabled)
            refs[env][f"m{i}"] = ref.RefMesh(v, t, pose, enabled)
    return world, refs


def _spheres(rng: np.random.Generator, refs, per_env: int) -> torch.Tensor:
    """(N_ENVS, 1, per_env, 4): half near a random mesh centre of the row's env, half anywhere."""
    rows = []
    for env in range(N_ENVS):
        meshes = list(refs[env].values())
        centres = np.stack([meshes[int(rng.integers(len(meshes)))].pose[:3] for _ in range(per_env)])
        near = centres + rng.normal(0.0, 0.08, (per_env, 3))
        anywhere = rng.uniform(-1.1, 1.1, (per_env, 3))
        p = np.where((np.arange(per_env) % 2 == 0)[:, None], near, anywhere)
        r = rng.uniform(0.01, 0.08, (per_env, 1))
        rows.append(np.concatenate([p, r], axis=1))
    return torch.tensor(np.stack(rows)[:, None], dtype=torch.float32)


def _per_slot_cost(world: MeshWorld, spheres: torch.Tensor, env_index: torch.Tensor, compute_esdf=False):
    """Cost and gradient through the per-slot loop: the snapshot's tensors with its plain per-slot
    sign methods (no snapshot as trailing argument, hence no slot BVH)."""
    snap = world.snapshot()
    b, h, n, _ = spheres.shape
    cost = torch.empty((b, h, n), device=spheres.device)
    grad = torch.empty((b, h, n, 4), device=spheres.device)
    sparsity = torch.zeros((b, h, n), dtype=torch.uint8, device=spheres.device)
    scalar = lambda x: torch.tensor([x], dtype=torch.float32, device=spheres.device)  # noqa: E731
    Query(scalar(1.0), scalar(ETA), scalar(MAX_DIST), snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
          snap.n_env_mesh, snap.sign_methods, esdf=compute_esdf, outputs=(cost, grad, sparsity)).cost(spheres, env_index)
    return cost, grad[..., :3]


def _reference_cost(refs, spheres: np.ndarray):
    costs, grads = [], []
    for env in range(N_ENVS):
        p = spheres[env, 0, :, :3].astype(np.float64)
        c, g = ref.point_cost(p, spheres[env, 0, :, 3], list(refs[env].values()), ETA, 1.0, MAX_DIST)
        costs.append(c)
        grads.append(g)
    return np.stack(costs)[:, None], np.stack(grads)[:, None]


def _check_world(world: MeshWorld, refs, rng: np.random.Generator, device: str) -> None:
    spheres = _spheres(rng, refs, 120).to(device)
    env_index = torch.arange(N_ENVS, dtype=torch.int32, device=device)
    cost, grad = world.evaluate_sphere_cost(spheres, activation_distance=ETA, env_index=env_index,
                                            max_distance=MAX_DIST)
    # The evaluation went through the trees: every env has one and they describe this snapshot.
    assert world._slot_index.tree_count() == N_ENVS
    assert world.snapshot().slot_bvh() is not None
    loop_cost, loop_grad = _per_slot_cost(world, spheres, env_index)
    ref_cost, ref_grad = _reference_cost(refs, spheres.cpu().numpy())
    assert int((ref_cost > 0).sum()) >= 20  # the comparison covers real contacts
    np.testing.assert_allclose(cost.cpu().numpy(), loop_cost.cpu().numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(grad.cpu().numpy(), loop_grad.cpu().numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(cost.cpu().numpy(), ref_cost, rtol=0, atol=2e-5)
    np.testing.assert_allclose(grad.cpu().numpy(), ref_grad, rtol=0, atol=2e-4)

    # Signed distance (the esdf path) of each env, against the loop and the reference.
    for env in range(N_ENVS):
        points = spheres[env, 0, :, :3]
        dist, _ = world.signed_distance(points, env=env, max_distance=MAX_DIST)
        loop, _ = _per_slot_cost(world, torch.cat([points, torch.zeros_like(points[:, :1])], 1)[None, None],
                                 torch.tensor([env], dtype=torch.int32, device=device), compute_esdf=True)
        np.testing.assert_allclose(dist.cpu().numpy(), -loop.reshape(-1).cpu().numpy(), rtol=0, atol=1e-6)
        sds = [m.signed_distance_world(points.cpu().numpy().astype(np.float64))[0]
               for m in refs[env].values() if m.enabled]
        expected = np.minimum(np.min(np.stack(sds), axis=0), MAX_DIST)
        np.testing.assert_allclose(dist.cpu().numpy(), expected, rtol=0, atol=2e-5)

    # Hessians (double backward) of the cost and of the esdf: trees (the snapshot passed) vs the
    # loop (its per-slot sign methods alone), on the same tensors.
    snap = world.snapshot()
    scalar = lambda x: torch.tensor([x], dtype=torch.float32, device=device)  # noqa: E731
    for esdf in (False, True):
        hessians = [Query(scalar(1.0), scalar(ETA), scalar(MAX_DIST), snap.mesh_idx, snap.mesh_pose_inverse,
                          snap.mesh_enable, snap.n_env_mesh, snap.sign_methods, snapshot,
                          esdf=esdf).hessian(spheres, env_index).cpu().numpy()
                    for snapshot in (snap, None)]
        assert int((np.abs(hessians[1]).sum(axis=(-1, -2)) > 0).sum()) >= 20  # not trivially zero
        np.testing.assert_allclose(hessians[0], hessians[1], rtol=0, atol=1e-4)

    # Swept cost along short trajectories (h = 4) through the same worlds: trees vs loop.
    traj = spheres[:, 0, :40].reshape(N_ENVS, 1, 40, 4).repeat(1, 4, 1, 1)
    traj[..., :3] += torch.linspace(0.0, 0.15, 4, device=device)[None, :, None, None]
    swept, swept_grad = world.evaluate_swept_sphere_cost(traj, activation_distance=ETA, sweep_steps=3,
                                                         env_index=env_index, max_distance=MAX_DIST)
    snap = world.snapshot()
    c = torch.empty(traj.shape[:3], device=device)
    g = torch.empty(traj.shape, device=device)
    sp = torch.zeros(traj.shape[:3], dtype=torch.uint8, device=device)
    scalar = lambda x: torch.tensor([x], dtype=torch.float32, device=device)  # noqa: E731
    Query(scalar(1.0), scalar(ETA), scalar(MAX_DIST), snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
          snap.n_env_mesh, snap.sign_methods, speed_dt=scalar(0.1), sweep_steps=3,
          outputs=(c, g, sp)).swept(traj, env_index)
    assert int((c > 0).sum()) >= 5
    np.testing.assert_allclose(swept.cpu().numpy(), c.cpu().numpy(), rtol=0, atol=1e-6)
    np.testing.assert_allclose(swept_grad.cpu().numpy(), g[..., :3].cpu().numpy(), rtol=0, atol=1e-5)


def test_slot_bvh_equals_loop_and_reference(device):
    rng = np.random.default_rng(1414)
    world, refs = _random_world(device, rng)
    _check_world(world, refs, rng, device)
    builds = world._slot_index.builds

    # Pose changes (refit, no rebuild), enable changes (no tree work), a replaced geometry with
    # the same slot count (refit).
    for env in range(N_ENVS):
        names = list(refs[env])
        for name in names[:4]:
            pose = np.concatenate([rng.uniform(-0.8, 0.8, 3), ref.random_quaternion(rng)])
            world.set_pose(name, pose, env=env)
            refs[env][name].pose = pose
        flip = names[5]
        refs[env][flip].enabled = not refs[env][flip].enabled
        world.set_enabled(flip, refs[env][flip].enabled, env=env)
        v, t = ref.icosphere(0.15, 1)
        world.add_mesh(names[6], v, t, pose=refs[env][names[6]].pose, env=env, enabled=True)
        refs[env][names[6]] = ref.RefMesh(v, t, refs[env][names[6]].pose, True)
    _check_world(world, refs, rng, device)
    assert world._slot_index.builds == builds  # refits only
    assert world._slot_index.refits >= N_ENVS

    # Removals and additions change the slot counts: the changed envs' trees are rebuilt.
    world.remove_mesh("m2", env=0)
    del refs[0]["m2"]
    world.remove_mesh("m0", env=2)
    del refs[2]["m0"]
    v, t = ref.box((0.1, 0.1, 0.1))
    pose = np.array([0.1, -0.2, 0.3, 1.0, 0.0, 0.0, 0.0])
    world.add_mesh("extra", v, t, pose=pose, env=1)
    refs[1]["extra"] = ref.RefMesh(v, t, pose, True)
    _check_world(world, refs, rng, device)
    assert world._slot_index.builds == builds + N_ENVS

    # Capacity growth reallocates the box storage: every tree is rebuilt over the new one.
    capacity = world.capacity
    k = 0
    while world.capacity == capacity:
        pose = np.concatenate([rng.uniform(-0.8, 0.8, 3), ref.random_quaternion(rng)])
        world.add_mesh(f"grow{k}", v, t, pose=pose, env=2)
        refs[2][f"grow{k}"] = ref.RefMesh(v, t, pose, True)
        k += 1
    builds = world._slot_index.builds
    _check_world(world, refs, rng, device)
    assert world._slot_index.builds == builds + N_ENVS


def test_stale_snapshot_falls_back_to_the_loop(device):
    """A snapshot taken before a pose change is not described by the refitted trees: an
    evaluation of it (the Functions with the snapshot as trailing argument) visits every slot and
    so still sees that snapshot's poses."""
    rng = np.random.default_rng(7)
    world, refs = _random_world(device, rng)
    spheres = _spheres(rng, refs, 60).to(device)
    env_index = torch.arange(N_ENVS, dtype=torch.int32, device=device)
    world.evaluate_sphere_cost(spheres, activation_distance=ETA, env_index=env_index, max_distance=MAX_DIST)
    old = world.snapshot()
    assert old.slot_bvh() is not None
    before, _ = _per_slot_cost(world, spheres, env_index)
    for env in range(N_ENVS):
        for name in list(refs[env]):
            world.set_pose(name, [5.0, 5.0, 5.0, 1.0, 0.0, 0.0, 0.0], env=env)
    after, _ = world.evaluate_sphere_cost(spheres, activation_distance=ETA, env_index=env_index,
                                          max_distance=MAX_DIST)
    assert float(after.abs().max()) == 0.0  # everything moved away
    assert old.slot_bvh() is None
    b, h, n, _ = spheres.shape
    cost = torch.empty((b, h, n), device=device)
    grad = torch.empty((b, h, n, 4), device=device)
    sp = torch.zeros((b, h, n), dtype=torch.uint8, device=device)
    scalar = lambda x: torch.tensor([x], dtype=torch.float32, device=device)  # noqa: E731
    Query(scalar(1.0), scalar(ETA), scalar(MAX_DIST), old.mesh_idx, old.mesh_pose_inverse, old.mesh_enable,
          old.n_env_mesh, old.sign_methods, old, outputs=(cost, grad, sp)).cost(spheres, env_index)
    assert int((before > 0).sum()) > 0
    np.testing.assert_allclose(cost.cpu().numpy(), before.cpu().numpy(), rtol=0, atol=0)


def test_small_envs_keep_the_loop(device):
    world = MeshWorld(device=device, num_envs=2)
    v, t = ref.box((0.1, 0.1, 0.1))
    for i in range(slot_index.MIN_SLOTS - 1):
        world.add_mesh(f"m{i}", v, t, pose=[0.2 * i, 0, 0, 1, 0, 0, 0])
    cost, _ = world.evaluate_sphere_cost(torch.tensor([[[[0.2, 0.0, 0.0, 0.06]]]]))
    assert world._slot_index.tree_count() == 0
    assert float(cost) > 0.0
