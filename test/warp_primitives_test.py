"""SdfMeshWarpPy against the independent numpy reference (docs/design.md "Tensor layouts", "Cost definition").

The Warp meshes and kernel tensors are built directly with Warp (conftest.build_warp_env), so
these tests do not depend on MeshWorld.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from conftest import build_warp_env, scalar
from robot_sdf.types import SignMethod
from robot_sdf.warp_primitives import SdfMeshWarpPy

ETA = 0.05
MAX_DIST = 0.5
COST_ATOL = 1e-4
GRAD_ATOL = 3e-4
SIGN_METHODS = ["default", "normal", "winding_number", "parity"]


def scene_meshes(seed: int = 0) -> list[ref.RefMesh]:
    """A rotated box and a rotated sphere mesh, side by side."""
    rng = np.random.default_rng(seed)
    bv, bt = ref.box((0.3, 0.4, 0.5))
    sv, st = ref.icosphere(0.2, 2)
    box_pose = np.concatenate([[0.35, 0.02, -0.03], ref.random_quaternion(rng)])
    sph_pose = np.concatenate([[-0.35, -0.05, 0.04], ref.random_quaternion(rng)])
    return [ref.RefMesh(bv, bt, box_pose), ref.RefMesh(sv, st, sph_pose)]


def random_spheres(rng: np.random.Generator, shape: tuple, meshes: list[ref.RefMesh],
                   low=(-0.75, -0.45, -0.45), high=(0.75, 0.45, 0.45), rmax: float = 0.1,
                   min_abs_sd: float = 2e-3) -> np.ndarray:
    """Random spheres (shape + (4,)) whose centres are at least min_abs_sd from every surface
    (the sign of a point on the surface is a coin toss for any implementation)."""
    n = int(np.prod(shape))
    out = np.empty((0, 3))
    while out.shape[0] < n:
        p = rng.uniform(low, high, size=(2 * n, 3))
        ok = np.ones(len(p), dtype=bool)
        for m in meshes:
            ok &= np.abs(m.signed_distance_world(p)[0]) > min_abs_sd
        out = np.concatenate([out, p[ok]])
    r = rng.uniform(0.0, rmax, size=(n, 1))
    return np.concatenate([out[:n], r], axis=1).reshape(shape + (4,))


def run_cost(spheres: np.ndarray, wenv, device: str, eta: float = ETA, weight: float = 1.0,
             max_dist: float = MAX_DIST, env_query=None, esdf: bool = False,
             requires_grad: bool = True, sign_method=None, return_loss: bool = False):
    """Call SdfMeshWarpPy.apply with garbage-filled outputs. Returns (qs, cost, out_grad, sparsity)."""
    qs = torch.tensor(spheres, dtype=torch.float32, device=device).requires_grad_(requires_grad)
    b, h, n = qs.shape[:3]
    out_cost = torch.full((b, h, n), float("nan"), device=device)
    out_grad = torch.full((b, h, n, 4), 1e9, device=device)
    sparsity = torch.full((b, h, n), 7, dtype=torch.uint8, device=device)
    eq = None if env_query is None else torch.tensor(env_query, dtype=torch.int32, device=device)
    args = [qs, out_cost, out_grad, sparsity, scalar(weight, device), scalar(eta, device),
            wenv.mesh_idx, wenv.mesh_pose_inverse, wenv.mesh_enable, wenv.n_env_mesh,
            scalar(max_dist, device), eq, return_loss, esdf]
    if sign_method is not None:
        args.append(SignMethod.parse(sign_method))
    cost = SdfMeshWarpPy.apply(*args)
    return qs, cost, out_grad, sparsity


def np_(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def grad_mask(spheres: np.ndarray, meshes: list[ref.RefMesh], delta: float = 2e-6,
              max_jump: float = 1e-4) -> np.ndarray:
    """Spheres whose distance gradients are well defined (off medial axes): shape spheres[..., 0].

    A float32 closest-point search may pick any triangle within ~1e-6 of the minimum; where
    near-tied candidates disagree on the gradient, the reference and the kernel may differ."""
    a = ref.world_gradient_ambiguity(spheres[..., :3].reshape(-1, 3), meshes, delta)
    return (a <= max_jump).reshape(spheres.shape[:-1])


def smooth_mask(spheres: np.ndarray, meshes: list[ref.RefMesh], h: float, tol: float = 0.02) -> np.ndarray:
    """Spheres around which every mesh's distance gradient stays within tol over the +-h
    central-difference stencil (no medial axis crossed): shape spheres[..., 0]."""
    p = spheres[..., :3].reshape(-1, 3)
    ok = np.ones(len(p), dtype=bool)
    for m in meshes:
        g0 = m.signed_distance_world(p)[1]
        for axis in range(3):
            for sign in (-1.0, 1.0):
                q = p.copy()
                q[:, axis] += sign * h
                ok &= np.linalg.norm(m.signed_distance_world(q)[1] - g0, axis=1) < tol
    return ok.reshape(spheres.shape[:-1])


@pytest.fixture(scope="module")
def meshes():
    return scene_meshes(0)


def test_cost_and_grad_match_reference(device, meshes):
    rng = np.random.default_rng(10)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (3, 4, 50), meshes)
    qs, cost, out_grad, sp = run_cost(s, wenv, device)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    # the sample must exercise every branch of the cost
    sd = np.stack([m.signed_distance_world(s[..., :3].reshape(-1, 3))[0] for m in meshes])
    d = s[..., 3].reshape(-1)[None] + ETA - sd
    assert np.any(d.max(0) <= 0) and np.any((d > 0) & (d <= ETA)) and np.any(d > ETA) and np.any(sd < 0)
    assert cost.shape == (3, 4, 50) and cost.dtype == torch.float32
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes)
    assert mask.mean() > 0.8
    np.testing.assert_allclose(np_(out_grad[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)
    assert torch.all(out_grad[..., 3] == 0)
    np.testing.assert_array_equal(sp.cpu().numpy(), (np_(cost) > 0).astype(np.uint8))


def test_cost_sums_over_meshes(device):
    """A sphere touching two boxes pays for both (a sum, not a minimum)."""
    bv, bt = ref.box((0.2, 0.2, 0.2))
    m = [ref.RefMesh(bv, bt, np.array([0.3, 0, 0, 1, 0, 0, 0.0])),
         ref.RefMesh(bv, bt, np.array([-0.3, 0, 0, 1, 0, 0, 0.0]))]
    wenv = build_warp_env([m], device)
    s = np.array([[[[0.0, 0.0, 0.0, 0.18], [0.01, 0.0, 0.0, 0.18]]]])
    _, cost, g, _ = run_cost(s, wenv, device)
    d0 = 0.18 + ETA - 0.2
    np.testing.assert_allclose(np_(cost)[0, 0, 0], 2 * d0 * d0 / (2 * ETA), rtol=1e-4)
    # second sphere: 0.19 from one box, 0.21 from the other
    dp, dm = 0.18 + ETA - 0.19, 0.18 + ETA - 0.21
    np.testing.assert_allclose(np_(cost)[0, 0, 1], (dp * dp + dm * dm) / (2 * ETA), rtol=1e-4)
    np.testing.assert_allclose(np_(g)[0, 0, 1, :3], [(dp - dm) / ETA, 0, 0], atol=1e-4)


def test_deep_inside_gets_full_cost_for_every_sign_method(device):
    """Centres farther than max_dist from every surface of the mesh they are in."""
    rng = np.random.default_rng(11)
    bv, bt = ref.box((1.2, 1.2, 1.2))
    sv, st = ref.icosphere(0.6, 2)
    m_box = ref.RefMesh(bv, bt, ref.random_pose(rng, 0.1))
    m_sph = ref.RefMesh(sv, st, np.concatenate([[3.0, 0, 0], ref.random_quaternion(rng)]))
    meshes = [m_box, m_sph]
    wenv = build_warp_env([meshes], device)
    local = rng.uniform(-0.3, 0.3, size=(2, 1, 40, 3))
    pts = np.empty_like(local)
    pts[0] = ref.transform_points(m_box.pose, local[0].reshape(-1, 3)).reshape(local[0].shape)
    pts[1] = ref.transform_points(m_sph.pose, 0.5 * local[1].reshape(-1, 3)).reshape(local[1].shape)
    s = np.concatenate([pts, rng.uniform(0, 0.05, size=(2, 1, 40, 1))], axis=-1)
    max_dist = 0.05
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, max_dist)
    sd = np.stack([m.signed_distance_world(s[..., :3].reshape(-1, 3))[0] for m in meshes]).min(0)
    assert np.all(sd < -0.15)  # truly deep: the search radius alone would miss them
    mask = grad_mask(s, meshes)
    for method in SIGN_METHODS:
        _, cost, g, _ = run_cost(s, wenv, device, max_dist=max_dist, sign_method=method)
        np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4, err_msg=method)
        np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, err_msg=method)
        # esdf: the true depth however deep
        _, val, ge, _ = run_cost(s, wenv, device, max_dist=max_dist, esdf=True, sign_method=method)
        np.testing.assert_allclose(np_(val).reshape(-1), -sd, atol=COST_ATOL, err_msg=method)


def test_raw_meshes_without_bounding_radius_match_filled_radius_and_reference(device):
    """cuRobo-built tensors (wp.Mesh with winding-number support, mesh_pose_inverse[..., 7] = 0)
    give the costs, gradients and esdf of the same tensors with the bounding radius filled and of
    the reference: deep centres keep their full cost; points outside a mesh but inside its box
    (or bounding sphere) and beyond the search bound cost nothing."""
    rng = np.random.default_rng(21)
    bv, bt = ref.box((0.8, 0.5, 0.6))
    sv, st = ref.icosphere(0.4, 2)
    meshes = [ref.RefMesh(bv, bt, np.concatenate([[0.5, 0.0, 0.0], ref.random_quaternion(rng)])),
              ref.RefMesh(sv, st, np.concatenate([[-0.5, 0.0, 0.05], ref.random_quaternion(rng)]))]
    raw = build_warp_env([meshes], device)
    assert torch.all(raw.mesh_pose_inverse[..., 7] == 0)
    filled = build_warp_env([meshes], device)
    filled.mesh_pose_inverse[0, :, 7] = torch.tensor([float(np.linalg.norm(m.vertices, axis=1).max()) for m in meshes])
    # Deep centres, centres in the corners of the sphere's box, and centres around both meshes.
    local_box = rng.uniform(-0.3, 0.3, size=(60, 3)) * np.array([1.0, 0.6, 0.8])
    corners = np.sign(rng.normal(size=(60, 3))) * rng.uniform(0.3, 0.4, size=(60, 3))
    around = rng.uniform([-1.1, -0.6, -0.6], [1.1, 0.6, 0.6], size=(120, 3))
    pts = np.concatenate([ref.transform_points(meshes[0].pose, local_box),
                          ref.transform_points(meshes[1].pose, corners), around])
    sd = np.stack([m.signed_distance_world(pts)[0] for m in meshes]).min(0)
    keep = np.abs(sd) > 2e-3
    s = np.concatenate([pts[keep], rng.uniform(0.0, 0.02, size=(int(keep.sum()), 1))], 1).reshape(1, 1, -1, 4)
    max_dist = 0.03
    sd = sd[keep]
    assert np.sum(sd < -0.1) >= 20  # deep: beyond every search bound
    assert np.sum(sd[60:120] > 0.1) >= 20  # outside the sphere mesh, inside its box, beyond the bound
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, max_dist)
    mask = grad_mask(s, meshes)
    for method in SIGN_METHODS:
        _, c_raw, g_raw, _ = run_cost(s, raw, device, max_dist=max_dist, sign_method=method)
        _, c_fill, g_fill, _ = run_cost(s, filled, device, max_dist=max_dist, sign_method=method)
        np.testing.assert_allclose(np_(c_raw), c_ref, atol=COST_ATOL, rtol=1e-4, err_msg=method)
        np.testing.assert_allclose(np_(g_raw[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL, err_msg=method)
        np.testing.assert_allclose(np_(c_raw), np_(c_fill), atol=1e-6, err_msg=method)
        np.testing.assert_allclose(np_(g_raw), np_(g_fill), atol=1e-6, err_msg=method)
        _, e_raw, _, _ = run_cost(s, raw, device, max_dist=max_dist, esdf=True, sign_method=method)
        expected = np.where(sd < max_dist, -sd, -max_dist)
        np.testing.assert_allclose(np_(e_raw).reshape(-1), expected, atol=COST_ATOL, err_msg=method)


def test_negative_radius_is_off(device, meshes):
    rng = np.random.default_rng(12)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (2, 2, 30), meshes)
    s[..., 3] = rng.uniform(0.05, 0.15, size=s.shape[:-1])
    off = rng.uniform(size=s.shape[:-1]) < 0.5
    s[..., 3][off] = -1.0
    qs, cost, g, sp = run_cost(s, wenv, device)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    on_cost = c_ref[~off]
    assert np.sum(on_cost > 0) > 5
    assert np.all(np_(cost)[off] == 0) and np.all(np_(g)[off] == 0) and np.all(sp.cpu().numpy()[off] == 0)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    # a sphere off deep inside a mesh too
    centre = meshes[0].pose[:3]
    _, c2, g2, _ = run_cost(np.array([[[[*centre, -0.5]]]]), wenv, device)
    assert float(c2) == 0.0 and torch.all(g2 == 0)


def test_disabled_and_unused_slots_are_ignored(device, meshes):
    rng = np.random.default_rng(13)
    bv, bt = ref.box((0.6, 0.6, 0.6))
    decoy = ref.RefMesh(bv, bt, ref.IDENTITY_POSE.copy())  # covers most sample points
    disabled = ref.RefMesh(bv, bt, ref.IDENTITY_POSE.copy(), enabled=False)
    envs = [[meshes[0], disabled, meshes[1]]]
    wenv = build_warp_env(envs, device, capacity=5, extra_slots=[[decoy]])
    assert int(wenv.n_env_mesh[0]) == 3 and int(wenv.mesh_enable[0, 3]) == 1
    s = random_spheres(rng, (1, 5, 40), meshes + [decoy])
    _, cost, g, _ = run_cost(s, wenv, device)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    c_with_decoy, _ = ref.sphere_cost(s, [meshes + [decoy]], ETA, 1.0, MAX_DIST)
    assert not np.allclose(c_ref, c_with_decoy)  # the decoys would matter if read
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)
    # an environment without any mesh: nothing collides, esdf reports -max_dist
    empty = build_warp_env([[]], device, capacity=2)
    _, c0, g0, _ = run_cost(s, empty, device)
    assert torch.all(c0 == 0) and torch.all(g0 == 0)
    _, e0, ge0, _ = run_cost(s, empty, device, esdf=True)
    np.testing.assert_allclose(np_(e0), -MAX_DIST, atol=1e-7)
    assert torch.all(ge0 == 0)


def test_two_environments_with_env_query_idx(device, meshes):
    rng = np.random.default_rng(14)
    bv, bt = ref.box((0.5, 0.3, 0.3))
    other = [ref.RefMesh(bv, bt, ref.random_pose(rng, 0.2))]
    envs = [meshes, other]
    wenv = build_warp_env(envs, device)
    s = random_spheres(rng, (4, 2, 25), meshes + other)
    env_query = [1, 0, 1, 1]
    _, cost, g, _ = run_cost(s, wenv, device, env_query=env_query)
    c_ref, g_ref = ref.sphere_cost(s, envs, ETA, 1.0, MAX_DIST, env_index=env_query)
    c_swapped, _ = ref.sphere_cost(s, envs, ETA, 1.0, MAX_DIST, env_index=[0, 1, 0, 0])
    assert not np.allclose(c_ref, c_swapped)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes + other)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)
    # None means environment 0 for every row
    _, c_none, _, _ = run_cost(s, wenv, device)
    c_ref0, _ = ref.sphere_cost(s, envs, ETA, 1.0, MAX_DIST)
    np.testing.assert_allclose(np_(c_none), c_ref0, atol=COST_ATOL, rtol=1e-4)


def test_large_batch_shapes(device):
    """b, h, n > 1 with enough spheres that a CPU launch is split over threads."""
    rng = np.random.default_rng(15)
    meshes = scene_meshes(1)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (4, 25, 50), meshes)
    _, cost, g, sp = run_cost(s, wenv, device)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)
    assert torch.all(g[..., 3] == 0)
    np.testing.assert_array_equal(sp.cpu().numpy(), (c_ref > 0).astype(np.uint8))


def test_random_mesh_poses(device):
    rng = np.random.default_rng(16)
    bv, bt = ref.box((0.25, 0.15, 0.35))
    for _ in range(3):
        pose = ref.random_pose(rng, 0.5)
        m = [ref.RefMesh(bv, bt, pose)]
        wenv = build_warp_env([m], device)
        c = pose[:3]
        s = random_spheres(rng, (1, 1, 60), m, low=c - 0.35, high=c + 0.35)
        _, cost, g, _ = run_cost(s, wenv, device)
        c_ref, g_ref = ref.sphere_cost(s, [m], ETA, 1.0, MAX_DIST)
        assert np.sum(c_ref > 0) > 10
        np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
        mask = grad_mask(s, m)
        np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)


def test_outputs_fully_overwritten_and_stable(device, meshes):
    """Garbage in the output buffers (NaN, 1e9, 7) never leaks; a second call with the same
    buffers gives the same numbers (no accumulation of stale values)."""
    rng = np.random.default_rng(17)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (2, 3, 20), meshes)
    qs, cost, g, sp = run_cost(s, wenv, device)
    assert torch.isfinite(cost).all() and torch.isfinite(g).all()
    assert torch.all(g.abs() < 1e3) and set(sp.unique().tolist()) <= {0, 1}
    first = (cost.clone(), g.clone())
    # same buffers again, with other spheres in between
    args = dict(weight=scalar(1.0, device), eta=scalar(ETA, device), md=scalar(MAX_DIST, device))
    s2 = torch.tensor(random_spheres(rng, (2, 3, 20), meshes), dtype=torch.float32, device=device).requires_grad_()
    for spheres in (s2, qs):
        SdfMeshWarpPy.apply(spheres, cost, g, sp, args["weight"], args["eta"], wenv.mesh_idx,
                            wenv.mesh_pose_inverse, wenv.mesh_enable, wenv.n_env_mesh, args["md"])
    assert torch.equal(cost, first[0]) and torch.equal(g, first[1])


def test_backward_applies_chain_rule(device, meshes):
    rng = np.random.default_rng(18)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (2, 3, 20), meshes)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    mask = grad_mask(s, meshes)
    w = torch.rand(2, 3, 20, device=device) * 4 - 2
    for return_loss in (False, True):
        qs, cost, g, _ = run_cost(s, wenv, device, return_loss=return_loss)
        (cost * w).sum().backward()
        expected = np_(w)[..., None] * g_ref
        np.testing.assert_allclose(np_(qs.grad[..., :3])[mask], expected[mask], atol=2 * GRAD_ATOL)
        assert torch.all(qs.grad[..., 3] == 0)
        # and exactly the kernel's gradient, scaled
        torch.testing.assert_close(qs.grad[..., :3], w[..., None] * g[..., :3])


def test_no_grad_requested_gives_zero_grad(device, meshes):
    rng = np.random.default_rng(19)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (1, 2, 40), meshes)
    qs, cost, g, _ = run_cost(s, wenv, device, requires_grad=False)
    c_ref, _ = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    assert np.sum(c_ref > 0) > 5
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    assert torch.all(g == 0)
    assert not cost.requires_grad


def test_weight_scales_cost_and_grad(device, meshes):
    rng = np.random.default_rng(20)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (1, 2, 40), meshes)
    _, c1, g1, _ = run_cost(s, wenv, device, weight=1.0)
    _, c2, g2, _ = run_cost(s, wenv, device, weight=2.5)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 2.5, MAX_DIST)
    np.testing.assert_allclose(np_(c2), c_ref, atol=2.5 * COST_ATOL, rtol=1e-4)
    torch.testing.assert_close(c2, 2.5 * c1, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(g2, 2.5 * g1, rtol=1e-6, atol=1e-7)
    assert torch.any(c1 > 0)


def test_finite_difference_gradient(device, meshes):
    """Central differences (h = 1e-3, float32) of the kernel's own cost match its gradient."""
    rng = np.random.default_rng(21)
    wenv = build_warp_env([meshes], device)
    h = 1e-3
    s = random_spheres(rng, (1, 1, 400), meshes, min_abs_sd=5e-3)
    # keep spheres whose cost is active, whose stencil stays off medial axes and zone borders
    sd = np.stack([m.signed_distance_world(s[..., :3].reshape(-1, 3))[0] for m in meshes])
    d = s[..., 3].reshape(-1)[None] + ETA - sd
    near_border = np.any((np.abs(d) < 4 * h) | (np.abs(d - ETA) < 4 * h), axis=0)
    ok = (~near_border) & smooth_mask(s, meshes, h).reshape(-1) & (d.max(0) > 0)
    s = s[:, :, ok]
    assert s.shape[2] > 30
    for esdf in (False, True):
        _, _, g, _ = run_cost(s, wenv, device, esdf=esdf)
        fd = np.zeros(s.shape[:-1] + (3,))
        for axis in range(3):
            sp_, sm_ = s.copy(), s.copy()
            sp_[..., axis] += h
            sm_[..., axis] -= h
            cp = np_(run_cost(sp_, wenv, device, esdf=esdf, requires_grad=False)[1])
            cm = np_(run_cost(sm_, wenv, device, esdf=esdf, requires_grad=False)[1])
            fd[..., axis] = (cp - cm) / (2 * h)
        np.testing.assert_allclose(np_(g[..., :3]), fd, atol=3e-3, err_msg=f"esdf={esdf}")


