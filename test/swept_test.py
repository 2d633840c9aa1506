"""SweptSdfMeshWarpPy against the numpy reference of the swept rule (docs/design.md "Swept cost": the
time-average of the sphere's cost over its slot, trapezoid weights, exact partial derivatives
towards both neighbours), finite differences, and the CHOMP speed metric."""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import warp as wp

import mesh_corpus
import reference as ref
from conftest import assert_kernels_agree, build_warp_env, scalar
from mesh_corpus import open_bowl
from robot_sdf.types import SignMethod
from robot_sdf.warp_primitives import Query, SdfMeshWarpPy, SweptSdfMeshWarpPy

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
    elif getattr(wenv, "sign_methods", None) is not None:
        args.append(wenv.sign_methods)
    cost = SweptSdfMeshWarpPy.apply(*args)
    return qs, cost, out_grad, sparsity


def world_env(envs: list[list[ref.RefMesh]], device: str, kind: str):
    """Kernel tensors of ``envs``: "raw" = wp.Mesh objects built directly (as cuRobo builds them,
    no bounding radius) and adopted (robot_sdf.adopt_meshes), "passthrough" = the same passed as
    they are (Warp's own sign queries), "world" = a MeshWorld's snapshot (robot_sdf's sign data:
    the pseudo-normal sign and the batched searches of the swept kernel)."""
    if kind in ("raw", "passthrough"):
        return build_warp_env(envs, device, adopt=kind == "raw")
    from robot_sdf import MeshWorld

    world = MeshWorld(device=device, num_envs=len(envs), mesh_capacity=max(1, max(len(e) for e in envs)),
                      max_distance=MAX_DIST)
    for e, meshes in enumerate(envs):
        for i, m in enumerate(meshes):
            world.add_mesh(f"m{i}", m.vertices, m.triangles, pose=m.pose, env=e, enabled=m.enabled)
    snap = world.snapshot()
    return SimpleNamespace(mesh_idx=snap.mesh_idx, mesh_pose_inverse=snap.mesh_pose_inverse,
                           mesh_enable=snap.mesh_enable, n_env_mesh=snap.n_env_mesh, world=world)


def swept_cost_only(spheres: np.ndarray, wenv, device: str, sweep_steps: int, eta: float = ETA,
                    max_dist: float = MAX_DIST) -> np.ndarray:
    """Cost (b,h,n) without autograd (float64 copy)."""
    _, c, _, _ = run_swept(spheres, wenv, device, sweep_steps, eta=eta, max_dist=max_dist, requires_grad=False)
    return np_(c)


def evaluations(spheres: np.ndarray, wenv, device: str, sweep_steps: int, eta: float = ETA,
                max_dist: float = MAX_DIST) -> np.ndarray:
    """Cost evaluations the kernel made per sphere (b,h,n)."""
    qs = torch.tensor(spheres, dtype=torch.float32, device=device)
    b, h, n = qs.shape[:3]
    count = torch.full((b, h, n), -1, dtype=torch.int32, device=device)
    signs = getattr(wenv, "sign_methods", None)
    Query(scalar(1.0, device), scalar(eta, device), scalar(max_dist, device), wenv.mesh_idx, wenv.mesh_pose_inverse,
          wenv.mesh_enable, wenv.n_env_mesh, "auto" if signs is None else signs, speed_dt=scalar(0.1, device),
          sweep_steps=sweep_steps, compute_grad=False).swept(qs, None, count)
    return count.cpu().numpy()


def plain_cost(spheres: np.ndarray, wenv, device: str, eta: float = ETA, weight: float = 1.0,
               max_dist: float = MAX_DIST):
    """SdfMeshWarpPy cost (b,h,n) and out_grad (b,h,n,4) of the same spheres."""
    qs = torch.tensor(spheres, dtype=torch.float32, device=device).requires_grad_()
    out_c = torch.zeros(spheres.shape[:-1], device=device)
    out_g = torch.zeros(spheres.shape[:-1] + (4,), device=device)
    sp = torch.zeros(spheres.shape[:-1], dtype=torch.uint8, device=device)
    wenv_args = (wenv.mesh_idx, wenv.mesh_pose_inverse, wenv.mesh_enable, wenv.n_env_mesh)
    signs = () if getattr(wenv, "sign_methods", None) is None else (None, False, False, wenv.sign_methods)
    SdfMeshWarpPy.apply(qs, out_c, out_g, sp, scalar(weight, device), scalar(eta, device), *wenv_args,
                        scalar(max_dist, device), *signs)
    return out_c, out_g, sp


def scene(seed: int) -> list[ref.RefMesh]:
    rng = np.random.default_rng(seed)
    bv, bt = ref.box((0.3, 0.25, 0.4))
    sv, st = ref.icosphere(0.15, 2)
    return [
        ref.RefMesh(bv, bt, np.concatenate([[0.25, 0.0, 0.0], ref.random_quaternion(rng)])),
        ref.RefMesh(sv, st, np.concatenate([[-0.25, 0.05, 0.0], ref.random_quaternion(rng)])),
    ]


def random_trajectories(rng: np.random.Generator, b: int, h: int, n: int, step: float = 0.08,
                        off_fraction: float = 0.1, lower=(-0.5, -0.3, -0.3), upper=(0.5, 0.3, 0.3),
                        radii=(0.01, 0.06)) -> np.ndarray:
    """(b,h,n,4) random walks (steps of ``step`` m per axis, normal) from starts uniform in the box
    [lower, upper] (default: the scene's), radii uniform in ``radii``; a fraction of the spheres
    switched off (radius -1)."""
    start = rng.uniform(lower, upper, size=(b, 1, n, 3))
    walk = np.cumsum(rng.normal(scale=step, size=(b, h, n, 3)), axis=1)
    walk[:, 0] = 0.0
    p = start + walk
    r = rng.uniform(*radii, size=(b, h, n, 1))
    r[rng.uniform(size=r.shape) < off_fraction] = -1.0
    return np.concatenate([p, r], axis=-1)


