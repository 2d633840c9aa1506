"""Checks of the numpy reference itself against closed-form geometry, so it can be trusted."""

from __future__ import annotations

import numpy as np
import pytest

import reference as ref


def box_sdf(p: np.ndarray, half: np.ndarray):
    """Analytic signed distance and gradient of an axis-aligned box (half extents `half`)."""
    q = np.abs(p) - half
    outside = np.linalg.norm(np.maximum(q, 0.0), axis=-1)
    inside = np.minimum(q.max(axis=-1), 0.0)
    sd = outside + inside
    g = np.zeros_like(p)
    out = outside > 0
    g[out] = np.maximum(q[out], 0.0) * np.sign(p[out]) / outside[out, None]
    k = np.argmax(q[~out], axis=-1)
    gi = np.zeros((int((~out).sum()), 3))
    gi[np.arange(len(k)), k] = np.sign(p[~out][np.arange(len(k)), k])
    g[~out] = gi
    return sd, g


def test_box_faces_point_outward():
    v, t = ref.box((0.4, 0.6, 0.8))
    a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]
    n = np.cross(b - a, c - a)
    centroid = (a + b + c) / 3.0
    assert np.all(np.sum(n * centroid, axis=1) > 0)
    vs, ts = ref.icosphere(1.0, 1)
    a, b, c = vs[ts[:, 0]], vs[ts[:, 1]], vs[ts[:, 2]]
    assert np.all(np.sum(np.cross(b - a, c - a) * (a + b + c), axis=1) > 0)


def test_closest_point_triangle_regions():
    a = np.array([[[0.0, 0.0, 0.0]]])
    b = np.array([[[1.0, 0.0, 0.0]]])
    c = np.array([[[0.0, 1.0, 0.0]]])
    cases = {
        (0.2, 0.3, 0.5): (0.2, 0.3, 0.0),  # face
        (-1.0, -1.0, 0.3): (0.0, 0.0, 0.0),  # vertex a
        (2.0, -0.5, 0.0): (1.0, 0.0, 0.0),  # vertex b
        (-0.1, 3.0, 1.0): (0.0, 1.0, 0.0),  # vertex c
        (0.5, -2.0, 0.0): (0.5, 0.0, 0.0),  # edge ab
        (-2.0, 0.4, -1.0): (0.0, 0.4, 0.0),  # edge ac
        (1.0, 1.0, 0.0): (0.5, 0.5, 0.0),  # edge bc
    }
    for p, expected in cases.items():
        got = ref.closest_point_triangles(np.array([[p]]), a, b, c)[0, 0]
        np.testing.assert_allclose(got, expected, atol=1e-12, err_msg=str(p))


def test_closest_point_matches_dense_sampling():
    """Brute force check of the region logic: no sampled point of the triangle is closer."""
    rng = np.random.default_rng(0)
    tri = rng.normal(size=(3, 3))
    uv = rng.uniform(size=(20000, 2))
    flip = uv.sum(axis=1) > 1
    uv[flip] = 1 - uv[flip]
    samples = tri[0] + uv[:, :1] * (tri[1] - tri[0]) + uv[:, 1:] * (tri[2] - tri[0])
    pts = rng.normal(size=(200, 3)) * 2
    cp = ref.closest_point_triangles(pts[:, None], tri[0][None, None], tri[1][None, None], tri[2][None, None])[:, 0]
    d = np.linalg.norm(cp - pts, axis=1)
    d_samples = np.linalg.norm(samples[None] - pts[:, None], axis=2).min(axis=1)
    assert np.all(d <= d_samples + 1e-12)
    assert np.all(d_samples - d < 0.05)


def test_box_signed_distance_analytic():
    rng = np.random.default_rng(1)
    half = np.array([0.2, 0.3, 0.4])
    v, t = ref.box(2 * half)
    pts = rng.uniform(-0.8, 0.8, size=(2000, 3))
    sd, g, _ = ref.signed_distance(pts, v, t)
    sd_a, g_a = box_sdf(pts, half)
    np.testing.assert_allclose(sd, sd_a, atol=1e-12)
    # gradients are ambiguous on the medial axis of the box interior: compare away from it
    q = np.sort(np.abs(pts) - half, axis=1)
    clear = (sd_a > 0) | (q[:, 2] - q[:, 1] > 1e-3)
    np.testing.assert_allclose(g[clear], g_a[clear], atol=1e-9)
    assert np.any(sd < 0) and np.any(sd > 0)


def test_cube_inside_outside_by_winding_number():
    v, t = ref.box((1.0, 1.0, 1.0))
    inside = np.array([[0.0, 0.0, 0.0], [0.49, 0.49, -0.49], [0.1, -0.3, 0.2]])
    outside = np.array([[0.51, 0.0, 0.0], [2.0, 2.0, 2.0], [0.0, -0.6, 0.0]])
    np.testing.assert_allclose(ref.winding_number(inside, v, t), 1.0, atol=1e-9)
    np.testing.assert_allclose(ref.winding_number(outside, v, t), 0.0, atol=1e-9)


