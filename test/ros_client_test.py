"""robot_sdf.ros.client.SdfClient against a running sdf_server: sync, async, autograd, errors.

One node process for the module. Results are compared with an in-process MeshWorld holding the
same mesh, with analytic box distances and with finite differences of the remote cost.
"""
from __future__ import annotations

import concurrent.futures
import time

import numpy as np
import pytest
import rclpy
import torch

import reference as ref
import ros_helpers as rh
from robot_sdf import MeshWorld
from robot_sdf.ros.client import (CostResult, RemoteSphereCost, RemoteSweptSphereCost, SdfClient,
                              SdfServiceError, remote_sphere_cost, remote_swept_sphere_cost)
from robot_sdf.ros.conversions import make_mesh_obstacle
from robot_sdf_interfaces.msg import MeshObstacle

DOMAIN = rh.domain_id(37)
ETA = 0.05
BOX = (0.4, 0.3, 0.2)
POSE = np.concatenate([[0.0, 0.0, 0.5], rh.quat_about_z(0.3)])
PARAMS = dict(device="cpu", num_envs=2, max_distance=0.5, activation_distance=ETA, weight=1.0,
              sign_method="normal", marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    harness = rh.RosHarness(DOMAIN, "sdf_client_test")
    node = rh.NodeProcess(PARAMS, tmp_path_factory.mktemp("ros_client"), DOMAIN)
    client = None
    try:
        # the default context, as an MPC script would have it; SdfClient() creates its node there
        rclpy.init(domain_id=DOMAIN)
        client = SdfClient(timeout_s=60.0)
        deadline = time.monotonic() + rh.SERVICE_TIMEOUT_S
        while not client.wait_for_services(0.5):
            assert node.alive(), node.log()
            assert time.monotonic() < deadline, node.log()
        pub = harness.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
        v, t = ref.box(BOX)
        pub.publish(make_mesh_obstacle("box", v, t, POSE))
        rh.wait_until(lambda: client.signed_distance(torch.zeros(1, 3)).world_revision == 1, 60.0,
                      what="the box")
        world = MeshWorld(device="cpu", num_envs=2, sign_method="normal", max_distance=0.5)
        world.add_mesh("box", v, t, POSE)
        yield harness, client, world
    finally:
        if client is not None:
            client.close()
        rclpy.try_shutdown()
        code = node.stop()
        harness.close()
        assert code == 0, node.log()


def _spheres(seed: int, b: int = 3, h: int = 4, n: int = 5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    s = torch.empty(b, h, n, 4)
    s[..., 0] = torch.rand(b, h, n, generator=g) * 0.8 - 0.4
    s[..., 1] = torch.rand(b, h, n, generator=g) * 0.6 - 0.3
    s[..., 2] = torch.rand(b, h, n, generator=g) * 0.5 + 0.25
    s[..., 3] = torch.rand(b, h, n, generator=g) * 0.06 + 0.02
    return s


def test_sync_calls_match_core(setup):
    _, client, world = setup
    s = _spheres(1)
    res = client.sphere_cost(s, activation_distance=ETA, weight=1.0)
    assert isinstance(res, CostResult) and res.world_revision == 1 and res.latency_s > 0
    assert res.cost.shape == (3, 4, 5) and res.cost.dtype == torch.float32 and res.cost.device == s.device
    assert res.gradient.shape == (3, 4, 5, 3)
    core_cost, core_grad = world.evaluate_sphere_cost(s, ETA, 1.0)
    torch.testing.assert_close(res.cost, core_cost, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.gradient, core_grad, rtol=1e-5, atol=1e-6)
    assert (res.cost > 0).sum() > 5 and (res.cost == 0).sum() > 5

    # server defaults for eta/weight <= 0, weight scales, no gradient when not asked
    assert torch.equal(client.sphere_cost(s).cost, res.cost)
    torch.testing.assert_close(client.sphere_cost(s, ETA, 3.0).cost, 3.0 * res.cost, rtol=1e-5, atol=1e-6)
    assert client.sphere_cost(s, compute_gradient=False).gradient is None

    # float64 input: results stay float32 on the input's device
    assert client.sphere_cost(s.double()).cost.dtype == torch.float32

    sw = client.swept_sphere_cost(s, sweep_steps=3, speed_dt=0.1, enable_speed_metric=True)
    core_sw, core_sw_grad = world.evaluate_swept_sphere_cost(s, ETA, 1.0, sweep_steps=3, speed_dt=0.1,
                                                             enable_speed_metric=True)
    torch.testing.assert_close(sw.cost, core_sw, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(sw.gradient, core_sw_grad, rtol=1e-5, atol=1e-5)

    pts = torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 0.75], [0.5, 0.0, 0.5], [2.0, 0.0, 0.5]])
    dist, grad, rev = client.signed_distance(pts)
    assert rev == 1 and dist.shape == (4,) and grad.shape == (4, 3)
    expected = np.minimum(rh.box_signed_distance(pts.numpy(), BOX, POSE), 0.5)
    np.testing.assert_allclose(dist.numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(grad[1].numpy(), [0, 0, 1], atol=1e-5)
    assert client.signed_distance(pts, max_distance=0.1).distance[3] == pytest.approx(0.1)
    # env 1 is empty
    assert torch.all(client.signed_distance(pts, env=1).distance == 0.5)
    assert not client.sphere_cost(s, env_index=[1, 1, 1]).cost.any()
    mixed = client.sphere_cost(s, env_index=torch.tensor([0, 1, 0]))
    assert torch.equal(mixed.cost[[0, 2]], res.cost[[0, 2]]) and not mixed.cost[1].any()


def test_async_calls(setup):
    _, client, _ = setup
    batches = [_spheres(10 + i) for i in range(6)]
    futures = [client.sphere_cost_async(s) for s in batches]
    swept = client.swept_sphere_cost_async(batches[0], sweep_steps=2)
    dist = client.signed_distance_async(torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0]]))
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    for s, f in zip(batches, futures):
        res = f.result(timeout=60)
        assert torch.equal(res.cost, client.sphere_cost(s).cost)
        torch.testing.assert_close(res.gradient, client.sphere_cost(s).gradient)
    assert torch.equal(swept.result(timeout=60).cost, client.swept_sphere_cost(batches[0], sweep_steps=2).cost)
    np.testing.assert_allclose(dist.result(timeout=60).distance.numpy(), [-0.1, 0.4], atol=1e-5)