def sample_mask(spheres: np.ndarray, meshes: list[ref.RefMesh], samples: list) -> np.ndarray:
    """Spheres whose base point and every sample their gradient depends on have a well-defined
    distance gradient and are not on a surface (where inside/outside is a coin toss)."""
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
    out_c, out_g, sp = plain_cost(s, wenv, device, weight=1.7)
    assert torch.any(out_c > 0)
    assert torch.equal(c_sw, out_c)
    assert torch.equal(g_sw, out_g)
    assert torch.equal(sp_sw, sp)


@pytest.mark.parametrize("kind", ["raw", "world"])
@pytest.mark.parametrize("sweep_steps,max_dist", [(1, 0.5), (2, 0.5), (4, 0.5), (4, 0.04)])
def test_swept_matches_reference(device, sweep_steps, max_dist, kind):
    rng = np.random.default_rng(31 + sweep_steps)
    meshes = scene(1)
    wenv = world_env([meshes], device, kind)
    # steps long enough that clearances often fall between samples (some skipped, some not)
    s = random_trajectories(rng, 4, 6, 6, step=0.15)
    samples: list = []
    c_ref, own, to_prev, to_next = ref.swept_sphere_partials(s, [meshes], ETA, 1.3, max_dist, sweep_steps,
                                                             samples_out=samples)
    g_ref = ref.swept_chain_rule(own, to_prev, to_next)
    c_plain, _ = ref.sphere_cost(s, [meshes], ETA, 1.3, max_dist)
    assert np.sum(np.abs(c_ref - c_plain) > 1e-3) >= 3  # the sweep changes the cost somewhere
    assert np.abs(to_prev).max() > 0.05 and np.abs(to_next).max() > 0.05  # neighbours matter
    qs, cost, g, sp = run_swept(s, wenv, device, sweep_steps, weight=1.3, max_dist=max_dist)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = sample_mask(s, meshes, samples)
    assert mask.mean() > 0.5 and np.sum(mask & (c_ref > 0)) >= 5
    # out_grad: the gradient of the summed cost, neighbours' partials included
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4)
    assert torch.all(g[..., 3] == 0)
    np.testing.assert_array_equal(sp.cpu().numpy(), (np_(cost) > 0).astype(np.uint8))
    off = s[..., 3] < 0
    assert np.any(off) and torch.all(cost[torch.from_numpy(off)] == 0)
    # off spheres receive nothing
    assert torch.all(g[torch.from_numpy(off)] == 0)
    # the chain rule through backward for arbitrary upstream weights
    w = torch.rand(cost.shape, device=device, dtype=torch.float64) * 2 - 1
    (grad,) = torch.autograd.grad(cost, qs, grad_outputs=w.float())
    g_chain = ref.swept_chain_rule(own, to_prev, to_next, np_(w))
    np.testing.assert_allclose(np_(grad[..., :3])[mask], g_chain[mask], atol=GRAD_ATOL, rtol=1e-4)
    assert torch.all(grad[..., 3] == 0) and torch.all(grad[torch.from_numpy(off)] == 0)


def test_samples_and_gradients_by_hand(device):
    """Point sphere (r = 0) moving between x = 0.18 and x = 0.58 against a box spanning x in
    [0.25, 0.45] (y, z in [-0.1, 0.1]); eta = 0.05, h = 2 (one side per step).

    sweep_steps 4: samples at s = 1/8 .. 4/8 of the 0.4 m segment, weights 1/8 (p[t]), 1/4, 1/4,
    1/4, 1/8 (half-way point).
    step 0 (x = 0.18): samples x = 0.23, 0.28, 0.33, 0.38, penetration d = 0.03, 0.08, 0.13, 0.12,
      cost 0.009, 0.055, 0.105, 0.095, d cost/dx = 0.6, 1, 1, -1:
      cost = (0.009 + 0.055 + 0.105) / 4 + 0.095 / 8 = 0.054125
      d cost_0/d p0 = (7/8 0.6 + 6/8 + 5/8) / 4 - (4/8) / 8 = 0.4125, d cost_0/d p1 = 0.1125
    step 1 (x = 0.58, clearance 0.08: the sample at 0.53, 0.05 away, is skipped): samples
      x = 0.48, 0.43, 0.38 with cost 0.004, 0.045, 0.095, d cost/dx = -0.4, -1, -1:
      cost = (0.004 + 0.045) / 4 + 0.095 / 8 = 0.024125
      d cost_1/d p1 = (6/8 (-0.4) + 5/8 (-1)) / 4 - (4/8) / 8 = -0.29375, d cost_1/d p0 = -0.18125
    out_grad (gradient of the sum): p0 0.4125 - 0.18125 = 0.23125, p1 -0.29375 + 0.1125 = -0.18125.
    """
    bv, bt = ref.box((0.2, 0.2, 0.2))
    meshes = [ref.RefMesh(bv, bt, np.array([0.35, 0, 0, 1, 0, 0, 0.0]))]
    wenv = build_warp_env([meshes], device, adopt=True)
    s = np.array([[[[0.18, 0.0, 0.0, 0.0]], [[0.58, 0.0, 0.0, 0.0]]]])
    qs, cost, g, _ = run_swept(s, wenv, device, 4, eta=0.05, max_dist=1.0)
    np.testing.assert_allclose(np_(cost).reshape(-1), [0.054125, 0.024125], atol=1e-6)
    np.testing.assert_allclose(np_(g[0, :, 0, :3]), [[0.23125, 0, 0], [-0.18125, 0, 0]], atol=1e-5)
    np.testing.assert_array_equal(evaluations(s, wenv, device, 4, eta=0.05, max_dist=1.0).reshape(-1), [5, 4])
    # the cost of step 0 alone: its partials
    (g0,) = torch.autograd.grad(cost[0, 0, 0], qs)
    np.testing.assert_allclose(np_(g0[0, :, 0, :3]), [[0.4125, 0, 0], [0.1125, 0, 0]], atol=1e-5)
    # sweep_steps 1: p[t] and the half-way point (x = 0.38), 1/2 each
    _, c1, _, _ = run_swept(s, wenv, device, 1, eta=0.05, max_dist=1.0)
    np.testing.assert_allclose(np_(c1).reshape(-1), [0.0475, 0.0475], atol=1e-6)
    c_ref, g_ref = ref.swept_sphere_cost(s, [meshes], 0.05, 1.0, 1.0, 4)
    np.testing.assert_allclose(c_ref.reshape(-1), [0.054125, 0.024125], rtol=1e-9)
    np.testing.assert_allclose(g_ref[0, :, 0], [[0.23125, 0, 0], [-0.18125, 0, 0]], atol=1e-9)


