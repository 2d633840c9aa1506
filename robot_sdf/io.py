"""Mesh loading (trimesh) and primitive meshes. Returns (vertices (V,3) float32 m, triangles (T,3) int32)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

SUPPORTED_SUFFIXES = (".stl", ".obj", ".ply", ".glb", ".gltf", ".off", ".dae")
_STL_HEADER = 84  # 80-byte header + uint32 triangle count
_STL_RECORD = 50  # normal, 3 vertices (12 float32) + uint16 attribute


def _as_arrays(mesh, what: str) -> tuple[np.ndarray, np.ndarray]:
    v = np.ascontiguousarray(mesh.vertices, dtype=np.float32)
    t = np.ascontiguousarray(mesh.faces, dtype=np.int32)
    if v.shape[0] < 3 or t.shape[0] == 0:
        raise ValueError(f"{what}: mesh is empty ({v.shape[0]} vertices, {t.shape[0]} triangles)")
    return v, t


def _check_binary_stl(p: Path) -> None:
    """Name a truncated binary STL as such (trimesh would report an empty or garbled mesh)."""
    size = p.stat().st_size
    with p.open("rb") as f:
        head = f.read(_STL_HEADER)
        if len(head) < _STL_HEADER:
            if not head.lstrip().lower().startswith(b"solid"):
                raise ValueError(f"{p}: truncated STL: {size} bytes, shorter than the 84-byte binary header")
            return
        rest = f.read(512)
    count = int(np.frombuffer(head[80:84], dtype="<u4")[0])
    expected = _STL_HEADER + _STL_RECORD * count
    if size == expected:
        return
    # ASCII STL starts with "solid" and holds "facet" soon after; binary headers may start with
    # "solid" too, hence the second look.
    text = head + rest
    if text.lstrip().lower().startswith(b"solid") and (b"facet" in text.lower() or b"endsolid" in text.lower()):
        return
    if size < expected:
        whole = (size - _STL_HEADER) // _STL_RECORD
        raise ValueError(f"{p}: truncated binary STL: the header announces {count} triangles "
                         f"({expected} bytes) but the file has {size} bytes ({whole} whole triangles)")


def _unit_metres(mesh) -> float:
    """Length of the file's unit in metres where the format records it (COLLADA <unit meter=>;
    trimesh keeps it as metadata "<x> * meters"), else 1."""
    units = str(getattr(mesh, "metadata", {}).get("units", ""))
    head, sep, tail = units.partition("*")
    if sep and tail.strip() == "meters":
        try:
            value = float(head)
        except ValueError:
            return 1.0
        if np.isfinite(value) and value > 0:
            return value
    return 1.0


def mesh_scale(scale) -> np.ndarray:
    """A loader's ``scale`` (one factor or three per-axis factors, as a URDF ``<mesh scale>``)
    as (3,) float64, or ValueError: every factor finite and non-zero (negative ones mirror)."""
    try:
        s = np.asarray(scale, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"scale must be a number or three numbers, got {scale!r}") from exc
    if s.shape == (1,):
        s = np.repeat(s, 3)
    if s.shape != (3,) or not np.all(np.isfinite(s)) or np.any(s == 0.0):
        raise ValueError(f"scale must be one or three finite, non-zero factors, got {np.ravel(scale).tolist()}")
    return s


def scale_mesh(vertices: np.ndarray, triangles: np.ndarray, scale) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (V,3) times ``scale`` (mesh_scale), float32; triangles (T,3) int32 with their
    winding reversed when the scale mirrors (an odd number of negative factors: determinant
    below 0), so that the outside stays outside. Returns new arrays."""
    s = mesh_scale(scale)
    v = np.ascontiguousarray(np.asarray(vertices, np.float64) * s, dtype=np.float32)
    t = np.ascontiguousarray(triangles, dtype=np.int32)
    if np.prod(np.sign(s)) < 0:
        t = np.ascontiguousarray(t[:, ::-1])
    return v, t


