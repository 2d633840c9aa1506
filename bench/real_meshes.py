"""Manufacturers' robot meshes shipped by rtb-data, loaded as the files are, and their facts.

The corpus (``CORPUS``) is a fixed, named selection of the CAD exports in the rtb-data package
(a pinned dependency: requirements.txt): KUKA, ABB, Franka Emika, Unimation, UFactory, Trossen
and Clearpath parts, visual and collision meshes, so that results are reproducible. Each file is
read as it is: STL through trimesh with ``process=False`` (a triangle soup, three vertices per
triangle, nothing merged or removed); COLLADA through pycollada (trimesh's COLLADA importer
merges vertices and drops triangles even with ``process=False``), every instance of every
triangle primitive in the file's scene graph with its node transform, concatenated in file
order, in the file's own indexing. The only change is the unit: COLLADA's ``<unit meter=...>``
and, for STL files given in millimetres, the scale the robot's URDF applies (``MeshFile.scale``).

``mesh_facts`` reports what makes a mesh hard (triangles, slivers, shells, closed or not,
self-intersections) and what MeshWorld's ``auto`` sign method chose for it and why;
``python -m bench.real_meshes`` prints the table (Markdown), with ``--winding`` also the exact
winding numbers of points around each mesh (test/reference.py, float64).

A machine without rtb-data (or its readers) loads the meshes from a pack instead: ``python -m
bench.real_meshes --pack FILE`` writes the corpus as loaded here into one compressed .npz, and
``load`` reads from it wherever the environment variable ROBOT_SDF_MESH_PACK names one.
"""
from __future__ import annotations

import argparse
import importlib.resources
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

# Longest edge / smallest height (= longest edge^2 / twice the area) above which a triangle is a
# sliver: robot_sdf.mesh_analysis.SLIVER_ASPECT, the criterion of the kernels' sliver flag.
SLIVER_ASPECT = 20.0
# Above this aspect a triangle is a needle (height below 1e-3 of its longest edge).
NEEDLE_ASPECT = 1000.0
# Height / longest edge at or below which a triangle is flat (no surface): mesh_topology.FLAT_RATIO.
FLAT_RATIO = 1e-6


@dataclass(frozen=True)
class MeshFile:
    """One mesh file of rtb-data: a stable short name, the path under the package directory,
    whether the robot's description uses it as a visual or a collision mesh, and the factor to
    metres that the description applies to it (1 for files in metres; COLLADA units apply too)."""

    name: str
    path: str
    kind: str
    scale: float = 1.0


