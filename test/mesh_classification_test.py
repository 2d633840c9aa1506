"""auto's classification (mesh_classification.classify): several shells told from nested ones,
T-junctions filled by collinear triangles kept in the winding regime."""
import numpy as np

import reference as ref
from robot_sdf import mesh_classification


def _tetrahedra(centres: np.ndarray, size: float) -> tuple[np.ndarray, np.ndarray]:
    """Outward-wound tetrahedra (one shell each) at ``centres`` (N,3)."""
    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1]], np.float64) * size
    t = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]], np.int64)
    verts = (centres[:, None, :] + v[None]).reshape(-1, 3)
    tris = (t[None] + 4 * np.arange(len(centres))[:, None, None]).reshape(-1, 3)
    return verts, tris


def test_solid_of_several_shells_is_told_from_nested_ones():
    """Separate tetrahedra bound one solid (auto: winding_number, solid); one more inside another
    (winding number 2 there) does not; an inward-wound one inside another is a cavity (solid);
    beyond MAX_SOLID_SHELLS shells nothing is checked (not solid)."""
    grid = np.stack(np.meshgrid(*[np.arange(4.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    v, t = _tetrahedra(grid, 0.5)
    verdict, _ = mesh_classification.classify(v, t)
    assert verdict.shells == 64 and verdict.solid and verdict.method.name == "WINDING_NUMBER", verdict.reason
    big_v, big_t = _tetrahedra(np.zeros((1, 3)), 3.0)
    small_v, small_t = _tetrahedra(np.full((1, 3), 0.3), 0.3)
    nested = (np.concatenate([big_v, small_v]), np.concatenate([big_t, small_t + 4]))
    verdict, _ = mesh_classification.classify(*nested)
    assert not verdict.solid and "winding number 1.00" in verdict.reason, verdict.reason
    cavity = (nested[0], np.concatenate([big_t, small_t[:, ::-1] + 4]))
    verdict, _ = mesh_classification.classify(*cavity)
    assert verdict.solid and verdict.shells == 2, verdict.reason
    many = np.stack(np.meshgrid(*[np.arange(13.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    assert len(many) > mesh_classification.MAX_SOLID_SHELLS
    verdict, _ = mesh_classification.classify(*_tetrahedra(many, 0.5))
    assert not verdict.solid and f"more than {mesh_classification.MAX_SOLID_SHELLS}" in verdict.reason


def _t_junction_box():
    """A 0.4 x 0.3 x 0.2 box whose +z face is cut in two with a vertex m on the middle of one of
    the face's edges, shared by the +y side only through a collinear triangle (a T-junction, as
    CAD exports leave them): the +y side's edge still runs corner to corner."""
    v, t = ref.box((0.4, 0.3, 0.2))
    top = [i for i, tri in enumerate(t) if np.all(v[tri, 2] > 0.09)]
    keep = np.delete(t, top, axis=0)
    corners = {tuple(np.round(v[i], 3)): i for i in range(len(v))}
    p = corners[(-0.2, -0.15, 0.1)]
    q = corners[(0.2, -0.15, 0.1)]
    r = corners[(0.2, 0.15, 0.1)]
    s = corners[(-0.2, 0.15, 0.1)]
    v = np.concatenate([v, [[0.0, 0.15, 0.1]]])
    m = len(v) - 1
    # Top face, counter-clockwise seen from +z, split at m on edge r-s; the collinear triangle
    # (s, m, r) balances the +y side's edge r -> s against the halves r -> m -> s.
    cut = np.array([[p, q, r], [p, r, m], [p, m, s], [s, m, r]])
    return v, np.concatenate([keep, cut])


def test_t_junction_filled_by_a_collinear_triangle_keeps_the_winding_number():
    """A collinear triangle that fills a T-junction balances the split edge, but its long edge's
    pseudo-normal would take the side face's normal alone (the filler has none): above the
    junction the pseudo-normal sign calls a point inside. auto keeps such a mesh in the winding
    regime (the filler closes it in the winding-number sense), whose signs and distances there are
    the exact winding number's and the reference's; without the filler the mesh is open."""
    import torch

    from robot_sdf import MeshWorld

    v, t = _t_junction_box()
    verdict, _ = mesh_classification.classify(v, t)
    assert not verdict.solid and verdict.method.name == "WINDING_NUMBER", verdict.reason
    rng = np.random.default_rng(3)
    pts = np.concatenate([rng.uniform(-0.25, 0.25, (3000, 3)),
                          np.array([0.0, 0.15, 0.1]) + rng.normal(0.0, 0.01, (1000, 3))])
    w = ref.winding_number(pts, v, t)
    d = ref.unsigned_distance(pts, v, t)
    far = d > 1e-4
    world = MeshWorld(device="cpu", max_distance=1.0)
    world.add_mesh("box", v, t)
    info = world.mesh_info("box")
    assert info["sign_method"] == "winding_number", info
    sd, _ = world.signed_distance(torch.from_numpy(pts.astype(np.float32)), max_distance=1.0)
    sd = sd.detach().numpy().reshape(-1)
    np.testing.assert_array_equal(sd[far] < 0, w[far] > 0.5)
    np.testing.assert_allclose(np.abs(sd[far]), d[far], atol=1e-5)
    stray_v, stray_t = _t_junction_box()
    assert not mesh_classification.classify(stray_v, stray_t[:-1])[0].closed


def test_real_collision_mesh_with_t_junctions_keeps_exact_signs():
    """KUKA KR210's link 2 collision mesh (rtb-data, as the file is) has 4 collinear triangles
    filling T-junctions: auto gives it the winding regime, whose signs agree with the exact
    winding number, and whose distances with the reference's, at points around and inside it
    beyond 0.1 mm of the surface."""
    import torch

    from bench import real_meshes
    from robot_sdf import MeshWorld

    v, t = real_meshes.load("kr210_link2_collision")
    verdict, _ = mesh_classification.classify(v, t)
    assert not verdict.solid and verdict.degenerate_triangles == 4, verdict.reason
    rng = np.random.default_rng(4)
    lo, hi = v.min(0), v.max(0)
    corners = v[t[rng.integers(0, len(t), 600)]]
    near = np.einsum("ij,ijk->ik", rng.dirichlet([1, 1, 1], 600), corners) + rng.normal(0.0, 0.005, (600, 3))
    pts = np.concatenate([rng.uniform(lo, hi, (600, 3)), near])
    w = ref.winding_number(pts, v, t)
    d = ref.unsigned_distance(pts, v, t)
    far = d > 1e-4
    assert np.sum(far & (w > 0.5)) >= 300
    world = MeshWorld(device="cpu", max_distance=2.0)
    world.add_mesh("link", v, t)
    assert world.mesh_info("link")["sign_method"] == "winding_number"
    sd, _ = world.signed_distance(torch.from_numpy(pts.astype(np.float32)), max_distance=2.0)
    sd = sd.detach().numpy()
    np.testing.assert_array_equal(sd.reshape(-1)[far] < 0, w[far] > 0.5)
    np.testing.assert_allclose(np.abs(sd.reshape(-1)[far]), d[far], atol=1e-5)
