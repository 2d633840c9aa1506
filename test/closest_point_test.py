"""robot_sdf.kernels.closest_point against test/reference.py: the float64 closest point on a
triangle and the feature holding it (random, sliver and zero-area triangles), the float64 distance
and normal of a mesh face, and on meshes with slivers the exact distance and pseudo-normal sign
from the triangle the sliver-aware searches find (native.mesh_closest_face, mesh_closest_points
with exact_thin), where Warp's float32 search picks a farther one."""
from __future__ import annotations

import numpy as np
import pytest
import warp as wp

import mesh_corpus as corpus
import reference as ref
from robot_sdf import mesh_analysis
from robot_sdf.kernels import closest_point
from robot_sdf.kernels.native import face_of, mesh_closest_face, mesh_closest_points
from robot_sdf.types import SignMethod


@wp.kernel
def _triangle_kernel(p: wp.array(dtype=wp.vec3d), a: wp.array(dtype=wp.vec3d), b: wp.array(dtype=wp.vec3d),
                     c: wp.array(dtype=wp.vec3d), closest: wp.array(dtype=wp.vec3d), feature: wp.array(dtype=wp.int32)):
    i = wp.tid()
    q, f = closest_point.closest_on_triangle(p[i] - a[i], b[i] - a[i], c[i] - a[i])
    closest[i] = a[i] + q
    feature[i] = f


def _triangles(rng: np.random.Generator, n: int):
    """(p, a, b, c) (n,3) each: random triangles, a quarter of them slivers (300:1) and a tenth of
    zero area (collinear corners), points around them (repeated corners: the next test)."""
    a, b, c = (rng.normal(size=(n, 3)) for _ in range(3))
    sliver = rng.random(n) < 0.25
    c[sliver] = a[sliver] + (b[sliver] - a[sliver]) * rng.random((sliver.sum(), 1)) \
        + rng.normal(size=(sliver.sum(), 3)) * np.linalg.norm(b[sliver] - a[sliver], axis=1, keepdims=True) / 300.0
    flat = rng.random(n) < 0.1
    c[flat] = a[flat] + (b[flat] - a[flat]) * rng.uniform(-0.5, 1.5, size=(flat.sum(), 1))
    p = (a + b + c) / 3.0 + rng.normal(scale=1.0, size=(n, 3))
    return p, a, b, c


