"""High-level differentiable API of MeshWorld (robot_sdf.cost) against the numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from robot_sdf import MeshWorld

ETA = 0.05
MAX_DIST = 0.4
ATOL = 1e-4
GRAD_ATOL = 3e-4

BOX_V, BOX_T = ref.box((0.3, 0.25, 0.35))
SPH_V, SPH_T = ref.icosphere(0.15, 2)


@pytest.fixture
def scene(device):
    rng = np.random.default_rng(40)
    meshes0 = [ref.RefMesh(BOX_V, BOX_T, np.concatenate([[0.25, 0.0, 0.0], ref.random_quaternion(rng)])),
               ref.RefMesh(SPH_V, SPH_T, np.concatenate([[-0.25, 0.05, 0.0], ref.random_quaternion(rng)]))]
    meshes1 = [ref.RefMesh(SPH_V * 2, SPH_T, np.concatenate([[0.0, 0.0, 0.1], ref.random_quaternion(rng)]))]
    world = MeshWorld(device=device, num_envs=2, mesh_capacity=4, max_distance=MAX_DIST)
    for env, meshes in enumerate((meshes0, meshes1)):
        for i, m in enumerate(meshes):
            world.add_mesh(f"m{i}", m.vertices, m.triangles, m.pose, env=env)
    return world, [meshes0, meshes1]


def spheres_off_surfaces(rng, shape, envs, low=(-0.55, -0.35, -0.35), high=(0.55, 0.35, 0.35)):
    n = int(np.prod(shape))
    p = rng.uniform(low, high, size=(4 * n, 3))
    ok = np.ones(len(p), dtype=bool)
    for meshes in envs:
        for m in meshes:
            ok &= np.abs(m.signed_distance_world(p)[0]) > 2e-3
    p = p[ok][:n]
    assert len(p) == n
    r = rng.uniform(0.0, 0.08, size=(n, 1))
    return np.concatenate([p, r], axis=1).reshape(tuple(shape) + (4,))


def grad_ok(points: np.ndarray, envs) -> np.ndarray:
    """Points off medial axes of every mesh (gradient well defined): shape points[..., 0]."""
    flat = points[..., :3].reshape(-1, 3)
    amb = np.zeros(len(flat))
    for meshes in envs:
        amb = np.maximum(amb, ref.world_gradient_ambiguity(flat, meshes, 2e-6))
    return (amb <= 1e-4).reshape(points.shape[:-1])


def test_sphere_cost_and_backward(scene, device):
    world, envs = scene
    rng = np.random.default_rng(41)
    s = spheres_off_surfaces(rng, (3, 4, 20), envs)
    env_index = [0, 1, 0]
    c_ref, g_ref = ref.sphere_cost(s, envs, ETA, 2.0, MAX_DIST, env_index=env_index)
    assert np.sum(c_ref > 0) > 20
    spheres = torch.tensor(s, dtype=torch.float32, device=device, requires_grad=True)
    cost = world.sphere_cost(spheres, activation_distance=ETA, weight=2.0, env_index=torch.tensor(env_index))
    assert cost.shape == (3, 4, 20) and cost.device == world.device and cost.requires_grad
    np.testing.assert_allclose(cost.detach().cpu().numpy(), c_ref, atol=ATOL, rtol=1e-4)
    cost.sum().backward()
    mask = grad_ok(s, envs)
    assert mask.mean() > 0.8
    np.testing.assert_allclose(spheres.grad[..., :3].cpu().numpy()[mask], g_ref[mask], atol=GRAD_ATOL)
    assert torch.all(spheres.grad[..., 3] == 0)
    # a second evaluation gives the same numbers (outputs are fresh every call)
    spheres2 = spheres.detach().clone().requires_grad_()
    cost2 = world.sphere_cost(spheres2, activation_distance=ETA, weight=2.0, env_index=env_index)
    (cost2 * 3.0).sum().backward()
    torch.testing.assert_close(cost2, cost)
    torch.testing.assert_close(spheres2.grad, 3.0 * spheres.grad)


def test_evaluate_sphere_cost_without_graph(scene, device):
    world, envs = scene
    rng = np.random.default_rng(42)
    s = spheres_off_surfaces(rng, (1, 2, 40), envs)
    c_ref, g_ref = ref.sphere_cost(s, envs, ETA, 1.0, MAX_DIST)
    cost, grad = world.evaluate_sphere_cost(torch.tensor(s, dtype=torch.float32), ETA, 1.0)
    assert grad.shape == (1, 2, 40, 3)
    np.testing.assert_allclose(cost.cpu().numpy(), c_ref, atol=ATOL, rtol=1e-4)
    mask = grad_ok(s, envs)
    np.testing.assert_allclose(grad.cpu().numpy()[mask], g_ref[mask], atol=GRAD_ATOL)
    cost2, grad2 = world.evaluate_sphere_cost(torch.tensor(s, dtype=torch.float32), ETA, 1.0, compute_gradient=False)
    assert grad2 is None
    torch.testing.assert_close(cost2, cost)
    cost3, _, rev = world.evaluate_sphere_cost(torch.tensor(s, dtype=torch.float32), ETA, return_revision=True)
    assert rev == world.revision == 3


def test_max_distance_override(scene, device):
    """max_distance bounds the search only: costs are unchanged, the esdf clamp moves."""
    world, envs = scene
    rng = np.random.default_rng(43)
    s = spheres_off_surfaces(rng, (1, 1, 50), envs)
    a, _ = world.evaluate_sphere_cost(torch.tensor(s, dtype=torch.float32), ETA, max_distance=0.01)
    c_ref, _ = ref.sphere_cost(s, envs, ETA, 1.0, 0.01)
    np.testing.assert_allclose(a.cpu().numpy(), c_ref, atol=ATOL, rtol=1e-4)
    pts = torch.tensor(s[0, 0, :, :3], dtype=torch.float32)
    d, _ = world.signed_distance(pts, max_distance=0.05)
    sd = np.min([m.signed_distance_world(s[0, 0, :, :3])[0] for m in envs[0]], axis=0)
    np.testing.assert_allclose(d.cpu().numpy(), np.minimum(sd, 0.05), atol=ATOL)


def test_swept_sphere_cost_and_backward(scene, device):
    world, envs = scene
    rng = np.random.default_rng(44)
    b, h, n = 2, 5, 3
    start = rng.uniform([-0.5, -0.2, -0.2], [-0.3, 0.2, 0.2], size=(b, 1, n, 3))
    end = rng.uniform([0.3, -0.2, -0.2], [0.5, 0.2, 0.2], size=(b, 1, n, 3))
    p = start + (end - start) * np.linspace(0, 1, h)[None, :, None, None]
    s = np.concatenate([p, rng.uniform(0.01, 0.05, size=(b, h, n, 1))], axis=-1)
    samples: list = []
    for metric in (False, True):
        c_ref, g_ref = ref.swept_sphere_cost(s, envs, ETA, 1.0, MAX_DIST, 3, 0.1, metric, env_index=[0, 1],
                                             samples_out=samples)
        spheres = torch.tensor(s, dtype=torch.float32, device=device, requires_grad=True)
        cost = world.swept_sphere_cost(spheres, activation_distance=ETA, sweep_steps=3, speed_dt=0.1,
                                       enable_speed_metric=metric, env_index=[0, 1])
        assert np.sum(c_ref > 0) > 5
        np.testing.assert_allclose(cost.detach().cpu().numpy(), c_ref, atol=5e-4, rtol=1e-3)
        cost.sum().backward()
        # compare gradients where neither the sphere nor its sweep samples sit on a medial axis
        mask = grad_ok(s, envs)
        for (bi, t, k), q in samples:
            if not grad_ok(q[None], [envs[[0, 1][bi]]])[0]:
                mask[bi, t, k] = False
        np.testing.assert_allclose(spheres.grad[..., :3].cpu().numpy()[mask], g_ref[mask], atol=2e-3, rtol=1e-3)
        samples.clear()
        c_eval, g_eval = world.evaluate_swept_sphere_cost(spheres.detach(), ETA, 1.0, 3, 0.1, metric, env_index=[0, 1])
        torch.testing.assert_close(c_eval, cost.detach())
        torch.testing.assert_close(g_eval, spheres.grad[..., :3])


def test_signed_distance(scene, device):
    world, envs = scene
    rng = np.random.default_rng(45)
    pts = spheres_off_surfaces(rng, (300,), envs, low=(-0.8, -0.6, -0.6), high=(0.8, 0.6, 0.6))[:, :3]
    for env in (0, 1):
        sds = np.stack([m.signed_distance_world(pts)[0] for m in envs[env]])
        grads = np.stack([m.signed_distance_world(pts)[1] for m in envs[env]])
        k = np.argmin(sds, axis=0)
        sd = sds[k, np.arange(len(pts))]
        g = grads[k, np.arange(len(pts))]
        dist, grad = world.signed_distance(torch.tensor(pts, dtype=torch.float32), env=env)
        assert dist.shape == (300,) and grad.shape == (300, 3)
        expected = np.where(sd > MAX_DIST, MAX_DIST, sd)
        assert np.any(sd < 0) and np.any(sd > MAX_DIST)
        np.testing.assert_allclose(dist.cpu().numpy(), expected, atol=ATOL)
        near = (sd < MAX_DIST - 1e-3) & grad_ok(pts, [envs[env]])
        np.testing.assert_allclose(grad.cpu().numpy()[near], g[near], atol=GRAD_ATOL)
        np.testing.assert_allclose(np.linalg.norm(grad.cpu().numpy()[near], axis=1), 1.0, atol=1e-4)
    # differentiable w.r.t. the points
    x = torch.tensor(pts, dtype=torch.float32, requires_grad=True)
    dist, grad = world.signed_distance(x)
    (dist * 2.0).sum().backward()
    torch.testing.assert_close(x.grad.to(grad.device), 2.0 * grad)


def test_bad_requests_raise(scene, device):
    world, _ = scene
    good = torch.zeros(1, 1, 2, 4)
    with pytest.raises(ValueError):
        world.sphere_cost(torch.zeros(1, 2, 4))
    with pytest.raises(ValueError):
        world.sphere_cost(torch.zeros(1, 1, 2, 3))
    with pytest.raises(ValueError):
        world.sphere_cost(good, env_index=[2])  # only envs 0 and 1
    with pytest.raises(ValueError):
        world.sphere_cost(good, env_index=[0, 1])  # one per batch row
    with pytest.raises(ValueError):
        world.sphere_cost(good, activation_distance=-0.1)
    with pytest.raises(ValueError):
        world.swept_sphere_cost(good, sweep_steps=-1)
    with pytest.raises(ValueError):
        world.signed_distance(torch.zeros(4, 2))
    with pytest.raises(ValueError):
        world.signed_distance(torch.zeros(4, 3), env=5)


def test_signed_distance_empty_env_and_float64_input(device):
    world = MeshWorld(device=device, num_envs=2, max_distance=0.3)
    world.add_mesh("box", BOX_V, BOX_T, env=1)
    pts = torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    dist, grad = world.signed_distance(pts, env=0)
    np.testing.assert_allclose(dist.cpu().numpy(), [0.3, 0.3])
    assert torch.all(grad == 0)
    dist, _ = world.signed_distance(pts, env=1)
    np.testing.assert_allclose(dist.cpu().numpy(), [-0.125, 0.3], atol=ATOL)
    # float64 spheres on the caller's side: gradients flow back in float64
    s = torch.tensor([[[[0.1, 0.05, 0.0, 0.05]]]], dtype=torch.float64, requires_grad=True)
    cost = world.sphere_cost(s, activation_distance=ETA, env_index=[1])
    cost.sum().backward()
    c_ref, g_ref = ref.sphere_cost(s.detach().numpy(), [[], [ref.RefMesh(BOX_V, BOX_T)]], ETA, 1.0, 0.3, env_index=[1])
    np.testing.assert_allclose(cost.detach().cpu().numpy(), c_ref, atol=ATOL)
    assert s.grad.dtype == torch.float64
    np.testing.assert_allclose(s.grad[..., :3].numpy(), g_ref, atol=GRAD_ATOL)
