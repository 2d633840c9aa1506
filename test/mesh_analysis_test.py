"""The sign data mesh_analysis writes (pseudo-normals, rim chunks, box, area, radii) against the
loops of the independent reference, at build and over refits, in one launch or in the passes
CUDA uses."""
import numpy as np
import pytest

import reference as ref
from robot_sdf import mesh_analysis, mesh_topology


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
    welded = mesh_topology.weld(v)
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
    writer = mesh_analysis.SignDataWriter(mesh_analysis.sign_topology(t, mesh_topology.weld(v)), "cpu",
                                          one_launch=False)
    group = ref.position_groups(v)
    for shape in (v, np.asarray(v * 0.5 - 0.1, np.float32)):
        out = np.full((writer.rows, 3), np.nan, np.float32)  # every row must be written
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