def test_esdf_mode(device, meshes):
    rng = np.random.default_rng(22)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (2, 2, 40), meshes, low=(-1.2, -0.8, -0.8), high=(1.2, 0.8, 0.8))
    max_dist = 0.3
    val_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, max_dist, compute_esdf=True)
    assert np.any(val_ref > 0) and np.any(val_ref == -max_dist) and np.any((val_ref < 0) & (val_ref > -max_dist))
    _, val, g, _ = run_cost(s, wenv, device, max_dist=max_dist, esdf=True)
    np.testing.assert_allclose(np_(val), val_ref, atol=COST_ATOL)
    mask = grad_mask(s, meshes)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)
    far = val_ref == -max_dist
    assert torch.all(g[torch.from_numpy(far)] == 0)
    # radius and activation distance are ignored, weight scales
    s2 = s.copy()
    s2[..., 3] = 0.3
    _, val2, _, _ = run_cost(s2, wenv, device, max_dist=max_dist, esdf=True, eta=0.2)
    torch.testing.assert_close(val2, val)
    _, val3, g3, _ = run_cost(s, wenv, device, max_dist=max_dist, esdf=True, weight=2.0)
    torch.testing.assert_close(val3, 2.0 * val)
    torch.testing.assert_close(g3, 2.0 * g)


