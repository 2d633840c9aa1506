"""robot_sdf.requests (the node's compute path without ROS) against the numpy reference.

Flat request arrays in, flat response arrays out, as the services carry them; runs on every
device of the `device` fixture (CUDA included, where there is no ROS).
"""
from __future__ import annotations

import numpy as np
import pytest

import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.requests import RequestError, RequestSettings, RequestTranslator

ETA = 0.05
MAX_DIST = 0.4
BOX_V, BOX_T = ref.box((0.4, 0.4, 0.4))
SPH_V, SPH_T = ref.icosphere(0.15, 2)
POSE0 = np.array([0.0, 0.0, 0.5, 1.0, 0.0, 0.0, 0.0])
POSE1 = np.array([0.1, -0.05, 0.45, 0.9238795, 0.0, 0.0, 0.3826834])


@pytest.fixture
def setup(device):
    world = MeshWorld(device=device, num_envs=2, mesh_capacity=4, max_distance=MAX_DIST)
    world.add_mesh("box", BOX_V, BOX_T, POSE0, env=0)
    world.add_mesh("ball", SPH_V, SPH_T, POSE1, env=1)
    envs = [[ref.RefMesh(BOX_V, BOX_T, POSE0)], [ref.RefMesh(SPH_V, SPH_T, POSE1)]]
    settings = RequestSettings(activation_distance=ETA, weight=2.0, max_distance=MAX_DIST,
                               max_spheres_per_request=1000, max_points_per_request=500, max_sweep_steps=8)
    return RequestTranslator(world, settings), envs


def _spheres(rng, shape, envs):
    """Spheres (shape + (4,)) float32 at least 2 mm off every surface (well-defined gradients)."""
    n = int(np.prod(shape))
    p = rng.uniform((-0.4, -0.4, 0.1), (0.4, 0.4, 0.9), size=(8 * n, 3))
    ok = np.ones(len(p), bool)
    for meshes in envs:
        for m in meshes:
            ok &= np.abs(m.signed_distance_world(p)[0]) > 2e-3
    p = p[ok][:n]
    r = rng.uniform(0.0, 0.08, size=(n, 1))
    return np.concatenate([p, r], axis=1).astype(np.float32).reshape(tuple(shape) + (4,))


def test_sphere_cost_matches_reference(setup):
    tr, envs = setup
    s = _spheres(np.random.default_rng(1), (2, 3, 10), envs)
    s[1, 2, 4, 3] = -1.0  # sphere off: cost 0, gradient 0 (the box centre would cost a lot)
    s[1, 2, 4, :3] = POSE1[:3]
    env_index = np.array([0, 1], np.uint32)
    res = tr.sphere_cost(2, 3, 10, s.reshape(-1), env_index, activation_distance=0.0, weight=0.0)
    cost, grad = ref.sphere_cost(s, envs, ETA, 2.0, MAX_DIST, env_index)  # node defaults apply
    assert res.cost.dtype == np.float32 and res.cost.shape == (60,)
    assert res.gradient.shape == (180,)
    assert np.any(cost > 0)
    np.testing.assert_allclose(res.cost, cost.reshape(-1), atol=2e-4)
    np.testing.assert_allclose(res.gradient, grad.reshape(-1), atol=5e-4)
    assert res.cost[1 * 30 + 2 * 10 + 4] == 0.0
    assert res.world_revision == 2
    assert res.spheres.shape == (2, 3, 10, 4)


def test_explicit_scalars_no_gradient_and_default_env(setup):
    tr, envs = setup
    s = _spheres(np.random.default_rng(2), (1, 2, 8), envs)
    res = tr.sphere_cost(1, 2, 8, s.reshape(-1), (), activation_distance=0.1, weight=3.0, compute_gradient=False)
    cost, _ = ref.sphere_cost(s, envs, 0.1, 3.0, MAX_DIST)
    np.testing.assert_allclose(res.cost, cost.reshape(-1), atol=3e-4)
    assert res.gradient.size == 0


def test_swept_cost_of_a_stationary_trajectory_is_the_plain_cost(setup):
    tr, envs = setup
    one = _spheres(np.random.default_rng(3), (2, 1, 6), envs)
    s = np.repeat(one, 4, axis=1)  # (2, 4, 6, 4): every step at the same place
    res = tr.swept_sphere_cost(2, 4, 6, s.reshape(-1), [1, 0], sweep_steps=3, speed_dt=0.1)
    cost, grad = ref.sphere_cost(s, envs, ETA, 2.0, MAX_DIST, [1, 0])
    np.testing.assert_allclose(res.cost, cost.reshape(-1), atol=2e-4)
    np.testing.assert_allclose(res.gradient, grad.reshape(-1), atol=5e-4)


def test_signed_distance_matches_reference(setup):
    tr, envs = setup
    pts = _spheres(np.random.default_rng(4), (40,), envs)[:, :3]
    res = tr.signed_distance(pts.reshape(-1), env=1, max_distance=0.0)
    sd, g = envs[1][0].signed_distance_world(pts.astype(np.float64))
    sd = np.minimum(sd, MAX_DIST)
    np.testing.assert_allclose(res.distance, sd, atol=2e-4)
    near = sd < MAX_DIST - 1e-3
    np.testing.assert_allclose(res.gradient.reshape(-1, 3)[near], g[near], atol=5e-4)