def convex_orbits(rng: np.random.Generator) -> tuple[list[ref.RefMesh], np.ndarray]:
    """Convex meshes and trajectories that stay outside them, within reach of the cost: the
    signed distance is C1 outside a convex mesh, so finite differences are meaningful."""
    sv, st = ref.icosphere(0.15, 2)
    bv, bt = ref.box((0.3, 0.3, 0.3))
    meshes = [ref.RefMesh(sv, st, np.array([0.0, 0.0, 0.0, 1, 0, 0, 0])),
              ref.RefMesh(bv, bt, np.concatenate([[0.8, 0.0, 0.0], ref.random_quaternion(rng)]))]
    h, n = 6, 2
    s = np.zeros((2, h, n, 4))
    s[..., 3] = 0.03
    ang = 0.12 * np.arange(h)[:, None] + rng.uniform(0, 2 * np.pi, size=(1, n))
    rad = 0.2 + 0.025 * np.sin(2.0 * np.arange(h))[:, None] + rng.uniform(-0.01, 0.01, size=(h, n))
    s[0, ..., 0], s[0, ..., 1], s[0, ..., 2] = rad * np.cos(ang), rad * np.sin(ang), 0.02 * ang
    # row 1: along a line past the box at 3-6 cm from its surface (outside)
    pts = np.linspace([0.45, -0.35, 0.0], [1.15, 0.35, 0.05], h)
    for k in range(n):
        q = pts + rng.normal(scale=0.01, size=(h, 3))
        sd = meshes[1].signed_distance_world(q)[0]
        _, gsd = meshes[1].signed_distance_world(q)
        s[1, :, k, :3] = q + gsd * (0.045 + 0.015 * k - sd)[:, None]  # project to the wanted distance
    for m in meshes:
        assert np.all(m.signed_distance_world(s[..., :3].reshape(-1, 3))[0] > 0.005)
    return meshes, s


@pytest.mark.parametrize("kind", ["raw", "world"])
@pytest.mark.parametrize("sweep_steps", [1, 2, 4])
def test_gradient_is_the_true_derivative(device, sweep_steps, kind):
    """autograd with random grad_outputs against central differences, for every coordinate of
    every sphere (neighbours included): of the float64 reference, and of the kernel's own cost."""
    rng = np.random.default_rng(60 + sweep_steps)
    meshes, s = convex_orbits(rng)
    wenv = world_env([meshes], device, kind)
    qs, cost, _, _ = run_swept(s, wenv, device, sweep_steps)
    c_np = np_(cost)
    assert np.sum(c_np > 0) >= 10 and np.sum((c_np > 0) & (c_np < 0.5 * ETA)) >= 3
    w = rng.uniform(-1.0, 1.0, size=c_np.shape)
    (grad,) = torch.autograd.grad(cost, qs, grad_outputs=torch.tensor(w, dtype=torch.float32, device=device),
                                  retain_graph=True)
    grad = np_(grad[..., :3])
    fd_ref = np.zeros_like(grad)
    fd_kernel = np.zeros_like(grad)
    for idx in np.ndindex(*s.shape[:-1], 3):
        plus, minus = s.copy(), s.copy()
        eps = 1e-6
        plus[idx] += eps
        minus[idx] -= eps
        loss = [np.sum(w * ref.swept_sphere_cost(x, [meshes], ETA, 1.0, MAX_DIST, sweep_steps)[0]) for x in (plus, minus)]
        fd_ref[idx] = (loss[0] - loss[1]) / (2 * eps)
        eps = 3e-4
        plus, minus = s.copy(), s.copy()
        plus[idx] += eps
        minus[idx] -= eps
        loss = [np.sum(w * swept_cost_only(x, wenv, device, sweep_steps)) for x in (plus, minus)]
        fd_kernel[idx] = (loss[0] - loss[1]) / (2 * eps)
    assert np.abs(fd_ref).max() > 0.1
    np.testing.assert_allclose(grad, fd_ref, atol=2e-4)
    np.testing.assert_allclose(grad, fd_kernel, atol=5e-3)
    # the step's cost depends on the neighbours: d cost_t / d p[t+1] is not zero
    bi, t, k = np.unravel_index(np.argmax(c_np[:, :-1]), c_np[:, :-1].shape)
    (g_t,) = torch.autograd.grad(cost[bi, t, k], qs, retain_graph=True)
    assert torch.linalg.vector_norm(g_t[bi, t + 1, k, :3]) > 1e-3


@pytest.mark.parametrize("kind", ["raw", "world"])
@pytest.mark.parametrize("sweep_steps", [1, 2, 4])
def test_stationary_trajectory_is_exactly_the_plain_cost(device, sweep_steps, kind):
    rng = np.random.default_rng(40)
    meshes = scene(7)
    wenv = world_env([meshes], device, kind)
    s = random_trajectories(rng, 3, 1, 6, off_fraction=0.0)
    s = np.repeat(s, 5, axis=1)  # every sphere sits still for 5 steps
    c_plain, g_plain, _ = plain_cost(s, wenv, device, weight=2.5)
    assert torch.sum(c_plain > 0) >= 6
    _, cost, g, _ = run_swept(s, wenv, device, sweep_steps, weight=2.5)
    assert_kernels_agree(cost, c_plain, device)
    # the summed cost's gradient of an inner sphere (whose neighbours are inner too) is the plain one
    torch.testing.assert_close(g[:, 2], g_plain[:, 2], atol=1e-5, rtol=1e-5)


