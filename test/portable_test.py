"""robot_sdf.kernels.portable, the pure-Warp set for a Warp that kernels.native was not checked
against: each function against an independent reference (brute-force box tests, every triangle's
float64 distance, numpy's edge lengths) or, where the value is Warp's own (its winding number, its
normal sign), against native's independent reading of it; and every kernel output on the test
corpus with the portable set (a process started with ROBOT_SDF_KERNELS=portable) against the
native set's, to float32 rounding, gradients apart only where the closest point is not unique."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import warp as wp

import kernel_outputs
import reference as ref
from mesh_corpus import open_bowl
from native_test import _sliver_ellipsoid, _triangle_distances, crinkled_fans, folded_open_surfaces, slot_hits_case
from robot_sdf.kernels import native, native_winding, portable

REPO = Path(__file__).resolve().parents[1]


def _mesh(v, t, winding=False) -> wp.Mesh:
    return wp.Mesh(points=wp.array(np.asarray(v, np.float32), dtype=wp.vec3, device="cpu"),
                   indices=wp.array(np.asarray(t, np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   support_winding_number=winding)


def _vec3(a) -> wp.array:
    return wp.array(np.asarray(a, np.float32), dtype=wp.vec3, device="cpu")


# ------------------------------------------------------------------------------- slot BVH hits
@wp.kernel
def _slot_hits_kernel(bvh: wp.uint64, lower: wp.array(dtype=wp.vec3), upper: wp.array(dtype=wp.vec3),
                      hits: wp.array2d(dtype=wp.int32)):
    i = wp.tid()
    found = portable.slot_bvh_hits(bvh, lower[i], upper[i])
    for j in range(33):
        hits[i, j] = found[j]


def test_slot_bvh_hits_are_the_overlapping_boxes():
    """native_test's case: every overlapping box, each once, and the exact count (also beyond 32)."""
    hits, overlap = slot_hits_case(_slot_hits_kernel)
    counts = overlap.sum(axis=1)
    np.testing.assert_array_equal(hits[:, 32], counts)
    assert (counts > 32).sum() > 10 and (counts == 0).sum() > 10
    for i in np.flatnonzero(counts <= 32):
        assert sorted(hits[i, :counts[i]]) == list(np.flatnonzero(overlap[i]))


# ------------------------------------------------------------------------ closest triangles
@wp.kernel
def _closest_face_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), max_dist: wp.array(dtype=float),
                         face: wp.array(dtype=wp.int32)):
    i = wp.tid()
    face[i] = portable.mesh_closest_face(mesh, pts[i], max_dist[i])


def test_mesh_closest_face_is_the_closest_triangle_slivers_included():
    """On native_test's sliver ellipsoid (where Warp's float32 pick misses by millimetres), random
    bounds: the closest triangle within the bound up to float32 rounding, -1 exactly where none."""
    v, t, mesh, pts = _sliver_ellipsoid()
    n = len(pts)
    rng = np.random.default_rng(9)
    max_dist = np.where(rng.random(n) < 0.3, rng.uniform(0.0, 0.006, n), 1.0e6).astype(np.float32)
    face = wp.zeros(n, dtype=wp.int32, device="cpu")
    wp.launch(_closest_face_kernel, n, [mesh.id, _vec3(pts), wp.array(max_dist, dtype=float, device="cpu"), face],
              device="cpu")
    face = face.numpy()
    dist = _triangle_distances(pts, v, t)
    best = dist.min(axis=1)
    bound = max_dist.astype(np.float64)
    none = best >= bound * (1.0 + 1.0e-6)
    assert none.sum() > 100 and (~none).sum() > 2000
    assert (face[none] == -1).all()
    assert (face[best < bound * (1.0 - 1.0e-6)] >= 0).all()
    rows = np.flatnonzero(face >= 0)
    assert (dist[rows, face[rows]] <= best[rows] + 2.0e-7).all()