def _segment_distance(p: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ab = b - a
    s = np.clip(np.einsum("ij,ij->i", p - a, ab) / np.maximum(np.einsum("ij,ij->i", ab, ab), 1e-300), 0.0, 1.0)
    return np.linalg.norm(p - (a + s[:, None] * ab), axis=1)


def test_closest_on_triangle_is_the_closest_point_and_names_its_feature():
    rng = np.random.default_rng(1)
    n = 20000
    p, a, b, c = _triangles(rng, n)
    closest = wp.zeros(n, dtype=wp.vec3d, device="cpu")
    feature = wp.zeros(n, dtype=wp.int32, device="cpu")
    arrays = [wp.array(x, dtype=wp.vec3d, device="cpu") for x in (p, a, b, c)]
    wp.launch(_triangle_kernel, n, [*arrays, closest, feature], device="cpu")
    closest, feature = closest.numpy(), feature.numpy()
    got = np.linalg.norm(closest - p, axis=1)
    want = np.linalg.norm(ref.closest_point_triangles(p[:, None], a[:, None], b[:, None], c[:, None])[:, 0] - p,
                          axis=1)
    # Triangles of zero area up to rounding (collinear corners): the truth is the closest of their
    # edges, which neither Ericson's regions nor the reference's guarded version of them find
    # (Warp's searches skip such triangles, and in the sliver-aware searches a triangle only counts
    # where it is nearer): never nearer than the truth.
    edges = np.min([_segment_distance(p, e0, e1) for e0, e1 in ((a, b), (b, c), (c, a))], axis=0)
    flat = np.linalg.norm(np.cross(b - a, c - a), axis=1) <= 1e-9 * np.sum((b - a) ** 2 + (c - a) ** 2, axis=1)
    assert 0.05 * n < flat.sum() < 0.15 * n
    assert np.all(got[flat] >= edges[flat] - 1e-12)
    np.testing.assert_allclose(got[~flat], want[~flat], rtol=1e-9, atol=1e-12)
    corners = np.stack([a, b, c], 1)
    for k in range(3):  # corner features 4, 5, 6 are the corners themselves
        at = feature == 4 + k
        assert at.sum() > 100
        np.testing.assert_allclose(closest[at], corners[at, k], rtol=0, atol=1e-12)
    for k in range(3):  # edge features 1, 2, 3: on the edge from corner k to corner k + 1
        on = feature == 1 + k
        assert on.sum() > 100
        e0, e1 = corners[on, k], corners[on, (k + 1) % 3]
        s = np.einsum("ij,ij->i", closest[on] - e0, e1 - e0) / np.einsum("ij,ij->i", e1 - e0, e1 - e0)
        np.testing.assert_allclose(closest[on], e0 + s[:, None] * (e1 - e0), atol=1e-12)
        assert np.all((s > -1e-12) & (s < 1 + 1e-12))
    face = (feature == 0) & ~flat
    assert face.sum() > 1000
    # In the face: p - closest is along the normal.
    normal = np.cross(b[face] - a[face], c[face] - a[face])
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    across = np.linalg.norm(np.cross(p[face] - closest[face], normal), axis=1)
    assert np.all(across <= 1e-9 * (1.0 + np.linalg.norm(p[face] - closest[face], axis=1)))


def test_closest_on_triangle_with_coincident_corners_is_the_closest_point_of_what_is_left():
    """Two corners at the same position (any pair) or all three: a segment or a point, whose closest
    point is found (it was NaN in the first edge's region)."""
    rng = np.random.default_rng(2)
    n = 4000
    a, b, c = (rng.normal(size=(n, 3)) for _ in range(3))
    kind = np.arange(n) % 4
    b[kind == 0] = a[kind == 0]
    c[kind == 1] = b[kind == 1]
    a[kind == 2] = c[kind == 2]
    b[kind == 3] = a[kind == 3]
    c[kind == 3] = a[kind == 3]
    p = (a + b + c) / 3.0 + rng.normal(size=(n, 3))
    closest = wp.zeros(n, dtype=wp.vec3d, device="cpu")
    feature = wp.zeros(n, dtype=wp.int32, device="cpu")
    arrays = [wp.array(x, dtype=wp.vec3d, device="cpu") for x in (p, a, b, c)]
    wp.launch(_triangle_kernel, n, [*arrays, closest, feature], device="cpu")
    got = np.linalg.norm(closest.numpy() - p, axis=1)
    edges = np.min([_segment_distance(p, e0, e1) for e0, e1 in ((a, b), (b, c), (c, a))], axis=0)
    np.testing.assert_allclose(got, edges, rtol=1e-9, atol=1e-12)


@wp.kernel
def _refine_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), faces: wp.array(dtype=wp.int32),
                   dist: wp.array(dtype=float), normal: wp.array(dtype=wp.vec3), delta: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    d, length, feature, n = closest_point.refine_closest(mesh, pts[i], faces[i])
    dist[i] = length
    normal[i] = n
    delta[i] = d


def test_refine_closest_measures_the_given_face_in_float64():
    """On a 0.6 m x 0.9 mm sliver box, float64 on each face: the distance to that face (not the
    nearest one) within 1e-6 relative of the reference, its unit normal, delta = p - closest."""
    v, t = corpus.sliver_box()
    v = np.asarray(v, np.float32)
    t = np.asarray(t, np.int64)
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(t.astype(np.int32).ravel(), dtype=wp.int32, device="cpu"))
    rng = np.random.default_rng(2)
    n = 4000
    pts = corpus.sample_points(v, n - 1 - 63, seed=3).astype(np.float32)
    faces = rng.integers(0, len(t), size=len(pts)).astype(np.int32)
    outs = [wp.zeros(len(pts), dtype=dt, device="cpu") for dt in (float, wp.vec3, wp.vec3)]
    wp.launch(_refine_kernel, len(pts), [mesh.id, wp.array(pts, dtype=wp.vec3, device="cpu"),
                                         wp.array(faces, dtype=wp.int32, device="cpu"), *outs], device="cpu")
    dist, normal, delta = (o.numpy() for o in outs)
    tri = v[t[faces]].astype(np.float64)
    want = ref.closest_point_triangles(pts[:, None].astype(np.float64), tri[:, None, 0], tri[:, None, 1],
                                       tri[:, None, 2])[:, 0]
    np.testing.assert_allclose(dist, np.linalg.norm(pts - want, axis=1), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(delta, pts - want, rtol=1e-5, atol=1e-7)
    n_ref = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    np.testing.assert_allclose(normal, n_ref / np.linalg.norm(n_ref, axis=1, keepdims=True), atol=1e-6)


@wp.kernel
def _feature_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), dist: wp.array(dtype=float),
                    sign: wp.array(dtype=float)):
    """The closest point of the triangle mesh_closest_face finds, signed by the pseudo-normal."""
    i = wp.tid()
    p = pts[i]
    face = mesh_closest_face(mesh, p, 1.0e6)
    delta, d, inside_out, outward = closest_point.closest_feature(mesh, p, face, 1.0, True)
    dist[i] = d
    sign[i] = inside_out


