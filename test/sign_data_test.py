"""robot_sdf.kernels.sign_data, the one home of the sign-data layout: its accessors read, through
nothing but the mesh id, the rows mesh_analysis writes at the offsets docs/design.md ("Sign-data
layout") documents, with the values numpy gives the geometry (box, area, rim length, closed,
slivers, unit pseudo-normals); meshes without the data are recognised as built elsewhere; and no
other kernel module reads a row by offset."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import warp as wp

import mesh_corpus as corpus
from robot_sdf import mesh_analysis
from robot_sdf.kernels import sign_data
from robot_sdf.types import SignMethod

KERNELS = Path(__file__).resolve().parents[1] / "robot_sdf" / "kernels"
FACTS = 12  # scalars per mesh read by _facts_kernel


@wp.kernel
def _facts_kernel(mesh: wp.uint64, facts: wp.array(dtype=float), boxes: wp.array(dtype=wp.vec3),
                  rims: wp.array(dtype=wp.vec3), vertex_normals: wp.array(dtype=wp.vec3),
                  edge_normals: wp.array(dtype=wp.vec3), face_rows: wp.array(dtype=wp.vec3)):
    data = sign_data.sign_data_offset(mesh)
    facts[0] = float(data)
    if data < 0:
        return
    boxes[0] = sign_data.box_lower(mesh, data)
    boxes[1] = sign_data.box_upper(mesh, data)
    facts[1] = wp.where(sign_data.supports_winding(mesh, data), 1.0, 0.0)
    facts[2] = float(sign_data.recorded_method(mesh, data))
    facts[3] = sign_data.winding_radius(mesh, data)
    facts[4] = wp.where(sign_data.is_closed(mesh, data), 1.0, 0.0)
    facts[5] = wp.where(sign_data.has_slivers(mesh, data), 1.0, 0.0)
    facts[6] = sign_data.surface_area(mesh, data)
    facts[7] = wp.where(sign_data.is_solid(mesh, data), 1.0, 0.0)
    chunks = sign_data.rim_chunk_count(mesh, data)
    facts[8] = float(chunks)
    for c in range(chunks):
        row = sign_data.rim_chunk_row(mesh, data, c)
        rims[3 * c] = sign_data.rim_chunk_lower(mesh, row)
        rims[3 * c + 1] = sign_data.rim_chunk_upper(mesh, row)
        rims[3 * c + 2] = wp.vec3(sign_data.rim_chunk_length(mesh, row), 0.0, 0.0)
    m = wp.mesh_get(mesh)
    for v in range(m.points.shape[0]):
        vertex_normals[v] = sign_data.vertex_normal(mesh, v)
    for f in range(m.indices.shape[0] // 3):
        for k in range(3):
            edge_normals[3 * f + k] = sign_data.edge_normal(mesh, f, k)
        face_rows[f] = sign_data.face_winding(mesh, f)


def _read(mesh: wp.Mesh, n_vertices: int, n_triangles: int) -> dict:
    out = dict(facts=wp.zeros(FACTS, dtype=float, device="cpu"), boxes=wp.zeros(2, dtype=wp.vec3, device="cpu"),
               rims=wp.zeros(3 * sign_data.RIM_CHUNKS, dtype=wp.vec3, device="cpu"),
               vertex_normals=wp.zeros(n_vertices, dtype=wp.vec3, device="cpu"),
               edge_normals=wp.zeros(3 * n_triangles, dtype=wp.vec3, device="cpu"),
               face_rows=wp.zeros(n_triangles, dtype=wp.vec3, device="cpu"))
    wp.launch(_facts_kernel, 1, [mesh.id, *out.values()], device="cpu")
    return {k: v.numpy() for k, v in out.items()}


def _mesh(v: np.ndarray, t: np.ndarray, velocities: np.ndarray | None) -> wp.Mesh:
    return wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(t.astype(np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   velocities=None if velocities is None else wp.array(velocities, dtype=wp.vec3, device="cpu"))


@pytest.mark.parametrize("name, winding, method", [("capsule", False, SignMethod.NORMAL),
                                                   ("open_cup", True, SignMethod.WINDING_NUMBER),
                                                   ("sliver_box", True, SignMethod.NORMAL),
                                                   ("hollow_shell", True, SignMethod.WINDING_NUMBER)])
def test_accessors_read_the_rows_mesh_analysis_writes(name, winding, method):
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    v = np.asarray(v, np.float32)
    t = np.asarray(t, np.int64)
    rows = mesh_analysis.sign_data(v, t, winding, method)
    rows[-1, 1] = 1.0  # the solid flag, which the owner of the mesh sets (MeshWorld, adoption)
    got = _read(_mesh(v, t, rows), len(v), len(t))
    n_v, n_t = len(v), len(t)
    # The documented layout: V + 4T + 3K + 5 rows, the mesh's box at B = V + 4T + 3K.
    k = (len(rows) - n_v - 4 * n_t - 5) // 3
    b = n_v + 4 * n_t + 3 * k
    assert sign_data.row_count(n_v, n_t, k) == len(rows) and sign_data.face_rows_start(n_v, n_t) == n_v + 3 * n_t
    assert len(rows) == b + 5 and 0 <= k <= 16
    facts, boxes = got["facts"], got["boxes"]
    assert facts[0] == b
    np.testing.assert_array_equal(boxes, rows[b:b + 2])
    np.testing.assert_array_equal(boxes, [v.min(0), v.max(0)])
    assert rows[b + 2, 0] == 7.0e5 and facts[1] == float(winding) and facts[2] == float(int(method))
    assert facts[3] == rows[b + 3, 0] and facts[3] > np.linalg.norm(v, axis=1).max()
    closed = name != "open_cup"
    tri = v[t].astype(np.float64)
    area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
    longest2 = np.max(np.sum((tri - np.roll(tri, 1, axis=1)) ** 2, axis=2), axis=1)
    # Slivers: longest edge / height above 20, not flat (height below 1e-6 of the longest edge).
    slivers = np.any((longest2 > 20.0 * area2) & (area2 > 1e-6 * longest2))
    assert slivers or name != "sliver_box"
    assert facts[4] == float(closed) and facts[5] == float(slivers) and facts[7] == 1.0
    np.testing.assert_allclose(facts[6], 0.5 * area2.sum(), rtol=1e-5)
    assert facts[8] == k and (k == 0) == closed
    rims = got["rims"][:3 * k]
    np.testing.assert_array_equal(rims, rows[n_v + 4 * n_t:b])
    if not closed:
        # The open cup's rim: the four top edges of a 0.2 m box, in chunks whose boxes hold them.
        np.testing.assert_allclose(rims[2::3, 0].sum(), 0.8, rtol=1e-5)
        top = v[:, 2].max()
        assert np.all(rims[1::3, 2] == top) and np.all(rims[0::3, 2] == top)
    np.testing.assert_array_equal(got["vertex_normals"], rows[:n_v])
    np.testing.assert_array_equal(got["edge_normals"], rows[n_v:n_v + 3 * n_t])
    # Face rows: written by the mesh's owner (robot_sdf.face_winding); the writer leaves them 0.
    np.testing.assert_array_equal(got["face_rows"], rows[n_v + 3 * n_t:n_v + 4 * n_t])
    assert not rows[n_v + 3 * n_t:n_v + 4 * n_t].any()
    used = np.unique(t)
    np.testing.assert_allclose(np.linalg.norm(got["vertex_normals"][used], axis=1), 1.0, rtol=1e-5)


def test_meshes_without_sign_data_are_built_elsewhere():
    """sign_data_offset is -1 for a mesh without velocities, with per-vertex velocities, with one
    row too many or too few, or without the marker; and the layout's own rows where all is right."""
    v, t = corpus.capsule()
    v = np.asarray(v, np.float32)
    t = np.asarray(t, np.int64)
    rows = mesh_analysis.sign_data(v, t, False, SignMethod.NORMAL)
    no_marker = rows.copy()
    no_marker[-3, 0] = 7.0e5 + 1.0
    cases = {"none": None, "per vertex": np.zeros_like(v), "one more": np.concatenate([rows, rows[-1:]]),
             "one fewer": rows[1:], "no marker": no_marker}
    for name, velocities in cases.items():
        assert _read(_mesh(v, t, velocities), len(v), len(t))["facts"][0] == -1.0, name
    assert _read(_mesh(v, t, rows), len(v), len(t))["facts"][0] == len(rows) - 5


