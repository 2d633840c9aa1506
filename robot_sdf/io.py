"""Mesh loading (trimesh) and primitive meshes. Returns (vertices (V,3) float32 m, triangles (T,3) int32)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

SUPPORTED_SUFFIXES = (".stl", ".obj", ".ply", ".glb", ".gltf", ".off")


def _as_arrays(mesh, what: str) -> tuple[np.ndarray, np.ndarray]:
    v = np.ascontiguousarray(mesh.vertices, dtype=np.float32)
    t = np.ascontiguousarray(mesh.faces, dtype=np.int32)
    if v.shape[0] < 3 or t.shape[0] == 0:
        raise ValueError(f"{what}: mesh is empty ({v.shape[0]} vertices, {t.shape[0]} triangles)")
    return v, t


def load_mesh(path: str | Path, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Read a triangle mesh file (STL, OBJ, PLY, GLB/glTF, OFF); scenes are flattened into one mesh.

    ``scale`` multiplies the vertex coordinates (e.g. 0.001 for files in millimetres).
    Raises ValueError when the file is missing, unreadable or holds no triangles.
    """
    import trimesh

    p = Path(path)
    if not p.is_file():
        raise ValueError(f"mesh file not found: {p}")
    if p.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise ValueError(f"{p}: unsupported mesh format {p.suffix!r}; expected one of {', '.join(SUPPORTED_SUFFIXES)}")
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"{p}: scale must be positive, got {scale}")
    try:
        loaded = trimesh.load(str(p), force="mesh", process=False)
    except Exception as exc:  # trimesh raises many types for corrupt files
        raise ValueError(f"{p}: cannot read mesh: {exc}") from exc
    if not isinstance(loaded, trimesh.Trimesh):
        raise ValueError(f"{p}: no triangle mesh in file")
    v, t = _as_arrays(loaded, str(p))
    if scale != 1.0:
        v = v * np.float32(scale)
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