def test_cost_is_continuous_when_a_neighbour_moves(device):
    """Neighbours exactly on p[t], then 1 um away: the cost moves by at most about 1 um times its
    slope (the old summed-samples rule, bench/legacy_swept.py, jumped from 1x to 9x the plain cost here
    with sweep_steps 4)."""
    rng = np.random.default_rng(41)
    bv, bt = ref.box((0.4, 0.4, 0.4))
    meshes = [ref.RefMesh(bv, bt)]
    wenv = build_warp_env([meshes], device, adopt=True)
    p = np.array([0.21, 0.03, -0.05, 0.05])  # 1 cm outside the +x face, in contact
    s = np.repeat(p[None, None, None], 3, axis=1)
    c_plain, _, _ = plain_cost(s, wenv, device)
    for steps in (1, 2, 4):
        base = swept_cost_only(s, wenv, device, steps)
        np.testing.assert_array_equal(base, np_(c_plain))
        for _ in range(5):
            for t in (0, 2):
                moved = s.copy()
                moved[0, t, 0, :3] += 1e-6 * ref.random_quaternion(rng)[1:] / 0.5
                c = swept_cost_only(moved, wenv, device, steps)
                assert np.abs(c - base).max() < 3e-6, (steps, t)
                # and moving back onto the coincident position is just as smooth
    # a scan: the neighbour moves away in 1 mm steps through contact and free space; every sample
    # moves by at most half of that, and |d cost / d q| <= 1 (one mesh, weight 1), so consecutive
    # costs differ by at most 0.5 mm (plus float32 noise), whatever samples get skipped
    base = np.array([0.25, 0.0, 0.0, 0.02])  # inside the box near its +x face
    xs = np.arange(0.0, 0.5, 1e-3)
    traj = np.repeat(base[None, None, None], 2, axis=1).repeat(len(xs), axis=0)
    traj[:, 1, 0, 0] += xs
    traj[:, 1, 0, 1] += 0.5 * xs
    for steps in (2, 4):
        c = swept_cost_only(traj, wenv, device, steps, eta=0.03, max_dist=0.2)[:, 0, 0]
        assert np.abs(np.diff(c)).max() <= 0.5e-3 * np.sqrt(1.25) + 1e-6
        ev = evaluations(traj, wenv, device, steps, eta=0.03, max_dist=0.2)[:, 1, 0]
        assert len(set(ev.tolist())) >= 2  # skipping changed along the scan: no jump from it


@pytest.mark.parametrize("sweep_steps", [1, 2, 4])
def test_linear_cost_gives_the_exact_time_average(device, sweep_steps):
    """Where the cost is linear along the path (penetration beyond eta everywhere), the trapezoid
    weights give the exact time-average over the slot, which equal weights would not."""
    bv, bt = ref.box((2.0, 2.0, 2.0))
    meshes = [ref.RefMesh(bv, bt, np.array([-1.0, 0, 0, 1, 0, 0, 0]))]  # +x face at x = 0
    wenv = build_warp_env([meshes], device)
    r, eta = 0.1, 0.04
    x = np.array([0.05, 0.02, -0.06, -0.07, 0.0])
    s = np.zeros((1, len(x), 1, 4))
    s[0, :, 0, 0] = x
    s[..., 3] = r
    cost = swept_cost_only(s, wenv, device, sweep_steps, eta=eta)[0, :, 0]

    def c(y):  # sd = y near the +x face, penetration r + eta - y > eta
        return r + eta / 2 - y

    mid = 0.5 * (x[1:] + x[:-1])
    expected = np.empty(len(x))
    expected[0] = 0.5 * (c(x[0]) + c(mid[0]))
    expected[-1] = 0.5 * (c(x[-1]) + c(mid[-1]))
    expected[1:-1] = 0.25 * (c(mid[:-1]) + c(x[1:-1])) + 0.25 * (c(x[1:-1]) + c(mid[1:]))
    np.testing.assert_allclose(cost, expected, atol=2e-6)
    # equal weights (1 / (2K + 1) each) would be off by far more than that
    k = np.arange(1, sweep_steps + 1) / (2 * sweep_steps)
    t = 2
    equal = (c(x[t]) + np.sum(c(x[t] + k * (x[t - 1] - x[t]))) + np.sum(c(x[t] + k * (x[t + 1] - x[t])))) / (
        2 * sweep_steps + 1)
    assert abs(equal - expected[t]) > 2e-4


@pytest.mark.parametrize("kind", ["raw", "world"])
def test_sphere_jumping_through_thin_wall(device, kind):
    """1 cm wall at x = 0; the sphere is 30 cm on either side at consecutive steps."""
    wv, wt = ref.thin_wall(0.01, 1.0, 1.0)
    meshes = [ref.RefMesh(wv, wt)]
    wenv = world_env([meshes], device, kind)
    s = np.array([[[[-0.3, 0.1, 0.0, 0.02]], [[0.3, 0.1, 0.0, 0.02]]]])
    c_plain, _ = ref.sphere_cost(s, [meshes], 0.02, 1.0, MAX_DIST)
    assert np.all(c_plain == 0)
    qs, c0, _, _ = run_swept(s, wenv, device, sweep_steps=0, eta=0.02)
    assert torch.all(c0 == 0)
    for steps in (1, 4):
        c_ref, g_ref = ref.swept_sphere_cost(s, [meshes], 0.02, 1.0, MAX_DIST, steps)
        _, cost, g, sp = run_swept(s, wenv, device, steps, eta=0.02)
        # the half-way sample sits in the wall: penetration 0.045 with weight 1 / (2 K)
        assert torch.all(cost > 0.5 * (0.045 - 0.01) / steps - 1e-6), steps
        assert torch.all(sp == 1)
        np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
        # the midpoint sample sits in the middle of the wall: its gradient is ambiguous in
        # x (either face), but it never pulls sideways
        np.testing.assert_allclose(np_(g[..., 1:3]), 0.0, atol=1e-5)


def contact_walks(rng: np.random.Generator, meshes: list[ref.RefMesh], start: np.ndarray, sweep_steps: int):
    """(3, 12, 8, 4) walks from ``start`` (3, 1, 8, 3) in short noisy steps along random
    directions, and the reference's swept costs, gradients and the mask of unambiguous gradients;
    asserts that some centres lie deeper than r + eta and that most spheres pay."""
    direction = rng.normal(size=(3, 1, 8, 3))
    direction /= np.linalg.norm(direction, axis=-1, keepdims=True)
    walk = start + direction * np.linspace(0.0, 0.3, 12)[None, :, None, None] \
        + np.cumsum(rng.normal(scale=0.004, size=(3, 12, 8, 3)), axis=1)
    s = np.concatenate([walk, rng.uniform(0.01, 0.04, size=(3, 12, 8, 1))], axis=-1)
    samples: list = []
    c_ref, own, to_prev, to_next = ref.swept_sphere_partials(s, [meshes], ETA, 1.0, MAX_DIST, sweep_steps,
                                                             samples_out=samples)
    g_ref = ref.swept_chain_rule(own, to_prev, to_next)
    sd = np.stack([m.signed_distance_world(s[..., :3].reshape(-1, 3))[0] for m in meshes]).min(0)
    assert np.sum(sd < -0.09) >= 10  # centres deeper than the samples' search bound r + eta
    assert np.mean(c_ref > 0) > 0.4
    return s, c_ref, g_ref, sample_mask(s, meshes, samples)