@pytest.mark.parametrize("method", SIGN_METHODS)
def test_sign_methods_agree_on_closed_meshes(device, meshes, method):
    rng = np.random.default_rng(23)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (1, 4, 50), meshes)
    val_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST, compute_esdf=True)
    assert np.any(val_ref > 0) and np.any(val_ref < 0)
    _, val, g, _ = run_cost(s, wenv, device, esdf=True, sign_method=method)
    np.testing.assert_allclose(np_(val), val_ref, atol=COST_ATOL)
    c_ref, gc_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    _, cost, gc, _ = run_cost(s, wenv, device, sign_method=method)
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes)
    np.testing.assert_allclose(np_(gc[..., :3])[mask], gc_ref[mask], atol=GRAD_ATOL)


def test_winding_number_on_open_meshes(device):
    """Open meshes: inside where the generalized winding number exceeds 1/2."""
    rng = np.random.default_rng(24)
    cv, ct = ref.open_box((0.4, 0.4, 0.4))
    shv, sht = ref.sheet(0.6, 4)
    cup = ref.RefMesh(cv, ct, np.concatenate([[0.4, 0, 0], ref.random_quaternion(rng)]))
    sheet = ref.RefMesh(shv, sht, np.concatenate([[-0.4, 0, 0], ref.random_quaternion(rng)]))
    for m, lo, hi in ((cup, -0.3, 0.3), (sheet, -0.35, 0.35)):
        local = rng.uniform(lo, hi, size=(600, 3))
        w = ref.winding_number(local, m.vertices, m.triangles)
        d = ref.unsigned_distance(local, m.vertices, m.triangles)
        # keep points whose inside/outside verdict is clear-cut and off the surface
        local = local[(np.abs(w - 0.5) > 0.1) & (d > 2e-3)][:200]
        pts = ref.transform_points(m.pose, local)
        s = np.concatenate([pts, np.zeros((len(pts), 1))], axis=1)[None, None]
        wenv = build_warp_env([[m]], device)
        val_ref, g_ref = ref.sphere_cost(s, [[m]], ETA, 1.0, MAX_DIST, compute_esdf=True)
        _, val, g, _ = run_cost(s, wenv, device, esdf=True, sign_method="winding_number")
        np.testing.assert_allclose(np_(val), val_ref, atol=COST_ATOL)
        if m is cup:
            assert np.sum(val_ref > 0) > 20  # points inside the open cup count as inside
        else:
            assert np.all(val_ref <= 0)  # a sheet has no inside on either side
        mask = grad_mask(s, [m])
        np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)


