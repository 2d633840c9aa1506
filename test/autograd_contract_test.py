"""The whole torch.autograd.Function contract of the in-process API and the cuRobo-signature
Functions: torch.func (grad, vmap, jacrev, jacfwd, jvp), forward-mode AD, double backward
(exact Hessians against finite differences of the numpy reference's gradient, and against
the closed forms on faces, edges and vertices), torch.compile(fullgraph=True), dtypes and the
private shortcuts against the public paths. What kept working is checked on the way: ordinary
backward, non-leaf inputs, no_grad / inference_mode, non-contiguous inputs, determinism.
"""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.autograd import forward_ad

import reference as ref
from robot_sdf import MeshWorld, _internals, warp_primitives
from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy

ETA = 0.05
MAX_DIST = 0.4
HALF = np.array([0.15, 0.125, 0.175])  # the box's half extents
BOX_V, BOX_T = ref.box(tuple(2 * HALF))
SPH_V, SPH_T = ref.icosphere(0.15, 2)
# A rotated pose, so that the Hessians go through the world <-> mesh rotation.
BOX_POSE = np.concatenate([[0.3, 0.05, -0.02], ref.quat_multiply(np.array([np.cos(0.2), 0.0, 0.0, np.sin(0.2)]),
                                                                    np.array([np.cos(0.15), np.sin(0.15), 0.0, 0.0]))])
SPH_POSE = np.array([-0.3, 0.0, 0.05, 1.0, 0.0, 0.0, 0.0])


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda:0", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device"))])
def scene(request):
    world = MeshWorld(device=request.param, num_envs=2, mesh_capacity=4, max_distance=MAX_DIST, sign_method="normal")
    world.add_mesh("box", BOX_V, BOX_T, BOX_POSE, env=0)
    world.add_mesh("ball", SPH_V, SPH_T, SPH_POSE, env=0)
    world.add_mesh("ball", SPH_V * 1.5, SPH_T, SPH_POSE, env=1)
    envs = [[ref.RefMesh(BOX_V, BOX_T, BOX_POSE), ref.RefMesh(SPH_V, SPH_T, SPH_POSE)],
            [ref.RefMesh(SPH_V * 1.5, SPH_T, SPH_POSE)]]
    return world, envs


def box_world_points(local: np.ndarray) -> np.ndarray:
    return ref.transform_points(BOX_POSE, np.asarray(local, dtype=np.float64))


def feature_spheres() -> tuple[np.ndarray, list[str]]:
    """Spheres (1,1,n,4) near the box, each well inside one closest-feature region and away from
    the penetration thresholds d = 0 and d = eta (in the quadratic or the linear part)."""
    local = [
        ([HALF[0] + 0.02, 0.03, -0.02], 0.01, "face, quadratic"),       # sd 0.02, d 0.04
        ([HALF[0] + 0.02, 0.03, -0.02], 0.06, "face, linear"),          # d 0.09
        ([HALF[0] + 0.02, HALF[1] + 0.015, 0.05], 0.01, "edge, quadratic"),
        ([HALF[0] + 0.02, HALF[1] + 0.015, 0.05], 0.07, "edge, linear"),
        ([HALF[0] + 0.015, HALF[1] + 0.01, HALF[2] + 0.012], 0.01, "vertex, quadratic"),
        ([HALF[0] + 0.015, HALF[1] + 0.01, HALF[2] + 0.012], 0.06, "vertex, linear"),
        ([HALF[0] - 0.03, 0.01, 0.02], 0.0, "inside, face"),
    ]
    pts = box_world_points([p for p, _, _ in local])
    radii = np.array([r for _, r, _ in local])
    return np.concatenate([pts, radii[:, None]], axis=1)[None, None].astype(np.float32), [w for _, _, w in local]