def load_mesh(path: str | Path, scale=1.0) -> tuple[np.ndarray, np.ndarray]:
    """Read a triangle mesh file (STL, OBJ, PLY, GLB/glTF, OFF, COLLADA .dae) into one mesh.

    Scenes (several geometries, e.g. a COLLADA or glTF file with a node hierarchy) are flattened
    with each node's transform applied, in the file's own frame; a node whose transform mirrors
    (negative determinant) has its triangles' winding reversed by the flattening, so every part
    keeps its outside. ``scale``: one factor, or three per-axis factors (sx, sy, sz) as a URDF
    ``<mesh scale>`` gives them, multiplying the vertex coordinates (e.g. 0.001 for files in
    millimetres; a COLLADA file's <unit> is applied first); factors must be finite and non-zero;
    a scale with negative determinant (an odd number of negative factors) mirrors the mesh and
    reverses its winding (scale_mesh). Returns (vertices (V,3) float32 m, triangles (T,3) int32).
    Raises ValueError naming the file and the problem when it is missing, unreadable, truncated,
    holds no triangles or non-finite (NaN, inf) coordinates, or the scale is invalid.
    """
    import trimesh

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"mesh file not found: {p}")
    if p.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise ValueError(f"{p}: unsupported mesh format {p.suffix!r}; expected one of {', '.join(SUPPORTED_SUFFIXES)}")
    try:
        factors = mesh_scale(scale)
    except ValueError as exc:
        raise ValueError(f"{p}: {exc}") from exc
    if p.suffix.lower() == ".stl":
        _check_binary_stl(p)
    try:
        loaded = trimesh.load(str(p), force="mesh", process=False)
    except ImportError as exc:
        raise ValueError(f"{p}: cannot read {p.suffix} files: {exc} (see requirements.txt)") from exc
    except Exception as exc:  # trimesh raises many types for corrupt files
        raise ValueError(f"{p}: cannot read mesh: {type(exc).__name__}: {exc}") from exc
    if isinstance(loaded, trimesh.Scene):
        # force="mesh" returns an empty Scene when the file holds no triangle geometry.
        raise ValueError(f"{p}: no triangle mesh in file")
    if not isinstance(loaded, trimesh.Trimesh):
        raise ValueError(f"{p}: no triangle mesh in file")
    raw = np.asarray(loaded.vertices, dtype=np.float64)
    if raw.size and not np.isfinite(raw).all():
        bad = int(np.flatnonzero(~np.isfinite(raw).all(axis=1))[0])
        raise ValueError(f"{p}: vertex {bad} is not finite ({raw[bad].tolist()}): NaN or inf in the file")
    v, t = _as_arrays(loaded, str(p))
    factors = factors * _unit_metres(loaded)
    if np.any(factors != 1.0):
        v, t = scale_mesh(v, t, factors)
    return v, t


def box_mesh(size=(1.0, 1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Axis-aligned box of extents (sx, sy, sz) m centred at the origin, outward winding."""
    import trimesh

    size = np.asarray(size, dtype=np.float64).reshape(-1)
    if size.shape != (3,) or not np.all(np.isfinite(size)) or np.any(size <= 0):
        raise ValueError(f"box size must be three positive lengths, got {size.tolist()}")
    return _as_arrays(trimesh.creation.box(extents=size), "box")


def sphere_mesh(radius: float = 0.5, subdivisions: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Icosphere of ``radius`` m centred at the origin (20 * 4**subdivisions triangles)."""
    import trimesh

    if not (np.isfinite(radius) and radius > 0):
        raise ValueError(f"sphere radius must be positive, got {radius}")
    return _as_arrays(trimesh.creation.icosphere(subdivisions=int(subdivisions), radius=float(radius)), "sphere")


def cylinder_mesh(radius: float = 0.5, length: float = 1.0, sections: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """Closed cylinder along z, centred at the origin."""
    import trimesh

    if not (np.isfinite(radius) and radius > 0 and np.isfinite(length) and length > 0):
        raise ValueError(f"cylinder radius and length must be positive, got {radius}, {length}")
    return _as_arrays(trimesh.creation.cylinder(radius=float(radius), height=float(length), sections=int(sections)),
                      "cylinder")
