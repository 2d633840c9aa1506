"""robot_sdf.kernels.signed_distance: mesh_signed_distance of single meshes against the exact signed
distance of test/reference.py in each sign regime (the pseudo-normal of a solid, the winding number
of open and nested surfaces, Warp's own queries on meshes built elsewhere): the distance where a
surface is within the bound, nothing found beyond it outside, inside points found for any bound;
and the ``need`` contract (a search within need first returns what the full search returns below
need, to the bit)."""
from __future__ import annotations

import numpy as np
import pytest
import warp as wp

import mesh_corpus as corpus
import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.kernels import signed_distance
from robot_sdf.kernels.sign_data import (SIGN_AUTO, SIGN_DEFAULT, SIGN_NORMAL, SIGN_PARITY,
                                         SIGN_WINDING_NUMBER, sign_data_offset)


@wp.kernel
def _sd_kernel(mesh: wp.uint64, pts: wp.array(dtype=wp.vec3), bound: wp.array(dtype=float), cull_radius: float,
               method: int, need: wp.array(dtype=float), found: wp.array(dtype=wp.int32), sd: wp.array(dtype=float),
               grad: wp.array(dtype=wp.vec3)):
    i = wp.tid()
    f, d, g = signed_distance.mesh_signed_distance(mesh, pts[i], bound[i], cull_radius, method, need[i])
    found[i] = f
    sd[i] = d
    grad[i] = g


def _evaluate(mesh_id: int, pts: np.ndarray, bound, cull_radius: float, method: int, need=None):
    """(found (N,) bool, sd (N,), grad (N,3)) of mesh-frame points; bound and need scalars or (N,)."""
    n = len(pts)
    bound = np.broadcast_to(np.asarray(bound, np.float32), (n,))
    need = bound if need is None else np.broadcast_to(np.asarray(need, np.float32), (n,))
    found = wp.zeros(n, dtype=wp.int32, device="cpu")
    sd = wp.zeros(n, dtype=float, device="cpu")
    grad = wp.zeros(n, dtype=wp.vec3, device="cpu")
    wp.launch(_sd_kernel, n, [wp.uint64(mesh_id), wp.array(pts.astype(np.float32), dtype=wp.vec3, device="cpu"),
                              wp.array(np.ascontiguousarray(bound), dtype=float, device="cpu"), float(cull_radius),
                              int(method), wp.array(np.ascontiguousarray(need), dtype=float, device="cpu"), found, sd,
                              grad], device="cpu")
    return found.numpy().astype(bool), sd.numpy(), grad.numpy()


def _world_mesh(v, t, method: str):
    """(world keeping the mesh alive, mesh id, kernel-frame shift, cull radius) of a MeshWorld mesh
    at the identity pose: its kernel frame is the given one shifted by ``shift``."""
    world = MeshWorld(device="cpu", mesh_capacity=1, sign_method=method)
    world.add_mesh("m", v, t)
    snap = world.snapshot()
    pose_inv = snap.mesh_pose_inverse[0, 0].numpy().astype(np.float64)
    assert np.allclose(pose_inv[3:7], [1, 0, 0, 0])
    return world, int(snap.mesh_idx[0, 0]), pose_inv[:3], float(pose_inv[7])


# (case, how the mesh is given, the call's sign method)
REGIMES = [
    ("capsule", "auto", SIGN_AUTO),  # solid: the pseudo-normal, deep points by the closed-shell ray
    ("hollow_shell", "auto", SIGN_AUTO),  # several shells bounding one solid
    ("sliver_box", "auto", SIGN_AUTO),  # solid with slivers
    ("open_cup", "auto", SIGN_AUTO),  # winding number of an open surface
    ("nested_shells", "auto", SIGN_AUTO),  # winding number of a closed surface (2 inside)
    ("capsule", "raw", SIGN_NORMAL),  # built elsewhere: Warp's own queries, the root box for deep points
    ("capsule", "raw", SIGN_DEFAULT),
    ("capsule", "raw", SIGN_PARITY),
    ("open_cup", "raw", SIGN_WINDING_NUMBER),
]


@pytest.mark.parametrize("name, given, method", REGIMES, ids=[f"{c}-{g}-{m}" for c, g, m in REGIMES])
def test_signed_distances_are_the_references(name, given, method):
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    pts = corpus.sample_points(v, 600, seed=5)
    if given == "raw":
        # Warp's own normal sign is not exact where faces tie (the capsule's axis and centre,
        # which sample_points adds): the random points only.
        pts = pts[1:601]
    sd_ref, grad_ref, _, clear = corpus.reference_labels(pts, *case.truth())
    if given == "raw":
        keep = wp.Mesh(points=wp.array(np.asarray(v, np.float32), dtype=wp.vec3, device="cpu"),
                       indices=wp.array(np.asarray(t, np.int32).ravel(), dtype=wp.int32, device="cpu"),
                       support_winding_number=True)
        mesh_id, shift, cull = keep.id, np.zeros(3), 0.0
    else:
        keep, mesh_id, shift, cull = _world_mesh(v, t, given)
    bound = 0.05 * float(np.ptp(np.asarray(v), 0).max())
    inside = clear & (sd_ref < 0)
    near = clear & (sd_ref >= 0) & (sd_ref < bound - 1e-4)
    far = clear & (sd_ref > bound + 1e-4)
    assert inside.sum() > 20 and near.sum() > 20 and far.sum() > 20
    assert (sd_ref[inside] < -1e-4).sum() > 20  # deep points, beyond the second bound
    # A negative bound (a negative max_dist) still finds every inside point, however deep.
    for b in (bound, 1e-4, -bound):
        found, sd, grad = _evaluate(mesh_id, pts + shift, b, cull, method)
        assert found[inside].all(), f"inside points not found with bound {b}"
        np.testing.assert_allclose(sd[inside], sd_ref[inside], atol=2e-5)
    found, sd, grad = _evaluate(mesh_id, pts + shift, bound, cull, method)
    assert found[near].all() and not found[far].any()
    np.testing.assert_allclose(sd[near], sd_ref[near], atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(grad[found], axis=1), 1.0, atol=1e-4)
    # The gradient is the reference's (p - c) / sd where the closest point is clear-cut.
    sure = (inside | near) & (np.abs(sd_ref) > 1e-3) & (ref.gradient_ambiguity(pts, *case.truth()) < 1e-3)
    assert sure.sum() > 20
    np.testing.assert_allclose(grad[sure], grad_ref[sure], atol=1e-3)