def random_spheres(seed: int, shape=(2, 3, 4)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    p = rng.uniform((-0.55, -0.3, -0.3), (0.55, 0.3, 0.3), size=(n, 3))
    r = rng.uniform(0.0, 0.08, size=(n, 1))
    return np.concatenate([p, r], axis=1).reshape(shape + (4,)).astype(np.float32)


def ordinary_grad(fn, s: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    x = s.clone().requires_grad_()
    out = fn(x)
    (out if weights is None else out * weights).sum().backward()
    return x.grad


def test_func_transforms_match_ordinary_backward(scene):
    world, envs = scene
    dev = world.device
    s = torch.from_numpy(random_spheres(1)).to(dev)
    env = torch.tensor([0, 1])
    tangent = torch.randn(s.shape, generator=torch.Generator().manual_seed(2)).to(dev)

    def cost(x):
        return world.sphere_cost(x, ETA, 1.0, env)

    grad = ordinary_grad(cost, s)
    c_ref, g_ref = ref.sphere_cost(s.cpu().numpy(), envs, ETA, 1.0, MAX_DIST, env_index=[0, 1])
    np.testing.assert_allclose(cost(s).cpu().numpy(), c_ref, atol=1e-4)
    assert (c_ref > 0).sum() >= 5  # the sample exercises the cost
    amb = np.maximum(ref.world_gradient_ambiguity(s[0, ..., :3].reshape(-1, 3).cpu().numpy(), envs[0]),
                     0.0).reshape(s.shape[1:-1])
    np.testing.assert_allclose(grad[0, ..., :3].cpu().numpy()[amb < 1e-4], g_ref[0][amb < 1e-4], atol=3e-4)

    torch.testing.assert_close(torch.func.grad(lambda x: cost(x).sum())(s), grad)
    jac = torch.func.jacrev(cost)(s)
    assert jac.shape == s.shape[:-1] + s.shape
    # each cost depends only on its own sphere: the Jacobian is block diagonal
    torch.testing.assert_close(jac.sum(dim=(0, 1, 2)), grad)
    assert int((jac.abs().sum(-1) > 0).sum()) == int((grad.abs().sum(-1) > 0).sum())
    torch.testing.assert_close(torch.func.jacfwd(cost)(s), jac)
    value, jvp = torch.func.jvp(lambda x: cost(x).sum(), (s,), (tangent,))
    torch.testing.assert_close(jvp, (grad * tangent).sum())
    with forward_ad.dual_level():
        dual = cost(forward_ad.make_dual(s, tangent))
        torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent, (grad * tangent).sum(-1))


def test_vmap_over_environments_is_one_launch(scene, monkeypatch):
    world, envs = scene
    dev = world.device
    spheres = torch.from_numpy(np.stack([random_spheres(10 + i) for i in range(3)])).to(dev)  # (E=3, 2, 3, 4, 4)
    env_ids = torch.tensor([[0, 1], [1, 1], [1, 0]])
    launches = []
    original = warp_primitives.Query.cost
    monkeypatch.setattr(warp_primitives.Query, "cost",
                        lambda q, s, *a: launches.append(tuple(s.shape)) or original(q, s, *a))

    def total(s, e):
        return world.sphere_cost(s, ETA, 1.0, e).sum()

    costs = torch.func.vmap(lambda s, e: world.sphere_cost(s, ETA, 1.0, e))(spheres, env_ids)
    assert launches == [(6, 3, 4, 4)]  # the vmapped dimension folded into b: one launch
    grads = torch.func.vmap(torch.func.grad(total))(spheres, env_ids)
    launches.clear()
    jvps = torch.func.vmap(lambda s, e, t: torch.func.jvp(lambda x: total(x, e), (s,), (t,))[1])(
        spheres, env_ids, torch.ones_like(spheres))
    assert len(launches) == 1
    for i in range(3):
        c_ref, _ = ref.sphere_cost(spheres[i].cpu().numpy(), envs, ETA, 1.0, MAX_DIST, env_index=env_ids[i].numpy())
        np.testing.assert_allclose(costs[i].cpu().numpy(), c_ref, atol=1e-4)
        g = ordinary_grad(lambda x: world.sphere_cost(x, ETA, 1.0, env_ids[i]), spheres[i])
        torch.testing.assert_close(grads[i], g)
        torch.testing.assert_close(jvps[i], g.sum())
    # grad of a vmap: the same gradients
    torch.testing.assert_close(torch.func.grad(lambda x: torch.func.vmap(total)(x, env_ids).sum())(spheres), grads)
    # vmap over the world's tensors is refused clearly
    snap = world.snapshot()
    with pytest.raises(ValueError, match="vmap over mesh_pose_inverse"):
        torch.func.vmap(lambda pose: SdfMeshWarpPy.apply(
            spheres[0], *_buffers(spheres[0]), 1.0, ETA, snap.mesh_idx, pose, snap.mesh_enable, snap.n_env_mesh,
            MAX_DIST))(snap.mesh_pose_inverse.unsqueeze(0).expand(2, -1, -1, -1))


def _buffers(s):
    b, h, n, _ = s.shape
    return (torch.empty(b, h, n, device=s.device), torch.empty(b, h, n, 4, device=s.device),
            torch.empty(b, h, n, dtype=torch.uint8, device=s.device))


def test_curobo_functions_under_transforms(scene):
    """SdfMeshWarpPy / SweptSdfMeshWarpPy called positionally, as cuRobo programs do."""
    world, _ = scene
    dev = world.device
    s = torch.from_numpy(random_spheres(3)).to(dev)
    tangent = torch.randn(s.shape, generator=torch.Generator().manual_seed(4)).to(dev)
    w = torch.rand(s.shape[:-1], generator=torch.Generator().manual_seed(5)).to(dev) + 0.5
    snap = world.snapshot()
    one = torch.ones(1, device=dev)
    eta = torch.full((1,), ETA, device=dev)
    max_d = torch.full((1,), MAX_DIST, device=dev)
    dt = torch.full((1,), 0.1, device=dev)
    env = torch.tensor([0, 1], dtype=torch.int32, device=dev)

    def plain(x):
        return SdfMeshWarpPy.apply(x, *_buffers(x), one, eta, snap.mesh_idx, snap.mesh_pose_inverse,
                                   snap.mesh_enable, snap.n_env_mesh, max_d, env, False, False, snap.sign_methods)

    def swept(x):
        return SweptSdfMeshWarpPy.apply(x, *_buffers(x), one, eta, dt, snap.mesh_idx, snap.mesh_pose_inverse,
                                        snap.mesh_enable, snap.n_env_mesh, max_d, 3, False, env, False,
                                        snap.sign_methods)

    for fn in (plain, swept):
        grad = ordinary_grad(fn, s, w)
        assert grad.abs().sum() > 0
        torch.testing.assert_close(torch.func.grad(lambda x: (fn(x) * w).sum())(s), grad)
        jac = torch.func.jacrev(fn)(s)
        torch.testing.assert_close((jac * w[..., None, None, None, None]).sum(dim=(0, 1, 2)), grad)
        torch.testing.assert_close(torch.func.jacfwd(fn)(s), jac)
        _, jvp = torch.func.jvp(fn, (s,), (tangent,))
        torch.testing.assert_close(jvp, (jac * tangent).sum(dim=(3, 4, 5, 6)))
        with forward_ad.dual_level():
            dual = fn(forward_ad.make_dual(s, tangent))
            torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent, jvp)
        stacked = torch.stack([s, s.flip(1)])
        v = torch.func.vmap(fn)(stacked)
        torch.testing.assert_close(v[1], fn(s.flip(1)))
        torch.testing.assert_close(torch.func.vmap(torch.func.grad(lambda x: (fn(x) * w).sum()))(stacked)[0], grad)

    # double backward: SdfMeshWarpPy's Hessian-vector product is world.sphere_cost's; the swept
    # Function refuses with torch's once_differentiable error
    def hvp(fn):
        x = s.clone().requires_grad_()
        (g,) = torch.autograd.grad((fn(x) * w).sum(), x, create_graph=True)
        return torch.autograd.grad((g * tangent).sum(), x)[0]

    expected = hvp(lambda x: world.sphere_cost(x, ETA, 1.0, env))
    assert expected.abs().sum() > 0
    torch.testing.assert_close(hvp(plain), expected)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        hvp(swept)