def test_autograd_functions(setup):
    _, client, _ = setup
    s = _spheres(3).requires_grad_()
    w = torch.rand(s.shape[:-1], generator=torch.Generator().manual_seed(4)) + 0.5
    cost = remote_sphere_cost(client, s, ETA, 1.0)
    (cost * w).sum().backward()
    ref_res = client.sphere_cost(s.detach(), ETA, 1.0)
    torch.testing.assert_close(cost.detach(), ref_res.cost)
    torch.testing.assert_close(s.grad[..., :3], w[..., None] * ref_res.gradient)
    assert torch.all(s.grad[..., 3] == 0)

    # the remote gradient is the derivative of the remote cost: central differences
    base = s.detach().clone()
    hit = torch.nonzero(ref_res.cost > 1e-3)[:6]
    eps = 1e-3
    for b, h, n in hit.tolist():
        for axis in range(3):
            plus, minus = base.clone(), base.clone()
            plus[b, h, n, axis] += eps
            minus[b, h, n, axis] -= eps
            fd = (client.sphere_cost(plus[b:b + 1], ETA, 1.0, compute_gradient=False).cost[0, h, n]
                  - client.sphere_cost(minus[b:b + 1], ETA, 1.0, compute_gradient=False).cost[0, h, n]) / (2 * eps)
            assert float(fd) == pytest.approx(float(ref_res.gradient[b, h, n, axis]), abs=2e-2, rel=2e-2)

    s2 = _spheres(5).requires_grad_()
    swept = remote_swept_sphere_cost(client, s2, sweep_steps=3)
    swept.sum().backward()
    sw_ref = client.swept_sphere_cost(s2.detach(), sweep_steps=3)
    torch.testing.assert_close(swept.detach(), sw_ref.cost)
    torch.testing.assert_close(s2.grad[..., :3], sw_ref.gradient)
    assert torch.all(s2.grad[..., 3] == 0)
    assert RemoteSphereCost.apply(s.detach(), client).shape == s.shape[:-1]
    assert RemoteSweptSphereCost.apply(s.detach(), client, 2).shape == s.shape[:-1]