def check_walks(s, c_ref, g_ref, mask, wenv, device: str, sweep_steps: int, kind: str) -> np.ndarray:
    """Swept costs and gradients of ``s`` on ``wenv`` against the reference's; returns the costs."""
    _, cost, g, _ = run_swept(s, wenv, device, sweep_steps)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4, err_msg=kind)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4, err_msg=kind)
    return np_(cost)


@pytest.mark.parametrize("sweep_steps", [2, 4, 11])
def test_contact_heavy_trajectories_in_and_out_of_meshes(device, sweep_steps):
    """Short steps (samples mm apart, searched together for MeshWorld's meshes) along walks that
    graze, enter and cross deep into a box and a sphere mesh: MeshWorld's tensors and cuRobo-built
    ones both give the reference's costs and gradients; deep samples keep their full cost."""
    rng = np.random.default_rng(70 + sweep_steps)
    bv, bt = ref.box((0.5, 0.4, 0.45))
    sv, st = ref.icosphere(0.2, 2)
    meshes = [ref.RefMesh(bv, bt, np.concatenate([[0.3, 0.0, 0.0], ref.random_quaternion(rng)])),
              ref.RefMesh(sv, st, np.concatenate([[-0.3, 0.05, 0.0], ref.random_quaternion(rng)]))]
    start = rng.uniform([-0.5, -0.25, -0.25], [0.55, 0.25, 0.25], size=(3, 1, 8, 3))
    start[:, :, :3] = rng.choice([-0.3, 0.3], size=(3, 1, 3, 1)) * np.array([1.0, 0.0, 0.0]) \
        + rng.uniform(-0.05, 0.05, size=(3, 1, 3, 3))  # near the centres of the meshes
    s, c_ref, g_ref, mask = contact_walks(rng, meshes, start, sweep_steps)
    costs = {}
    for kind in ("raw", "world"):
        wenv = world_env([meshes], device, kind)
        costs[kind] = check_walks(s, c_ref, g_ref, mask, wenv, device, sweep_steps, kind)
    np.testing.assert_allclose(costs["raw"], costs["world"], atol=1e-5)


@pytest.mark.parametrize("sweep_steps", [2, 4])
def test_contact_heavy_trajectories_through_winding_number_meshes(device, sweep_steps):
    """Closed surfaces that auto evaluates by winding number (two overlapping boxes in one mesh,
    a box nested in a box: winding number 2 inside), walked through in short steps: the shared
    traversal signs each point by its winding number (MeshWorld's meshes and cuRobo-built ones,
    through their winding-number twins) and gives the reference's costs and gradients; deep
    samples, in the overlap and in the inner box, keep their full cost."""
    rng = np.random.default_rng(90 + sweep_steps)
    ov, ot = mesh_corpus.overlapping_boxes()
    nv, nt = mesh_corpus.nested_shells()
    meshes = [ref.RefMesh(ov * 2.0, ot, np.concatenate([[0.3, 0.0, 0.0], ref.random_quaternion(rng)])),
              ref.RefMesh(nv * 1.2, nt, np.concatenate([[-0.35, 0.05, 0.0], ref.random_quaternion(rng)]))]
    start = rng.uniform([-0.6, -0.25, -0.25], [0.6, 0.25, 0.25], size=(3, 1, 8, 3))
    start[:, :, :4] = ref.transform_points(meshes[0].pose, np.array([[0.1, 0.05, 0.03]]))[0] \
        + rng.uniform(-0.05, 0.05, size=(3, 1, 4, 3))  # in the overlap
    start[:, :, 4:6] = meshes[1].pose[:3] + rng.uniform(-0.03, 0.03, size=(3, 1, 2, 3))  # in the inner box
    s, c_ref, g_ref, mask = contact_walks(rng, meshes, start, sweep_steps)
    for kind in ("raw", "world"):
        wenv = world_env([meshes], device, kind)
        if kind == "world":
            assert [wenv.world.mesh_info(f"m{i}")["sign_method"] for i in range(2)] == ["winding_number"] * 2
        check_walks(s, c_ref, g_ref, mask, wenv, device, sweep_steps, kind)


@dataclass
class NormalSignSheet(ref.RefMesh):
    """An open sheet under the pseudo-normal sign (Warp's for raw meshes, robot_sdf's `normal`):
    the sign is the side of the sheet's plane (normal +z) wherever the closest point lies, even
    beyond its edges, and a point is found only within ``bound`` (its box is flat: nothing
    deeper is inside)."""

    bound: float = 0.0

    def signed_distance_world(self, points: np.ndarray):
        local = ref.transform_points(ref.pose_inverse(self.pose), points)
        c, d, _ = ref.closest_point_mesh(local, self.vertices, self.triangles)
        sign = np.where(local[:, 2] > 0.0, 1.0, -1.0)
        grad = (local - c) / np.maximum(d, 1e-300)[:, None] * sign[:, None]
        sd = np.where(d < self.bound, d * sign, 10.0)
        return sd, grad @ ref.quat_to_matrix(self.pose[3:]).T