def test_curobo_functions_with_zero_upstream_derivatives(scene):
    """Only the spheres carry derivatives through SdfMeshWarpPy / SweptSdfMeshWarpPy: a tangent on
    the weight alone moves the cost by exactly 0 (forward mode and torch.func.jvp), and a cost
    whose upstream gradient is undefined (a Function downstream returns None for it) gives the
    spheres a zero gradient, not a missing one (torch.autograd.grad would refuse that as unused)."""
    world, _ = scene
    dev = world.device
    s = torch.from_numpy(random_spheres(6)).to(dev)
    snap = world.snapshot()
    one = torch.ones(1, device=dev)
    eta = torch.full((1,), ETA, device=dev)
    max_d = torch.full((1,), MAX_DIST, device=dev)
    dt = torch.full((1,), 0.1, device=dev)

    def plain(x, w):
        return SdfMeshWarpPy.apply(x, *_buffers(x), w, eta, snap.mesh_idx, snap.mesh_pose_inverse,
                                   snap.mesh_enable, snap.n_env_mesh, max_d, None, False, False, snap.sign_methods)

    def swept(x, w):
        return SweptSdfMeshWarpPy.apply(x, *_buffers(x), w, eta, dt, snap.mesh_idx, snap.mesh_pose_inverse,
                                        snap.mesh_enable, snap.n_env_mesh, max_d, 2, False, None, False,
                                        snap.sign_methods)

    class Cut(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return None

    for fn in (plain, swept):
        assert fn(s, one).sum() > 0
        zero = torch.zeros(s.shape[:-1], device=dev)
        with forward_ad.dual_level():
            dual = fn(s, forward_ad.make_dual(one, torch.ones(1, device=dev)))
            # Derivatives are taken w.r.t. the spheres only: no tangent (torch's zero) or zeros.
            tangent = forward_ad.unpack_dual(dual).tangent
            torch.testing.assert_close(zero if tangent is None else tangent, zero)
        torch.testing.assert_close(torch.func.jvp(lambda w: fn(s, w), (one,), (torch.ones(1, device=dev),))[1], zero)
        x = s.clone().requires_grad_()
        (grad,) = torch.autograd.grad(Cut.apply(fn(x, one)).sum(), x)
        torch.testing.assert_close(grad, torch.zeros_like(s))


def _reference_grad(spheres: np.ndarray, envs, env_index=None) -> np.ndarray:
    return ref.sphere_cost(spheres, envs, ETA, 1.0, MAX_DIST, env_index=env_index)[1]


def test_double_backward_hessian_vector_products_match_finite_differences(scene):
    """H v from double backward, from forward-over-reverse and from reverse-over-reverse, against
    central differences (float64) of the numpy reference's gradient, one closest-feature region
    per sphere, in the quadratic and the linear part of the cost."""
    world, envs = scene
    dev = world.device
    spheres, what = feature_spheres()
    s = torch.from_numpy(spheres).to(dev)
    rng = np.random.default_rng(7)
    v = rng.normal(size=spheres.shape)
    v[..., 3] = 0.0
    eps = 1e-5
    fd = (_reference_grad(spheres.astype(np.float64) + eps * v, envs)
          - _reference_grad(spheres.astype(np.float64) - eps * v, envs)) / (2 * eps)
    vt = torch.from_numpy(v.astype(np.float32)).to(dev)

    def total(x):
        return world.sphere_cost(x, ETA, 1.0).sum()

    x = s.clone().requires_grad_()
    (g,) = torch.autograd.grad(total(x), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * vt).sum(), x)
    got = hv[..., :3].cpu().numpy()[0, 0]
    for i, name in enumerate(what):
        scale = max(1.0, float(np.abs(fd[0, 0, i]).max()))
        np.testing.assert_allclose(got[i], fd[0, 0, i], atol=2e-3 * scale, err_msg=name)
    assert np.abs(fd[0, 0, 0]).max() > 1.0 and np.abs(fd[0, 0, 1]).max() < 1e-6  # face: c'' n n^T, then 0
    hess = torch.func.hessian(total)(s)  # forward-over-reverse
    torch.testing.assert_close(torch.einsum("abijcdkl,cdkl->abij", hess, vt), hv, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.func.jacrev(torch.func.jacrev(total))(s), hess, atol=1e-4, rtol=1e-4)
    # third derivatives are refused
    x = s.clone().requires_grad_()
    (g,) = torch.autograd.grad(total(x), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * vt).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="beyond the second"):
        torch.autograd.grad(hv.sum(), x)


