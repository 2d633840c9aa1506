"""Accuracy on manufacturers' robot meshes (bench.real_meshes: rtb-data's CAD exports, loaded as
the files are), against the float64 reference of test/reference.py, for MeshWorld's default sign
method (auto) and for meshes built elsewhere and adopted (robot_sdf.adopt_meshes).

The truth is the mesh as given: inside where its exact winding number is above 0.5. Required
(issue "real robot meshes are the yardstick"):
- signs right at every point 0.1 mm or more from the surface (points whose winding number is
  within WINDING_MARGIN of 0.5 are left out: on an open surface the side is a matter of a
  threshold there);
- where the cost is nonzero (inside, or within r + eta of a surface) the signed distance within
  1e-5 m and its gradient within 0.5 degrees (points where the closest feature is a tie of
  features with different directions are left out: reference.gradient_ambiguity), and the cost
  within 1e-5 with its gradient within 0.5 degrees;
- every centre inside costed, its cost the reference's, with a search bound (max_dist) of 1 mm;
- the cost exactly 0 (and its gradient) at points farther than r + eta + SEARCH_BOUND outside.

Each mesh gets 150 points (surface points moved along the face normal by 0.1 mm to 6 cm either
way, points 3-10 cm out, points in its box), evaluated once per regime (module caches); the
reference is brute force, so the file keeps to about a minute on one core.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
import torch
import warp as wp

import reference as ref
import robot_sdf
from bench import real_meshes
from robot_sdf import MeshWorld
from robot_sdf.warp_primitives import SdfMeshWarpPy

RADIUS = 0.01  # m, sphere radius
ETA = 0.02  # m, activation distance
MAX_DIST = 0.1  # m, search bound of the cost and of the signed distances (ESDF mode)
DEEP_MAX_DIST = 1e-3  # m: a search bound far below the depth of most inside points
SURFACE_MARGIN = 1e-4  # m: signs are required from here on
WINDING_MARGIN = 0.1  # |w - 0.5| below this: no side required (test/mesh_corpus.py's margin)
# Error bound of the float32 closest-point search, by which the band where the cost may be
# nonzero widens (issue: "r + eta (+ the float32 search's error bound)"): mesh_analysis's sliver
# note puts Warp's pick within ~1e-4 m of the closest triangle.
SEARCH_BOUND = 1e-4
DISTANCE_TOLERANCE = 1e-5  # m
ANGLE_TOLERANCE = 0.5  # degrees
REGIMES = ("meshworld_auto", "adopted")
# 17 of the corpus's 27 meshes, 107,704 triangles (the brute-force reference's time grows with
# them): every kind of surface it holds. Open visual exports (kr10 link 2, the Panda hand and
# decimated link 5 with mostly fractional winding numbers, the Ridgeback body), nearly closed
# collision meshes (kr3 link 1, kr210 link 2, iiwa link 2 visual), closed self-intersecting
# visual meshes (kr16 link 3, wx250s forearm, Ridgeback lidar, kr5 base with edges used four
# times), overlapping shells (irb140 link 1), closed single shells (kr120 link 2, iiwa link 2
# collision, the sliver-heavy puma560 link 3), one crossing (kr120 link 5) and a gripper whose
# patches the orientation repair turns (vx300s). Left out: the other open visual exports, and the
# double-sided kr210_link2_visual (every triangle twice, once each way: winding number 0
# everywhere, nothing inside to test).
MESHES = ("kr10_link2_visual", "panda_hand_visual", "panda_link5_decimated", "ridgeback_body", "kr3_link1_collision",
          "kr210_link2_collision", "iiwa_link2_visual", "kr16_link3_visual", "wx250s_lower_forearm", "ridgeback_lidar",
          "kr5_base_visual", "irb140_link1", "kr120_link2_visual", "iiwa_link2_collision", "puma560_link3_visual",
          "kr120_link5_collision", "vx300s_gripper")

# Requirements the code does not meet on these meshes, as measured (strict xfail: a fix makes
# them pass, and the mark must then go). None now. Fixed: adopted open surfaces were kept on
# Warp's own sign (points up to 5 cm inside kr10_link2_visual and ridgeback_body read outside);
# vx300s_gripper's 11 inward-facing holes inside an outer patch that edges used four times leave
# "open" were turned outward by the orientation repair (winding number 0 -> 2, a hollow made
# solid: points 0.27-1.24 mm outside read inside).
KNOWN_FAILURES: dict[tuple[str, str, str], str] = {}


@lru_cache(maxsize=None)
def case(name: str):
    """Points around a corpus mesh and the reference there: (vertices, triangles, points (P,3),
    signed distance (P,), its gradient (P,3), winding number (P,), gradient ambiguity (P,))."""
    v, t = real_meshes.load(name)
    v64, t64 = v.astype(np.float64), t.astype(np.int64)
    rng = np.random.default_rng(sum(map(ord, name)))  # a seed per mesh, the same in every process
    corners = v64[t64]
    normal = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    area = np.linalg.norm(normal, axis=1)

    def on_surface(count):
        pick = rng.choice(t64.shape[0], size=count, p=area / area.sum())
        r1, r2 = np.sqrt(rng.uniform(size=count)), rng.uniform(size=count)
        c = corners[pick]
        p = (1 - r1)[:, None] * c[:, 0] + (r1 * (1 - r2))[:, None] * c[:, 1] + (r1 * r2)[:, None] * c[:, 2]
        return p, normal[pick] / area[pick, None]

    p, n = on_surface(90)
    near = p + n * (np.exp(rng.uniform(np.log(1e-4), np.log(0.06), 90)) * rng.choice([-1.0, 1.0], 90))[:, None]
    p, n = on_surface(25)
    out = p + n * rng.uniform(RADIUS + ETA + 2 * SEARCH_BOUND, MAX_DIST, 25)[:, None]
    box = rng.uniform(v64.min(0), v64.max(0), (35, 3))
    pts = np.concatenate([near, out, box])
    # reference.signed_distance, with its winding number kept
    closest, distance, _ = ref.closest_point_mesh(pts, v64, t64)
    winding = ref.winding_number(pts, v64, t64)
    sign = np.where(winding > 0.5, -1.0, 1.0)
    sd = sign * distance
    grad = (pts - closest) / np.maximum(distance, 1e-300)[:, None] * sign[:, None]
    ambiguity = ref.gradient_ambiguity(pts, v64, t64, delta=2e-6)
    return v, t, pts, sd, grad, winding, ambiguity


class _Evaluator:
    """SdfMeshWarpPy on one mesh (identity pose) through a regime's world tensors."""

    def __init__(self, name: str, regime: str):
        v, t = real_meshes.load(name)
        self.keep = []
        if regime == "meshworld_auto":
            self.world = MeshWorld(device="cpu")
            self.world.add_mesh("m", v, t)
            self.adopted = None
        else:
            self.world = None
            mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                           indices=wp.array(t.reshape(-1), dtype=wp.int32, device="cpu"), support_winding_number=True)
            raw_idx = torch.tensor([[int(np.uint64(mesh.id).astype(np.int64))]], dtype=torch.int64)
            self.adopted = robot_sdf.adopt_meshes(raw_idx)
            self.keep = [mesh]  # the raw mesh outlives its adoption here, as in a cuRobo world
            pose_inv = torch.zeros((1, 1, 8))
            pose_inv[0, 0, 3] = 1.0
            self.tensors = (self.adopted.mesh_idx, pose_inv, torch.ones((1, 1), dtype=torch.uint8),
                            torch.ones(1, dtype=torch.int32))

    def __call__(self, points: np.ndarray, max_dist: float, esdf: bool) -> tuple[np.ndarray, np.ndarray]:
        """(value (P,), gradient (P,3)) of the cost (spheres of RADIUS) or, with ``esdf``, of
        -signed distance, float64."""
        s = np.concatenate([points, np.full((len(points), 1), RADIUS)], axis=1)[None, None]
        x = torch.tensor(s, dtype=torch.float32).requires_grad_(True)
        cost, grad = torch.zeros(x.shape[:3]), torch.zeros(x.shape)
        args = (x, cost, grad, torch.zeros(x.shape[:3], dtype=torch.uint8), torch.ones(1), torch.full((1,), ETA))
        md = torch.full((1,), max_dist)
        if self.world is not None:
            with self.world.reading() as snap:
                SdfMeshWarpPy.apply(*args, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh,
                                    md, None, False, esdf, snapshot=snap)
        else:
            SdfMeshWarpPy.apply(*args, *self.tensors, md, None, False, esdf, self.adopted.sign_methods)
        return (cost.reshape(-1).numpy().astype(np.float64), grad[..., :3].reshape(-1, 3).numpy().astype(np.float64))