_KUKA = "xacro/kuka_description"
_TROSSEN = "xacro/trossen_descriptions/meshes"
CORPUS: tuple[MeshFile, ...] = (
    MeshFile("kr3_link2_visual", f"{_KUKA}/kuka_kr3/meshes/kr3r540/visual/link_2.stl", "visual"),
    MeshFile("kr3_link4_visual", f"{_KUKA}/kuka_kr3/meshes/kr3r540/visual/link_4.stl", "visual"),
    MeshFile("kr3_link1_collision", f"{_KUKA}/kuka_kr3/meshes/kr3r540/collision/link_1.stl", "collision"),
    MeshFile("kr10_link2_visual", f"{_KUKA}/kuka_kr10/meshes/kr10r1100sixx/visual/link_2.stl", "visual"),
    MeshFile("kr10_base_visual", f"{_KUKA}/kuka_kr10/meshes/kr10r1100sixx/visual/base_link.stl", "visual"),
    MeshFile("kr6_link1_collision", f"{_KUKA}/kuka_kr6/meshes/kr6_agilus/collision/link_1.stl", "collision"),
    MeshFile("kr5_base_visual", f"{_KUKA}/kuka_kr5/meshes/kr5_arc/visual/base_link.dae", "visual"),
    MeshFile("kr16_link3_visual", f"{_KUKA}/kuka_kr16/meshes/kr16_2/visual/link_3.dae", "visual"),
    MeshFile("kr120_link2_visual", f"{_KUKA}/kuka_kr120/meshes/kr120r2500pro/visual/link_2.dae", "visual"),
    MeshFile("kr120_link5_collision", f"{_KUKA}/kuka_kr120/meshes/kr120r2500pro/collision/link_5.stl", "collision"),
    MeshFile("kr150_link1_visual", f"{_KUKA}/kuka_kr150/meshes/kr150_2/visual/link_1.dae", "visual"),
    MeshFile("kr210_link2_visual", f"{_KUKA}/kuka_kr210/meshes/kr210l150/visual/link_2.dae", "visual"),
    MeshFile("kr210_link2_collision", f"{_KUKA}/kuka_kr210/meshes/kr210l150/collision/link_2.stl", "collision"),
    MeshFile("iiwa_link2_visual", f"{_KUKA}/kuka_lbr_iiwa/meshes/lbr_iiwa_14_r820/visual/link_2.dae", "visual"),
    MeshFile("iiwa_link2_collision", f"{_KUKA}/kuka_lbr_iiwa/meshes/lbr_iiwa_14_r820/collision/link_2.stl",
             "collision"),
    MeshFile("irb140_link1", "meshes/ABB/IRB140/link1.stl", "visual"),
    MeshFile("panda_link0_visual", "xacro/qut_frankie_description/meshes/visual/link0.dae", "visual"),
    MeshFile("panda_hand_visual", "xacro/qut_frankie_description/meshes/visual/hand.dae", "visual"),
    # rtb-data's own Panda model: decimated copies of the visual meshes (link0: 5,119 of 20,483
    # triangles); its hand.stl is the visual hand.dae's geometry, so it is not listed.
    MeshFile("panda_link0_decimated", "meshes/FRANKA-EMIKA/Panda/link0.stl", "visual"),
    MeshFile("panda_link5_decimated", "meshes/FRANKA-EMIKA/Panda/link5.stl", "visual"),
    MeshFile("puma560_link3_visual", "xacro/unimation_puma560_description/meshes/puma560_link3.dae", "visual"),
    MeshFile("puma560_link1_collision", "xacro/unimation_puma560_description/meshes/puma560_collision1.dae",
             "collision"),
    MeshFile("xarm6_link2_visual", "armer_xarm/data/xacro/meshes/xarm6/visual/link2.stl", "visual"),
    MeshFile("vx300s_gripper", f"{_TROSSEN}/meshes_vx300s/VXSA-300-M-7-Gripper.stl", "visual", 0.001),
    MeshFile("wx250s_lower_forearm", f"{_TROSSEN}/meshes_wx250s/WXSA-250-M-5-LF.stl", "visual", 0.001),
    MeshFile("ridgeback_body", "xacro/clearpath_ridgeback_description/meshes/body.stl", "visual"),
    MeshFile("ridgeback_lidar", "xacro/clearpath_ridgeback_description/meshes/ust-10lx.stl", "visual"),
)
BY_NAME = {m.name: m for m in CORPUS}
# The bench's real-mesh scene (bench.scenes.real_robot_meshes): 11 meshes, 128,992 triangles,
# every kind of surface of the corpus except the double-sided kr210_link2_visual (winding number
# 0 everywhere: it bounds nothing). Open visual exports with self-intersections (kr3, kr10, panda),
# closed self-intersecting ones (kr16, kr5, irb140), a nearly closed collision mesh (kr6), closed
# single shells (kr120 link 2: normal; puma560 link 3: normal, sliver-heavy), a closed collision
# mesh with one crossing (kr120 link 5) and a gripper whose winding the orientation repair turns.
BENCH_SCENE = ("kr3_link4_visual", "kr10_link2_visual", "kr6_link1_collision", "kr16_link3_visual",
               "kr120_link2_visual", "kr120_link5_collision", "irb140_link1", "panda_link0_visual",
               "puma560_link3_visual", "vx300s_gripper", "kr5_base_visual")


def data_dir() -> Path:
    """The rtb-data package directory (where its meshes are installed)."""
    return Path(str(importlib.resources.files("rtbdata")))


def _read_stl(path: Path) -> tuple[np.ndarray, np.ndarray]:
    import trimesh

    m = trimesh.load(str(path), file_type="stl", process=False)
    return np.asarray(m.vertices, np.float64), np.asarray(m.faces, np.int64)


