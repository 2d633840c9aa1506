"""robot_sdf.kernels.winding: Warp's winding number in tiers (the coarse tier within its margin of
Warp's default accuracy, which is within its stated error of the exact winding number), the
inside verdicts against the exact winding number of test/reference.py, the bound that declares
far points of open surfaces outside, and the rim chunks' bound on the winding number's gradient
(central differences of the exact one)."""
from __future__ import annotations

import numpy as np
import pytest
import warp as wp

import mesh_corpus as corpus
import reference as ref
from bench import scenes
from mesh_corpus import open_bowl
from robot_sdf import MeshWorld, SignMethod
from robot_sdf.kernels import native, sign_data, winding
from robot_sdf.kernels.closest_point import UNBOUNDED


# ------------------------------------------------------------------------------ the tiers
@wp.kernel
def _coarse_and_fine_winding(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), accuracy: float,
                             coarse: wp.array(dtype=float), fine: wp.array(dtype=float)):
    i = wp.tid()
    coarse[i] = native.winding_number(mesh, pts[i], accuracy)
    fine[i] = native.winding_number(mesh, pts[i], winding.WINDING_ACCURACY)


def _warp_winding_numbers(v: np.ndarray, t, pts: np.ndarray, accuracy: float):
    """A CPU wp.Mesh of (v, t) with winding-number support, and Warp's winding numbers of pts
    (N,3) at ``accuracy`` and at WINDING_ACCURACY: (mesh, coarse (N,), fine (N,))."""
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(np.asarray(t, np.int32).reshape(-1), dtype=wp.int32, device="cpu"),
                   support_winding_number=True)
    coarse = wp.zeros(len(pts), dtype=float, device="cpu")
    fine = wp.zeros(len(pts), dtype=float, device="cpu")
    wp.launch(_coarse_and_fine_winding, len(pts), [mesh.id, wp.array(pts, dtype=wp.vec3, device="cpu"), float(accuracy),
                                                    coarse, fine], device="cpu")
    return mesh, coarse.numpy(), fine.numpy()


@wp.kernel
def _surface_distance(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), distance: wp.array(dtype=float)):
    i = wp.tid()
    q = wp.mesh_query_point_no_sign(mesh, pts[i], 1.0e6)
    distance[i] = wp.length(pts[i] - wp.mesh_eval_position(mesh, q.face, q.u, q.v))


@pytest.mark.parametrize("case", corpus.CORPUS, ids=lambda c: c.name)
def test_coarse_winding_number_within_margin(case):
    """The inside test decides from the winding number at COARSEST_WINDING_ACCURACY unless it lies
    within COARSEST_WINDING_SETTLED of 0.5 (then at Warp's default accuracy); that keeps Warp's own
    sign only while the coarse accuracy differs from Warp's default by less than its margin.
    Checked with room to spare (half the margin) on points in, around and near every corpus mesh."""
    accuracy, margin = winding.COARSEST_WINDING_ACCURACY, winding.COARSEST_WINDING_SETTLED

    v, t = case.build()
    v = np.asarray(v, np.float32)
    rng = np.random.default_rng(5)
    tri = v[np.asarray(t)]
    near = tri.mean(1) + rng.normal(scale=0.01 * float(np.ptp(v, 0).max()), size=tri.shape[:1] + (3,))
    pts = np.concatenate([corpus.sample_points(v, 4000), near[:4000]]).astype(np.float32)
    _, coarse, fine = _warp_winding_numbers(v, t, pts, accuracy)
    gap = np.abs(coarse - fine)
    assert gap.max() < 0.5 * margin, (case.name, float(gap.max()))


def _perception_scan():
    m = scenes.perception_mesh()
    return m.vertices, m.triangles


# Fewer points on the large meshes: the numpy winding number costs points x triangles.
_APPROXIMATION_CASES = [(c.name, c.build, 1000 if c.name == "sliver_box" else 2000) for c in corpus.CORPUS] \
    + [("perception_scan", _perception_scan, 400)]