@wp.kernel
def _closest_points_kernel(mesh: wp.uint64, start: wp.array(dtype=wp.vec3), direction: wp.array(dtype=wp.vec3),
                           warp_sign: bool, exact_thin: bool, use_portable: bool, face: wp.array2d(dtype=wp.int32),
                           inside: wp.array2d(dtype=wp.float32)):
    i = wp.tid()
    d = direction[i]
    if use_portable:
        batch = portable.mesh_closest_points(mesh, start[i], 1.0e6, d, 0.125, 8, -d, 0.125, 6, 0.125, 1.0e6, -1.0,
                                             False, warp_sign, exact_thin)
        for j in range(15):
            face[i, j] = portable.face_of(batch[j])
            inside[i, j] = portable.warp_inside(batch[j])
    else:
        batch = native.mesh_closest_points(mesh, start[i], 1.0e6, d, 0.125, 8, -d, 0.125, 6, 0.125, 1.0e6, -1.0,
                                           False, warp_sign, exact_thin)
        for j in range(15):
            face[i, j] = native.face_of(batch[j])
            inside[i, j] = native.warp_inside(batch[j])


def _closest_points(mesh, starts, direction, warp_sign, exact_thin, use_portable):
    n = len(starts)
    face = wp.zeros((n, 15), dtype=wp.int32, device="cpu")
    inside = wp.zeros((n, 15), dtype=wp.float32, device="cpu")
    wp.launch(_closest_points_kernel, n, [mesh.id, _vec3(starts), _vec3(direction), warp_sign, exact_thin,
                                          use_portable, face, inside], device="cpu")
    return face.numpy(), inside.numpy()


def _lanes(starts, direction):
    s = np.concatenate([[0.0], 0.125 * (1 + np.arange(8)), -0.125 * (1 + np.arange(6))])
    return (starts[:, None, :] + s[None, :, None] * direction[:, None, :]).astype(np.float32)


@pytest.mark.parametrize("exact_thin", [True, False])
def test_mesh_closest_points_finds_each_points_closest_triangle(exact_thin):
    """A centre and 14 samples on two segments (the swept kernel's lanes): with exact_thin every
    lane's triangle is the closest up to float32 rounding (every triangle's float64 distance);
    without it, Warp's own pick: the distance native's shared traversal finds, to rounding."""
    v, t, mesh, pts = _sliver_ellipsoid()
    rng = np.random.default_rng(10)
    starts = pts[::15]
    direction = rng.normal(size=(len(starts), 3))
    direction = (direction * (0.02 / np.linalg.norm(direction, axis=1))[:, None]).astype(np.float32)
    face, _ = _closest_points(mesh, starts, direction, False, exact_thin, True)
    lanes = _lanes(starts, direction).reshape(-1, 3)
    dist = _triangle_distances(lanes, v, t)
    face = face.reshape(-1)
    lane = np.arange(len(face))
    assert (face >= 0).all()
    if exact_thin:
        assert (dist[lane, face] <= dist.min(axis=1) + 2.0e-7).all()
    else:
        native_face, _ = _closest_points(mesh, starts, direction, False, False, False)
        native_face = native_face.reshape(-1)
        np.testing.assert_allclose(dist[lane, face], dist[lane, native_face], atol=2.0e-7)


@pytest.mark.parametrize("surface", ["folded", "fans"])
def test_warp_sign_is_warps_own_and_agrees_with_natives_reading(surface):
    """With warp_sign the portable set asks Warp's own signed query; native reads Warp's sign rule
    in a shared traversal. Both find the same distance everywhere and the same sign except where
    faces tie in a chain (which Warp's visit order decides; native_test bounds those to 1e-3)."""
    v, t = folded_open_surfaces() if surface == "folded" else crinkled_fans()
    mesh = _mesh(v, t)
    rng = np.random.default_rng(5)
    starts = v[t[rng.integers(0, len(t), 600)]].mean(axis=1) + rng.normal(scale=0.02, size=(600, 3))
    direction = rng.normal(scale=0.01, size=(600, 3)).astype(np.float32)
    face, inside = _closest_points(mesh, starts.astype(np.float32), direction, True, False, True)
    native_face, native_inside = _closest_points(mesh, starts.astype(np.float32), direction, True, False, False)
    assert (face >= 0).all() and (native_face >= 0).all()
    lanes = _lanes(starts.astype(np.float32), direction).reshape(-1, 3)
    dist = _triangle_distances(lanes, v, t)
    lane = np.arange(lanes.shape[0])
    np.testing.assert_allclose(dist[lane, face.ravel()], dist[lane, native_face.ravel()], atol=2.0e-6)
    off_surface = dist.min(axis=1) > 1e-4
    disagree = off_surface & (inside.ravel() != native_inside.ravel())
    assert (inside < 0).any() and (inside > 0).any()
    assert disagree.sum() <= 1e-3 * off_surface.sum()


