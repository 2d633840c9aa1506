"""robot_sdf.io: mesh files written by trimesh round-trip; primitives have the asked geometry."""

from __future__ import annotations

import numpy as np
import pytest
import trimesh

import reference as ref
from robot_sdf.io import box_mesh, cylinder_mesh, load_mesh, scale_mesh, sphere_mesh

FORMATS = ["stl", "obj", "ply", "glb"]


def canonical_triangles(vertices: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Triangles as (T, 9) coordinates, each rotated (orientation kept) to start at its smallest
    vertex, rows sorted: equal for two meshes with the same oriented faces, whatever the indexing."""
    tri = np.asarray(vertices, dtype=np.float64)[np.asarray(triangles)]
    keys = np.round(tri, 5)
    out = np.empty_like(tri)
    for i in range(len(tri)):
        order = [tuple(k) for k in keys[i]]
        start = order.index(min(order))
        out[i] = np.roll(tri[i], -start, axis=0)
    flat = out.reshape(len(tri), 9)
    return flat[np.lexsort(np.round(flat, 5).T[::-1])]


@pytest.fixture(scope="module")
def source_mesh():
    """An asymmetric closed mesh: a squashed, shifted icosphere."""
    v, t = ref.icosphere(0.2, 1)
    return v * np.array([1.0, 0.6, 1.4]) + np.array([0.1, -0.05, 0.3]), t


@pytest.mark.parametrize("fmt", FORMATS)
def test_round_trip(tmp_path, source_mesh, fmt):
    v, t = source_mesh
    path = tmp_path / f"mesh.{fmt}"
    trimesh.Trimesh(vertices=v, faces=t, process=False).export(str(path))
    lv, lt = load_mesh(path)
    assert lv.dtype == np.float32 and lv.ndim == 2 and lv.shape[1] == 3
    assert lt.dtype == np.int32 and lt.ndim == 2 and lt.shape == (len(t), 3)
    assert lt.min() >= 0 and lt.max() < len(lv)
    np.testing.assert_allclose(canonical_triangles(lv, lt), canonical_triangles(v, t), atol=1e-6)
    # same solid: same signed distances (so the winding survived too)
    pts = np.random.default_rng(0).uniform(-0.3, 0.6, size=(100, 3))
    np.testing.assert_allclose(ref.signed_distance(pts, lv, lt)[0], ref.signed_distance(pts, v, t)[0], atol=1e-6)
    # scale
    sv, st = load_mesh(path, scale=0.001)
    np.testing.assert_allclose(sv, lv * 0.001, rtol=1e-6)
    np.testing.assert_array_equal(st, lt)


def test_box_mesh_geometry():
    v, t = box_mesh((0.2, 0.4, 0.6))
    assert v.dtype == np.float32 and t.dtype == np.int32
    np.testing.assert_allclose(v.min(axis=0), [-0.1, -0.2, -0.3], atol=1e-7)
    np.testing.assert_allclose(v.max(axis=0), [0.1, 0.2, 0.3], atol=1e-7)
    # a closed, outward-wound solid: the reference box distance everywhere
    pts = np.random.default_rng(1).uniform(-0.5, 0.5, size=(200, 3))
    rv, rt = ref.box((0.2, 0.4, 0.6))
    np.testing.assert_allclose(ref.signed_distance(pts, v, t)[0], ref.signed_distance(pts, rv, rt)[0], atol=1e-6)


def test_sphere_mesh_geometry():
    v, t = sphere_mesh(0.3, subdivisions=2)
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 0.3, atol=1e-6)
    assert len(t) == 20 * 4**2
    np.testing.assert_allclose(ref.winding_number(np.zeros((1, 3)), v, t), 1.0, atol=1e-9)
    # inscribed polyhedron: the centre is between the sagitta and the radius deep
    sd = ref.signed_distance(np.zeros((1, 3)), v, t)[0][0]
    assert -0.3 <= sd < -0.28


def test_cylinder_mesh_geometry():
    v, t = cylinder_mesh(0.1, 0.5, sections=24)
    np.testing.assert_allclose([v[:, 2].min(), v[:, 2].max()], [-0.25, 0.25], atol=1e-7)
    r = np.linalg.norm(v[:, :2], axis=1)
    assert r.max() == pytest.approx(0.1, abs=1e-6)
    np.testing.assert_allclose(ref.winding_number(np.array([[0, 0, 0.0], [0.05, 0, 0.2]]), v, t), 1.0, atol=1e-9)
    np.testing.assert_allclose(ref.winding_number(np.array([[0.2, 0, 0.0], [0, 0, 0.3]]), v, t), 0.0, atol=1e-9)
    # the side at the centre height is radius-accurate to the polygon's apothem
    sd = ref.signed_distance(np.array([[0.0, 0.0, 0.0]]), v, t)[0][0]
    assert -0.1 <= sd <= -0.1 * np.cos(np.pi / 24) + 1e-6


@pytest.mark.parametrize("call", [
    lambda: box_mesh((0.1, -0.2, 0.3)),
    lambda: box_mesh((0.1, 0.2)),
    lambda: box_mesh((0.1, np.nan, 0.3)),
    lambda: sphere_mesh(0.0),
    lambda: sphere_mesh(-1.0),
    lambda: cylinder_mesh(0.1, 0.0),
    lambda: cylinder_mesh(-0.1, 1.0),
])
def test_bad_primitives(call):
    with pytest.raises(ValueError):
        call()


def test_bad_files(tmp_path):
    with pytest.raises(ValueError):
        load_mesh(tmp_path / "missing.stl")
    garbage = tmp_path / "garbage.stl"
    garbage.write_bytes(b"\x00\x01 this is not an stl file \xff" * 3)
    with pytest.raises(ValueError):
        load_mesh(garbage)
    empty = tmp_path / "empty.obj"
    empty.write_text("")
    with pytest.raises(ValueError):
        load_mesh(empty)
    points_only = tmp_path / "points.obj"
    points_only.write_text("v 0 0 0\nv 1 0 0\nv 0 1 0\n")
    with pytest.raises(ValueError):
        load_mesh(points_only)
    text = tmp_path / "mesh.txt"
    text.write_text("solid x\nendsolid x\n")
    with pytest.raises(ValueError):
        load_mesh(text)
    directory = tmp_path / "dir.stl"
    directory.mkdir()
    with pytest.raises(ValueError):
        load_mesh(directory)
    good = tmp_path / "good.stl"
    trimesh.Trimesh(*ref.box((1, 1, 1)), process=False).export(str(good))
    for scale in (0.0, float("nan"), (1.0, 0.0, 1.0), (1.0, 2.0), "big", (1.0, float("inf"), 1.0)):
        with pytest.raises(ValueError, match=r"good\.stl: scale"):
            load_mesh(good, scale=scale)


def _collada(geometries: dict[str, tuple[np.ndarray, np.ndarray]], nodes: list[tuple[str, np.ndarray]],
             unit_metres: float = 1.0) -> str:
    """A COLLADA 1.4.1 document written by hand: each geometry a <triangles> mesh, each node a
    4x4 <matrix> (row-major, as COLLADA stores it) instancing one geometry."""
    geo_xml = []
    for name, (v, t) in geometries.items():
        floats = " ".join(f"{x:.9g}" for x in np.asarray(v, np.float64).reshape(-1))
        idx = " ".join(str(int(i)) for i in np.asarray(t).reshape(-1))
        geo_xml.append(f"""
    <geometry id="{name}" name="{name}"><mesh>
      <source id="{name}-pos"><float_array id="{name}-arr" count="{v.size}">{floats}</float_array>
        <technique_common><accessor source="#{name}-arr" count="{len(v)}" stride="3">
          <param name="X" type="float"/><param name="Y" type="float"/><param name="Z" type="float"/>
        </accessor></technique_common></source>
      <vertices id="{name}-vtx"><input semantic="POSITION" source="#{name}-pos"/></vertices>
      <triangles count="{len(t)}"><input semantic="VERTEX" source="#{name}-vtx" offset="0"/><p>{idx}</p></triangles>
    </mesh></geometry>""")
    node_xml = []
    for k, (geo, matrix) in enumerate(nodes):
        m = " ".join(f"{x:.9g}" for x in np.asarray(matrix, np.float64).reshape(-1))
        node_xml.append(f"""
      <node id="n{k}" name="n{k}"><matrix>{m}</matrix><instance_geometry url="#{geo}"/></node>""")
    return f"""<?xml version="1.0" encoding="utf-8"?>
<COLLADA xmlns="http://www.collada.org/2005/11/COLLADASchema" version="1.4.1">
  <asset><unit meter="{unit_metres}" name="unit"/><up_axis>Z_UP</up_axis></asset>
  <library_geometries>{"".join(geo_xml)}
  </library_geometries>
  <library_visual_scenes><visual_scene id="scene">{"".join(node_xml)}
  </visual_scene></library_visual_scenes>
  <scene><instance_visual_scene url="#scene"/></scene>
</COLLADA>
"""


def _matrix(pose) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = ref.quat_to_matrix(np.asarray(pose[3:], np.float64))
    m[:3, 3] = pose[:3]
    return m


def test_collada_two_geometries_with_node_transforms(tmp_path):
    """A .dae with two geometries under transformed nodes loads as one mesh with every node's
    transform applied (and the same solid as the transformed parts)."""
    box_v, box_t = ref.box((0.2, 0.1, 0.3))
    ball_v, ball_t = ref.icosphere(0.1, 1)
    pose_box = (0.5, 0.0, 0.2, np.cos(0.3), 0.0, 0.0, np.sin(0.3))
    pose_ball = (-0.3, 0.4, 0.0, 1.0, 0.0, 0.0, 0.0)
    path = tmp_path / "link.dae"
    path.write_text(_collada({"box": (box_v, box_t), "ball": (ball_v, ball_t)},
                             [("box", _matrix(pose_box)), ("ball", _matrix(pose_ball))]))
    v, t = load_mesh(path)
    want_v = np.concatenate([ref.transform_points(np.asarray(pose_box), box_v),
                             ref.transform_points(np.asarray(pose_ball), ball_v)])
    want_t = np.concatenate([box_t, ball_t + len(box_v)])
    assert t.shape == want_t.shape
    np.testing.assert_allclose(canonical_triangles(v, t), canonical_triangles(want_v, want_t), atol=1e-6)
    # millimetre file, scaled by its <unit>
    mm = tmp_path / "link_mm.dae"
    mm.write_text(_collada({"box": (box_v * 1000.0, box_t)}, [("box", np.eye(4))], unit_metres=0.001))
    v_mm, _ = load_mesh(mm)
    np.testing.assert_allclose(np.sort(v_mm, axis=0), np.sort(box_v, axis=0), atol=1e-6)


def test_load_errors_name_the_file_and_the_problem(tmp_path):
    good = tmp_path / "good.stl"
    trimesh.Trimesh(*ref.box((1, 1, 1)), process=False).export(str(good))
    data = good.read_bytes()
    cut = tmp_path / "cut.stl"
    cut.write_bytes(data[: len(data) - 70])
    with pytest.raises(ValueError, match=r"cut\.stl: truncated binary STL.*12 triangles"):
        load_mesh(cut)
    stub = tmp_path / "stub.stl"
    stub.write_bytes(data[:40])
    with pytest.raises(ValueError, match=r"stub\.stl: truncated STL"):
        load_mesh(stub)
    nan_obj = tmp_path / "nan.obj"
    nan_obj.write_text("v 0 0 0\nv 1 0 nan\nv 0 1 0\nf 1 2 3\n")
    with pytest.raises(ValueError, match=r"nan\.obj: vertex 1 is not finite.*NaN"):
        load_mesh(nan_obj)
    nan_stl = tmp_path / "nan.stl"
    floats = np.frombuffer(data, dtype="<f4", count=12, offset=84).copy()
    floats[4] = np.nan  # x of the first vertex of the first triangle
    nan_stl.write_bytes(data[:84] + floats.tobytes() + data[84 + 48:])
    with pytest.raises(ValueError, match=r"nan\.stl: vertex \d+ is not finite"):
        load_mesh(nan_stl)
    bad_dae = tmp_path / "broken.dae"
    bad_dae.write_text("<COLLADA><library_geometries>")
    with pytest.raises(ValueError, match=r"broken\.dae"):
        load_mesh(bad_dae)


def _volume(v, t) -> float:
    a, b, c = (np.asarray(v, np.float64)[np.asarray(t)[:, k]] for k in range(3))
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6.0)


@pytest.mark.parametrize("scale", [(-1.0, 1.0, 1.0), (0.5, -2.0, 1.5), (-1.0, -1.0, -1.0), -0.001,
                                   (1.0, -1.0, -1.0), (2.0, 1.0, 0.5)])
def test_scale_mirrors_into_the_same_solid(tmp_path, source_mesh, scale):
    """A per-axis scale (a URDF <mesh scale>) with negative determinant mirrors the part: the
    loaded mesh is the mirrored solid, wound outward (positive volume), whose signed distance is
    the reference's at the mirrored points; a rotation-like scale (two negative factors) and a
    positive one keep the winding."""
    v, t = source_mesh
    path = tmp_path / "part.obj"
    trimesh.Trimesh(vertices=v, faces=t, process=False).export(str(path))
    lv, lt = load_mesh(path, scale=scale)
    s = np.broadcast_to(np.asarray(scale, np.float64), (3,))
    np.testing.assert_allclose(lv, np.asarray(v, np.float32) * s.astype(np.float32), rtol=1e-6, atol=1e-9)
    assert _volume(lv, lt) == pytest.approx(abs(np.prod(s)) * _volume(v, t), rel=1e-5)
    mirrored = np.prod(np.sign(s)) < 0
    orig_tri = np.asarray(t)
    # canonical comparison: the same triangles, reversed exactly when the scale mirrors
    want_t = orig_tri[:, ::-1] if mirrored else orig_tri
    np.testing.assert_allclose(canonical_triangles(lv, lt), canonical_triangles(np.asarray(v) * s, want_t), atol=1e-6)
    rng = np.random.default_rng(1)
    pts = rng.uniform(-0.4, 0.6, size=(200, 3))
    got = ref.signed_distance(pts * s, lv, lt)[0]
    want = ref.signed_distance(pts, v, t)[0]
    # |s| scales the distance only where it is uniform: compare signs everywhere, values then
    if np.allclose(np.abs(s), np.abs(s[0])):
        np.testing.assert_allclose(got, want * abs(s[0]), atol=1e-6)
    clear = np.abs(want) > 1e-3
    assert np.array_equal(got[clear] < 0, want[clear] < 0)
    # scale_mesh directly: same arrays, inputs untouched
    sv, st = scale_mesh(v, t, scale)
    np.testing.assert_array_equal(st, lt)
    assert np.array_equal(np.asarray(t), orig_tri)


def test_collada_mirrored_node_is_the_mirrored_solid(tmp_path):
    """A COLLADA node whose matrix mirrors (negative determinant) gives the mirrored part wound
    outward: the reference signed distance of the mirrored, re-wound part at every point."""
    box_v, box_t = ref.box((0.2, 0.1, 0.3))
    ball_v, ball_t = ref.icosphere(0.1, 1)
    ball_v = ball_v * np.array([1.0, 0.5, 1.5])  # asymmetric, so a mirror is not the identity
    mirror = np.diag([-1.0, 1.0, 1.0, 1.0])
    mirror[:3, 3] = (0.4, 0.0, 0.1)
    turn = _matrix((0.0, 0.3, 0.0, np.cos(0.4), np.sin(0.4), 0.0, 0.0)) @ np.diag([1.0, 1.0, -1.0, 1.0])
    path = tmp_path / "mirrored.dae"
    path.write_text(_collada({"box": (box_v, box_t), "ball": (ball_v, ball_t)},
                             [("box", mirror), ("ball", turn), ("box", np.eye(4))]))
    v, t = load_mesh(path)
    parts = []
    for (pv, pt), m in (((box_v, box_t), mirror), ((ball_v, ball_t), turn), ((box_v, box_t), np.eye(4))):
        mv = pv @ m[:3, :3].T + m[:3, 3]
        parts.append((mv, pt[:, ::-1] if np.linalg.det(m[:3, :3]) < 0 else pt))
    want_v = np.concatenate([p[0] for p in parts])
    want_t = np.concatenate([parts[0][1], parts[1][1] + len(box_v), parts[2][1] + len(box_v) + len(ball_v)])
    np.testing.assert_allclose(canonical_triangles(v, t), canonical_triangles(want_v, want_t), atol=1e-6)
    for k, (pv, pt) in enumerate(parts):
        assert _volume(pv, pt) > 0
    assert _volume(v, t) == pytest.approx(sum(_volume(*p) for p in parts), rel=1e-5)