def _read_collada(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Every triangle of every bound primitive in the scene (node transforms applied; polylists
    triangulated as pycollada fans them), in metres (the file's unit), each primitive's own
    vertex array and indices, concatenated."""
    import warnings

    import collada

    doc = collada.Collada(str(path), ignore=[collada.common.DaeUnsupportedError, collada.common.DaeBrokenRefError])
    unit = doc.assetInfo.unitmeter or 1.0
    verts, tris, offset = [], [], 0
    with warnings.catch_warnings():
        # pycollada's node transforms are numpy matrices (a PendingDeprecationWarning per node).
        warnings.simplefilter("ignore", PendingDeprecationWarning)
        for geometry in doc.scene.objects("geometry"):
            for prim in geometry.primitives():
                if isinstance(prim, collada.polylist.BoundPolylist):
                    prim = prim.triangleset()
                if not isinstance(prim, collada.triangleset.BoundTriangleSet) or prim.vertex is None:
                    continue  # lines, points
                v = np.asarray(prim.vertex, np.float64).reshape(-1, 3)
                t = np.asarray(prim.vertex_index, np.int64).reshape(-1, 3)
                verts.append(v)
                tris.append(t + offset)
                offset += v.shape[0]
    if not tris:
        raise ValueError(f"{path}: no triangles")
    return np.concatenate(verts) * unit, np.concatenate(tris)


PACK_VARIABLE = "ROBOT_SDF_MESH_PACK"


def write_pack(path: str, names: list[str]) -> None:
    """The meshes ``names`` as ``load`` gives them, in one compressed .npz (``<name>.vertices``,
    ``<name>.triangles``), for load on a machine without rtb-data (PACK_VARIABLE)."""
    arrays = {}
    for name in names:
        arrays[f"{name}.vertices"], arrays[f"{name}.triangles"] = load(name)
    np.savez_compressed(path, **arrays)


@lru_cache(maxsize=None)
def _load_cached(name: str) -> tuple[np.ndarray, np.ndarray]:
    mesh = BY_NAME[name]
    pack = os.environ.get(PACK_VARIABLE)
    if pack:
        with np.load(pack) as arrays:
            v, t = arrays[f"{name}.vertices"], arrays[f"{name}.triangles"]
    else:
        path = data_dir() / mesh.path
        v, t = _read_collada(path) if path.suffix.lower() == ".dae" else _read_stl(path)
        v = v * mesh.scale
    v = v.astype(np.float32)
    t = t.astype(np.int32)
    v.setflags(write=False)
    t.setflags(write=False)
    return v, t


def load(mesh: MeshFile | str) -> tuple[np.ndarray, np.ndarray]:
    """(vertices (V,3) float32 m in the file's frame, triangles (T,3) int32) of a corpus mesh,
    as the file stores them (module docstring). Read-only arrays, cached per process."""
    return _load_cached(mesh if isinstance(mesh, str) else mesh.name)


# ---------------------------------------------------------------------------------------- facts
@dataclass(frozen=True)
class MeshFacts:
    """What a mesh is made of, and what MeshWorld's auto made of it.

    triangles, vertices: as loaded; positions: distinct vertex positions (exact float32);
    flat: triangles without surface (a repeated position, or height <= FLAT_RATIO x longest edge);
    slivers: other triangles with longest edge / height > SLIVER_ASPECT (20); needles: of those,
    aspect > NEEDLE_ASPECT (1000); shells: connected components (triangles joined by shared
    positions); open_edges: edges (between positions) used by one triangle; nonmanifold_edges:
    used by more than two; closed: no open edge and every edge used as often in each direction
    (the integer-winding-number sense of closed); manifold: every edge used by exactly two
    triangles (what auto calls closed); self_intersections: edge-triangle crossings
    between triangles that share no position (robot_sdf.mesh_classification.count_self_intersections,
    on the triangles as loaded, for every mesh: auto only counts them for closed, oriented ones);
    auto: MeshWorld's choice for sign_method auto, solid: whether it classified the mesh as the
    boundary of a solid, reason: its reason, faces_reversed: triangles its orientation repair
    turned; size: bounding-box extents (m)."""

    name: str
    kind: str
    triangles: int
    vertices: int
    positions: int
    flat: int
    slivers: int
    needles: int
    shells: int
    open_edges: int
    nonmanifold_edges: int
    closed: bool
    manifold: bool
    self_intersections: int
    auto: str
    solid: bool
    reason: str
    faces_reversed: int
    size: tuple[float, float, float]
    seconds: float


def _positions(vertices: np.ndarray) -> np.ndarray:
    """(V,) index of a representative of each vertex's exact float32 position."""
    bits = (np.ascontiguousarray(vertices, np.float32) + np.float32(0.0)).view(np.uint32).reshape(-1, 3)
    _, inverse = np.unique(bits, axis=0,
                           return_inverse=True)
    return inverse.reshape(-1)


def triangle_shapes(vertices: np.ndarray, triangles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat (T,) bool, aspect (T,) float64 = longest edge / height, inf for flat triangles)."""
    c = np.asarray(vertices, np.float64)[np.asarray(triangles, np.int64)]
    area2 = np.linalg.norm(np.cross(c[:, 1] - c[:, 0], c[:, 2] - c[:, 0]), axis=1)
    longest2 = np.max(((c - np.roll(c, 1, axis=1)) ** 2).sum(axis=2), axis=1)
    group = _positions(vertices)[np.asarray(triangles, np.int64)]
    repeated = (group[:, 0] == group[:, 1]) | (group[:, 1] == group[:, 2]) | (group[:, 2] == group[:, 0])
    flat = repeated | (area2 <= FLAT_RATIO * longest2)
    with np.errstate(divide="ignore", invalid="ignore"):
        aspect = np.where(flat, np.inf, longest2 / area2)
    return flat, aspect


def _edge_counts(group_tri: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per undirected edge between positions: (uses, net uses lo->hi minus hi->lo)."""
    a = group_tri.reshape(-1)
    b = np.roll(group_tri, -1, axis=1).reshape(-1)
    keep = a != b
    a, b = a[keep], b[keep]
    key = np.minimum(a, b) * np.int64(n) + np.maximum(a, b)
    _, inverse, uses = np.unique(key, return_inverse=True, return_counts=True)
    net = np.bincount(inverse, weights=np.where(a < b, 1.0, -1.0), minlength=uses.shape[0])
    return uses, net


def _shells(group_tri: np.ndarray, n: int) -> int:
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    a = group_tri.reshape(-1)
    b = np.roll(group_tri, -1, axis=1).reshape(-1)
    graph = coo_matrix((np.ones(a.shape[0]), (a, b)), shape=(n, n))
    _, label = connected_components(graph, directed=False)
    return int(np.unique(label[np.unique(group_tri)]).shape[0])


def self_intersections(vertices: np.ndarray, triangles: np.ndarray) -> int:
    """Edge-triangle crossings of the mesh with itself (robot_sdf.mesh_classification), CPU."""
    import warp as wp

    from robot_sdf import mesh_classification, mesh_topology

    v = np.ascontiguousarray(vertices, np.float32)
    t = np.ascontiguousarray(triangles, np.int32)
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device="cpu"),
                   indices=wp.array(t.reshape(-1), dtype=wp.int32, device="cpu"))
    return mesh_classification.count_self_intersections(mesh, v, t, mesh_topology.weld(v))


def auto_choice(vertices: np.ndarray, triangles: np.ndarray) -> dict:
    """MeshWorld(sign_method auto).mesh_info of the mesh (CPU): its "sign_method", "auto" and
    "orientation" entries say what auto chose and why."""
    from robot_sdf import MeshWorld

    world = MeshWorld(device="cpu", sign_method="auto")
    world.add_mesh("m", vertices, triangles)
    return world.mesh_info("m")


def mesh_facts(mesh: MeshFile | str) -> MeshFacts:
    spec = mesh if isinstance(mesh, MeshFile) else BY_NAME[mesh]
    t0 = time.perf_counter()
    v, t = load(spec)
    group = _positions(v)
    n = int(group.max()) + 1
    group_tri = group[t]
    flat, aspect = triangle_shapes(v, t)
    uses, net = _edge_counts(group_tri[~flat], n)
    info = auto_choice(v, t)
    auto = info.get("auto", {})
    return MeshFacts(
        name=spec.name, kind=spec.kind, triangles=int(t.shape[0]), vertices=int(v.shape[0]), positions=n,
        flat=int(flat.sum()), slivers=int(np.count_nonzero(~flat & (aspect > SLIVER_ASPECT))),
        needles=int(np.count_nonzero(~flat & (aspect > NEEDLE_ASPECT))), shells=_shells(group_tri, n),
        open_edges=int(np.count_nonzero(uses == 1)), nonmanifold_edges=int(np.count_nonzero(uses > 2)),
        closed=bool(np.all(net == 0) and np.all(uses >= 2)), manifold=bool(np.all(uses == 2)),
        self_intersections=self_intersections(v, t),
        auto=str(info.get("sign_method")), solid=bool(auto.get("solid", False)), reason=str(auto.get("reason", "")),
        faces_reversed=int(info.get("orientation", {}).get("faces_reversed", 0)),
        size=tuple(float(x) for x in np.ptp(v.astype(np.float64), axis=0)), seconds=time.perf_counter() - t0)


def _closed_cell(f: MeshFacts) -> str:
    if f.manifold and f.closed:
        return "yes"
    if f.closed:
        return f"yes, {f.nonmanifold_edges:,} edges used 4+ times"
    return f"no: {f.open_edges:,} open, {f.nonmanifold_edges:,} non-manifold edges"


def facts_table(facts: list[MeshFacts]) -> str:
    from bench import table

    rows = [[f.name, f.kind, f"{f.triangles:,}", f"{f.slivers:,} ({f.needles:,})", f"{f.flat:,}", f.shells,
             _closed_cell(f),
             f"{f.self_intersections:,}", f.auto + (", solid" if f.solid and f.auto != "normal" else ""),
             f.reason, f"{f.faces_reversed:,}", " x ".join(f"{x:.2f}" for x in f.size)] for f in facts]
    total = sum(f.triangles for f in facts)
    rows.append(["all", "", f"{total:,}", f"{sum(f.slivers for f in facts):,} ({sum(f.needles for f in facts):,})",
                 f"{sum(f.flat for f in facts):,}", "", "", "", "", "", "", ""])
    return table(["mesh", "kind", "triangles", "slivers >20:1 (>1000:1)", "flat", "shells", "closed",
                  "self-intersections", "auto", "auto's reason", "faces reversed", "size m"], rows)


# --------------------------------------------------------------------------- winding numbers
def survey_points(vertices: np.ndarray, triangles: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """(count, 3) float64 points around a mesh: half uniform in its bounding box grown by 20 %,
    half near its surface (area-uniform surface points moved along the face normal by +-U[0.1 mm,
    2 cm])."""
    rng = np.random.default_rng(seed)
    v = np.asarray(vertices, np.float64)
    c = v[np.asarray(triangles, np.int64)]
    lo, hi = v.min(0), v.max(0)
    centre, half = (lo + hi) / 2, (hi - lo) / 2 * 1.2
    box = centre + rng.uniform(-1, 1, (count - count // 2, 3)) * half
    n = np.cross(c[:, 1] - c[:, 0], c[:, 2] - c[:, 0])
    area = np.linalg.norm(n, axis=1)
    pick = rng.choice(c.shape[0], size=count // 2, p=area / area.sum())
    r1, r2 = np.sqrt(rng.uniform(size=pick.shape[0])), rng.uniform(size=pick.shape[0])
    t = c[pick]
    on = (1 - r1)[:, None] * t[:, 0] + (r1 * (1 - r2))[:, None] * t[:, 1] + (r1 * r2)[:, None] * t[:, 2]
    offset = rng.uniform(1e-4, 2e-2, pick.shape[0]) * rng.choice([-1.0, 1.0], pick.shape[0])
    near = on + (n[pick] / area[pick, None]) * offset[:, None]
    return np.concatenate([box, near])


def _reference():
    """test/reference.py (the float64 numpy reference), loaded by path: ``test`` is also the name
    of a standard-library package."""
    import importlib.util
    import sys

    module = sys.modules.get("reference")
    if module is not None:
        return module
    spec = importlib.util.spec_from_file_location("reference", Path(__file__).resolve().parents[1] / "test" /
                                                  "reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["reference"] = module  # before it runs: its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def winding_survey(mesh: MeshFile | str, count: int = 400, margin: float = 1e-4, seed: int = 0) -> dict:
    """Exact winding numbers w (test/reference.py, float64) of ``count`` survey_points farther than
    ``margin`` (m) from the surface of a corpus mesh, as loaded: the share of points within 0.01
    of 0, of 1, of another integer, and of the rest (fractional: the surface does not bound a
    solid there), the extremes, and the share of points where the sign of the angle-weighted
    pseudo-normal of the closest feature (the ``solid`` regime's rule) disagrees with w > 0.5."""
    ref = _reference()
    v, t = load(mesh)
    pts = survey_points(v, t, count, seed)
    d = ref.unsigned_distance(pts, v, t)
    pts = pts[d > margin]
    w = ref.winding_number(pts, v, t)
    nearest = np.round(w)
    integer = np.abs(w - nearest) < 0.01
    normal_sign, _, _ = ref.pseudo_normal_sign(pts, v, t)
    return {"points": int(pts.shape[0]), "zero": float(np.mean(integer & (nearest == 0))),
            "one": float(np.mean(integer & (nearest == 1))),
            "other_integer": float(np.mean(integer & (nearest != 0) & (nearest != 1))),
            "fractional": float(np.mean(~integer)), "min": float(w.min()), "max": float(w.max()),
            "max_off_integer": float(np.abs(w - nearest).max()),
            "normal_disagrees": float(np.mean((normal_sign < 0) != (w > 0.5)))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_meshes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--winding", type=int, default=0, metavar="N",
                        help="also survey the exact winding number at N points around each mesh (slow: brute force)")
    parser.add_argument("--pack", metavar="FILE", help=f"write the meshes into FILE (.npz) for {PACK_VARIABLE} and stop")
    parser.add_argument("names", nargs="*", help="corpus meshes (default: all)")
    args = parser.parse_args(argv)
    if args.pack:
        write_pack(args.pack, args.names or [m.name for m in CORPUS])
        print(f"{args.pack}: {len(args.names or CORPUS)} meshes, {os.path.getsize(args.pack) / 1e6:.1f} MB")
        return 0
    import warp as wp

    from bench import cpu_model, emit, table

    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    names = args.names or [m.name for m in CORPUS]
    emit(f"rtb-data meshes ({data_dir()}), CPU {cpu_model()}\n")
    facts = [mesh_facts(n) for n in names]
    emit(facts_table(facts))
    if args.winding:
        rows = []
        for f in facts:
            s = winding_survey(f.name, args.winding)
            rows.append([f.name, f.auto, _closed_cell(f), f"{f.self_intersections:,}", s["points"],
                         f"{100 * s['zero']:.1f} %", f"{100 * s['one']:.1f} %", f"{100 * s['other_integer']:.1f} %",
                         f"{100 * s['fractional']:.1f} %", f"{s['min']:.3f} .. {s['max']:.3f}",
                         f"{s['max_off_integer']:.3f}", f"{100 * s['normal_disagrees']:.1f} %"])
        emit("\nExact winding numbers w (float64) at points more than 0.1 mm from the surface (half in the box "
             "grown by 20 %, half 0.1 mm-2 cm off the surface); 'pseudo-normal sign wrong': the closest feature's "
             "angle-weighted pseudo-normal (the solid regime's sign) disagrees with w > 0.5:\n")
        emit(table(["mesh", "auto", "closed", "self-intersections", "points", "w ~ 0", "w ~ 1", "w ~ other integer",
                    "fractional", "range", "max |w - nearest integer|", "pseudo-normal sign wrong"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