# --------------------------------------------------------------------------- winding numbers
@wp.kernel
def _winding_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), accuracy: float,
                    ours: wp.array(dtype=float), warps: wp.array(dtype=float)):
    i = wp.tid()
    ours[i] = portable.winding_number(mesh, pts[i], accuracy)
    warps[i] = native.winding_number(mesh, pts[i], accuracy)


@pytest.mark.parametrize("accuracy", [1.25, 2.0])
def test_winding_number_is_warps_value(accuracy):
    """Read back through Warp's public signed query, the fast winding number is Warp's own
    (native.winding_number calls Warp's directly): to the bit above 1e-4, within 1e-12 below; and
    near the exact winding number (numpy) within Warp's approximation."""
    bv, bt = open_bowl()
    fv, ft = folded_open_surfaces()
    v = np.concatenate([bv, fv + [0.5, 0.0, 0.0]])
    t = np.concatenate([bt, ft + len(bv)])
    mesh = _mesh(v, t, winding=True)
    rng = np.random.default_rng(11)
    pts = np.concatenate([rng.uniform(v.min(0) - 0.2, v.max(0) + 0.2, size=(600, 3)),
                          v[rng.integers(0, len(v), size=200)] + rng.normal(scale=0.01, size=(200, 3))])
    ours, warps = (wp.zeros(len(pts), dtype=float, device="cpu") for _ in range(2))
    wp.launch(_winding_kernel, len(pts), [mesh.id, _vec3(pts), accuracy, ours, warps], device="cpu")
    ours, warps = ours.numpy(), warps.numpy()
    assert np.abs(warps).max() > 0.5
    large = np.abs(warps) > 1e-4
    np.testing.assert_array_equal(ours[large], warps[large])
    np.testing.assert_allclose(ours[~large], warps[~large], atol=1e-12)
    exact = ref.winding_number(pts.astype(np.float32).astype(np.float64), v, t)
    assert np.abs(ours - exact).max() < 0.05


@wp.kernel
def _winding_numbers_kernel(mesh: wp.uint64, start: wp.array(dtype=wp.vec3), direction: wp.array(dtype=wp.vec3),
                            lanes: wp.array(dtype=wp.int32), ours: wp.array2d(dtype=float),
                            natives: wp.array2d(dtype=float)):
    i = wp.tid()
    d = direction[i]
    a = portable.mesh_winding_numbers(mesh, start[i], d, 0.125, 5, -d, 0.25, 3, 0.125, 2.0, lanes[i])
    b = native_winding.mesh_winding_numbers(mesh, start[i], d, 0.125, 5, -d, 0.25, 3, 0.125, 2.0, lanes[i])
    for j in range(16):
        ours[i, j] = a[j]
        natives[i, j] = b[j]


def test_shared_winding_numbers_are_natives():
    """Point by point, the winding numbers of the lanes asked for; 0 elsewhere (native's, which
    native_test checks against Warp's to the bit)."""
    v, t = open_bowl()
    mesh = _mesh(v, t, winding=True)
    rng = np.random.default_rng(12)
    n = 300
    start = rng.uniform(v.min(0) - 0.1, v.max(0) + 0.1, size=(n, 3))
    direction = rng.normal(scale=0.05, size=(n, 3))
    lanes = rng.integers(0, 1 << 9, size=n).astype(np.int32)
    ours, natives = (wp.zeros((n, 16), dtype=float, device="cpu") for _ in range(2))
    wp.launch(_winding_numbers_kernel, n, [mesh.id, _vec3(start), _vec3(direction),
                                           wp.array(lanes, dtype=wp.int32, device="cpu"), ours, natives],
              device="cpu")
    ours, natives = ours.numpy(), natives.numpy()
    assert np.abs(natives).max() > 0.5 and (ours == 0).sum() > n
    large = np.abs(natives) > 1e-4
    np.testing.assert_array_equal(ours[large], natives[large])
    np.testing.assert_allclose(ours, natives, atol=1e-12)


# ------------------------------------------------------------------------------- mesh facts
@wp.kernel
def _facts_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), reach: wp.array(dtype=float),
                  beyond: wp.array(dtype=wp.int32), edge: wp.array(dtype=float)):
    i = wp.tid()
    beyond[i] = wp.where(portable.mesh_box_beyond(mesh, pts[i], reach[i]), 1, 0)
    edge[i] = portable.mesh_average_edge_length(mesh)