@lru_cache(maxsize=None)
def evaluated(name: str, regime: str):
    """(esdf value, esdf gradient, cost, cost gradient, cost at DEEP_MAX_DIST) at case(name)'s points."""
    if regime == "adopted" and not hasattr(robot_sdf, "adopt_meshes"):
        pytest.skip("robot_sdf has no adopt_meshes")
    pts = case(name)[2]
    evaluate = _Evaluator(name, regime)
    esdf, esdf_grad = evaluate(pts, MAX_DIST, True)
    cost, cost_grad = evaluate(pts, MAX_DIST, False)
    deep, _ = evaluate(pts, DEEP_MAX_DIST, False)
    return esdf, esdf_grad, cost, cost_grad, deep


def _params(check: str):
    out = []
    for name in MESHES:
        for regime in REGIMES:
            reason = KNOWN_FAILURES.get((check, name, regime))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, regime, marks=marks, id=f"{name}-{regime}"))
    return out


def _angles(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Angles in degrees between the rows of a and b (90 where either is zero)."""
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    cos = np.einsum("ij,ij->i", a, b) / np.maximum(na * nb, 1e-300)
    return np.where((na > 0) & (nb > 0), np.degrees(np.arccos(np.clip(cos, -1.0, 1.0))), 90.0)


def _decided(name: str) -> np.ndarray:
    _, _, _, sd, _, winding, _ = case(name)
    return (np.abs(sd) >= SURFACE_MARGIN) & (np.abs(winding - 0.5) >= WINDING_MARGIN)


@pytest.mark.parametrize("name, regime", _params("signs"))
def test_signs_beyond_a_tenth_of_a_millimetre(name, regime):
    _, _, pts, sd, _, _, _ = case(name)
    esdf, _, _, _, _ = evaluated(name, regime)
    decided = _decided(name)
    # ESDF: -sd within MAX_DIST, -MAX_DIST beyond: positive exactly inside.
    wrong = decided & ((esdf > 0) != (sd < 0))
    assert decided.sum() >= 100
    assert not wrong.any(), (f"{int(wrong.sum())} of {int(decided.sum())} points on the wrong side, reference sd "
                             f"{np.round(sd[wrong][:6], 5).tolist()} at {np.round(pts[wrong][:3], 4).tolist()}")


@pytest.mark.parametrize("name, regime", _params("band"))
def test_distance_and_gradient_where_the_cost_is_nonzero(name, regime):
    _, _, pts, sd, grad, _, ambiguity = case(name)
    esdf, esdf_grad, cost, cost_grad, _ = evaluated(name, regime)
    band = _decided(name) & (sd < RADIUS + ETA)
    assert band.sum() >= 50
    error = np.abs(-esdf - sd)
    assert error[band].max() <= DISTANCE_TOLERANCE, (
        f"distance error {error[band].max():.2e} m (reference sd {sd[band][np.argmax(error[band])]:.5f}); "
        f"{int((error[band] > DISTANCE_TOLERANCE).sum())} of {int(band.sum())} points above {DISTANCE_TOLERANCE}")
    want_cost, want_grad = ref.point_cost(pts, np.full(len(pts), RADIUS), [ref.RefMesh(*case(name)[:2])], ETA, 1.0,
                                          MAX_DIST)
    cost_error = np.abs(cost - want_cost)
    assert cost_error[band].max() <= DISTANCE_TOLERANCE, f"cost error {cost_error[band].max():.2e}"
    clear = band & (ambiguity < 5e-3)
    distance_angle = _angles(-esdf_grad, grad)[clear]
    cost_angle = _angles(cost_grad, want_grad)[clear & (want_cost > 0)]
    assert distance_angle.max() <= ANGLE_TOLERANCE, f"distance gradient off by {distance_angle.max():.2f} degrees"
    assert cost_angle.max() <= ANGLE_TOLERANCE, f"cost gradient off by {cost_angle.max():.2f} degrees"


@pytest.mark.parametrize("name, regime", _params("deep"))
def test_every_centre_inside_is_costed(name, regime):
    _, _, pts, sd, _, _, _ = case(name)
    _, _, _, _, deep = evaluated(name, regime)
    inside = _decided(name) & (sd < 0)
    if inside.sum() < 10:
        pytest.skip(f"{int(inside.sum())} decided points inside the mesh as given (its winding number: "
                    f"bench.real_meshes.winding_survey)")
    want, _ = ref.cost_of_penetration(RADIUS + ETA - sd, ETA)
    missed = inside & (deep <= 0)
    assert not missed.any(), (f"{int(missed.sum())} of {int(inside.sum())} centres inside cost 0 at max_dist "
                              f"{DEEP_MAX_DIST}; depths {np.round(-sd[missed][:6], 4).tolist()}")
    error = np.abs(deep - want)[inside]
    assert error.max() <= DISTANCE_TOLERANCE, f"cost error {error.max():.2e} at depth {-sd[inside][np.argmax(error)]:.4f}"


@pytest.mark.parametrize("name, regime", _params("zero"))
def test_cost_is_exactly_zero_beyond_the_band(name, regime):
    _, _, pts, sd, _, winding, _ = case(name)
    _, _, cost, cost_grad, _ = evaluated(name, regime)
    beyond = (sd > RADIUS + ETA + SEARCH_BOUND) & (np.abs(winding - 0.5) >= WINDING_MARGIN)
    assert beyond.sum() >= 15
    costed = beyond & ((cost != 0) | np.any(cost_grad != 0, axis=1))
    assert not costed.any(), (f"{int(costed.sum())} of {int(beyond.sum())} points beyond r + eta + {SEARCH_BOUND} m "
                              f"costed: cost {cost[costed][:6].tolist()} at reference sd {sd[costed][:6].tolist()}")


def test_a_mesh_pack_loads_the_meshes_as_the_files_give_them(tmp_path, monkeypatch):
    """python -m bench.real_meshes --pack: a machine without rtb-data (a GPU image) loads from the
    pack exactly what the files give here, an STL and a COLLADA mesh alike."""
    names = ["panda_link0_visual", "kr3_link4_visual"]  # COLLADA, STL
    direct = [real_meshes.load(n) for n in names]
    pack = tmp_path / "meshes.npz"
    assert real_meshes.main(["--pack", str(pack), *names]) == 0
    monkeypatch.setenv(real_meshes.PACK_VARIABLE, str(pack))
    real_meshes._load_cached.cache_clear()
    try:
        for name, (v, t) in zip(names, direct):
            pv, pt = real_meshes.load(name)
            assert pv.dtype == np.float32 and pt.dtype == np.int32 and len(t) > 1000
            assert np.array_equal(pv, v) and np.array_equal(pt, t)
        with pytest.raises(KeyError):
            real_meshes.load("kr120_link2_visual")  # not in the pack
    finally:
        real_meshes._load_cached.cache_clear()
