"""SweptSdfMeshWarpPy against the numpy reference of the swept rule and the CHOMP speed metric."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from conftest import build_warp_env, scalar
from robot_sdf.types import SignMethod
from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy

ETA = 0.04
MAX_DIST = 0.5
COST_ATOL = 2e-4
GRAD_ATOL = 5e-4


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def run_swept(spheres: np.ndarray, wenv, device: str, sweep_steps: int, eta: float = ETA,
              weight: float = 1.0, max_dist: float = MAX_DIST, speed_dt: float = 0.1,
              speed_metric: bool = False, env_query=None, requires_grad: bool = True, sign_method=None):
    """SweptSdfMeshWarpPy.apply with garbage-filled outputs. Returns (qs, cost, out_grad, sparsity)."""
    qs = torch.tensor(spheres, dtype=torch.float32, device=device).requires_grad_(requires_grad)
    b, h, n = qs.shape[:3]
    out_cost = torch.full((b, h, n), float("nan"), device=device)
    out_grad = torch.full((b, h, n, 4), -1e9, device=device)
    sparsity = torch.full((b, h, n), 5, dtype=torch.uint8, device=device)
    eq = None if env_query is None else torch.tensor(env_query, dtype=torch.int32, device=device)
    args = [qs, out_cost, out_grad, sparsity, scalar(weight, device), scalar(eta, device),
            scalar(speed_dt, device), wenv.mesh_idx, wenv.mesh_pose_inverse, wenv.mesh_enable,
            wenv.n_env_mesh, scalar(max_dist, device), sweep_steps, speed_metric, eq, False]
    if sign_method is not None:
        args.append(SignMethod.parse(sign_method))
    cost = SweptSdfMeshWarpPy.apply(*args)
    return qs, cost, out_grad, sparsity


def scene(seed: int) -> list[ref.RefMesh]:
    rng = np.random.default_rng(seed)
    bv, bt = ref.box((0.3, 0.25, 0.4))
    sv, st = ref.icosphere(0.15, 2)
    return [
        ref.RefMesh(bv, bt, np.concatenate([[0.25, 0.0, 0.0], ref.random_quaternion(rng)])),
        ref.RefMesh(sv, st, np.concatenate([[-0.25, 0.05, 0.0], ref.random_quaternion(rng)])),
    ]


def random_trajectories(rng: np.random.Generator, b: int, h: int, n: int, step: float = 0.08,
                        off_fraction: float = 0.1) -> np.ndarray:
    """(b,h,n,4) random walks through the scene; a few spheres switched off (radius -1)."""
    start = rng.uniform([-0.5, -0.3, -0.3], [0.5, 0.3, 0.3], size=(b, 1, n, 3))
    walk = np.cumsum(rng.normal(scale=step, size=(b, h, n, 3)), axis=1)
    walk[:, 0] = 0.0
    p = start + walk
    r = rng.uniform(0.01, 0.06, size=(b, h, n, 1))
    r[rng.uniform(size=r.shape) < off_fraction] = -1.0
    return np.concatenate([p, r], axis=-1)


def sample_mask(spheres: np.ndarray, meshes: list[ref.RefMesh], samples: list) -> np.ndarray:
    """Spheres whose base point and every sweep sample have a well-defined distance gradient and
    are not on a surface (where the inside/outside verdict is a coin toss)."""
    pts = [spheres[..., :3].reshape(-1, 3)]
    owners = [np.arange(int(np.prod(spheres.shape[:-1])))]
    if samples:
        idx = np.array([np.ravel_multi_index(k, spheres.shape[:-1]) for k, _ in samples])
        pts.append(np.stack([q for _, q in samples]))
        owners.append(idx)
    p = np.concatenate(pts)
    owner = np.concatenate(owners)
    bad = ref.world_gradient_ambiguity(p, meshes, 2e-6) > 1e-4
    for m in meshes:
        bad |= np.abs(m.signed_distance_world(p)[0]) < 1e-4
    mask = np.ones(int(np.prod(spheres.shape[:-1])), dtype=bool)
    mask[owner[bad]] = False
    return mask.reshape(spheres.shape[:-1])


def test_zero_sweep_steps_equals_plain_cost(device):
    rng = np.random.default_rng(30)
    meshes = scene(0)
    wenv = build_warp_env([meshes], device)
    s = random_trajectories(rng, 2, 5, 4)
    _, c_sw, g_sw, sp_sw = run_swept(s, wenv, device, sweep_steps=0, weight=1.7)
    qs = torch.tensor(s, dtype=torch.float32, device=device).requires_grad_()
    out_c = torch.zeros(s.shape[:-1], device=device)
    out_g = torch.zeros(s.shape[:-1] + (4,), device=device)
    sp = torch.zeros(s.shape[:-1], dtype=torch.uint8, device=device)
    SdfMeshWarpPy.apply(qs, out_c, out_g, sp, scalar(1.7, device), scalar(ETA, device), wenv.mesh_idx,
                        wenv.mesh_pose_inverse, wenv.mesh_enable, wenv.n_env_mesh, scalar(MAX_DIST, device))
    assert torch.any(out_c > 0)
    assert torch.equal(c_sw, out_c)
    assert torch.equal(g_sw, out_g)
    assert torch.equal(sp_sw, sp)


@pytest.mark.parametrize("sweep_steps,max_dist", [(1, 0.5), (3, 0.5), (6, 0.04)])
def test_swept_matches_reference(device, sweep_steps, max_dist):
    rng = np.random.default_rng(31 + sweep_steps)
    meshes = scene(1)
    wenv = build_warp_env([meshes], device)
    # steps long enough that the clearance often lies between L / sweep_steps and L, where
    # sphere tracing places samples differently from uniform spacing
    s = random_trajectories(rng, 2, 6, 4, step=0.15)
    samples: list = []
    c_ref, g_ref = ref.swept_sphere_cost(s, [meshes], ETA, 1.3, max_dist, sweep_steps, samples_out=samples)
    c_plain, _ = ref.sphere_cost(s, [meshes], ETA, 1.3, max_dist)
    assert np.sum(c_ref > c_plain + 1e-3) >= 3  # the sweep adds cost somewhere
    qs, cost, g, sp = run_swept(s, wenv, device, sweep_steps, weight=1.3, max_dist=max_dist)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = sample_mask(s, meshes, samples)
    assert mask.mean() > 0.7
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4)
    assert torch.all(g[..., 3] == 0)
    np.testing.assert_array_equal(sp.cpu().numpy(), (np_(cost) > 0).astype(np.uint8))
    off = s[..., 3] < 0
    assert np.any(off) and torch.all(cost[torch.from_numpy(off)] == 0)
    # chain rule through backward with arbitrary upstream weights
    w = torch.rand(cost.shape, device=device) * 2 - 1
    (cost * w).sum().backward()
    torch.testing.assert_close(qs.grad[..., :3], w[..., None] * g[..., :3])
    assert torch.all(qs.grad[..., 3] == 0)


def test_sphere_tracing_sample_positions_by_hand(device):
    """Point sphere (r = 0) moving between x = 0.18 and x = 0.58 against a box spanning x in
    [0.25, 0.45] (y, z in [-0.1, 0.1]); eta = 0.05, sweep_steps = 4, so L = 0.2, L/4 = 0.05.

    step 0 (sd 0.07, clearance 0.02 < 0.05): samples at x = 0.23, 0.28, 0.33, 0.38 with
      penetration d = 0.03, 0.08, 0.13, 0.12 -> 0.009 + 0.055 + 0.105 + 0.095 = 0.264
    step 1 (sd 0.13, clearance 0.08 > 0.05): samples at x = 0.50, 0.45, 0.40, 0.38 with
      d = 0, 0.05, 0.10, 0.12 -> 0 + 0.025 + 0.075 + 0.095 = 0.195
      (uniform spacing would sample 0.53, 0.48, 0.43, 0.38 and give 0.0 + 0.0 + 0.07 + 0.095)
    """
    bv, bt = ref.box((0.2, 0.2, 0.2))
    meshes = [ref.RefMesh(bv, bt, np.array([0.35, 0, 0, 1, 0, 0, 0.0]))]
    wenv = build_warp_env([meshes], device)
    s = np.array([[[[0.18, 0.0, 0.0, 0.0]], [[0.58, 0.0, 0.0, 0.0]]]])
    _, cost, g, _ = run_swept(s, wenv, device, 4, eta=0.05, max_dist=1.0)
    np.testing.assert_allclose(np_(cost).reshape(-1), [0.264, 0.195], atol=1e-5)
    # gradients: +x (deeper) for samples in the entry zone, -x towards the nearer +x face
    # (x = 0.45) for samples past the middle: step 0: 0.6 + 1 + 1 - 1 ; step 1: 1 - 1 - 1 (the
    # sample on the face at x = 0.45 has d = eta: 1 either way; its direction is ambiguous)
    np.testing.assert_allclose(np_(g[0, 0, 0, :3]), [0.6 + 1 + 1 - 1, 0, 0], atol=1e-4)
    np.testing.assert_allclose(np_(g[0, 1, 0, 1:3]), [0, 0], atol=1e-4)


def test_sphere_jumping_through_thin_wall(device):
    """1 cm wall at x = 0; the sphere is 30 cm on either side at consecutive steps."""
    wv, wt = ref.thin_wall(0.01, 1.0, 1.0)
    meshes = [ref.RefMesh(wv, wt)]
    wenv = build_warp_env([meshes], device)
    s = np.array([[[[-0.3, 0.1, 0.0, 0.02]], [[0.3, 0.1, 0.0, 0.02]]]])
    c_plain, _ = ref.sphere_cost(s, [meshes], 0.02, 1.0, MAX_DIST)
    assert np.all(c_plain == 0)
    qs, c0, _, _ = run_swept(s, wenv, device, sweep_steps=0, eta=0.02)
    assert torch.all(c0 == 0)
    for steps in (1, 4):
        c_ref, g_ref = ref.swept_sphere_cost(s, [meshes], 0.02, 1.0, MAX_DIST, steps)
        _, cost, g, sp = run_swept(s, wenv, device, steps, eta=0.02)
        assert torch.all(cost > 0.01), steps
        assert torch.all(sp == 1)
        np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
        # the midpoint sample sits in the middle of the wall: its gradient is ambiguous in
        # x (either face), but it never pulls sideways
        np.testing.assert_allclose(np_(g[..., 1:3]), 0.0, atol=1e-5)


def test_swept_two_environments(device):
    rng = np.random.default_rng(33)
    m0 = scene(2)
    bv, bt = ref.box((0.6, 0.2, 0.2))
    m1 = [ref.RefMesh(bv, bt, ref.random_pose(rng, 0.1))]
    wenv = build_warp_env([m0, m1], device)
    s = random_trajectories(rng, 3, 5, 3, off_fraction=0.0)
    eq = [1, 0, 1]
    samples: list = []
    c_ref, g_ref = ref.swept_sphere_cost(s, [m0, m1], ETA, 1.0, MAX_DIST, 2, env_index=eq, samples_out=samples)
    _, cost, g, _ = run_swept(s, wenv, device, 2, env_query=eq)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = sample_mask(s, m0 + m1, samples)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4)


def test_speed_metric(device):
    rng = np.random.default_rng(34)
    meshes = scene(3)
    wenv = build_warp_env([meshes], device)
    # trajectories that cross the meshes so that many middle steps have cost > 0
    b, h, n = 3, 7, 3
    a = rng.uniform([-0.6, -0.2, -0.2], [-0.4, 0.2, 0.2], size=(b, 1, n, 3))
    z = rng.uniform([0.4, -0.2, -0.2], [0.6, 0.2, 0.2], size=(b, 1, n, 3))
    tt = np.linspace(0, 1, h)[None, :, None, None]
    p = a + (z - a) * tt ** 1.5 + rng.normal(scale=0.02, size=(b, h, n, 3))
    p[0, 4, 0] = p[0, 2, 0]  # zero velocity at step 3 of this sphere: metric skipped there
    s = np.concatenate([p, np.full((b, h, n, 1), 0.05)], axis=-1)
    dt = 0.2
    _, c_off, g_off, _ = run_swept(s, wenv, device, 2, speed_dt=dt, weight=1.5)
    _, c_on, g_on, sp = run_swept(s, wenv, device, 2, speed_dt=dt, weight=1.5, speed_metric=True)
    c_np, g_np = ref.speed_metric(np_(c_off), np_(g_off[..., :3]), s[..., :3], dt)
    mid = np_(c_off)[:, 1:-1] > 0
    assert mid.sum() > 10
    np.testing.assert_allclose(np_(c_on), c_np, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(g_on[..., :3]), g_np, rtol=1e-4, atol=1e-4)
    assert torch.all(g_on[..., 3] == 0)
    np.testing.assert_array_equal(sp.cpu().numpy(), (np_(c_on) > 0).astype(np.uint8))
    # first and last steps are untouched, as is the step with no velocity
    assert torch.equal(c_on[:, [0, -1]], c_off[:, [0, -1]])
    assert torch.equal(g_on[:, [0, -1]], g_off[:, [0, -1]])
    assert torch.equal(c_on[0, 3, 0], c_off[0, 3, 0]) and torch.equal(g_on[0, 3, 0], g_off[0, 3, 0])
    # the metric really changed the middle steps
    assert not np.allclose(np_(c_on)[:, 1:-1][mid], np_(c_off)[:, 1:-1][mid])
    # and the whole pipeline agrees with the full reference
    c_full, _ = ref.swept_sphere_cost(s, [meshes], ETA, 1.5, MAX_DIST, 2, dt, enable_speed_metric=True)
    np.testing.assert_allclose(np_(c_on), c_full, atol=5e-4, rtol=1e-3)


def test_speed_metric_short_horizon_untouched(device):
    """h = 2 has no interior step: the metric changes nothing."""
    meshes = scene(4)
    wenv = build_warp_env([meshes], device)
    s = np.array([[[[0.1, 0.0, 0.0, 0.05]], [[0.3, 0.0, 0.0, 0.05]]]])
    _, c_off, g_off, _ = run_swept(s, wenv, device, 2)
    _, c_on, g_on, _ = run_swept(s, wenv, device, 2, speed_metric=True)
    assert torch.all(c_off > 0)
    assert torch.equal(c_on, c_off) and torch.equal(g_on, g_off)


def test_negative_sweep_steps_rejected(device):
    meshes = scene(5)
    wenv = build_warp_env([meshes], device)
    s = np.zeros((1, 2, 1, 4))
    with pytest.raises(ValueError):
        run_swept(s, wenv, device, -1)


def test_large_launch_equals_per_row_launches(device):
    """4500 spheres: a CPU launch is split into chunks whose borders cut through trajectories;
    every batch row must equal the same row evaluated alone (rows are independent)."""
    rng = np.random.default_rng(35)
    meshes = scene(6)
    wenv = build_warp_env([meshes], device)
    s = random_trajectories(rng, 5, 30, 30, step=0.05)
    _, cost, g, _ = run_swept(s, wenv, device, 3, speed_metric=True)
    assert torch.sum(cost > 0) > 100
    for bi in range(5):
        _, c_row, g_row, _ = run_swept(s[bi : bi + 1], wenv, device, 3, speed_metric=True)
        torch.testing.assert_close(cost[bi : bi + 1], c_row, rtol=0, atol=0)
        torch.testing.assert_close(g[bi : bi + 1], g_row, rtol=0, atol=0)
    # without requires_grad the gradient buffer is zero-filled, the cost unchanged
    _, c_ng, g_ng, _ = run_swept(s, wenv, device, 3, speed_metric=True, requires_grad=False)
    assert torch.equal(c_ng, cost) and torch.all(g_ng == 0)