def test_box_test_and_average_edge_length():
    """mesh_box_beyond: the L-infinity gap of p to the vertices' box exceeds the reach (numpy);
    average edge length: the mean of the triangles' three edges (numpy, float64)."""
    v, t = ref.icosphere(0.3, 2)
    v = (v * [1.0, 0.5, 2.0] + [0.1, -0.2, 0.3]).astype(np.float32)
    mesh = _mesh(v, t)
    rng = np.random.default_rng(4)
    pts = rng.uniform(-1.0, 1.0, size=(2000, 3)).astype(np.float32)
    reach = np.where(rng.random(2000) < 0.3, 0.0, rng.uniform(0.0, 0.4, 2000)).astype(np.float32)
    beyond = wp.zeros(2000, dtype=wp.int32, device="cpu")
    edge = wp.zeros(2000, dtype=float, device="cpu")
    wp.launch(_facts_kernel, 2000, [mesh.id, _vec3(pts), wp.array(reach, dtype=float, device="cpu"), beyond, edge],
              device="cpu")
    gap = np.max(np.maximum(v.min(0) - pts, pts - v.max(0)), axis=1)
    want = gap > reach
    assert want.sum() > 200 and (~want).sum() > 200
    np.testing.assert_array_equal(beyond.numpy() == 1, want)
    tri = v[t].astype(np.float64)
    np.testing.assert_allclose(edge.numpy(), np.linalg.norm(tri - np.roll(tri, 1, axis=1), axis=2).mean(), rtol=1e-5)


# ------------------------------------------------------------------ every kernel, both sets
def test_every_kernel_output_matches_the_native_sets(tmp_path):
    """test/kernel_outputs.py's outputs (plain cost, ESDF and gradients, Hessians, swept cost and
    gradients, signed distances: MeshWorld per sign method, raw and adopted tensors, every corpus
    mesh) in a process on the portable set against this process's native set: costs, distances,
    Hessians and flags within float32 rounding; a plain or ESDF gradient differs only at points
    whose closest surface point is not unique (the reference's gradient ambiguity); a swept
    gradient, which averages such points' gradients over its samples, within 1e-4."""
    from robot_sdf.kernels import mesh_queries

    assert mesh_queries.NATIVE
    path = tmp_path / "portable.npz"
    env = dict(os.environ, ROBOT_SDF_KERNELS="portable")
    done = subprocess.run([sys.executable, str(REPO / "test" / "kernel_outputs.py"), "save", str(path)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    other = np.load(path)
    mine = kernel_outputs.run()
    assert set(other.files) == set(mine)
    geos, poses, spheres, _ = kernel_outputs._scene()
    points = spheres[0, 0, :, :3]
    at_ties = {0: set(), 1: set()}  # environment -> points whose gradients differ
    for key in sorted(mine):
        a, b = mine[key].astype(np.float64), other[key].astype(np.float64)
        close = np.abs(a - b) <= 1e-6 + 1e-6 * np.abs(a)
        if "/swept/" in key and key.endswith("grad"):
            close = np.abs(a - b) <= 1e-4
        elif key.endswith("grad") and not close.all():
            rows = np.flatnonzero(~close.reshape(-1, a.shape[-1]).all(axis=1))
            for row in rows:  # (2, 1, N, c) by environment, or (N, 3) of environment 0
                at_ties[int(row // len(points)) if a.ndim == 4 else 0].add(int(row % len(points)))
            continue
        assert close.all(), f"{key}: {int((~close).sum())} of {a.size} values differ, max {np.abs(a - b).max():.3g}"
    for e, rows in at_ties.items():
        rows = np.array(sorted(rows), dtype=int)
        if rows.size:
            meshes = [ref.RefMesh(v, t, pose) for (_, v, t), pose in zip(geos, poses[e])]
            ambiguity = ref.world_gradient_ambiguity(points[rows], meshes, 2e-6)
            assert (ambiguity > 1e-4).all(), f"environment {e}: gradients differ at points with a unique closest point: " \
                                             f"{points[rows[ambiguity <= 1e-4]][:5]}"
    differ_at_ties = sum(len(rows) for rows in at_ties.values())
    assert differ_at_ties < 0.2 * len(points)