@pytest.mark.parametrize("sweep_steps", [4, 9])
@pytest.mark.parametrize("case", ["raw sheet", "world normal sheet", "world auto bowl"])
def test_open_surfaces_cost_the_mean_of_plain_costs_at_the_samples(device, case, sweep_steps):
    """Where the sign is not that of a closed surface, a point free of the surface may still be
    inside (beyond a sheet's edge under the pseudo-normal sign, in a bowl's opening under the
    winding number): no sample is freed by a clearance, and each costs what the plain cost says
    there (regression: samples inside such a clearance were skipped, costing 0). The points of a
    step share traversals (sweep_steps 9: beyond the first traversal's 7 samples a side)."""
    from robot_sdf import MeshWorld

    max_dist = 0.2
    rng = np.random.default_rng(77)
    pose = np.concatenate([[0.05, -0.02, 0.03], ref.random_quaternion(rng)])
    if case.endswith("sheet"):
        v, t = ref.sheet(1.0, 6)
        meshes = [NormalSignSheet(v, t, pose)]
        start = rng.uniform([-0.7, -0.7, -0.3], [0.7, 0.7, 0.3], size=(6, 1, 8, 3))
    else:
        v, t = open_bowl()
        meshes = [ref.RefMesh(v, t, pose)]
        start = rng.uniform(-0.25, 0.25, size=(6, 1, 8, 3))
    start = ref.transform_points(pose, start.reshape(-1, 3)).reshape(start.shape)
    walk = np.cumsum(rng.normal(scale=0.08, size=(6, 6, 8, 3)), axis=1)
    walk[:, 0] = 0.0
    # One radius per sphere index, so that the sheet's found bound is one number per index.
    radius = np.broadcast_to(rng.uniform(0.01, 0.06, size=(1, 1, 8, 1)), (6, 6, 8, 1))
    s = np.concatenate([start + walk, radius], axis=-1)
    if case == "raw sheet":
        wenv = build_warp_env([[ref.RefMesh(v, t, pose)]], device)
    else:
        world = MeshWorld(device=device, mesh_capacity=1, max_distance=max_dist,
                          sign_method=SignMethod.NORMAL if case.endswith("sheet") else SignMethod.AUTO)
        world.add_mesh("open", v, t, pose=pose)
        wenv = world.snapshot()
    c_ref = np.zeros(s.shape[:-1])
    own, to_prev, to_next = (np.zeros(s.shape[:-1] + (3,)) for _ in range(3))
    for n in range(s.shape[2]):
        if case.endswith("sheet"):
            meshes[0].bound = max_dist + float(s[0, 0, n, 3]) + ETA
        cn, on, pn, nn = ref.swept_sphere_partials(s[:, :, n:n + 1], [meshes], ETA, 1.0, max_dist, sweep_steps)
        c_ref[:, :, n], own[:, :, n], to_prev[:, :, n], to_next[:, :, n] = cn[..., 0], on[:, :, 0], pn[:, :, 0], nn[:, :, 0]
    g_ref = ref.swept_chain_rule(own, to_prev, to_next)
    samples: list = []
    ref.swept_sphere_partials(s, [[ref.RefMesh(v, t, pose)]], ETA, 1.0, max_dist, sweep_steps, samples_out=samples)
    # Spheres whose points all stay clear of the plain cost's jumps: the sheet's plane and found
    # bound, the bowl's winding number 0.5 (Warp's is the fast approximation), the surface.
    pts = np.concatenate([s[..., :3].reshape(-1, 3), np.stack([q for _, q in samples])])
    owner = np.concatenate([np.arange(s[..., 0].size),
                            [np.ravel_multi_index(k, s.shape[:-1]) for k, _ in samples]])
    radius = s[..., 3].reshape(-1)[owner]
    local = ref.transform_points(ref.pose_inverse(pose), pts)
    _, d, _ = ref.closest_point_mesh(local, v, t)
    if case.endswith("sheet"):
        bad = (np.abs(local[:, 2]) < 1e-4) | (np.abs(d - (max_dist + radius + ETA)) < 1e-3)
    else:
        bad = (np.abs(ref.winding_number(local, v, t) - 0.5) < 0.05) | (d < 1e-4)
    mask = np.ones(s[..., 0].size, dtype=bool)
    mask[owner[bad]] = False
    mask = mask.reshape(s.shape[:-1])
    qs, cost, g, _ = run_swept(s, wenv, device, sweep_steps, max_dist=max_dist)
    c_plain = ref.sphere_cost(s, [meshes], ETA, 1.0, max_dist)[0]
    assert mask.mean() > 0.8 and np.sum(mask & (np.abs(c_ref - c_plain) > 1e-3)) >= 10
    np.testing.assert_allclose(np_(cost)[mask], c_ref[mask], atol=COST_ATOL, rtol=1e-4)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4)


@wp.kernel
def _warp_winding_inside(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), threshold: float,
                         inside: wp.array(dtype=wp.int32)):
    i = wp.tid()
    q = wp.mesh_query_point_sign_winding_number(mesh, pts[i], 1.0e6, 2.0, threshold)
    inside[i] = wp.where(q.result and q.sign < 0.0, 1, 0)