@pytest.mark.parametrize("name, build, count", _APPROXIMATION_CASES, ids=[c[0] for c in _APPROXIMATION_CASES])
def test_warp_winding_number_within_approximation_error(name, build, count):
    """The swept samples' rim shortcut (docs/sign_methods.md, "Swept samples on open surfaces")
    counts Warp's error at WINDING_ACCURACY (far-field expansion, float32 solid angles) as at most
    E = WINDING_APPROXIMATION_ERROR at each end of a step. Checked against the exact winding number
    (solid angles in numpy, float64) on points in, around and near every corpus mesh and the
    perception scan: farther from the surface than 0.1 % of the mesh's size, below E / 2 (room to
    spare); closer (float32 rounding of the nearest triangles' solid angles grows there: 0.022 at
    60 um on arm_link_fine), below 1.5 E, within the 2 E that keeps the shortcut's verdict the exact
    winding number's. Points on the surface (where the winding number jumps) are left out."""
    v, t = build()
    v = np.asarray(v, np.float32)
    t = np.asarray(t, np.int64)
    rng = np.random.default_rng(8)
    size = float(np.ptp(v, 0).max())
    centres = v[t].mean(1)
    near = centres[rng.choice(len(t), count // 2)] + rng.normal(scale=0.01 * size, size=(count // 2, 3))
    pts = np.concatenate([corpus.sample_points(v, count // 2), near]).astype(np.float32)
    mesh, _, fine = _warp_winding_numbers(v, t, pts, winding.WINDING_ACCURACY)
    error = np.abs(fine - ref.winding_number(pts, v, t))
    distance = wp.zeros(len(pts), dtype=float, device="cpu")  # Warp's closest point: only a filter
    wp.launch(_surface_distance, len(pts), [mesh.id, wp.array(pts, dtype=wp.vec3, device="cpu"), distance],
              device="cpu")
    distance = distance.numpy()
    far, off = distance > 1e-3 * size, distance > 1e-6 * size
    assert far.sum() > 0.9 * len(pts) and off.sum() > 0.98 * len(pts)
    error_bound = float(winding.WINDING_APPROXIMATION_ERROR)
    assert error[far].max() < 0.5 * error_bound, (name, float(error[far].max()))
    assert error[off].max() < 1.5 * error_bound, (name, float(error[off].max()))

@wp.kernel
def _verdicts_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), inside: wp.array(dtype=wp.int32),
                     clear_inside: wp.array(dtype=wp.int32), clearance: wp.array(dtype=float),
                     fine: wp.array(dtype=float), batched: wp.array(dtype=wp.int32)):
    i = wp.tid()
    p = pts[i]
    inside[i] = wp.where(winding.winding_inside(mesh, p), 1, 0)
    verdict, c = winding.winding_clearance(mesh, p)
    clear_inside[i] = wp.where(verdict, 1, 0)
    clearance[i] = c
    fine[i] = native.winding_number(mesh, p, winding.WINDING_ACCURACY)
    # The same point as the centre of a step of 5 + 4 points, every lane asked for.
    d = wp.vec3(0.013, -0.007, 0.011) * float(i % 5)
    lanes = winding.batched_winding_inside(mesh, p, d, -d, 0.125, 5, 4, 0x3FF)
    batched[i] = lanes


@pytest.mark.parametrize("name", ["open_cup", "nested_shells", "self_intersecting_shell", "capsule", "open_cup_flipped"])
def test_inside_verdicts_are_the_exact_winding_numbers(name):
    """winding_inside (coarse tier, then Warp's default accuracy) says inside exactly where the
    exact winding number is above 1/2, for points clear of 1/2 and of the surface; winding_clearance
    gives the same verdict and a clearance that bounds Warp's default-accuracy value away from
    1/2; batched_winding_inside gives each of a step's points the verdict winding_inside gives it."""
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    v = np.asarray(v, np.float32)
    pts = corpus.sample_points(v, 3000).astype(np.float32)
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(np.asarray(t, np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   support_winding_number=True)
    n = len(pts)
    outs = [wp.zeros(n, dtype=dt, device="cpu") for dt in (wp.int32, wp.int32, float, float, wp.int32)]
    wp.launch(_verdicts_kernel, n, [mesh.id, wp.array(pts, dtype=wp.vec3, device="cpu"), *outs], device="cpu")
    inside, clear_inside, clearance, fine, batched = (o.numpy() for o in outs)
    exact = ref.winding_number(pts, v, t)
    distance = ref.unsigned_distance(pts, v, t)
    clear = (np.abs(exact - 0.5) > 0.05) & (distance > 1e-3)
    assert clear.mean() > 0.8 and 0.05 < (exact[clear] > 0.5).mean() < 0.95
    np.testing.assert_array_equal(inside[clear], (exact[clear] > 0.5).astype(np.int32))
    np.testing.assert_array_equal(clear_inside, inside)
    assert np.all(np.abs(fine - 0.5) >= clearance - 1e-6)
    # Lane 0 of each step is the point itself; the others are checked against their own evaluation.
    np.testing.assert_array_equal(batched & 1, inside)
    # The points as the kernel forms them, in float32: p + d (0.125 j) for j = 1..5, p - d (0.125 j)
    # for j = 1..4, d = (0.013, -0.007, 0.011) (i % 5).
    d = np.array([0.013, -0.007, 0.011], np.float32)[None] * (np.arange(n) % 5).astype(np.float32)[:, None]
    others, own = [], []
    for j in range(1, 10):
        s = np.float32(0.125 * (j if j <= 5 else j - 5))
        others.append(pts + (d if j <= 5 else -d) * s)
        own.append((batched >> j) & 1)
    q = np.concatenate(others)
    q_inside = wp.zeros(len(q), dtype=wp.int32, device="cpu")
    scratch = [wp.zeros(len(q), dtype=dt, device="cpu") for dt in (wp.int32, float, float, wp.int32)]
    wp.launch(_verdicts_kernel, len(q), [mesh.id, wp.array(q, dtype=wp.vec3, device="cpu"), q_inside, *scratch],
              device="cpu")
    np.testing.assert_array_equal(np.concatenate(own), q_inside.numpy())


# ------------------------------------------------------------------------ open surfaces, far
@wp.kernel
def _outside_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), searched: wp.array(dtype=float),
                    outside: wp.array(dtype=wp.int32)):
    i = wp.tid()
    data = sign_data.sign_data_offset(mesh)
    outside[i] = wp.where(winding.open_winding_outside(mesh, data, pts[i], searched[i], 0.0), 1, 0)


@pytest.mark.parametrize("name", ["open_cup", "open_bowl", "open_cup_flipped"])
def test_far_points_declared_outside_are_outside(name):
    """open_winding_outside, given each point's true distance to the surface, declares a point
    outside only where the exact winding number is below 1/2; it does so for most points farther
    than the surface's size."""
    v, t = open_bowl() if name == "open_bowl" else next(c for c in corpus.CORPUS if c.name == name).build()
    world = MeshWorld(device="cpu", mesh_capacity=1, sign_method=SignMethod.WINDING_NUMBER)
    world.add_mesh("open", v, t)
    snap = world.snapshot()
    mesh_id, shift = int(snap.mesh_idx[0, 0]), snap.mesh_pose_inverse[0, 0, :3].numpy().astype(np.float64)
    assert np.allclose(snap.mesh_pose_inverse[0, 0, 3:7].numpy(), [1, 0, 0, 0])  # a translation only
    size = float(np.ptp(v, 0).max())
    rng = np.random.default_rng(6)
    direction = rng.normal(size=(3000, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    pts = v.mean(0) + direction * rng.uniform(0.0, 3.0 * size, size=(3000, 1))
    searched = ref.unsigned_distance(pts, v, t)
    outside = wp.zeros(len(pts), dtype=wp.int32, device="cpu")
    wp.launch(_outside_kernel, len(pts), [wp.uint64(mesh_id), wp.array((pts + shift).astype(np.float32), dtype=wp.vec3,
              device="cpu"), wp.array(searched.astype(np.float32) * 0.999, dtype=float, device="cpu"), outside],
              device="cpu")
    outside = outside.numpy().astype(bool)
    exact = ref.winding_number(pts, v, t)
    assert np.all(exact[outside] < 0.5)
    assert outside[searched > size].mean() > 0.9 and (exact > 0.5).sum() > 10


@wp.kernel
def _escape_bound(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), spread: wp.array(dtype=float),
                  out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = winding.rim_escape_bound(mesh, sign_data.sign_data_offset(mesh), pts[i], spread[i])


@pytest.mark.parametrize("surface", ["sheet", "bowl", "cup", "kr10_link2_visual"])
def test_rim_escape_bound_bounds_the_winding_number(surface):
    """winding.rim_escape_bound(p, spread) bounds |w(q)| of the exact winding number at a random
    point q within spread of each of 1,200 points p outside the surface's box (spread 0 to 0.9 of
    p's distance to the box), and is finite there; it puts most of those with a spread below 0.2 of
    that distance below 0.48 (outside), and on the sheet it is within 4x of |w| at its tightest
    (so a bound 4x too small fails)."""
    if surface == "kr10_link2_visual":
        from bench import real_meshes
        v, t = real_meshes.load(surface)
        v = v.astype(np.float64)
    else:
        v, t = {"sheet": lambda: ref.sheet(0.6, 6), "bowl": open_bowl, "cup": corpus.open_cup}[surface]()
    world = MeshWorld(device="cpu", mesh_capacity=1, sign_method=SignMethod.WINDING_NUMBER)
    world.add_mesh("open", v, t)
    snap = world.snapshot()
    mesh_id, shift = int(snap.mesh_idx[0, 0]), snap.mesh_pose_inverse[0, 0, :3].numpy().astype(np.float64)
    assert np.allclose(snap.mesh_pose_inverse[0, 0, 3:7].numpy(), [1, 0, 0, 0])  # a translation only
    lo, hi = v.min(0), v.max(0)
    size = float(np.ptp(v, 0).max())
    rng = np.random.default_rng(21)
    p = rng.uniform(lo - size, hi + size, size=(4000, 3))
    gap = np.linalg.norm(np.maximum(np.maximum(lo - p, p - hi), 0.0), axis=1)
    keep = gap > 1e-3 * size
    p, gap = p[keep][:1200], gap[keep][:1200]
    spread = rng.uniform(0.0, 0.9, size=len(p)) * gap
    direction = rng.normal(size=p.shape)
    q = p + direction / np.linalg.norm(direction, axis=1)[:, None] * (spread * rng.uniform(size=len(p)) ** (1 / 3))[:, None]
    bound = wp.zeros(len(p), dtype=float, device="cpu")
    wp.launch(_escape_bound, len(p), [wp.uint64(mesh_id), wp.array((p + shift).astype(np.float32), dtype=wp.vec3,
                                                                    device="cpu"),
                                      wp.array(spread.astype(np.float32), dtype=float, device="cpu"), bound],
              device="cpu")
    bound = bound.numpy().astype(np.float64)
    exact = np.abs(ref.winding_number(q, v, t))
    assert np.all(bound < float(UNBOUNDED))
    assert np.all(exact <= bound), (surface, float((bound / np.maximum(exact, 1e-30)).min()))
    near_p = spread < 0.2 * gap
    assert (bound < 0.48)[near_p].mean() > 0.6, (surface, float((bound < 0.48)[near_p].mean()))
    if surface == "sheet":
        tightest = float((bound / np.maximum(exact, 1e-30)).min())
        assert tightest < 4.0, tightest


# ------------------------------------------------------------------------------ the rim bound
@wp.kernel
def _rim_slope(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), reach: wp.array(dtype=float),
               out: wp.array(dtype=float)):
    i = wp.tid()
    out[i] = winding.rim_slope(mesh, sign_data.sign_data_offset(mesh), pts[i], reach[i])


def _winding_gradient_norm(points: np.ndarray, v: np.ndarray, t: np.ndarray, h: float = 1e-5) -> np.ndarray:
    """|grad w| of the exact winding number (numpy, float64) by central differences."""
    g = np.stack([(ref.winding_number(points + h * e, v, t) - ref.winding_number(points - h * e, v, t)) / (2 * h)
                  for e in np.eye(3)], axis=1)
    return np.linalg.norm(g, axis=1)


@pytest.mark.parametrize("surface", ["sheet", "bowl", "cup"])
def test_rim_slope_bounds_the_winding_number_gradient(surface):
    """winding.rim_slope(p, reach) bounds |grad w| of the exact winding number at every point
    within reach of p (off the surface, where the swept rim shortcut uses it): checked at a random
    point q within reach of each of 1,500 points p around three open surfaces, reach 0 to 0.9 of
    p's distance to the surface, against central differences of the numpy winding number. On the
    sheet the bound is within 1.3-1.5x of the gradient near its straight rim (the triangle
    inequality over a line integral), so a bound 0.75x too small fails."""
    v, t = {"sheet": lambda: ref.sheet(0.6, 6), "bowl": open_bowl, "cup": corpus.open_cup}[surface]()
    world = MeshWorld(device="cpu", mesh_capacity=1, max_distance=0.2, sign_method=SignMethod.WINDING_NUMBER)
    world.add_mesh("open", v, t)
    mesh_id = int(world.snapshot().mesh_idx[0, 0])
    rng = np.random.default_rng(12)
    p = rng.uniform(v.min(0) - 0.1, v.max(0) + 0.1, size=(1600, 3))
    d = ref.unsigned_distance(p, v, t)
    p, d = p[d > 2e-3][:1500], d[d > 2e-3][:1500]
    reach = rng.uniform(0.0, 0.9, size=len(p)) * d
    direction = rng.normal(size=p.shape)
    q = p + direction / np.linalg.norm(direction, axis=1)[:, None] * (reach * rng.uniform(size=len(p)) ** (1 / 3))[:, None]
    bound = wp.zeros(len(p), dtype=float, device="cpu")
    wp.launch(_rim_slope, len(p), [wp.uint64(mesh_id), wp.array(p.astype(np.float32), dtype=wp.vec3, device="cpu"),
                                   wp.array(reach.astype(np.float32), dtype=float, device="cpu"), bound], device="cpu")
    bound = bound.numpy()
    gradient = _winding_gradient_norm(q, v, t)
    finite = bound < float(UNBOUNDED)
    assert finite.mean() > 0.75
    ratio = bound[finite] / gradient[finite]
    assert ratio.min() >= 1.0, (surface, float(ratio.min()))
    if surface == "sheet":
        assert ratio.min() < 1.33 / 0.75, float(ratio.min())
