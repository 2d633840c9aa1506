"""Code paths that only CUDA takes in production, run on the CPU where they can be.

- Warp's recorded launch with its packed parameter list (robot_sdf.launch._replay's generic
  branch): every CUDA launch re-uses one, rewriting array descriptors and scalars in place; CPU
  launches normally bypass it (_CpuCall). robot_sdf.launch.CPU_DIRECT_CALLS = False sends CPU
  launches through it.
- Rows of an unknown environment: on the GPU, robot_sdf.cost does not check env_index on the
  host (that would cost a device sync per call); the kernels give such rows cost 0, gradient 0
  (sphere cost), -max_distance (ESDF). On the CPU the host check raises first, so the kernel
  branch is driven here through the autograd functions directly.

What stays CUDA-only (streams, events, graph capture): docs/history/benchmarks.md, "CUDA-only branches".
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from conftest import build_warp_env
from robot_sdf import launch
from swept_test import run_swept
from warp_primitives_test import COST_ATOL, ETA, MAX_DIST, np_, random_spheres, run_cost, scene_meshes


@pytest.fixture
def generic_launches(monkeypatch):
    """CPU launches through Warp's recorded launch (the CUDA path), with a fresh launch cache."""
    monkeypatch.setattr(launch, "CPU_DIRECT_CALLS", False)
    monkeypatch.setattr(launch, "_launches", launch._Launches())
    return launch._launches


def test_recorded_launch_path_rewrites_arguments_between_calls(generic_launches):
    rng = np.random.default_rng(21)
    meshes = scene_meshes(3)
    bv, bt = ref.box((0.4, 0.3, 0.2))
    other = [ref.RefMesh(bv, bt, ref.random_pose(rng, 0.2))]
    envs = [meshes, other]
    wenv = build_warp_env(envs, "cpu")
    # Three calls on one recorded launch: a new sphere tensor, a new size (set_dim), new scalars
    # (weight, activation distance) and an environment index that appears only in the last.
    calls = [((2, 3, 7), 1.0, ETA, None), ((3, 2, 11), 2.5, ETA, None), ((2, 2, 5), 0.5, 0.08, [1, 0])]
    for shape, weight, eta, env in calls:
        s = random_spheres(rng, shape, meshes + other)
        _, cost, grad, sparsity = run_cost(s, wenv, "cpu", eta=eta, weight=weight, env_query=env)
        c_ref, _ = ref.sphere_cost(s, envs, eta, weight, MAX_DIST, env_index=env)
        np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL * weight, rtol=1e-4)
        assert torch.equal(sparsity.bool(), cost > 0)
    s = random_spheres(rng, (2, 4, 6), meshes + other)
    _, swept, _, _ = run_swept(s, wenv, "cpu", 3, eta=ETA, max_dist=MAX_DIST, env_query=[0, 1])
    s_ref, _ = ref.swept_sphere_cost(s, envs, ETA, 1.0, MAX_DIST, 3, 0.1, False, env_index=[0, 1])
    np.testing.assert_allclose(np_(swept), s_ref, atol=COST_ATOL, rtol=1e-4)
    # The calls really went through recorded launches, none through the direct CPU call.
    entries = list(generic_launches.by_kernel.values())
    assert entries and all(fast is None for _, _, fast in entries)


@pytest.mark.parametrize("launches", ["direct", "recorded"])
def test_rows_of_an_unknown_environment_cost_nothing(request, launches):
    if launches == "recorded":
        request.getfixturevalue("generic_launches")
    rng = np.random.default_rng(22)
    meshes = scene_meshes(4)
    bv, bt = ref.box((0.5, 0.3, 0.3))
    envs = [meshes, [ref.RefMesh(bv, bt, ref.random_pose(rng, 0.2))]]
    wenv = build_warp_env(envs, "cpu")
    s = random_spheres(rng, (4, 3, 9), meshes)
    env = [1, -1, 2, 0]  # rows 1 and 2 name no environment of this world (2 of them)
    bad = np.array([False, True, True, False])
    _, cost, grad, sparsity = run_cost(s, wenv, "cpu", env_query=env)
    c_ref, _ = ref.sphere_cost(s[~bad], envs, ETA, 1.0, MAX_DIST, env_index=[1, 0])
    assert np.all(c_ref > -1) and np.any(c_ref > 0)  # the valid rows do collide somewhere
    np.testing.assert_allclose(np_(cost)[~bad], c_ref, atol=COST_ATOL, rtol=1e-4)
    assert torch.all(cost[bad] == 0) and torch.all(grad[bad] == 0) and torch.all(sparsity[bad] == 0)
    _, esdf, esdf_grad, _ = run_cost(s, wenv, "cpu", env_query=env, esdf=True)
    assert torch.all(esdf[bad] == -MAX_DIST) and torch.all(esdf_grad[bad] == 0)
    _, swept, swept_grad, _ = run_swept(s, wenv, "cpu", 2, eta=ETA, max_dist=MAX_DIST, env_query=env)
    sw_ref, _ = ref.swept_sphere_cost(s[~bad], envs, ETA, 1.0, MAX_DIST, 2, 0.1, False, env_index=[1, 0])
    np.testing.assert_allclose(np_(swept)[~bad], sw_ref, atol=COST_ATOL, rtol=1e-4)
    assert torch.all(swept[bad] == 0) and torch.all(swept_grad[bad] == 0)