def test_float64_input_is_checked_in_float32(setup):
    tr, envs = setup
    s = _spheres(np.random.default_rng(5), (1, 1, 2), envs).astype(np.float64)
    s[0, 0, 1, 0] = 1e39  # finite in float64, inf in float32
    with pytest.raises(RequestError, match=r"sphere \(batch 0, step 0, sphere 1\) is not finite"):
        tr.sphere_cost(1, 1, 2, s.reshape(-1))


BAD = [
    ("sizes 0", dict(batch=0), "must be > 0"),
    ("length mismatch", dict(batch=2), "spheres has 32 floats, expected batch*horizon*spheres_per_step*4 = 64"),
    ("over the limit", dict(batch=1000), "exceeds max_spheres_per_request 1000"),
    ("uint32 max sizes", dict(batch=2**32 - 1, horizon=2**32 - 1, spheres_per_step=2**32 - 1),
     "exceeds max_spheres_per_request"),
    ("nan", dict(edit=(0, 1, 0, np.nan)), "sphere (batch 0, step 1, sphere 0) is not finite"),
    ("inf radius", dict(edit=(0, 0, 1, 3, np.inf)), "radius is not finite"),
    ("-inf radius", dict(edit=(0, 0, 1, 3, -np.inf)), "radius is not finite"),
    ("huge radius", dict(edit=(0, 0, 2, 3, 3e38)), "radius 3e+38 m exceeds the limit of 1000 m"),
    ("far coordinate", dict(edit=(0, 1, 3, 2, 2e5)), "beyond max_coordinate"),
    ("env_index length", dict(env_index=[0, 0]), "env_index must have one entry per batch row (1), got 2"),
    ("env_index range", dict(env_index=[2]), "env_index values must be in [0, 2)"),
    ("env_index beyond int32", dict(env_index=[2**32 - 1]), "env_index values must be in"),
    ("nan eta", dict(activation_distance=float("nan")), "activation_distance must be finite"),
    ("float32-overflowing eta", dict(activation_distance=1e39), "activation_distance must be finite"),
    ("absurd eta", dict(activation_distance=5e3), "activation_distance 5000 exceeds the limit"),
    ("inf weight", dict(weight=float("inf")), "weight must be finite"),
]


@pytest.mark.parametrize("label, change, reason", BAD, ids=[b[0] for b in BAD])
def test_bad_cost_requests_are_refused(setup, label, change, reason):
    tr, envs = setup
    change = dict(change)
    s = np.zeros((1, 2, 4, 4), np.float32)
    s[..., 3] = 0.05
    if "edit" in change:
        *idx, value = change.pop("edit")
        s[tuple(idx)] = value
    args = dict(batch=1, horizon=2, spheres_per_step=4, spheres=s.reshape(-1))
    args.update(change)
    rev = tr.world.revision
    with pytest.raises(ValueError) as info:
        tr.sphere_cost(**args)
    assert reason in str(info.value)
    assert tr.world.revision == rev


def test_non_finite_result_is_refused(setup):
    tr, envs = setup
    s = np.array([[[[0.0, 0.0, 0.5, 10.0]]]], np.float32)  # at the box centre: cost ~10.2
    ok = tr.sphere_cost(1, 1, 1, s.reshape(-1), weight=1.0)
    np.testing.assert_allclose(ok.cost[0], 10.0 + ETA + 0.2 - ETA / 2, rtol=1e-5)
    with pytest.raises(RequestError, match="not finite in float32"):
        tr.sphere_cost(1, 1, 1, s.reshape(-1), weight=3e38)


def test_bad_swept_and_distance_requests(setup):
    tr, _ = setup
    s = np.zeros(4 * 2, np.float32)
    with pytest.raises(RequestError, match="exceeds max_sweep_steps 8"):
        tr.swept_sphere_cost(1, 2, 1, s, sweep_steps=9)
    with pytest.raises(ValueError, match="speed_dt must be > 0"):
        tr.swept_sphere_cost(1, 2, 1, s, sweep_steps=1, speed_dt=0.0, enable_speed_metric=True)
    with pytest.raises(RequestError, match="speed_dt must be finite"):
        tr.swept_sphere_cost(1, 2, 1, s, speed_dt=float("inf"))
    for points, kw, reason in (
            (np.zeros(0), {}, "points is empty"),
            (np.zeros(7), {}, "not a multiple of 3"),
            (np.zeros(3 * 501), {}, "exceed max_points_per_request 500"),
            (np.array([0.0, np.nan, 0.0]), {}, "point 0 is not finite"),
            (np.array([0.0, 0.0, 1e39]), {}, "point 0 is not finite"),
            (np.array([0.0, -3e5, 0.0]), {}, "beyond max_coordinate"),
            (np.zeros(3), dict(max_distance=float("nan")), "max_distance must be finite"),
            (np.zeros(3), dict(max_distance=1e6), "max_distance 1e+06 exceeds the limit"),
            (np.zeros(3), dict(env=2), "env 2 out of range")):
        with pytest.raises(ValueError) as info:
            tr.signed_distance(points, **kw)
        assert reason in str(info.value), (reason, str(info.value))


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_length"):
        RequestSettings(max_length=float("inf"))
    with pytest.raises(ValueError, match="max_spheres_per_request"):
        RequestSettings(max_spheres_per_request=0)