@pytest.mark.parametrize("name", ["sliver_box", "arm_link_fine"])
def test_slivers_keep_the_exact_distance_and_sign(name):
    """On sliver-heavy meshes, the exact distance (1e-6 m) of points inside or within 2 cm of the
    surface from the triangle mesh_closest_face finds (thin triangles in float64), signed by the
    pseudo-normal of the closest feature beyond 1e-5 m."""
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    v = np.asarray(v, np.float32)
    t = np.asarray(t, np.int64)
    rows = mesh_analysis.sign_data(v, t, False, SignMethod.NORMAL)
    assert rows[-2, 2] == 1.0  # slivers
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(t.astype(np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   velocities=wp.array(rows, dtype=wp.vec3, device="cpu"))
    rng = np.random.default_rng(4)
    tri = v[t]
    # (The reference's winding number costs points x triangles: 20,600 triangles here.)
    on_surface = tri[rng.integers(0, len(t), 1200)]
    w = rng.dirichlet(np.ones(3), size=1200)[:, :, None]
    near = (on_surface * w).sum(1) + rng.normal(scale=0.006, size=(1200, 3))
    pts = np.concatenate([near, corpus.sample_points(v, 300)]).astype(np.float32)
    sd, _, _ = ref.signed_distance(pts, v, t)
    wanted = (sd < 0.0) | (np.abs(sd) < 0.02)
    pts, sd = pts[wanted], sd[wanted]
    assert len(pts) > 1000 and (sd < 0).sum() > 200
    dist, sign = (wp.zeros(len(pts), dtype=float, device="cpu") for _ in range(2))
    wp.launch(_feature_kernel, len(pts), [mesh.id, wp.array(pts, dtype=wp.vec3, device="cpu"), dist, sign],
              device="cpu")
    dist, sign = dist.numpy(), sign.numpy()
    np.testing.assert_allclose(dist, np.abs(sd), atol=1e-6)
    clear = np.abs(sd) > 1e-5
    np.testing.assert_array_equal(sign[clear], np.where(sd[clear] < 0, -1.0, 1.0))


@wp.kernel
def _query_distance_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), dist: wp.array(dtype=float)):
    i = wp.tid()
    q = wp.mesh_query_point_no_sign(mesh, pts[i], 1.0e6)
    dist[i] = wp.length(pts[i] - wp.mesh_eval_position(mesh, q.face, q.u, q.v))


@wp.kernel
def _closest_face_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), face: wp.array(dtype=wp.int32)):
    i = wp.tid()
    face[i] = mesh_closest_face(mesh, pts[i], 1.0e6)


def _mesh(v, t, rows=None):
    velocities = None if rows is None else wp.array(rows, dtype=wp.vec3, device="cpu")
    return wp.Mesh(points=wp.array(np.asarray(v, np.float32), dtype=wp.vec3, device="cpu"),
                   indices=wp.array(np.asarray(t, np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   velocities=velocities)


@wp.kernel
def _batch_face_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), exact_thin: bool,
                       face: wp.array(dtype=wp.int32)):
    """The centre's triangle from the swept samples' shared traversal (no samples)."""
    i = wp.tid()
    d = wp.vec3(1.0, 0.0, 0.0)
    batch = mesh_closest_points(mesh, pts[i], 1.0e6, d, 0.0, 0, d, 0.0, 0, 0.1, 1.0e6, -1.0, False, False,
                                exact_thin)
    face[i] = face_of(batch[0])