def test_signed_distance_hessian_closed_forms(scene):
    """Hessian of the signed distance: 0 on a face, (I - n n^T)/d at a vertex, (I - n n^T - e e^T)/d
    on an edge (world frame)."""
    world, _ = scene
    rot = ref.quat_to_matrix(BOX_POSE[3:])
    cases = [([HALF[0] + 0.03, 0.02, 0.01], None), ([HALF[0] + 0.02, HALF[1] + 0.03, 0.04], 2),
             ([HALF[0] + 0.02, HALF[1] + 0.01, HALF[2] + 0.03], "vertex")]
    for local, edge_axis in cases:
        local = np.array(local)
        closest = np.clip(local, -HALF, HALF)
        d = np.linalg.norm(local - closest)
        n = rot @ ((local - closest) / d)
        if edge_axis is None:
            expected = np.zeros((3, 3))
        else:
            expected = np.eye(3) - np.outer(n, n)
            if edge_axis != "vertex":
                e = rot[:, edge_axis]
                expected -= np.outer(e, e)
            expected /= d
        p = torch.tensor(box_world_points(local[None])[0], dtype=torch.float32, device=world.device)
        hess = torch.func.hessian(lambda q: world.signed_distance(q.reshape(1, 3))[0].sum())(p)
        np.testing.assert_allclose(hess.cpu().numpy(), expected, atol=2e-3 * max(1.0, 1.0 / d))
        x = p.clone().reshape(1, 3).requires_grad_()
        (g,) = torch.autograd.grad(world.signed_distance(x)[0].sum(), x, create_graph=True)
        (row,) = torch.autograd.grad(g[0, 0], x)
        np.testing.assert_allclose(row[0].cpu().numpy(), expected[0], atol=2e-3 * max(1.0, 1.0 / d))
    # vmap over point sets: the same distances as one call per set
    sets = torch.from_numpy(random_spheres(15, (2, 1, 6))[:, 0, :, :3]).to(world.device)
    dist = torch.func.vmap(lambda q: world.signed_distance(q)[0])(sets)
    for i in range(2):
        torch.testing.assert_close(dist[i], world.signed_distance(sets[i])[0])


