"""robot_sdf.kernels.plain_cost: sphere_cost_kernel (through warp_primitives.Query.cost, its
host side) against test/reference.py on a world of posed meshes in two environments (one with a
slot BVH), closed and open, deep centres included: the cost summed over meshes and its gradient,
the ESDF (max of -sd, -max_dist where nothing is in range) and its gradient, spheres switched off,
and outputs written in full whatever the buffers held."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import mesh_corpus as corpus
import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.warp_primitives import Query

ETA, MAX_DIST, WEIGHT = 0.03, 0.03, 1.7
GEOMETRIES = [corpus.capsule, lambda: ref.icosphere(0.12, 2), lambda: ref.box((0.2, 0.1, 0.15)), corpus.open_cup,
              corpus.arm_link]


@pytest.fixture(scope="module")
def scene():
    """(world, reference meshes per env): 9 meshes in env 0 (a slot BVH), 3 in env 1, random poses
    in a 1.2 m cube, so that meshes overlap and spheres meet several."""
    rng = np.random.default_rng(23)
    world = MeshWorld(device="cpu", num_envs=2, mesh_capacity=9, max_distance=MAX_DIST)
    envs = [[], []]
    for env, count in ((0, 9), (1, 3)):
        for j in range(count):
            v, t = GEOMETRIES[(j + env) % len(GEOMETRIES)]()
            pose = np.concatenate([rng.uniform(-0.4, 0.4, 3), ref.random_quaternion(rng)])
            world.add_mesh(f"m{j}", v, t, pose=pose, env=env)
            envs[env].append(ref.RefMesh(np.asarray(v, np.float64), np.asarray(t), pose))
    return world, envs


def _spheres(rng: np.random.Generator, envs, per_env: int) -> np.ndarray:
    """(2, 1, per_env, 4): half near a surface of the row's environment, a sixth near the meshes'
    origins (deep inside the closed ones), the rest anywhere; radii 0..4 cm, a tenth switched off."""
    rows = []
    for meshes in envs:
        near = []
        for _ in range(per_env // 2):
            m = meshes[rng.integers(len(meshes))]
            corner = m.vertices[rng.integers(len(m.vertices))]
            near.append(ref.transform_points(m.pose, corner[None])[0] + rng.normal(scale=0.03, size=3))
        for _ in range(per_env // 6):
            near.append(meshes[rng.integers(len(meshes))].pose[:3] + rng.normal(scale=0.01, size=3))
        anywhere = rng.uniform(-0.7, 0.7, size=(per_env - len(near), 3))
        radius = rng.uniform(0.0, 0.04, size=(per_env, 1))
        radius[rng.random(per_env) < 0.1] = -1.0
        rows.append(np.concatenate([np.concatenate([near, anywhere]), radius], 1))
    return np.stack(rows)[:, None].astype(np.float32)


def _launch(world, spheres: np.ndarray, esdf: bool, compute_grad: bool = True):
    s = torch.from_numpy(spheres)
    b, h, n = s.shape[:3]
    # Buffers holding garbage: every element must be written.
    cost = torch.full((b, h, n), float("nan"))
    grad = torch.full((b, h, n, 4), float("nan"))
    sparsity = torch.full((b, h, n), 7, dtype=torch.uint8)
    with world.reading() as snap:
        Query(torch.tensor([WEIGHT]), torch.tensor([ETA]), torch.tensor([MAX_DIST]), snap.mesh_idx,
              snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, snap.sign_methods, snap, esdf=esdf,
              compute_grad=compute_grad, outputs=(cost, grad, sparsity)).cost(
            s, torch.tensor([0, 1], dtype=torch.int32))
    return cost.numpy(), grad.numpy(), sparsity.numpy()


@pytest.mark.parametrize("esdf", [False, True], ids=["cost", "esdf"])
def test_cost_and_esdf_are_the_references(scene, esdf):
    world, envs = scene
    spheres = _spheres(np.random.default_rng(3), envs, 1500)
    cost, grad, sparsity = _launch(world, spheres, esdf)
    want, want_grad = ref.sphere_cost(spheres.astype(np.float64), envs, ETA, WEIGHT, MAX_DIST, env_index=[0, 1],
                                      compute_esdf=esdf)
    # Points off the surfaces and off the open cup's ambiguous winding numbers; for the gradient,
    # also off medial axes (a float32 search may pick any triangle within ~1e-6 of the closest).
    sure = np.zeros(spheres.shape[:3], bool)
    clear_cut = np.zeros(spheres.shape[:3], bool)
    for row, meshes in enumerate(envs):
        p = spheres[row, 0, :, :3].astype(np.float64)
        sd = np.stack([m.signed_distance_world(p)[0] for m in meshes])
        w = np.stack([ref.winding_number(ref.transform_points(ref.pose_inverse(m.pose), p), m.vertices, m.triangles)
                      for m in meshes])
        sure[row, 0] = np.all(np.abs(sd) > 1e-3, axis=0) & np.all(np.abs(w - 0.5) > 0.05, axis=0)
        clear_cut[row, 0] = ref.world_gradient_ambiguity(p, meshes, 2e-6) <= 1e-4
    assert sure.mean() > 0.9 and (sure & clear_cut).mean() > 0.8
    np.testing.assert_allclose(cost[sure], want[sure], atol=5e-5 * WEIGHT)
    np.testing.assert_allclose(grad[..., :3][sure & clear_cut], want_grad[sure & clear_cut], atol=1e-3 * WEIGHT)
    assert np.all(np.isfinite(cost)) and np.all(grad[..., 3] == 0.0)
    np.testing.assert_array_equal(sparsity, (cost > 0).astype(np.uint8))
    if esdf:
        inside = want > 0
        assert inside.sum() > 100 and (want == -MAX_DIST * WEIGHT).sum() > 100  # inside and out of range
    else:
        off = spheres[..., 3] < 0
        assert off.sum() > 100 and np.all(cost[off] == 0) and np.all(grad[off] == 0)
        assert (want > 0).sum() > 500 and (want[sure] > ETA * WEIGHT).sum() > 100  # both parts of the cost
        # Centres deeper than max_dist + r + eta pay in full.
        deep = np.zeros(spheres.shape[:3], bool)
        for row, meshes in enumerate(envs):
            p = spheres[row, 0, :, :3].astype(np.float64)
            deep[row, 0] = np.stack([m.signed_distance_world(p)[0] for m in meshes]).min(0) < -(MAX_DIST + 0.08)
        deep &= sure & (spheres[..., 3] >= 0)
        assert deep.sum() > 10 and np.all(cost[deep] > MAX_DIST * WEIGHT)


def test_without_gradient_the_gradient_is_zero_and_the_cost_unchanged(scene):
    world, envs = scene
    spheres = _spheres(np.random.default_rng(4), envs, 300)
    cost, _, sparsity = _launch(world, spheres, False)
    cost_ng, grad_ng, sparsity_ng = _launch(world, spheres, False, compute_grad=False)
    np.testing.assert_array_equal(cost_ng, cost)
    np.testing.assert_array_equal(sparsity_ng, sparsity)
    assert np.all(grad_ng == 0.0) and (cost > 0).sum() > 50