def test_the_searches_find_a_sliver_that_warp_measures_too_far():
    """Warp's float32 distance of a 2000:1 sliver is too long at some points (by up to 1e-2 m);
    with a well-shaped triangle placed just nearer than that wrong distance, Warp picks the
    well-shaped one. The sliver-aware searches must find the sliver (mesh_closest_face, and the
    swept samples' shared traversal with exact_thin; without it that traversal measures as Warp
    does), and its exact distance follows (1e-6 m)."""
    sliver = np.array([[-0.3, 0.0, 0.0], [0.3, 0.0, 0.0], [0.1, 3.0e-4, 0.0]], np.float32) + np.float32([0.05, 0.02, 0.01])
    rng = np.random.default_rng(5)
    pts = (sliver[0] + rng.uniform(0.0, 1.0, (40000, 1)) * (sliver[1] - sliver[0])
           + rng.normal(0.0, 0.01, (40000, 3))).astype(np.float32)
    alone = _mesh(sliver, [[0, 1, 2]])
    d32 = wp.zeros(len(pts), dtype=float, device="cpu")
    wp.launch(_query_distance_kernel, len(pts), [alone.id, wp.array(pts, dtype=wp.vec3, device="cpu"), d32],
              device="cpu")
    p64 = pts.astype(np.float64)
    closest = ref.closest_point_triangles(p64, *(np.broadcast_to(c.astype(np.float64), p64.shape) for c in sliver))
    true = np.linalg.norm(p64 - closest, axis=1)
    excess = d32.numpy() - true
    chosen = np.flatnonzero((excess > 2.0e-4) & (true > 3.0e-3) & (true < 0.015))[:20]
    assert len(chosen) >= 5  # Warp's float32 sliver distances are that wrong at a few points
    for i in chosen:
        # An equilateral triangle (circumradius 2 mm) facing p, its centre excess / 2 beyond the
        # sliver's true distance, on the far side from the sliver.
        away = (p64[i] - closest[i]) / true[i]
        centre = p64[i] + away * (true[i] + 0.5 * excess[i])
        e1 = np.cross(away, [0.0, 0.0, 1.0] if abs(away[2]) < 0.9 else [1.0, 0.0, 0.0])
        e1 /= np.linalg.norm(e1)
        e2 = np.cross(away, e1)
        angles = np.array([0.0, 2.0, 4.0]) * np.pi / 3.0
        well = centre + 2.0e-3 * (np.cos(angles)[:, None] * e1 + np.sin(angles)[:, None] * e2)
        v = np.concatenate([sliver, well]).astype(np.float32)
        t = np.array([[0, 1, 2], [3, 4, 5]])
        rows = mesh_analysis.sign_data(v, t, False, SignMethod.NORMAL)
        assert rows[-2, 2] == 1.0  # slivers
        mesh = _mesh(v, t, rows)
        picked = wp.zeros(1, dtype=float, device="cpu")
        point = wp.array(pts[i:i + 1], dtype=wp.vec3, device="cpu")
        wp.launch(_query_distance_kernel, 1, [mesh.id, point, picked], device="cpu")
        assert picked.numpy()[0] > true[i] + 1.0e-4  # Warp picked the well-shaped triangle
        dist, sign = (wp.zeros(1, dtype=float, device="cpu") for _ in range(2))
        wp.launch(_feature_kernel, 1, [mesh.id, point, dist, sign], device="cpu")
        assert abs(float(dist.numpy()[0]) - true[i]) < 1.0e-6
        face = wp.zeros(1, dtype=wp.int32, device="cpu")
        wp.launch(_closest_face_kernel, 1, [mesh.id, point, face], device="cpu")
        assert face.numpy()[0] == 0  # the sliver
        for exact_thin, want in ((True, 0), (False, 1)):
            wp.launch(_batch_face_kernel, 1, [mesh.id, point, exact_thin, face], device="cpu")
            assert face.numpy()[0] == want