def test_errors_raise(setup):
    harness, client, _ = setup
    with pytest.raises(SdfServiceError, match="env_index values must be in"):
        client.sphere_cost(_spheres(1), env_index=[0, 5, 0])
    fut = client.sphere_cost_async(_spheres(1, b=2), env_index=[0])
    with pytest.raises(SdfServiceError, match="one entry per batch row"):
        fut.result(timeout=60)
    with pytest.raises(SdfServiceError, match="exceeds max_sweep_steps"):
        client.swept_sphere_cost(_spheres(1), sweep_steps=1000)
    with pytest.raises(SdfServiceError, match="env 7 out of range"):
        client.signed_distance(torch.zeros(1, 3), env=7)
    with pytest.raises(SdfServiceError, match="not finite"):
        client.signed_distance(torch.full((1, 3), float("nan")))
    with pytest.raises(ValueError):
        client.sphere_cost(torch.zeros(2, 3, 4))
    with pytest.raises(ValueError):
        client.signed_distance(torch.zeros(3))

    # nobody serves /nowhere: the call times out instead of hanging
    lost = SdfClient(node=harness.node, server="/nowhere", timeout_s=0.3)
    try:
        assert not lost.wait_for_services(0.2)
        t0 = time.monotonic()
        with pytest.raises(SdfServiceError, match="timeout"):
            lost.sphere_cost(_spheres(1))
        # honoured (0.3 s), not hanging: a generous bound that a loaded machine still meets
        assert time.monotonic() - t0 < 30.0
        with pytest.raises(SdfServiceError, match="timeout"):
            lost.signed_distance_async(torch.zeros(1, 3)).result(timeout=60)
    finally:
        lost.close()
    lost.close()  # idempotent
    with pytest.raises(SdfServiceError, match="closed"):
        lost.sphere_cost(_spheres(1))


def test_client_on_a_given_node(setup):
    harness, client, _ = setup
    with SdfClient(node=harness.node, timeout_s=60.0) as own:
        assert own.wait_for_services(60.0)
        s = _spheres(8)
        assert torch.equal(own.sphere_cost(s).cost, client.sphere_cost(s).cost)


def test_autograd_functions_under_torch_func(setup):
    """The remote Functions under torch.func (grad, vmap folded into one request, jacrev, jacfwd,
    jvp), forward-mode AD and double backward (refused), against the ordinary backward."""
    from torch.autograd import forward_ad
    _, client, _ = setup
    s = _spheres(2)
    tangent = torch.randn(s.shape, generator=torch.Generator().manual_seed(5))
    x = s.clone().requires_grad_()
    remote_sphere_cost(client, x, ETA, 1.0).sum().backward()
    grad = x.grad

    def total(y):
        return remote_sphere_cost(client, y, ETA, 1.0).sum()

    torch.testing.assert_close(torch.func.grad(total)(s), grad)
    jac = torch.func.jacrev(lambda y: remote_sphere_cost(client, y, ETA, 1.0))(s)
    torch.testing.assert_close(jac.sum(dim=(0, 1, 2)), grad)
    torch.testing.assert_close(torch.func.jacfwd(lambda y: remote_sphere_cost(client, y, ETA, 1.0))(s), jac)
    _, jvp = torch.func.jvp(total, (s,), (tangent,))
    torch.testing.assert_close(jvp, (grad * tangent).sum())
    with forward_ad.dual_level():
        dual = remote_sphere_cost(client, forward_ad.make_dual(s, tangent), ETA, 1.0)
        torch.testing.assert_close(forward_ad.unpack_dual(dual).tangent.sum(), (grad * tangent).sum())

    # vmap over three perturbed copies: one request for all of them
    batch = torch.stack([s, s + 0.01, s - 0.01])
    calls = []
    original = client.sphere_cost
    client.sphere_cost = lambda *a, **k: calls.append(a[0].shape) or original(*a, **k)
    try:
        costs = torch.func.vmap(lambda y: remote_sphere_cost(client, y, ETA, 1.0))(batch)
    finally:
        client.sphere_cost = original
    assert calls == [torch.Size((3 * s.shape[0],) + tuple(s.shape[1:]))]
    for i in range(3):
        torch.testing.assert_close(costs[i], client.sphere_cost(batch[i], ETA, 1.0).cost)
    vgrads = torch.func.vmap(torch.func.grad(total))(batch)
    for i in range(3):
        torch.testing.assert_close(vgrads[i, ..., :3], client.sphere_cost(batch[i], ETA, 1.0).gradient)

    # swept: grad of the summed cost is exact
    s2 = _spheres(5)
    sw = torch.func.grad(lambda y: remote_swept_sphere_cost(client, y, sweep_steps=3).sum())(s2)
    torch.testing.assert_close(sw[..., :3], client.swept_sphere_cost(s2, sweep_steps=3).gradient)

    # double backward: refused with torch's once_differentiable error
    for fn in (lambda y: remote_sphere_cost(client, y, ETA, 1.0),
               lambda y: remote_swept_sphere_cost(client, y, sweep_steps=3)):
        y = s2.clone().requires_grad_()
        (g,) = torch.autograd.grad(fn(y).sum(), y, create_graph=True)
        with pytest.raises(RuntimeError, match="once_differentiable"):
            torch.autograd.grad(g.sum(), y)