def test_sphere_mesh_distance():
    v, t = ref.icosphere(0.5, 3)
    # the sphere mesh is inscribed: every face lies between the sagitta and the radius
    edge = np.linalg.norm(v[t[:, 0]] - v[t[:, 1]], axis=1).max()
    sagitta = 0.5 - np.sqrt(0.5**2 - (edge / np.sqrt(3)) ** 2)
    rng = np.random.default_rng(2)
    dirs = rng.normal(size=(300, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    radii = rng.uniform(0.0, 1.5, size=300)
    pts = dirs * radii[:, None]
    sd, g, _ = ref.signed_distance(pts, v, t)
    exact = radii - 0.5
    assert np.all(sd >= exact - 1e-12)
    assert np.all(sd <= exact + sagitta + 1e-12)
    far = radii > 0.8
    # the gradient of a sphere points radially
    assert np.all(np.sum(g[far] * dirs[far], axis=1) > 0.99)
    # along a face normal through the face centroid the distance is exact
    a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]
    n = np.cross(b - a, c - a)
    n /= np.linalg.norm(n, axis=1, keepdims=True)
    cen = (a + b + c) / 3
    for h in (0.05, -0.02):
        sdf, _, _ = ref.signed_distance(cen[:50] + h * n[:50], v, t)
        np.testing.assert_allclose(sdf, h, atol=1e-12)


def test_winding_number_open_meshes():
    # flat square sheet: solid angle on the axis at height z is 4 asin(a^2 / (a^2 + 4 z^2))
    v, t = ref.sheet(1.0, 3)
    for z in (0.05, 0.3, -0.05, -1.0):
        w = ref.winding_number(np.array([[0.0, 0.0, z]]), v, t)[0]
        expected = -np.sign(z) * 4 * np.arcsin(1 / (1 + 4 * z * z)) / (4 * np.pi)
        np.testing.assert_allclose(w, expected, atol=1e-12)
    # open-topped cube: from the centre the missing face covers 1/6 of the sphere
    v, t = ref.open_box((1.0, 1.0, 1.0))
    np.testing.assert_allclose(ref.winding_number(np.zeros((1, 3)), v, t), 5 / 6, atol=1e-12)
    assert ref.winding_number(np.array([[0.0, 0.0, 2.0]]), v, t)[0] < 0.5
    assert ref.signed_distance(np.array([[0.0, 0.0, -0.3]]), v, t)[0][0] == pytest.approx(-0.2)


def test_pose_inverse_and_transform():
    rng = np.random.default_rng(3)
    for _ in range(10):
        pose = ref.random_pose(rng)
        pts = rng.normal(size=(5, 3))
        back = ref.transform_points(ref.pose_inverse(pose), ref.transform_points(pose, pts))
        np.testing.assert_allclose(back, pts, atol=1e-12)
        R = ref.quat_to_matrix(pose[3:])
        np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
        q2 = ref.random_quaternion(rng)
        np.testing.assert_allclose(
            ref.quat_to_matrix(ref.quat_multiply(pose[3:], q2)), R @ ref.quat_to_matrix(q2), atol=1e-12
        )
    # 90 degrees about z maps x to y
    q = np.array([np.cos(np.pi / 4), 0, 0, np.sin(np.pi / 4)])
    np.testing.assert_allclose(ref.quat_to_matrix(q) @ [1, 0, 0], [0, 1, 0], atol=1e-12)


def test_posed_mesh_distance_and_gradient():
    rng = np.random.default_rng(4)
    half = np.array([0.1, 0.2, 0.15])
    v, t = ref.box(2 * half)
    pose = ref.random_pose(rng)
    mesh = ref.RefMesh(v, t, pose)
    local = rng.uniform(-0.5, 0.5, size=(300, 3))
    local = local[np.abs(box_sdf(local, half)[0]) > 0.02]
    world = ref.transform_points(pose, local)
    sd, g = mesh.signed_distance_world(world)
    np.testing.assert_allclose(sd, box_sdf(local, half)[0], atol=1e-12)
    # finite differences of the world-frame distance
    h = 1e-6
    for axis in range(3):
        e = np.zeros(3)
        e[axis] = h
        fd = (mesh.signed_distance_world(world + e)[0] - mesh.signed_distance_world(world - e)[0]) / (2 * h)
        ok = np.abs(fd - g[:, axis]) < 1e-5
        assert ok.mean() > 0.97  # the few misses are medial-axis points inside the box


def test_cost_piecewise_and_continuous():
    eta = 0.05
    d = np.array([-0.1, 0.0, 0.02, 0.05, 0.2])
    c, dc = ref.cost_of_penetration(d, eta)
    np.testing.assert_allclose(c, [0, 0, 0.0004 / 0.1, 0.025, 0.175])
    np.testing.assert_allclose(dc, [0, 0, 0.4, 1.0, 1.0])
    # C1 at d = eta
    e = 1e-9
    assert abs(ref.cost_of_penetration(eta - e, eta)[0] - ref.cost_of_penetration(eta + e, eta)[0]) < 1e-8


def test_point_cost_sums_meshes_and_cuts_off():
    half = np.array([0.1, 0.1, 0.1])
    v, t = ref.box(2 * half)
    m1 = ref.RefMesh(v, t, np.array([0.3, 0, 0, 1, 0, 0, 0.0]))
    m2 = ref.RefMesh(v, t, np.array([-0.3, 0, 0, 1, 0, 0, 0.0]))
    p = np.array([[0.0, 0.0, 0.0]])  # 0.2 from both boxes
    r, eta = 0.18, 0.05
    c, g = ref.point_cost(p, np.array([r]), [m1, m2], eta, 2.0, 0.5)
    d = r + eta - 0.2
    np.testing.assert_allclose(c, 2.0 * 2 * d * d / (2 * eta))
    np.testing.assert_allclose(g, 0.0, atol=1e-12)  # symmetric pull cancels
    c1, g1 = ref.point_cost(p, np.array([r]), [m1], eta, 1.0, 0.5)
    np.testing.assert_allclose(g1[0], [d / eta, 0, 0])  # towards more penetration (+x)
    # radius < 0: off
    c2, g2 = ref.point_cost(np.array([[0.3, 0, 0]]), np.array([-1.0]), [m1], eta, 1.0, 0.5)
    assert c2[0] == 0 and np.all(g2 == 0)
    # deep inside a large box: full cost regardless of max_dist
    vb, tb = ref.box((4.0, 4.0, 4.0))
    c3, _ = ref.point_cost(np.zeros((1, 3)), np.array([0.1]), [ref.RefMesh(vb, tb)], eta, 1.0, 0.1)
    np.testing.assert_allclose(c3, 0.1 + eta + 2.0 - eta / 2)
    # esdf
    val, ge = ref.point_esdf(np.array([[0.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.3, 0.05, 0.0]]), [m1, m2], 1.0, 0.5)
    np.testing.assert_allclose(val, [-0.2, -0.5, 0.05])
    np.testing.assert_allclose(ge[1], 0.0)
    np.testing.assert_allclose(ge[2], [0, -1, 0], atol=1e-12)


def test_clearance():
    v, t = ref.box((0.2, 0.2, 0.2))
    m = [ref.RefMesh(v, t)]
    pts = np.array([[0.5, 0, 0], [5.0, 0, 0], [0.0, 0, 0]])
    c = ref.clearance(pts, np.array([0.1, 0.1, 0.1]), m, 0.05, 1.0)
    np.testing.assert_allclose(c, [0.4 - 0.15, 1.0, 0.0])
    np.testing.assert_allclose(ref.clearance(pts, np.full(3, 0.1), [], 0.05, 0.7), 0.7)


def test_swept_rule_samples_by_hand():
    """Point sphere (r = 0) moving +x into a box whose face is at x = 0.25 (box spans 0.25..0.45)."""
    v, t = ref.box((0.2, 0.2, 0.2))
    envs = [[ref.RefMesh(v, t, np.array([0.35, 0, 0, 1, 0, 0, 0.0]))]]
    s = np.zeros((1, 2, 1, 4))
    s[0, :, 0, 0] = [0.18, 0.58]
    eta = 0.05
    c, _ = ref.swept_sphere_cost(s, envs, eta, 1.0, 1.0, sweep_steps=4)
    # step 0: one side (h = 2), samples at s = 1/8..4/8 of the 0.4 m segment: x = 0.23, 0.28,
    # 0.33, 0.38 with sd = 0.02, -0.03, -0.08, -0.07 -> d = 0.03, 0.08, 0.13, 0.12; trapezoid
    # weights 1/8 (x = 0.18, cost 0), 1/4, 1/4, 1/4, 1/8
    expected = (0.03**2 / (2 * eta) + (0.08 - eta / 2) + (0.13 - eta / 2)) / 4 + (0.12 - eta / 2) / 8
    np.testing.assert_allclose(c[0, 0, 0], expected, rtol=1e-9)
    # step 1 from x = 0.58 (sd 0.13): x = 0.53 (sd 0.08), 0.48 (0.03), 0.43 (-0.02), 0.38 (-0.07)
    expected1 = (0.0 + 0.02**2 / (2 * eta) + (0.07 - eta / 2)) / 4 + (0.12 - eta / 2) / 8
    np.testing.assert_allclose(c[0, 1, 0], expected1, rtol=1e-9)
    # with sweep_steps = 1: p[t] and the midpoint, 1/2 each
    c1, _ = ref.swept_sphere_cost(s, envs, eta, 1.0, 1.0, sweep_steps=1)
    np.testing.assert_allclose(c1[0, :, 0], 0.5 * (0.12 - eta / 2), rtol=1e-9)


def test_swept_weights_sum_to_one():
    for k in (1, 2, 3, 4, 7):
        for sides in (1, 2):
            w_p, frac, w = ref.swept_weights(k, sides)
            np.testing.assert_allclose(w_p + sides * w.sum(), 1.0, rtol=1e-12)
            np.testing.assert_allclose(frac, np.arange(1, k + 1) / (2 * k))
            assert w_p == 0.5 / k
            assert w[-1] == (0.5 * w[0] if k > 1 else 0.5 / sides)
    assert ref.swept_weights(0, 2)[0] == 1.0 and ref.swept_weights(3, 0)[0] == 1.0


def test_swept_reference_gradient_is_its_derivative():
    """The reference's own partials against its own central differences (float64)."""
    rng = np.random.default_rng(7)
    v, t = ref.icosphere(0.2, 2)
    envs = [[ref.RefMesh(v, t)]]
    ang = np.linspace(0.0, 0.6, 4)
    s = np.zeros((1, 4, 1, 4))
    s[0, :, 0, :3] = np.stack([0.24 * np.cos(ang), 0.24 * np.sin(ang), 0.01 * rng.normal(size=4)], axis=1)
    s[..., 3] = 0.03
    w = rng.uniform(-1, 1, size=(1, 4, 1))
    cost, own, prev, nxt = ref.swept_sphere_partials(s, envs, 0.04, 1.0, 0.5, 3)
    assert np.all(cost > 0)
    grad = ref.swept_chain_rule(own, prev, nxt, w)
    eps = 1e-6
    for idx in np.ndindex(1, 4, 1, 3):
        a, b = s.copy(), s.copy()
        a[idx] += eps
        b[idx] -= eps
        fd = (np.sum(w * ref.swept_sphere_partials(a, envs, 0.04, 1.0, 0.5, 3)[0])
              - np.sum(w * ref.swept_sphere_partials(b, envs, 0.04, 1.0, 0.5, 3)[0])) / (2 * eps)
        np.testing.assert_allclose(grad[idx], fd, atol=1e-6)


def test_speed_metric_formula():
    rng = np.random.default_rng(5)
    p = rng.normal(size=(1, 3, 1, 3))
    cost = np.array([[[1.0], [2.0], [3.0]]])
    grad = rng.normal(size=(1, 3, 1, 3))
    dt = 0.1
    c, g = ref.speed_metric(cost, grad, p, dt)
    v = (p[0, 2, 0] - p[0, 0, 0]) / (2 * dt)
    s = np.linalg.norm(v)
    a = (p[0, 0, 0] + p[0, 2, 0] - 2 * p[0, 1, 0]) / dt**2
    P = np.eye(3) - np.outer(v, v) / s**2
    np.testing.assert_allclose(c[0, 1, 0], s * 2.0)
    np.testing.assert_allclose(g[0, 1, 0], s * (P @ grad[0, 1, 0] - 2.0 * P @ (a / s**2)))
    np.testing.assert_array_equal(c[0, [0, 2]], cost[0, [0, 2]])
    np.testing.assert_array_equal(g[0, [0, 2]], grad[0, [0, 2]])


def test_pruned_closest_point_equals_all_triangles():
    rng = np.random.default_rng(6)
    v, t = ref.icosphere(0.3, 2)
    pts = rng.uniform(-0.6, 0.6, size=(400, 3))
    a, b, c = v[t[:, 0]][None], v[t[:, 1]][None], v[t[:, 2]][None]
    cp = ref.closest_point_triangles(pts[:, None], a, b, c)
    d_all = np.linalg.norm(cp - pts[:, None], axis=-1).min(axis=1)
    np.testing.assert_array_equal(ref.closest_point_mesh(pts, v, t)[1], d_all)


def test_gradient_ambiguity_marks_medial_axis():
    v, t = ref.box((1.0, 1.0, 1.0))
    pts = np.array([
        [0.2, 0.2, 0.0],  # inside, equidistant from the +x and +y faces: gradient jumps
        [0.3, 0.1, 0.0],  # inside, clearly closest to +x
        [0.9, 0.0, 0.0],  # outside over a face: the closest point is clear-cut
        [0.9, 0.9, 0.0],  # outside, closest to an edge shared by four triangles: not ambiguous
    ])
    amb = ref.gradient_ambiguity(pts, v, t, delta=1e-6)
    assert amb[0] > 1.0
    np.testing.assert_allclose(amb[1:], 0.0, atol=1e-9)