def warp_winding_inside(mesh_id: int, points: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Warp's own winding-number inside test (its public query, default accuracy 2.0) of mesh-frame
    points (N,3): the sign the kernels' winding number reproduces."""
    pts = wp.array(np.asarray(points, np.float32), dtype=wp.vec3, device="cpu")
    inside = wp.zeros(len(points), dtype=wp.int32, device="cpu")
    wp.launch(_warp_winding_inside, len(points), [wp.uint64(mesh_id), pts, float(threshold), inside], device="cpu")
    return inside.numpy().astype(bool)


@dataclass
class WarpWindingMesh(ref.RefMesh):
    """A mesh at the identity pose signed by Warp's own winding-number query on the CPU Warp mesh
    ``mesh_id`` (same geometry): distances and gradients from the numpy reference."""

    mesh_id: int = 0

    def signed_distance_world(self, points: np.ndarray):
        c, d, _ = ref.closest_point_mesh(points, self.vertices, self.triangles)
        sign = np.where(warp_winding_inside(self.mesh_id, points), -1.0, 1.0)
        grad = (points - c) / np.maximum(d, 1e-300)[:, None] * sign[:, None]
        return d * sign, grad


def _warp_winding_world(v: np.ndarray, t: np.ndarray, device: str, max_dist: float, sign_method):
    """A MeshWorld on ``device`` holding (v, t) as "m", and the reference of that mesh signed by
    Warp's own winding number, read from its CPU twin (the same BVH build on any device): (world,
    the CPU mesh id, [WarpWindingMesh])."""
    from robot_sdf import MeshWorld

    worlds = []
    for dev in dict.fromkeys([device, "cpu"]):
        w = MeshWorld(device=dev, mesh_capacity=1, max_distance=max_dist, sign_method=sign_method)
        w.add_mesh("m", v, t)
        worlds.append(w)
    mesh_id = int(worlds[-1].snapshot().mesh_idx[0, 0])
    return worlds[0], mesh_id, [WarpWindingMesh(v, t, mesh_id=mesh_id)]


def _reference_and_points(s: np.ndarray, meshes: list, v: np.ndarray, t: np.ndarray, max_dist: float,
                          sweep_steps: int):
    """The reference swept cost (b,h,n) and gradient of the summed cost (b,h,n,3) of spheres s
    (b,h,n,4) on ``meshes``, every point whose plain cost it averages (the centres, then the
    samples of (v, t) at the identity pose) and the flat index of the sphere each belongs to."""
    c_ref, own, to_prev, to_next = ref.swept_sphere_partials(s, [meshes], ETA, 1.0, max_dist, sweep_steps)
    samples: list = []
    ref.swept_sphere_partials(s, [[ref.RefMesh(v, t)]], ETA, 1.0, max_dist, sweep_steps, samples_out=samples)
    pts = np.concatenate([s[..., :3].reshape(-1, 3), np.stack([q for _, q in samples])])
    owner = np.concatenate([np.arange(s[..., 0].size), [np.ravel_multi_index(k, s.shape[:-1]) for k, _ in samples]])
    return c_ref, ref.swept_chain_rule(own, to_prev, to_next), pts, owner


@pytest.mark.parametrize("sweep_steps", [4, 9])
def test_rim_shortcut_keeps_the_winding_verdicts_through_a_bowl_opening(device, sweep_steps):
    """The rim shortcut (docs/sign_methods.md, "Swept samples on open surfaces") gives a sample
    its step centre's winding-number verdict where the rim bound proves that the winding number
    cannot reach 0.5 in between. In a bowl's opening the winding number passes 0.5 in free space
    (at 4.2 per metre at its centre, about what the bound allows), so walks of 3-5 cm steps there
    cross it between samples that the segment reaches without meeting the surface: every sphere
    clear of the ambiguous points costs what the swept rule gives with Warp's own verdict at each
    sample. Dropping the rim bound's slope term fails here (it passed every other test); a bound
    too small by less than that is caught by test_rim_slope_bounds_the_winding_number_gradient."""
    max_dist = 0.2
    v, t = open_bowl()
    world, mesh_id, meshes = _warp_winding_world(v, t, device, max_dist, SignMethod.AUTO)
    assert world.mesh_info("m")["sign_method"] == "winding_number"
    s = random_trajectories(np.random.default_rng(31 + sweep_steps), 8, 8, 12, step=0.025, off_fraction=0.0,
                            lower=(-0.08, -0.08, 0.0), upper=(0.08, 0.08, 0.16), radii=(0.02, 0.07))
    c_ref, g_ref, pts, owner = _reference_and_points(s, meshes, v, t, max_dist, sweep_steps)
    n_spheres = s[..., 0].size
    # Left out: spheres with a point on the surface or whose verdict float32 rounding of the sample
    # position could flip (Warp's winding number within 1e-3 of 0.5).
    _, d, _ = ref.closest_point_mesh(pts, v, t)
    bad = (d < 1e-4) | (warp_winding_inside(mesh_id, pts, 0.499) != warp_winding_inside(mesh_id, pts, 0.501))
    mask = np.ones(n_spheres, dtype=bool)
    mask[owner[bad]] = False
    # Spheres with a sample on the other side of 0.5 from their centre (the crossings the bound
    # must see).
    inside = warp_winding_inside(mesh_id, pts)
    sample_owner = owner[n_spheres:]
    crossing = np.zeros(n_spheres, dtype=bool)
    crossing[sample_owner[inside[n_spheres:] != inside[sample_owner]]] = True
    assert mask.mean() > 0.7 and np.sum(mask & crossing) >= 20, (mask.mean(), np.sum(mask & crossing))
    mask = mask.reshape(s.shape[:-1])
    _, cost, g, _ = run_swept(s, world.snapshot(), device, sweep_steps, max_dist=max_dist)
    np.testing.assert_allclose(np_(cost)[mask], c_ref[mask], atol=COST_ATOL, rtol=1e-4)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4)


@pytest.mark.parametrize("sweep_steps", [4, 9])
def test_open_surface_inside_beyond_its_box(device, sweep_steps):
    """An open surface's winding number can pass 1/2 far from it and outside its box: over three
    copies of a flat 1 m sheet (rim multiplicity 3, a box of zero height) it is above 1/2 up to
    about 0.5 m above the centre. Walks 0.12-0.7 m above it, farther than r + eta from the surface
    (where the swept kernel's far bounds may skip the search: kernels.winding.open_winding_outside),
    cost their depth wherever Warp's winding number says inside, as the swept rule gives with
    Warp's own verdict at each sample (declaring a free step outside without those bounds, or
    every free sample outside, fails here)."""
    max_dist = 0.2
    v1, t1 = ref.sheet(1.0, 6)
    t1 = t1[:, ::-1]  # facing -z: inside (positive winding number) above it
    v = np.concatenate([v1] * 3)
    t = np.concatenate([t1 + k * len(v1) for k in range(3)])
    world, mesh_id, meshes = _warp_winding_world(v, t, device, max_dist, SignMethod.WINDING_NUMBER)
    s = random_trajectories(np.random.default_rng(41 + sweep_steps), 8, 8, 12, step=0.015, off_fraction=0.0,
                            lower=(-0.4, -0.4, 0.12), upper=(0.4, 0.4, 0.7), radii=(0.02, 0.05))
    c_ref, g_ref, pts, owner = _reference_and_points(s, meshes, v, t, max_dist, sweep_steps)
    # Left out: spheres with a point whose verdict float32 rounding could flip.
    bad = warp_winding_inside(mesh_id, pts, 0.499) != warp_winding_inside(mesh_id, pts, 0.501)
    mask = np.ones(s[..., 0].size, dtype=bool)
    mask[owner[bad]] = False
    mask = mask.reshape(s.shape[:-1])
    # Costed far from the surface (only by being inside), and free ones too.
    far = s[..., 2] - s[..., 3] - ETA > 0.05
    assert mask.mean() > 0.9 and np.sum(mask & far & (c_ref > 0.05)) >= 50 and np.sum(mask & (c_ref == 0)) >= 50
    _, cost, g, _ = run_swept(s, world.snapshot(), device, sweep_steps, max_dist=max_dist)
    np.testing.assert_allclose(np_(cost)[mask], c_ref[mask], atol=COST_ATOL, rtol=1e-4)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, rtol=1e-4)