def _flat_diagonals() -> list[tuple[np.ndarray, np.ndarray]]:
    """(a, b) box-frame ends of each face's diagonal: the edge its two coplanar triangles share."""
    out = []
    for axis in range(3):
        for side in (-1.0, 1.0):
            on = [t for t in BOX_T if np.allclose(BOX_V[t, axis], side * HALF[axis])]
            assert len(on) == 2
            shared = sorted(set(on[0].tolist()) & set(on[1].tolist()))
            out.append((BOX_V[shared[0]], BOX_V[shared[1]]))
    return out


def test_hessian_is_zero_above_flat_edges(scene):
    """Above (and below) the diagonal of a box face, where the face's two coplanar triangles
    meet, the distance is that to a plane: the signed distance has no curvature there, and the
    cost's Hessian is c''(d) n n^T alone (central differences of the reference's gradient)."""
    world, envs = scene
    rng = np.random.default_rng(21)
    local, radii = [], []
    for a, b in _flat_diagonals():
        normal = np.where(np.isclose(np.abs(a), HALF) & np.isclose(np.abs(b), HALF) & (np.sign(a) == np.sign(b)),
                          np.sign(a), 0.0)
        for t in (0.25, 0.5, 0.7):
            on_edge = a + t * (b - a)
            local += [on_edge + 0.03 * normal, on_edge - 0.03 * normal]
            radii += [0.01, 0.0]
    spheres = np.concatenate([box_world_points(np.array(local)), np.array(radii)[:, None]], 1)[None, None]
    v = rng.normal(size=spheres.shape)
    v[..., 3] = 0.0
    eps = 1e-5
    fd = (_reference_grad(spheres + eps * v, envs) - _reference_grad(spheres - eps * v, envs)) / (2 * eps)
    x = torch.tensor(spheres, dtype=torch.float32, device=world.device).requires_grad_()
    (g,) = torch.autograd.grad(world.sphere_cost(x, ETA, 1.0).sum(), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * torch.tensor(v, dtype=torch.float32, device=world.device)).sum(), x)
    np.testing.assert_allclose(hv[..., :3].cpu().numpy(), fd, atol=2e-3 * max(1.0, float(np.abs(fd).max())))
    # The signed distance's own Hessian: 0 at every one of these points.
    pts = torch.tensor(spheres[0, 0, :, :3], dtype=torch.float32, device=world.device)
    for p in pts:
        hess = torch.func.hessian(lambda q: world.signed_distance(q.reshape(1, 3))[0].sum())(p)
        assert float(hess.abs().max()) < 1e-3