def test_layout_constants_are_those_documented():
    assert (sign_data.ROW_BOX_LOWER, sign_data.ROW_BOX_UPPER, sign_data.ROW_MARKER, sign_data.ROW_BOUNDS,
            sign_data.ROW_AREA) == (0, 1, 2, 3, 4)
    assert (sign_data.SIGN_DATA_EXTRA, sign_data.RIM_ROWS_PER_CHUNK, sign_data.RIM_CHUNKS) == (5, 3, 16)
    assert (sign_data.RIM_LOWER, sign_data.RIM_UPPER, sign_data.RIM_LENGTH) == (0, 1, 2)
    assert sign_data.SIGN_DATA_MAGIC == 7.0e5 == float(np.float32(7.0e5))
    # mesh_analysis writes with the same constants, not copies of them.
    assert mesh_analysis.SIGN_DATA_MAGIC is sign_data.SIGN_DATA_MAGIC
    assert mesh_analysis.RIM_CHUNKS is sign_data.RIM_CHUNKS
    # The sign codes the data records are SignMethod's.
    for name in ("NORMAL", "DEFAULT", "WINDING_NUMBER", "PARITY", "AUTO"):
        assert getattr(sign_data, f"SIGN_{name}") == int(SignMethod[name])
    assert sign_data.SIGN_PER_SLOT not in {int(m) for m in SignMethod}


def test_no_other_kernel_module_reads_the_rows():
    """Only sign_data reads a mesh's velocities array (``m.velocities``), and the marker value is
    written in one place of the package."""
    for path in sorted(KERNELS.glob("*.py")):
        text = path.read_text()
        if path.name != "sign_data.py":
            assert not re.search(r"\.velocities\b", text), path.name
        assert path.name == "sign_data.py" or not re.search(r"7\.0e5|700000", text), path.name
    core = Path(mesh_analysis.__file__).parent
    holders = [p.relative_to(core).as_posix() for p in sorted(core.rglob("*.py")) if re.search(r"7\.0e5", p.read_text())]
    assert holders == ["kernels/sign_data.py"]
