"""robot_sdf.face_winding and the verdict the kernels draw from its rows (kernels.winding's
settled_winding_inside, kernels.signed_distance's ray_winding_inside), against the exact winding
number and brute-force crossings of test/reference.py."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp

import mesh_corpus as corpus
import reference as ref
from robot_sdf import MeshWorld, face_winding, mesh_analysis, mesh_topology
from robot_sdf.kernels.closest_point import closest_feature_face
from robot_sdf.kernels.native import mesh_closest_face
from robot_sdf.kernels.sign_data import (FACE_INTERIOR_SETTLED, FACE_SETTLED, face_rows_start,
                                         sign_data_offset)
from robot_sdf.kernels.sign_data import face_winding as face_row
from robot_sdf.kernels.signed_distance import ray_winding_inside
from robot_sdf.kernels.winding import settled_winding_inside
from robot_sdf.types import SignMethod


def _built(v: np.ndarray, t: np.ndarray):
    """A winding-number mesh with robot_sdf's sign data and its face rows written, and the rows."""
    v = np.asarray(v, np.float32)
    t = np.asarray(t, np.int64)
    welded = mesh_topology.weld(v)
    topology = mesh_analysis.sign_topology(t, welded, v)
    data = mesh_analysis.sign_data(v, t, True, SignMethod.WINDING_NUMBER, topology=topology)
    velocities = wp.array(data, dtype=wp.vec3, device="cpu")
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(t.astype(np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   velocities=velocities, support_winding_number=True)
    rows = face_winding.write_face_rows(mesh, velocities, v, topology)
    start = len(v) + 3 * len(t)
    written = velocities.numpy()[start:start + len(t)]
    if rows is None:
        assert not written.any()  # an open surface above the size cap: nothing settled
    else:
        np.testing.assert_array_equal(written, rows)
    return mesh, rows


def _crossed_faces(v: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Faces that an edge of a face not sharing a vertex position with them crosses, or whose own
    edges cross another face (brute force, float64)."""
    v = np.asarray(v, np.float64)
    t = np.asarray(t, np.int64)
    key = np.unique(v, axis=0, return_inverse=True)[1].reshape(-1)[t]
    out = np.zeros(len(t), bool)
    a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]
    for f in range(len(t)):
        for k in range(3):
            p, q = v[t[f, k]], v[t[f, (k + 1) % 3]]
            d = q - p
            e1, e2 = b - a, c - a
            h = np.cross(d, e2)
            det = np.einsum("ij,ij->i", e1, h)
            ok = np.abs(det) > 1e-12
            inv = np.where(ok, 1.0 / np.where(ok, det, 1.0), 0.0)
            s = p - a
            u = inv * np.einsum("ij,ij->i", s, h)
            qv = np.cross(s, e1)
            w = inv * (qv @ d)
            tt = inv * np.einsum("ij,ij->i", e2, qv)
            hit = ok & (u > 1e-9) & (w > 1e-9) & (u + w < 1 - 1e-9) & (tt > 1e-9) & (tt < 1 - 1e-9)
            adjacent = np.isin(key, key[f, [k, (k + 1) % 3]]).any(axis=1)
            hit &= ~adjacent
            if hit.any():
                out[f] = True
                out[hit] = True
    return out


@wp.kernel
def _verdict_kernel(mesh: wp.uint64, points: wp.array(dtype=wp.vec3), by_face: wp.array(dtype=int),
                    by_ray: wp.array(dtype=int)):
    i = wp.tid()
    p = points[i]
    data = sign_data_offset(mesh)
    delta, dist, side, outward, face, feature = closest_feature_face(mesh, p, mesh_closest_face(mesh, p, 1.0e6), 1.0,
                                                                     True)
    by_face[i] = settled_winding_inside(mesh, data, face, side < 0.0, feature == 0, p, dist)
    by_ray[i] = ray_winding_inside(mesh, data, p)


def _spheres(shift: float, inner: float):
    """Two icospheres (r = 0.1 m, 1280 triangles each): the second of radius ``inner`` moved by
    ``shift`` along x (overlapping when shift > 0, nested when inside)."""
    v, t = ref.icosphere(0.1, 3)
    v2, t2 = ref.icosphere(inner, 3)
    return np.concatenate([v, v2 + [shift, 0.0, 0.0]]), np.concatenate([t, t2 + len(v)])


def _open_hemisphere():
    v, t = ref.icosphere(0.1, 3)
    keep = v[t].mean(axis=1)[:, 2] < 0.02
    return v, t[keep]


def _real(name: str):
    from bench import real_meshes
    v, t = real_meshes.load(name)
    return v.astype(np.float64), t


# name: (mesh, least share of the clear points a face row settles from the closest point, and
# from a ray's first hit); the coarse corpus meshes have a crossing, a rim or a touching face at
# nearly every corner: checked for being right only. On open surfaces a row settles only as far
# as the rim allows, a ray's hit (farther than the closest point) less often.
VERDICT_CASES = {
    "overlapping_spheres": (lambda: _spheres(0.08, 0.1), 0.8, 0.8),
    "nested_spheres": (lambda: _spheres(0.0, 0.05), 0.9, 0.9),
    "open_hemisphere": (_open_hemisphere, 0.1, 0.03),
    "nested_shells": (corpus.nested_shells, 0.0, 0.0),
    "self_intersecting_shell": (corpus.self_intersecting_shell, 0.0, 0.0),
    "overlapping_one_inside_out": (corpus.overlapping_one_inside_out, 0.0, 0.0),
    "open_cup": (corpus.open_cup, 0.0, 0.0),
    "kr10_link2_visual": (lambda: _real("kr10_link2_visual"), 0.08, 0.04),  # a manufacturer's open CAD mesh
}


@pytest.mark.parametrize("name", ["open_hemisphere", "open_cup", "kr10_link2_visual"])
def test_open_surface_rows_are_the_winding_number_beside_each_face(name):
    """An open surface's face rows (FACE_OPEN): w_out is the exact winding number at the row's
    point (OPEN_RELATIVE_OFFSET of the face's reach off its centroid, outer side) within the
    winding number's approximation error, the reach covers the way there, and (on the small
    meshes) faces crossed by another part of the mesh are not settled."""
    from robot_sdf.kernels.sign_data import FACE_OPEN
    from robot_sdf.kernels.winding import WINDING_APPROXIMATION_ERROR

    v, t = VERDICT_CASES[name][0]()
    v, t = np.asarray(v, np.float32).astype(np.float64), np.asarray(t, np.int64)
    _, rows = _built(v, t)
    settled = rows[:, 2] == float(FACE_OPEN)
    assert settled.mean() > 0.5
    faces = np.flatnonzero(settled)[:600]
    corners = v[t[faces]]
    centroid = corners.mean(axis=1)
    reach = np.sqrt(((corners - centroid[:, None]) ** 2).sum(-1).max(axis=1))
    normal = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    unit = normal / np.linalg.norm(normal, axis=1, keepdims=True)
    offset = np.maximum(face_winding.OPEN_RELATIVE_OFFSET * reach, face_winding.MIN_OFFSET)
    exact = ref.winding_number(centroid + offset[:, None] * unit, v, t)
    assert np.abs(rows[faces, 0] - exact).max() < float(WINDING_APPROXIMATION_ERROR)
    assert np.all(rows[faces, 1] >= reach + offset)
    if len(t) < 2000:  # the brute-force crossing test is quadratic (25 s on kr10_link2's 13.5k)
        assert not (settled & _crossed_faces(v, t)).any()


def test_large_open_surfaces_get_no_rows(monkeypatch):
    monkeypatch.setattr(face_winding, "OPEN_ROWS_MAX_TRIANGLES", 9)  # the cup has 10
    _, rows = _built(*corpus.open_cup())
    assert rows is None


@pytest.mark.parametrize("name", ["nested_shells", "overlapping_boxes", "self_intersecting_shell",
                                  "duplicated_faces", "touching_boxes", "overlapping_spheres", "nested_spheres"])
def test_rows_are_the_exact_winding_number_beside_each_settled_face(name):
    """A settled face's w_out is the exact winding number just off its outer side (an integer);
    faces on a crossing, duplicated or touching faces are not settled."""
    v, t = VERDICT_CASES[name][0]() if name in VERDICT_CASES else next(c for c in corpus.CORPUS if c.name == name).build()
    v, t = np.asarray(v, np.float64), np.asarray(t, np.int64)
    mesh, rows = _built(v, t)
    settled = rows[:, 2] != 0.0  # FACE_SETTLED, or FACE_INTERIOR_SETTLED (its w_out holds alike)
    tri = v[t]
    centroid = tri.mean(axis=1)
    normal = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    normal /= np.linalg.norm(normal, axis=1, keepdims=True)
    size = np.linalg.norm(np.ptp(v, axis=0))
    w_out = ref.winding_number(centroid + 1e-5 * size * normal, v, t)
    np.testing.assert_allclose(rows[settled, 0], w_out[settled], atol=1e-6)
    reach = np.sqrt(((tri - centroid[:, None]) ** 2).sum(-1)).max(1)
    np.testing.assert_allclose(rows[:, 1], reach, rtol=1e-4)
    assert not (settled & _crossed_faces(v, t)).any()
    if name == "duplicated_faces":
        assert not settled.any()  # every face lies on another one
    elif name == "touching_boxes":
        # The faces where the boxes touch lie on each other: not settled; the rest are.
        assert 0 < settled.sum() < len(t)
    elif name in ("nested_shells", "nested_spheres"):
        assert settled.all()
    elif name == "overlapping_spheres":
        assert 0.8 < settled.mean() < 1.0  # all but the faces near the crossing circle


@pytest.mark.parametrize("name", list(VERDICT_CASES))
def test_settled_verdicts_are_the_exact_winding_numbers(name):
    """Where the closest feature's face row (or the first face a ray meets) settles the sign, it is
    the exact winding number's (inside above 1/2) at every point 0.1 mm or more from the surface
    and 0.05 from w = 1/2; and on fine meshes it settles most points."""
    build, face_share, ray_share = VERDICT_CASES[name]
    v, t = build()
    v, t = np.asarray(v, np.float64), np.asarray(t, np.int64)
    mesh, _ = _built(v, t)
    pts = corpus.sample_points(v, 400)
    w = ref.winding_number(pts, v, t)
    dist = ref.closest_point_mesh(pts, v, t)[1]
    clear = (dist > 1e-4) & (np.abs(w - 0.5) > 0.05)
    by_face, by_ray = (wp.zeros(len(pts), dtype=int, device="cpu") for _ in range(2))
    wp.launch(_verdict_kernel, len(pts), [mesh.id, wp.array(pts.astype(np.float32), dtype=wp.vec3, device="cpu"),
                                          by_face, by_ray], device="cpu")
    truth = (w > 0.5).astype(int)
    for got in (by_face.numpy(), by_ray.numpy()):
        decided = (got >= 0) & clear
        np.testing.assert_array_equal(got[decided], truth[decided])
    assert ((by_face.numpy() >= 0) & clear).sum() >= face_share * clear.sum()
    assert ((by_ray.numpy() >= 0) & clear).sum() >= ray_share * clear.sum()


def _touching_tetrahedra():
    """Two tetrahedra (0.1 m) that touch at one vertex, the second the first mirrored through it
    and reversed to face outward: (v, t)."""
    tet = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float64) * 0.1
    tri = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])
    return np.concatenate([tet, -tet]), np.concatenate([tri, tri[:, ::-1] + 4])


def test_touching_fans_settle_interior_points_only():
    """Two tetrahedra that touch at one vertex: the faces at that vertex (two fans there) settle
    only points inside the face (FACE_INTERIOR_SETTLED), the others any point (FACE_SETTLED)."""
    v, t = _touching_tetrahedra()
    _, rows = _built(v, t)
    at_touch = (t == 0).any(axis=1) | (t == 4).any(axis=1)
    assert (rows[at_touch, 2] == float(FACE_INTERIOR_SETTLED)).all()
    assert (rows[~at_touch, 2] == float(FACE_SETTLED)).all()


@wp.kernel
def _touch_kernel(mesh: wp.uint64, points: wp.array(dtype=wp.vec3), by_face: wp.array(dtype=int),
                  feature_out: wp.array(dtype=int), settled_out: wp.array(dtype=float)):
    i = wp.tid()
    p = points[i]
    delta, dist, side, outward, face, feature = closest_feature_face(mesh, p, mesh_closest_face(mesh, p, 1.0e6), 1.0,
                                                                     True)
    by_face[i] = settled_winding_inside(mesh, sign_data_offset(mesh), face, side < 0.0, feature == 0, p, dist)
    feature_out[i] = feature
    settled_out[i] = face_row(mesh, face)[2]


def _row_verdicts(mesh, v, t, pts):
    """Each point's verdict from its closest triangle's face row (_touch_kernel), asserted to be
    the exact winding number's wherever a row gives one (points 0.1 mm or more from the surface and
    0.05 from w = 1/2): (exact winding numbers, the points decided so, verdicts, closest features,
    row codes)."""
    w = ref.winding_number(pts, v, t)
    dist = ref.closest_point_mesh(pts, v, t)[1]
    clear = (dist > 1e-4) & (np.abs(w - 0.5) > 0.05)
    by_face, feature = (wp.zeros(len(pts), dtype=int, device="cpu") for _ in range(2))
    settled = wp.zeros(len(pts), dtype=float, device="cpu")
    wp.launch(_touch_kernel, len(pts), [mesh.id, wp.array(pts.astype(np.float32), dtype=wp.vec3, device="cpu"),
                                        by_face, feature, settled], device="cpu")
    by_face, feature, settled = by_face.numpy(), feature.numpy(), settled.numpy()
    decided = (by_face >= 0) & clear
    np.testing.assert_array_equal(by_face[decided], (w[decided] > 0.5).astype(int))
    return w, decided, by_face, feature, settled


def test_spheres_touching_at_a_corner_keep_exact_verdicts_there():
    """Two icospheres (r = 0.1 m) touching at one vertex (the second the first's point reflection
    through it): points within 3 cm of that vertex, between, inside either and outside both. Where
    the closest point lies inside a face of the touching fans, its row decides, and its verdict
    is the exact winding number's."""
    v1, t1 = ref.icosphere(0.1, 3)
    corner = v1[0]
    v = np.concatenate([v1, 2.0 * corner - v1])
    t = np.concatenate([t1, t1[:, ::-1] + len(v1)])  # reflected: reversed to face outward
    mesh, rows = _built(v, t)
    at_touch = (t == 0).any(axis=1) | (t == len(v1)).any(axis=1)
    assert (rows[at_touch, 2] == float(FACE_INTERIOR_SETTLED)).all()
    rng = np.random.default_rng(12)
    pts = corner + rng.normal(0.0, 0.012, size=(3000, 3))
    w, decided, _, _, settled = _row_verdicts(mesh, v, t, pts)
    interior_rows = decided & (settled == float(FACE_INTERIOR_SETTLED))
    assert interior_rows.sum() > 300 and (w[interior_rows] > 0.5).sum() > 100 and (w[interior_rows] < 0.5).sum() > 20


def test_touching_tetrahedra_settle_no_point_on_an_edge_of_their_touching_fans():
    """Two tetrahedra touching at one vertex, points around them: every verdict a row gives is the
    exact winding number's; a point whose closest feature is an edge or a corner of a face of the
    touching fans gets none from its row (the winding number decides), one in such a face's
    interior does."""
    v, t = _touching_tetrahedra()
    mesh, _ = _built(v, t)
    pts = np.random.default_rng(13).normal(0.0, 0.06, size=(3000, 3))
    w, decided, by_face, feature, settled = _row_verdicts(mesh, v, t, pts)
    touching = settled == float(FACE_INTERIOR_SETTLED)
    assert (touching & (feature != 0)).sum() > 200 and (by_face[touching & (feature != 0)] == -1).all()
    assert (decided & touching & (feature == 0)).sum() > 200


def test_a_refit_clears_the_rows_and_signs_stay_the_winding_numbers():
    """update_vertices moves the surface under the rows: the refit leaves no face settled (the
    kernels then evaluate the winding number), and the signs after it are the reference's winding
    numbers of the moved mesh (the overlap of two spheres moved, points in the old overlap now
    inside one sphere or none)."""
    v, t = _spheres(0.08, 0.1)
    world = MeshWorld(device="cpu", max_distance=0.02)
    world.add_mesh("m", v, t)
    assert world.mesh_info("m")["sign_method"] == "winding_number"
    (geometry,) = world._geometries.values()
    start = face_rows_start(len(v), len(t))
    assert geometry.velocities.numpy()[start:start + len(t), 2].sum() > 0.5 * len(t)
    moved = np.asarray(v, np.float64).copy()
    moved[len(v) // 2:] += [0.07, 0.02, 0.0]
    world.update_vertices("m", moved)
    (geometry,) = world._geometries.values()
    assert not geometry.velocities.numpy()[start:start + len(t), 2].any()
    pts = corpus.sample_points(moved, 1500, seed=12)
    sd, _ = world.signed_distance(torch.tensor(pts, dtype=torch.float32))
    sd_ref, _, _, clear = corpus.reference_labels(pts, moved, t)
    clear &= np.abs(sd_ref) > 1e-4
    inside = ref.winding_number(pts, moved, t) > 0.5
    assert clear.sum() > 1000 and (inside & clear).sum() > 200
    np.testing.assert_array_equal(sd.numpy()[clear] < 0, inside[clear])


def _tube(radius: float = 0.1, length: float = 0.2, sections: int = 16):
    """An open tube along z (no caps), each face spanning its whole length (as CAD exports cut a
    cylinder), facing outward: (v, t). Its winding number is about 0.7 half way along the axis and
    passes 1/2 inside it near each open end."""
    angle = np.linspace(0.0, 2.0 * np.pi, sections, endpoint=False)
    ring = np.stack([radius * np.cos(angle), radius * np.sin(angle), np.zeros(sections)], axis=1)
    v = np.concatenate([ring - [0.0, 0.0, 0.5 * length], ring + [0.0, 0.0, 0.5 * length]])
    k = np.arange(sections)
    k1 = (k + 1) % sections
    t = np.concatenate([np.stack([k, k1, k1 + sections], axis=1), np.stack([k, k1 + sections, k + sections], axis=1)])
    return v, t


def test_open_rows_leave_the_winding_number_where_the_rim_can_carry_it_across_one_half():
    """Inside an open tube near its ends the winding number is below 1/2 (about 0.45 on its axis
    at the end), while beside the faces' centroids (a third of the way from an end, where the rows
    are evaluated) it is 0.7-0.8: points there
    whose closest point lies inside a face must not take the row's verdict (the rim is near: the
    bound leaves them to the winding number); every verdict a row gives is the exact one. A row
    that ignored the rim's change on the way would call them inside."""
    v, t = _tube()
    mesh, rows = _built(v, t)
    assert (rows[:, 2] == 3.0).all()  # FACE_OPEN, every face
    rng = np.random.default_rng(17)
    n = 2000
    rho = rng.uniform(0.0, 0.09, n)
    phi = rng.uniform(0.0, 2.0 * np.pi, n)
    z = np.sign(rng.uniform(-1, 1, n)) * rng.uniform(0.0, 0.0995, n)
    pts = np.stack([rho * np.cos(phi), rho * np.sin(phi), z], axis=1)
    w, _, by_face, feature, _ = _row_verdicts(mesh, v, t, pts)
    near_end = (w < 0.49) & (feature == 0)
    assert near_end.sum() > 30, near_end.sum()
    assert (by_face[near_end] == -1).all()