def test_swept_and_remote_style_double_backward_is_refused(scene):
    world, _ = scene
    s = torch.from_numpy(random_spheres(5)).to(world.device).requires_grad_()
    (g,) = torch.autograd.grad(world.swept_sphere_cost(s, ETA, sweep_steps=2).sum(), s, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        torch.autograd.grad(g.sum(), s)
    # first derivatives are unaffected by create_graph
    torch.testing.assert_close(g, ordinary_grad(lambda x: world.swept_sphere_cost(x, ETA, sweep_steps=2), s.detach()))


def test_swept_transforms_match_ordinary_backward(scene):
    world, envs = scene
    s = torch.from_numpy(random_spheres(6, (2, 5, 3))).to(world.device)
    w = torch.rand(s.shape[:-1], generator=torch.Generator().manual_seed(8)).to(world.device) + 0.5

    def cost(x):
        return world.swept_sphere_cost(x, ETA, 1.0, sweep_steps=2, env_index=[0, 1])

    grad = ordinary_grad(cost, s, w)
    c_ref, g_ref = ref.swept_sphere_cost(s.cpu().numpy(), envs, ETA, 1.0, MAX_DIST, sweep_steps=2, env_index=[0, 1])
    np.testing.assert_allclose(cost(s).detach().cpu().numpy(), c_ref, atol=1e-4)
    torch.testing.assert_close(torch.func.grad(lambda x: (cost(x) * w).sum())(s), grad)
    jac = torch.func.jacrev(cost)(s)
    torch.testing.assert_close((jac * w[..., None, None, None, None]).sum(dim=(0, 1, 2)), grad)
    torch.testing.assert_close(torch.func.jacfwd(cost)(s), jac)
    stacked = torch.stack([s, s + 0.01])
    torch.testing.assert_close(torch.func.vmap(cost)(stacked)[1], cost(s + 0.01))


def test_torch_compile_fullgraph(scene):
    """One compiled cost function calling sphere_cost, swept_sphere_cost and signed_distance:
    same values and gradients as eager; a moved mesh reaches it without recompiling."""
    world, _ = scene
    s = torch.from_numpy(random_spheres(9)).to(world.device)
    env = torch.tensor([0, 1])

    def objective(x):
        dist, _ = world.signed_distance(x[0, 0, :, :3], env=0)
        return (world.sphere_cost(x, ETA, 2.0, env).sum() + world.swept_sphere_cost(x, ETA, 1.0, 2).sum()
                + dist.sum())

    compiled = torch.compile(objective, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        eager_x, comp_x = s.clone().requires_grad_(), s.clone().requires_grad_()
        e, c = objective(eager_x), compiled(comp_x)
        e.backward()
        c.backward()
        torch.testing.assert_close(c, e)
        torch.testing.assert_close(comp_x.grad, eager_x.grad)
        world.set_pose("box", BOX_POSE + np.array([0.02, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]), env=0)
    world.set_pose("box", BOX_POSE, env=0)


def test_cost_op_backward_is_the_eager_one(scene, monkeypatch):
    """The plain-cost op a compiled cost function calls (robot_sdf.ops) differentiates as the
    eager API does: the same first derivative, no Hessian launched when only the cost is used,
    the eager Hessian-vector product through a double backward and for a loss on its gradient
    output."""
    from robot_sdf import ops

    world, _ = scene
    s = torch.from_numpy(random_spheres(11)).to(world.device)
    vt = torch.from_numpy(random_spheres(12)).to(world.device)
    vt[..., 3] = 0.0
    handle = ops.world_handle(world)
    hessians = []
    hessian = warp_primitives.Query.hessian
    monkeypatch.setattr(warp_primitives.Query, "hessian",
                        lambda args, *a: hessians.append(1) or hessian(args, *a))

    def op(x):
        return torch.ops.robot_sdf.sphere_cost(x, handle, ETA, 2.0, -1.0, None, False)

    x = s.clone().requires_grad_()
    op(x)[0].sum().backward()
    assert hessians == []
    torch.testing.assert_close(x.grad, ordinary_grad(lambda y: world.sphere_cost(y, ETA, 2.0), s))
    e = s.clone().requires_grad_()
    (ge,) = torch.autograd.grad(world.sphere_cost(e, ETA, 2.0).sum(), e, create_graph=True)
    (eager_hv,) = torch.autograd.grad((ge * vt).sum(), e)
    assert eager_hv.abs().max() > 0
    x = s.clone().requires_grad_()
    (g,) = torch.autograd.grad(op(x)[0].sum(), x, create_graph=True)
    (hv,) = torch.autograd.grad((g * vt).sum(), x)
    torch.testing.assert_close(hv, eager_hv)
    x = s.clone().requires_grad_()
    (op(x)[1] * vt).sum().backward()
    torch.testing.assert_close(x.grad, eager_hv)
    assert len(hessians) == 3  # the eager double backward's, then one per backward of the op that needs it


def test_float64_inputs_give_float64_outputs(scene):
    world, _ = scene
    s32 = torch.from_numpy(random_spheres(11)).to(world.device)
    s64 = s32.double()
    for fn in (lambda x: world.sphere_cost(x, ETA, 1.0, [0, 1]),
               lambda x: world.swept_sphere_cost(x, ETA, 1.0, 2, env_index=[0, 1]),
               lambda x: world.signed_distance(x[0, 0, :, :3])[0]):
        c64, c32 = fn(s64), fn(s32)
        assert c64.dtype == torch.float64 and c32.dtype == torch.float32
        torch.testing.assert_close(c64, c32.double())  # computed in float32, as documented
        g64 = torch.func.grad(lambda x: fn(x).sum())(s64)
        assert g64.dtype == torch.float64
        torch.testing.assert_close(g64, ordinary_grad(fn, s32).double())
    with pytest.raises(ValueError, match="query_spheres must be float32"):
        snap = world.snapshot()
        SdfMeshWarpPy.apply(s64, *_buffers(s64), 1.0, ETA, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                            snap.n_env_mesh, MAX_DIST)


def test_what_worked_keeps_working(scene):
    """Non-leaf inputs (a kinematic chain), no_grad / inference_mode, non-contiguous inputs and
    determinism, on the new Functions, also under torch.func.grad."""
    world, _ = scene
    s = torch.from_numpy(random_spheres(12)).to(world.device)
    q = torch.full((3,), 0.01, device=world.device)

    def chain(q):
        return world.sphere_cost(torch.cat([s[..., :3] + q, s[..., 3:]], dim=-1), ETA, 1.0, [0, 1]).sum()

    qq = q.clone().requires_grad_()
    chain(qq).backward()
    torch.testing.assert_close(torch.func.grad(chain)(q), qq.grad)
    base = world.sphere_cost(s, ETA, 1.0, [0, 1])
    with torch.no_grad():
        torch.testing.assert_close(world.sphere_cost(s.requires_grad_(False), ETA, 1.0, [0, 1]), base)
    with torch.inference_mode():
        torch.testing.assert_close(world.sphere_cost(s, ETA, 1.0, [0, 1]), base)
    strided = torch.stack([s, s], dim=-1).reshape(*s.shape[:-1], 8)[..., ::2]
    assert torch.equal(strided, s)
    assert not strided.is_contiguous()
    torch.testing.assert_close(world.sphere_cost(strided.permute(1, 0, 2, 3), ETA, 1.0).permute(1, 0, 2),
                               world.sphere_cost(s.permute(1, 0, 2, 3).contiguous(), ETA, 1.0).permute(1, 0, 2))
    g1 = torch.func.grad(lambda x: world.sphere_cost(x, ETA, 1.0, [0, 1]).sum())(strided)
    g2 = torch.func.grad(lambda x: world.sphere_cost(x, ETA, 1.0, [0, 1]).sum())(strided)
    assert torch.equal(g1, g2)


def test_private_shortcuts_match_public_paths(scene, monkeypatch):
    """Each private shortcut of robot_sdf._internals (and Warp's recorded launches) against the
    public path it replaces, and the version gate."""
    world, _ = scene
    from robot_sdf import cost as cost_module
    minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    assert _internals.TORCH_SHORTCUTS == (minor in _internals.SUPPORTED_TORCH)
    s = torch.from_numpy(random_spheres(13)).to(world.device)

    def run():
        x = s.clone().requires_grad_()
        c = world.sphere_cost(x, ETA, 1.0, [0, 1])
        c.sum().backward()
        sw = world.swept_sphere_cost(s, ETA, 1.0, 2, env_index=[0, 1])
        h = torch.func.hessian(lambda y: world.sphere_cost(y, ETA, 1.0, [1]).sum())(s[1:, :1])
        return c.detach(), x.grad, sw, h

    snap = world.snapshot()

    def curobo():
        x = s.clone().requires_grad_()
        c = SdfMeshWarpPy.apply(x, *_buffers(x), 1.0, ETA, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                                snap.n_env_mesh, MAX_DIST, torch.tensor([0, 1], dtype=torch.int32, device=x.device))
        c.sum().backward()
        sw = SweptSdfMeshWarpPy.apply(x, *_buffers(x), 1.0, ETA, 0.1, snap.mesh_idx, snap.mesh_pose_inverse,
                                      snap.mesh_enable, snap.n_env_mesh, MAX_DIST, 2)
        return c.detach(), x.grad, sw.detach()

    shortcut = run() + curobo()
    monkeypatch.setattr(warp_primitives, "sphere_cost_apply", warp_primitives.SphereCost.apply)
    monkeypatch.setattr(warp_primitives, "swept_cost_apply", warp_primitives.SweptCost.apply)
    monkeypatch.setattr(cost_module, "sphere_cost_apply", warp_primitives.SphereCost.apply)
    monkeypatch.setattr(cost_module, "swept_cost_apply", warp_primitives.SweptCost.apply)
    monkeypatch.setattr(_internals, "WARP_SHORTCUTS", False)
    monkeypatch.setattr(_internals, "transforms_active", _internals._transforms_active_fallback)
    public = run() + curobo()
    for a, b in zip(shortcut, public):
        assert torch.equal(a, b)


def test_documented_torch_func_example():
    """The example of docs/pytorch.md "torch.func and torch.compile" runs as written."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "pytorch.md").read_text()
    section = page.split("## torch.func and torch.compile", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "docs/pytorch.md", "exec"), namespace)  # noqa: S102 - the documented example itself
    assert namespace["step"].shape == namespace["x"].shape == (8, 1, 10, 4)
    assert namespace["costs"].shape == (3,) and namespace["grads"].shape == (3, 8, 1, 10, 4)
    assert torch.isfinite(namespace["step"]).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_torch_compile_reduce_overhead_on_cuda():
    """On CUDA the compiled cost also runs with CUDA graphs (mode="reduce-overhead"; the Warp
    launches between the captured parts), with the eager values and gradients, also after the
    world changed (not run without a GPU)."""
    world = MeshWorld(device="cuda:0", num_envs=1, max_distance=MAX_DIST, sign_method="normal")
    world.add_mesh("box", BOX_V, BOX_T, BOX_POSE)
    s = torch.from_numpy(random_spheres(14)).to("cuda:0")

    def objective(x):
        return world.sphere_cost(x, ETA, 1.0).sum()

    compiled = torch.compile(objective, fullgraph=True, mode="reduce-overhead")
    for step in range(4):  # warm-up, record, replays
        eager_x, comp_x = s.clone().requires_grad_(), s.clone().requires_grad_()
        e, c = objective(eager_x), compiled(comp_x)
        e.backward()
        c.backward()
        torch.testing.assert_close(c, e)
        torch.testing.assert_close(comp_x.grad, eager_x.grad)
        world.set_pose("box", BOX_POSE + np.array([0.01 * step, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]))
