"""bench/curobo_style.py, the timing reference of the benchmarks' comparisons with cuRobo, does the work
it stands for: its plain cost and gradient equal the numpy reference's, and its swept cost equals
a numpy run of cuRobo's sample schedule on the reference's signed distances (so a ratio against
it compares like with like, not against a kernel that skips queries)."""
from __future__ import annotations

import numpy as np
import pytest

import reference as ref
from bench import scenes
from bench.core_bench import CostRunner, TensorWorld
from bench.curobo_style import CuroboStyleRunner

ETA = scenes.ACTIVATION
MAX_DIST = scenes.MAX_DIST


def _meshes(rng: np.random.Generator) -> list[scenes.SceneMesh]:
    box_v, box_t = ref.box((0.3, 0.2, 0.25))
    ball_v, ball_t = ref.icosphere(0.12, 3)
    poses = [ref.random_pose(rng, 0.0), ref.random_pose(rng, 0.0)]
    poses[1][:3] = (0.35, 0.05, -0.02)
    return [scenes.SceneMesh("box", box_v.astype(np.float32), box_t.astype(np.int32), poses[0]),
            scenes.SceneMesh("ball", ball_v.astype(np.float32), ball_t.astype(np.int32), poses[1])]


def _ref_meshes(meshes: list[scenes.SceneMesh]) -> list[ref.RefMesh]:
    return [ref.RefMesh(m.vertices.astype(np.float64), m.triangles, m.pose) for m in meshes]


def _curobo_schedule(spheres: np.ndarray, meshes: list[ref.RefMesh], sweep_steps: int) -> np.ndarray:
    """Swept cost (b,h,n) of cuRobo's schedule (bench/curobo_style.py's docstring), from the
    reference's signed distances, each mesh on its own."""
    b, h, n, _ = spheres.shape
    out = np.zeros((b, h, n))
    for bi, t, k in np.ndindex(b, h, n):
        p, r = spheres[bi, t, k, :3].astype(np.float64), float(spheres[bi, t, k, 3])
        r_eta = r + ETA
        bound = MAX_DIST + r_eta if r_eta > MAX_DIST else MAX_DIST
        sides = [(spheres[bi, s, k, :3].astype(np.float64), s < t) for s in (t - 1, t + 1) if 0 <= s < h]
        for mesh in meshes:
            def sample(q):
                sd = float(mesh.signed_distance_world(q[None])[0][0])
                found = sd < bound
                pen = r_eta - sd
                return (float(ref.cost_of_penetration(pen, ETA)[0]) if found else 0.0), pen, found

            cost, pen, found = sample(p)
            mid = abs(pen) if found else bound
            for neighbour, previous in sides:
                half = 0.5 * np.linalg.norm(neighbour - p)
                jump, step = mid, 0
                while step < sweep_steps and jump < half:
                    kk = 1.0 - 0.5 * jump / half
                    c, pen_s, found_s = sample(kk * p + (1.0 - kk) * neighbour)
                    cost += c
                    if not found_s:
                        jump += bound
                    elif pen_s > 0.0:
                        jump += pen_s if previous else max(pen_s - r_eta, r_eta)
                    else:
                        jump += max(-pen_s - r_eta, r_eta)
                    step += 1
            out[bi, t, k] += cost
    return out


@pytest.fixture(scope="module")
def scene():
    rng = np.random.default_rng(14)
    meshes = _meshes(rng)
    return meshes, TensorWorld(meshes, "cpu", 0.0)


def test_plain_cost_and_gradient_match_the_reference(scene):
    meshes, world = scene
    rng = np.random.default_rng(3)
    spheres = scenes.near_surface_spheres(meshes, 300)
    spheres[:40, :3] = rng.uniform(-0.1, 0.1, (40, 3))  # deep inside the box
    runner = CuroboStyleRunner(CostRunner(world, spheres))
    grad = runner.forward_backward().numpy()
    cost_ref, grad_ref = ref.sphere_cost(spheres.reshape(1, 1, -1, 4), [_ref_meshes(meshes)], ETA, 1.0, MAX_DIST)
    assert (cost_ref > 0).sum() > 100
    np.testing.assert_allclose(runner.cost.detach().numpy(), cost_ref, atol=2e-5)
    np.testing.assert_allclose(grad[..., :3], grad_ref, atol=2e-4)


def test_swept_cost_follows_curobos_sample_schedule(scene):
    meshes, world = scene
    traj = scenes.trajectories(meshes, 1, 8, 40)
    # Longer steps than the contact-heavy walks, so that sides take several samples.
    traj[..., :3] = traj[:, :1, :, :3] + 4.0 * (traj[..., :3] - traj[:, :1, :, :3])
    runner = CuroboStyleRunner(CostRunner(world, traj))
    runner.forward_backward(sweep_steps=4)
    swept = runner.cost.detach().numpy().copy()
    expected = _curobo_schedule(traj, _ref_meshes(meshes), 4)
    runner.forward_backward(sweep_steps=0)
    plain = runner.cost.detach().numpy()
    assert (swept > plain + 1e-3).sum() > 20  # samples between the steps do add cost
    np.testing.assert_allclose(swept, expected, atol=5e-4)