def test_zero_activation_distance(device, meshes):
    """eta = 0: the cost is the plain penetration r - sd (no quadratic zone, no division by 0)."""
    rng = np.random.default_rng(25)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (1, 2, 50), meshes)
    _, cost, g, _ = run_cost(s, wenv, device, eta=0.0)
    c_ref, g_ref = ref.sphere_cost(s, [meshes], 0.0, 1.0, MAX_DIST)
    assert np.sum(c_ref > 0) > 5
    assert torch.isfinite(cost).all() and torch.isfinite(g).all()
    np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes)
    np.testing.assert_allclose(np_(g[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)


def test_strided_output_buffers(device, meshes):
    """Outputs that are views into larger tensors are filled in place."""
    rng = np.random.default_rng(26)
    wenv = build_warp_env([meshes], device)
    s = random_spheres(rng, (2, 3, 10), meshes)
    qs = torch.tensor(s, dtype=torch.float32, device=device).requires_grad_()
    big_cost = torch.full((2, 3, 20), float("nan"), device=device)
    big_grad = torch.full((2, 3, 10, 8), float("nan"), device=device)
    sparsity = torch.zeros((2, 3, 10), dtype=torch.uint8, device=device)
    out_cost = big_cost[:, :, ::2]
    out_grad = big_grad[..., 2:6]
    assert not out_cost.is_contiguous() and not out_grad.is_contiguous()
    SdfMeshWarpPy.apply(qs, out_cost, out_grad, sparsity, scalar(1.0, device), scalar(ETA, device),
                        wenv.mesh_idx, wenv.mesh_pose_inverse, wenv.mesh_enable, wenv.n_env_mesh,
                        scalar(MAX_DIST, device))
    c_ref, g_ref = ref.sphere_cost(s, [meshes], ETA, 1.0, MAX_DIST)
    np.testing.assert_allclose(np_(out_cost), c_ref, atol=COST_ATOL, rtol=1e-4)
    mask = grad_mask(s, meshes)
    np.testing.assert_allclose(np_(out_grad[..., :3])[mask], g_ref[mask], atol=GRAD_ATOL)
    assert torch.isnan(big_cost[:, :, 1::2]).all()  # neighbours of the view untouched


# ---------------------------------------------------------------- regressions found in review
def _single_mesh_cost(vertices, triangles, spheres: np.ndarray, sign_method: str, max_dist: float,
                      n_env_mesh=None, support_winding: bool | None = None) -> np.ndarray:
    import warp as wp

    mesh = wp.Mesh(points=wp.array(np.asarray(vertices, np.float32), dtype=wp.vec3),
                   indices=wp.array(np.asarray(triangles, np.int32).reshape(-1), dtype=wp.int32),
                   support_winding_number=(sign_method == "winding_number") if support_winding is None
                   else support_winding)
    s = torch.from_numpy(np.asarray(spheres, np.float32)).reshape(1, 1, -1, 4)
    out_cost = torch.empty(s.shape[:3])
    out_grad = torch.empty(s.shape)
    sparsity = torch.zeros(s.shape[:3], dtype=torch.uint8)
    mesh_idx = torch.tensor([[np.int64(np.uint64(mesh.id).astype(np.int64))]])
    pose_inv = torch.tensor([[[0, 0, 0, 1, 0, 0, 0, 0]]], dtype=torch.float32)  # pad 0: no cull radius
    enable = torch.ones(1, 1, dtype=torch.uint8)
    counts = torch.tensor([1] if n_env_mesh is None else [n_env_mesh], dtype=torch.int32)
    cost = SdfMeshWarpPy.apply(s, out_cost, out_grad, sparsity, scalar(1.0, "cpu"), scalar(ETA, "cpu"), mesh_idx, pose_inv,
                               enable, counts, scalar(max_dist, "cpu"), None, False, False, SignMethod.parse(sign_method))
    return cost.numpy().ravel()


@pytest.mark.parametrize("sign_method", ["normal", "default", "winding_number"])
def test_open_wall_far_in_front_costs_nothing(sign_method):
    # One-sided quad y=0, normal -y. Spheres in front of it beyond the search bound are outside:
    # the deep-inside fallback must not call them inside from ray parity alone. (The parity sign
    # method itself is defined for closed meshes only: it calls these points inside by design.)
    v = np.array([[-2, 0, -2], [2, 0, -2], [2, 0, 2], [-2, 0, 2]], np.float32)
    t = np.array([[0, 1, 2], [0, 2, 3]])
    ys = np.array([-0.3, -0.7, -1.0, -1.5])
    spheres = np.stack([np.full(4, 0.1), ys, np.full(4, 0.2), np.full(4, 0.05)], 1)
    expected = ref.point_cost(spheres[:, :3], spheres[:, 3], [ref.RefMesh(v, t, np.array([0, 0, 0, 1, 0, 0, 0.]))],
                              ETA, 1.0, 0.25)[0]
    assert np.allclose(expected, 0.0)
    assert np.allclose(_single_mesh_cost(v, t, spheres, sign_method, max_dist=0.25), 0.0)


@pytest.mark.parametrize("sign_method", ["normal", "default", "parity"])
def test_deep_inside_when_parity_ray_grazes_a_shared_edge(sign_method):
    # Centres deep inside a cube, placed so that the parity ray leaves through the diagonal edge
    # shared by the two triangles of the top face (a watertight ray test counts that hit twice).
    bv, bt = ref.box((2.0, 2.0, 2.0))
    direction = np.array([0.5773, 0.5774, 0.5775])
    rng = np.random.default_rng(3)
    z = rng.uniform(-0.3, 0.3, 400)
    h = rng.uniform(-0.5, 0.5, 400)
    travel = (1.0 - z) / direction[2]
    centres = np.stack([h - direction[0] * travel, h - direction[1] * travel, z], 1)
    centres = centres[np.all(np.abs(centres) < 0.8, axis=1)]
    assert len(centres) > 50
    spheres = np.concatenate([centres, np.full((len(centres), 1), 0.05)], 1)
    got = _single_mesh_cost(bv, bt, spheres, sign_method, max_dist=0.05)
    expected = ref.point_cost(centres, spheres[:, 3], [ref.RefMesh(bv, bt, np.array([0, 0, 0, 1, 0, 0, 0.]))],
                              ETA, 1.0, 0.05)[0]
    assert np.all(expected > 0.2)
    np.testing.assert_allclose(got, expected, atol=COST_ATOL)


def test_slot_count_beyond_tensor_width_is_clamped():
    bv, bt = ref.box((0.5, 0.5, 0.5))
    spheres = np.array([[0.3, 0.0, 0.0, 0.1], [2.0, 0.0, 0.0, 0.1]])
    clamped = _single_mesh_cost(bv, bt, spheres, "normal", max_dist=0.5, n_env_mesh=1000)
    np.testing.assert_allclose(clamped, _single_mesh_cost(bv, bt, spheres, "normal", max_dist=0.5), atol=1e-7)


def test_outputs_on_another_device_are_rejected():
    s = torch.zeros(1, 1, 1, 4)
    with pytest.raises(ValueError, match="device"):
        SdfMeshWarpPy.apply(s, torch.empty(1, 1, 1, device="meta"), torch.empty(1, 1, 1, 4), torch.zeros(1, 1, 1, dtype=torch.uint8),
                            scalar(1.0, "cpu"), scalar(ETA, "cpu"), torch.zeros(1, 1, dtype=torch.int64),
                            torch.zeros(1, 1, 8), torch.zeros(1, 1, dtype=torch.uint8), torch.zeros(1, dtype=torch.int32),
                            scalar(0.5, "cpu"))


def test_winding_number_slot_of_a_mesh_without_winding_support_is_signed_by_normals():
    """A mesh built elsewhere without support_winding_number, passed with the winding_number sign
    method: Warp's winding-number query would read solid-angle data the mesh lacks (on CUDA a
    fault that ends the context); the kernels sign it by pseudo-normals instead. Costs of spheres
    inside, across and outside a closed box against the numpy reference."""
    v, t = ref.box((0.6, 0.5, 0.4))  # full sides
    rng = np.random.default_rng(12)
    centres = rng.uniform(-0.35, 0.35, size=(300, 3))
    spheres = np.concatenate([centres, rng.uniform(0.0, 0.05, size=(300, 1))], 1).astype(np.float32)
    expected = ref.point_cost(spheres[:, :3], spheres[:, 3], [ref.RefMesh(v, t, np.array([0, 0, 0, 1, 0, 0, 0.]))],
                              ETA, 1.0, 0.5)[0]
    assert np.sum(expected > 0.1) > 20  # deep centres among them
    got = _single_mesh_cost(v, t, spheres, "winding_number", max_dist=0.5, support_winding=False)
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
