"""mesh_analysis helpers that replace GIL-holding numpy calls: same results as numpy's own.

weld and _unique exist so that analysing a million-triangle mesh never holds the GIL for long
(bench/soak.py --only stall measures the effect); here they are checked against np.unique.
"""
import numpy as np
import pytest

import reference as ref
from robot_sdf import mesh_analysis


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 50_000])
def test_weld_matches_numpy_unique_rows(n):
    rng = np.random.default_rng(n)
    v = rng.integers(-3, 3, (n, 3)).astype(np.float32) * np.float32(0.25)
    if n >= 2:
        v[0], v[1] = [-0.0, 0.5, 0.0], [0.0, 0.5, -0.0]  # signed zeros are the same position
    _, first, inverse = np.unique(v, axis=0, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(mesh_analysis.weld(v), first[inverse.reshape(-1)])
    if n >= 2:
        assert mesh_analysis.weld(v)[1] == 0


def test_weld_of_no_vertices():
    assert mesh_analysis.weld(np.zeros((0, 3), np.float32)).shape == (0,)


@pytest.mark.parametrize("n", [0, 1, 9, 10_000])
def test_unique_matches_numpy(n):
    x = np.random.default_rng(n + 5).integers(0, max(1, n // 3), n)
    values, index, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    got = mesh_analysis._unique(x, return_index=True, return_inverse=True, return_counts=True)
    for want, have in zip((values, index, inverse.reshape(-1), counts), got):
        np.testing.assert_array_equal(have, want)
    np.testing.assert_array_equal(mesh_analysis._unique(x), np.unique(x))


def test_scatter_min_matches_a_loop():
    rng = np.random.default_rng(2)
    index = rng.integers(0, 1000, 3 * mesh_analysis._GIL_CHUNK + 17)  # several chunks
    values = rng.integers(0, 10**6, index.shape[0])
    target = rng.integers(0, 10**6, 1000)
    want = target.copy()
    for i, v in zip(index.tolist(), values.tolist()):
        want[i] = min(want[i], v)
    mesh_analysis._scatter_min(target, index, values)
    np.testing.assert_array_equal(target, want)


# ---------------------------------------------------------------------------- sign data vs loops
def _sign_meshes():
    import mesh_corpus as corpus

    picked = ("thin_ridge", "concave_vertex", "icosphere_soup", "duplicated_faces", "degenerate_triangles",
              "touching_boxes", "open_cup", "flipped_faces", "open_cup_flipped", "arm_link_flipped_10")
    return [(case.name, case.build()) for case in corpus.CORPUS if case.name in picked]


def _check_rim_rows(data, v, t, group):
    """The rim chunk rows (mesh_analysis module docstring) against the rim found by loops: the
    row count, the chunks' lengths summing to the rim's length times multiplicity, and every rim
    edge inside the box of a chunk."""
    n_v, n_t = len(v), len(t)
    rim = ref.loop_rim(v, t, group)
    chunks = int(data[-1, 2])
    assert chunks == min(mesh_analysis.RIM_CHUNKS, len(rim))
    assert data.shape == (n_v + 4 * n_t + 3 * chunks + mesh_analysis.SIGN_DATA_EXTRA, 3)
    # The face rows before the rim: left 0 (nothing settled) by the writer, at build and refit.
    assert not data[n_v + 3 * n_t:n_v + 4 * n_t].any()
    rows = data[n_v + 4 * n_t:n_v + 4 * n_t + 3 * chunks].reshape(chunks, 3, 3)
    v64 = np.asarray(v, np.float64)
    length = sum(m * np.linalg.norm(v64[b] - v64[a]) for a, b, m in rim)
    assert rows[:, 2, 0].astype(np.float64).sum() == pytest.approx(length, rel=1e-5)
    assert rows[:, 2, 0].astype(np.float64).sum() >= length * (1.0 - 1e-6)  # rounded up, not down
    for a, b, _ in rim:
        ends = np.asarray(v, np.float32)[[a, b]]
        inside = np.all((ends[:, None] >= rows[None, :, 0]) & (ends[:, None] <= rows[None, :, 1]), axis=(0, 2))
        assert inside.any(), (a, b)


@pytest.mark.parametrize("name, mesh", _sign_meshes(), ids=[n for n, _ in _sign_meshes()])
def test_sign_data_normals_match_loops_also_after_refits(name, mesh):
    """The sign data of the built shape and of two deformations that reuse its topology (what
    every refit after the first does): pseudo-normals, bounding radius and area."""
    from robot_sdf.types import SignMethod

    v, t = np.asarray(mesh[0], np.float32), np.asarray(mesh[1], np.int64)
    n_v, n_t = len(v), len(t)
    group = ref.position_groups(v)  # a refit keeps the grouping of the shape it was built from
    welded = mesh_analysis.weld(v)
    topology = mesh_analysis.sign_topology(t, welded)
    rng = np.random.default_rng(3)
    for step, shape in enumerate([v, v * 1.7 + 0.2, v + rng.normal(0.0, 0.004, v.shape)]):
        shape = np.asarray(shape, np.float32)
        data = mesh_analysis.sign_data(shape, t, False, SignMethod.NORMAL, welded=welded,
                                       topology=topology if step else None)
        _check_rim_rows(data, shape, t, group)
        vn, en = ref.loop_pseudo_normals(shape, t, group)
        np.testing.assert_allclose(data[:n_v], vn, atol=2e-6)
        np.testing.assert_allclose(data[n_v:n_v + 3 * n_t].reshape(-1, 3, 3), en, atol=2e-6)
        s64 = shape.astype(np.float64)
        np.testing.assert_allclose(data[-5], s64.min(axis=0), atol=1e-7)
        np.testing.assert_allclose(data[-4], s64.max(axis=0), atol=1e-7)
        assert data[-2, 0] > np.sqrt((s64 ** 2).sum(axis=1)).max()
        area = 0.5 * np.linalg.norm(np.cross(s64[t[:, 1]] - s64[t[:, 0]], s64[t[:, 2]] - s64[t[:, 0]]), axis=1).sum()
        np.testing.assert_allclose(data[-1, 0], area, rtol=1e-5)


def _launch_meshes():
    return [m for m in _sign_meshes() if m[0] in ("touching_boxes", "thin_ridge", "open_cup_flipped",
                                                  "arm_link_flipped_10")]


@pytest.mark.parametrize("name, mesh", _launch_meshes(), ids=[n for n, _ in _launch_meshes()])
def test_sign_data_passes_as_separate_launches_match_loops(name, mesh):
    """The four one-pass kernels CUDA uses (run here on the CPU), reused over two shapes."""
    from robot_sdf.types import SignMethod

    v, t = np.asarray(mesh[0], np.float32), np.asarray(mesh[1], np.int64)
    writer = mesh_analysis.SignDataWriter(mesh_analysis.sign_topology(t, mesh_analysis.weld(v)), "cpu",
                                          one_launch=False)
    group = ref.position_groups(v)
    for shape in (v, np.asarray(v * 0.5 - 0.1, np.float32)):
        out = np.empty((writer.rows, 3), np.float32)
        points = np.empty_like(shape)
        # given about a centre: the writer centres them (float64, rounded once)
        raw = np.asarray(shape.astype(np.float64) + (0.25, -1.5, 3.0), np.float32)
        radius, winding_radius = writer.write(mesh_analysis.host_array(raw), (0.25, -1.5, 3.0),
                                              mesh_analysis.host_array(points), mesh_analysis.host_array(out), True,
                                              SignMethod.WINDING_NUMBER)
        np.testing.assert_array_equal(points, np.asarray(raw.astype(np.float64) - (0.25, -1.5, 3.0), np.float32))
        shape = points
        vn, en = ref.loop_pseudo_normals(shape, t, group)
        np.testing.assert_allclose(out[:len(v)], vn, atol=2e-6)
        np.testing.assert_allclose(out[len(v):len(v) + 3 * len(t)].reshape(-1, 3, 3), en, atol=2e-6)
        assert radius == pytest.approx(np.sqrt((shape.astype(np.float64) ** 2).sum(axis=1)).max(), rel=1e-12)
        assert winding_radius > radius and out[-3, 0] == mesh_analysis.SIGN_DATA_MAGIC and out[-3, 1] == 1.0
        _check_rim_rows(out, shape, t, group)


# ---------------------------------------------------------------------------- orientation repair
def _signed_volume(v, t) -> float:
    a, b, c = (np.asarray(v, np.float64)[np.asarray(t)[:, k]] for k in range(3))
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6.0)


def _directed_edges_once(t) -> bool:
    """Every directed edge used at most once: consistent winding (a plain set, no numpy)."""
    seen = set()
    for a, b, c in np.asarray(t).tolist():
        for e in ((a, b), (b, c), (c, a)):
            if e in seen:
                return False
            seen.add(e)
    return True


def test_orient_components_restores_every_part():
    """Three separate closed parts (one inverted, one with 40 % of its triangles flipped, one
    clean), a hollow (outer box with an inward cavity, both flipped in part) and an open sheet
    with a minority flipped: each part comes back as built, counted per part."""
    import mesh_corpus as corpus

    rng = np.random.default_rng(9)
    parts = [corpus._moved(ref.icosphere(0.1, 2), (1.0, 0, 0)), corpus._moved(corpus.capsule(), (0, 1.0, 0)),
             corpus._moved(ref.box((0.2, 0.3, 0.1)), (0, 0, 1.0)),
             ref.box((0.4, 0.4, 0.4)), corpus.inside_out(ref.box((0.2, 0.2, 0.2))),
             corpus._moved(ref.sheet(0.3, 6), (-1.0, 0, 0))]
    v, want = corpus._merge(*parts)
    sizes = np.cumsum([0] + [len(p[1]) for p in parts])
    damaged = want.copy()
    damaged[sizes[0]:sizes[1]] = damaged[sizes[0]:sizes[1], ::-1]  # inverted
    for k, share in ((1, 0.4), (3, 0.25), (4, 0.25), (5, 0.2)):
        rows = sizes[k] + rng.choice(sizes[k + 1] - sizes[k], int(share * (sizes[k + 1] - sizes[k])), replace=False)
        damaged[rows] = damaged[rows, ::-1]
    out, rep = mesh_analysis.orient_components(v.astype(np.float32), damaged)
    np.testing.assert_array_equal(out, want)
    assert rep.components == 6 and rep.closed_components == 5 and rep.non_orientable == 0
    assert rep.components_reversed == 1
    assert rep.faces_reversed == int(np.count_nonzero(np.any(damaged != want, axis=1)))
    assert _directed_edges_once(out)
    for k in range(5):
        part = out[sizes[k]:sizes[k + 1]]
        assert (_signed_volume(v, part) > 0) == (k != 4)  # the cavity stays inward
    # already consistent and outward: nothing to do, same array content
    again, rep2 = mesh_analysis.orient_components(v.astype(np.float32), want)
    np.testing.assert_array_equal(again, want)
    assert rep2.faces_reversed == 0 and rep2.components_reversed == 0


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
    verdict, _ = mesh_analysis.classify(v, t)
    assert verdict.shells == 64 and verdict.solid and verdict.method.name == "WINDING_NUMBER", verdict.reason
    big_v, big_t = _tetrahedra(np.zeros((1, 3)), 3.0)
    small_v, small_t = _tetrahedra(np.full((1, 3), 0.3), 0.3)
    nested = (np.concatenate([big_v, small_v]), np.concatenate([big_t, small_t + 4]))
    verdict, _ = mesh_analysis.classify(*nested)
    assert not verdict.solid and "winding number 1.00" in verdict.reason, verdict.reason
    cavity = (nested[0], np.concatenate([big_t, small_t[:, ::-1] + 4]))
    verdict, _ = mesh_analysis.classify(*cavity)
    assert verdict.solid and verdict.shells == 2, verdict.reason
    many = np.stack(np.meshgrid(*[np.arange(13.0)] * 3, indexing="ij"), -1).reshape(-1, 3)
    assert len(many) > mesh_analysis.MAX_SOLID_SHELLS
    verdict, _ = mesh_analysis.classify(*_tetrahedra(many, 0.5))
    assert not verdict.solid and f"more than {mesh_analysis.MAX_SOLID_SHELLS}" in verdict.reason


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
    verdict, _ = mesh_analysis.classify(v, t)
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
    assert not mesh_analysis.classify(stray_v, stray_t[:-1])[0].closed


def test_real_collision_mesh_with_t_junctions_keeps_exact_signs():
    """KUKA KR210's link 2 collision mesh (rtb-data, as the file is) has 4 collinear triangles
    filling T-junctions: auto gives it the winding regime, whose signs agree with the exact
    winding number, and whose distances with the reference's, at points around and inside it
    beyond 0.1 mm of the surface."""
    import torch

    from bench import real_meshes
    from robot_sdf import MeshWorld

    v, t = real_meshes.load("kr210_link2_collision")
    verdict, _ = mesh_analysis.classify(v, t)
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


def test_cavity_inside_an_open_outer_surface_stays_a_cavity():
    """An inward-wound closed box (a cavity) inside a box whose top face is missing (open, as
    CAD outer surfaces with cracks are): the repair keeps the cavity as given, the winding number
    there stays 5/6 - 1 < 1/2 (outside), and MeshWorld's signs are the exact winding number's of
    the mesh as given. Turned outward (what the repair did before) it would read 5/6 + 1: a
    hollow made solid."""
    import torch

    from robot_sdf import MeshWorld

    outer_v, outer_t = ref.box((1.0, 1.0, 1.0))
    top = np.all(outer_v[outer_t][:, :, 2] > 0.49, axis=1)
    outer_t = outer_t[~top]
    cavity_v, cavity_t = ref.box((0.3, 0.3, 0.3))
    v = np.concatenate([outer_v, cavity_v])
    t = np.concatenate([outer_t, cavity_t[:, ::-1] + len(outer_v)])
    oriented, repair = mesh_analysis.orient_components(v, t)
    np.testing.assert_array_equal(oriented[len(outer_t):], t[len(outer_t):])
    assert repair.components_reversed == 0
    centre = np.zeros((1, 3))
    assert ref.winding_number(centre, v, t)[0] < 0.0
    rng = np.random.default_rng(9)
    pts = np.concatenate([rng.uniform(-0.14, 0.14, (200, 3)), rng.uniform(-0.45, 0.45, (400, 3))])
    w = ref.winding_number(pts, v, t)
    d = ref.unsigned_distance(pts, v, t)
    far = d > 1e-3
    world = MeshWorld(device="cpu", max_distance=2.0)
    world.add_mesh("shell", v, t)
    sd, _ = world.signed_distance(torch.from_numpy(pts.astype(np.float32)), max_distance=2.0)
    sd = sd.numpy()
    assert np.sum(far & (np.abs(pts).max(axis=1) < 0.14)) >= 100  # in the cavity, outside
    np.testing.assert_array_equal(sd[far] < 0, w[far] > 0.5)