def test_off_spheres_contribute_and_receive_nothing(device):
    """Step 1 of the middle trajectory is off: steps 0 and 2 lose that side (step 0 then has no
    side at all and pays its plain cost), and the off sphere gets no gradient."""
    meshes = scene(8)
    wenv = build_warp_env([meshes], device)
    rng = np.random.default_rng(42)
    s = random_trajectories(rng, 1, 4, 3, step=0.05, off_fraction=0.0)
    s[0, :, 1, :3] = np.linspace([0.02, 0.0, 0.0], [0.3, 0.05, 0.0], 4)  # inside the box: costly
    s[0, 1, 1, 3] = -1.0
    qs, cost, g, _ = run_swept(s, wenv, device, 3)
    c_plain, _, _ = plain_cost(s, wenv, device)
    assert cost[0, 0, 1] > 0 and torch.equal(cost[0, 0, 1], c_plain[0, 0, 1])
    assert cost[0, 1, 1] == 0 and torch.all(g[0, 1, 1] == 0)
    (grad,) = torch.autograd.grad(cost, qs, grad_outputs=torch.rand_like(cost))
    assert torch.all(grad[0, 1, 1] == 0)
    c_ref, _ = ref.swept_sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST, 3)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    # moving the off sphere changes nothing
    moved = s.copy()
    moved[0, 1, 1, :3] += 0.1
    np.testing.assert_array_equal(swept_cost_only(moved, wenv, device, 3), np_(cost))


def test_free_space_samples_are_skipped(device):
    """Spheres whose clearance covers their half segments cost one evaluation each."""
    meshes = scene(9)
    wenv = build_warp_env([meshes], device, adopt=True)
    rng = np.random.default_rng(43)
    s = random_trajectories(rng, 2, 8, 5, step=0.01, off_fraction=0.0)
    s[..., 0] += 2.0  # 1.5 m or more from every mesh
    for steps in (1, 4):
        assert np.all(evaluations(s, wenv, device, steps) == 1)
        assert np.all(swept_cost_only(s, wenv, device, steps) == 0)


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
    samples: list = []
    _, c_off, g_off, _ = run_swept(s, wenv, device, 2, speed_dt=dt, weight=1.5)
    qs, c_on, g_on, sp = run_swept(s, wenv, device, 2, speed_dt=dt, weight=1.5, speed_metric=True)
    c_ref, own, to_prev, to_next = ref.swept_sphere_partials(s, [meshes], ETA, 1.5, MAX_DIST, 2, dt,
                                                             enable_speed_metric=True, samples_out=samples)
    mid = np_(c_off)[:, 1:-1] > 0
    assert mid.sum() > 10
    np.testing.assert_allclose(np_(c_on), c_ref, rtol=1e-4, atol=2e-4)
    mask = sample_mask(s, meshes, samples)
    assert mask.mean() > 0.5
    np.testing.assert_allclose(np_(g_on[..., :3])[mask], ref.swept_chain_rule(own, to_prev, to_next)[mask],
                               rtol=1e-3, atol=2e-3)
    assert torch.all(g_on[..., 3] == 0)
    np.testing.assert_array_equal(sp.cpu().numpy(), (np_(c_on) > 0).astype(np.uint8))
    # first and last steps keep their cost, as does the step with no velocity
    assert torch.equal(c_on[:, [0, -1]], c_off[:, [0, -1]])
    assert torch.equal(c_on[0, 3, 0], c_off[0, 3, 0])
    # the metric really changed the middle steps
    assert not np.allclose(np_(c_on)[:, 1:-1][mid], np_(c_off)[:, 1:-1][mid])
    # a step where the metric applies sends its gradient to p[t] only
    applied = np.argwhere((np_(c_on) != np_(c_off)) & mask)
    assert len(applied) >= 5
    for bi, t, k in applied[:5]:
        (g_t,) = torch.autograd.grad(c_on[bi, t, k], qs, retain_graph=True)
        nz = torch.nonzero(torch.linalg.vector_norm(g_t[..., :3], dim=-1)).tolist()
        assert nz == [[bi, t, k]]
        np.testing.assert_allclose(np_(g_t[bi, t, k, :3]), own[bi, t, k], rtol=1e-3, atol=2e-3)


def test_speed_metric_short_horizon_untouched(device):
    """h = 2 has no interior step: the metric changes nothing."""
    meshes = scene(4)
    wenv = build_warp_env([meshes], device)
    s = np.array([[[[0.1, 0.0, 0.0, 0.05]], [[0.3, 0.0, 0.0, 0.05]]]])
    _, c_off, g_off, _ = run_swept(s, wenv, device, 2)
    _, c_on, g_on, _ = run_swept(s, wenv, device, 2, speed_metric=True)
    assert torch.all(c_off > 0)
    assert torch.equal(c_on, c_off) and torch.equal(g_on, g_off)


def test_single_step_horizon_is_the_plain_cost(device):
    meshes = scene(10)
    wenv = build_warp_env([meshes], device)
    s = random_trajectories(np.random.default_rng(44), 2, 1, 20)
    c_plain, g_plain, _ = plain_cost(s, wenv, device)
    _, cost, g, _ = run_swept(s, wenv, device, 4)
    assert torch.any(c_plain > 0)
    assert_kernels_agree(cost, c_plain, device)
    assert_kernels_agree(g, g_plain, device, atol=1e-5)


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
        assert_kernels_agree(c_row, cost[bi : bi + 1], device)
        assert_kernels_agree(g_row, g[bi : bi + 1], device, atol=1e-5)
    # without requires_grad the gradient buffer is zero-filled, the cost unchanged
    _, c_ng, g_ng, _ = run_swept(s, wenv, device, 3, speed_metric=True, requires_grad=False)
    assert_kernels_agree(c_ng, cost, device)
    assert torch.all(g_ng == 0)