@pytest.mark.parametrize("name", ["capsule", "hollow_shell", "open_cup", "nested_shells", "arm_link"])
def test_a_search_within_need_first_gives_the_full_searchs_results_below_need(name):
    """mesh_signed_distance's ``need``: a result with sd < need is the full search's to the bit;
    an outside result at or beyond need may be left out; every inside point is still found."""
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    world, mesh_id, shift, cull = _world_mesh(v, t, "auto")  # the world keeps the mesh alive
    rng = np.random.default_rng(9)
    pts = corpus.sample_points(v, 3000, seed=9) + shift
    bound = 0.2
    need = rng.uniform(0.0, 0.1 * float(np.ptp(np.asarray(v), 0).max()), size=len(pts)).astype(np.float32)
    full = _evaluate(mesh_id, pts, bound, cull, SIGN_AUTO)
    first = _evaluate(mesh_id, pts, bound, cull, SIGN_AUTO, need)
    below = full[0] & (full[1] < need)
    assert below.sum() > 300 and (full[0] & (full[1] >= need)).sum() > 300 and (full[1][full[0]] < 0).sum() > 100
    assert np.array_equal(first[0][below], full[0][below])
    assert np.array_equal(first[1][below], full[1][below]) and np.array_equal(first[2][below], full[2][below])
    # Whatever the first search finds below need is what the full search found.
    got = first[0] & (first[1] < need)
    assert np.array_equal(got, below)
    assert world.mesh_count() == 1


@wp.kernel
def _out_of_reach_kernel(mesh: wp.uint64, cull_radius: float, pts: wp.array(dtype=wp.vec3),
                         reach: wp.array(dtype=float), out: wp.array(dtype=wp.int32)):
    i = wp.tid()
    data = sign_data_offset(mesh)
    out[i] = wp.where(signed_distance.out_of_reach(mesh, data, cull_radius, pts[i], reach[i]), 1, 0)


@pytest.mark.parametrize("name, given", [("capsule", "auto"), ("nested_shells", "auto"), ("open_cup", "auto"),
                                         ("capsule", "raw"), ("open_cup", "raw"), ("open_cup", "cull radius"),
                                         ("nested_shells", "cull radius")])
def test_out_of_reach_only_where_nothing_is_within_reach(name, given):
    """out_of_reach is True only where the reference finds no surface point within ``reach`` and
    the point is not inside (winding number < 0.5): by the mesh's own bounds (slots without a cull
    radius: MeshWorld's meshes, raw ones), or by MeshWorld's cull radius of the mesh; and it is True
    wherever the vertices' bounding box (or the cull sphere) is farther than reach, so the cull is
    not vacuous."""
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    cull_radius = 0.0
    if given == "raw":
        keep = wp.Mesh(points=wp.array(np.asarray(v, np.float32), dtype=wp.vec3, device="cpu"),
                       indices=wp.array(np.asarray(t, np.int32).ravel(), dtype=wp.int32, device="cpu"))
        mesh_id, shift = keep.id, np.zeros(3)
    else:
        keep, mesh_id, shift, radius = _world_mesh(v, t, "auto")
        if given == "cull radius":
            cull_radius = radius
    rng = np.random.default_rng(21)
    size = float(np.ptp(np.asarray(v), 0).max())
    lo, hi = np.asarray(v, np.float64).min(0), np.asarray(v, np.float64).max(0)
    spread = 1.5 if given != "raw" and name == "open_cup" else 0.4  # an open surface's inside reaches out
    pts = rng.uniform(lo - spread * size, hi + spread * size, size=(3000, 3))
    reach = rng.uniform(0.0, 0.6 * size, size=3000)
    out = wp.zeros(len(pts), dtype=wp.int32, device="cpu")
    wp.launch(_out_of_reach_kernel, len(pts), [wp.uint64(mesh_id), cull_radius,
                                               wp.array((pts + shift).astype(np.float32), dtype=wp.vec3, device="cpu"),
                                               wp.array(reach.astype(np.float32), dtype=float, device="cpu"), out],
              device="cpu")
    culled = out.numpy().astype(bool)
    tv, tt = case.truth()
    dist = np.abs(ref.signed_distance(pts, tv, tt)[0])
    inside = ref.winding_number(pts, tv, tt) > 0.5
    assert culled.sum() > 200 and (~culled).sum() > 200
    assert (dist[culled] > reach[culled] * (1 - 1e-5) - 1e-6).all() and not inside[culled].any()
    box_gap = np.linalg.norm(np.maximum(np.maximum(lo - pts, pts - hi), 0.0), axis=1)
    beyond = box_gap > reach * (1 + 1e-4) + 1e-6
    if given == "cull radius":
        beyond = np.linalg.norm(pts + shift, axis=1) > cull_radius + reach * (1 + 1e-4) + 1e-6
    if given != "auto" or name != "open_cup":  # an open surface is culled by its winding radius
        assert culled[beyond].all()
