"""Generate the demo's shipped mesh file, config/meshes/boulder.stl (run once; the result is committed).

    python -m robot_sdf.tools.make_demo_mesh [--output config/meshes/boulder.stl]

The boulder is an icosphere whose vertices are pushed in and out along their rays by a smooth,
seeded random field, then squashed into a flat ellipsoid. Moving every vertex along its own ray
keeps the surface star-shaped around the centre, so the mesh stays closed, consistently wound and
free of self-intersections: exactly what the "normal" sign method of the demo server needs.
The output is deterministic (fixed seed) and small (320 triangles, about 16 KB of binary STL).
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

DEFAULT_OUTPUT = Path(__file__).resolve().parents[2] / "config" / "meshes" / "boulder.stl"


def boulder(seed: int = 7, subdivisions: int = 2, semi_axes=(0.42, 0.32, 0.35),
            roughness: float = 0.18) -> tuple[np.ndarray, np.ndarray]:
    """Vertices (V,3) float32 [m] and triangles (T,3) int32 of a rough, closed boulder.

    The base of the boulder sits at z = 0 (its frame origin is on the ground), so a scene pose
    with z = 0 puts it on the floor. semi_axes: ellipsoid half-extents x, y, z [m] before the
    roughness; roughness: relative amplitude of the radial bumps.
    """
    import trimesh

    ico = trimesh.creation.icosphere(subdivisions=subdivisions, radius=1.0)
    v = np.asarray(ico.vertices, dtype=np.float64)
    rng = np.random.default_rng(seed)
    # A few random low-frequency lobes: smooth bumps rather than per-vertex noise.
    dirs = rng.normal(size=(6, 3))
    dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
    amps = rng.uniform(-1.0, 1.0, size=6)
    field = (amps[None] * np.exp(3.0 * (v @ dirs.T - 1.0))).sum(axis=1)
    field /= max(np.abs(field).max(), 1e-9)
    v = v * (1.0 + roughness * field)[:, None] * np.asarray(semi_axes)[None]
    v[:, 2] -= v[:, 2].min()
    return v.astype(np.float32), np.asarray(ico.faces, dtype=np.int32)


def write_stl(path: Path, vertices: np.ndarray, triangles: np.ndarray) -> None:
    """Binary STL, written with trimesh (normals recomputed from the winding)."""
    import trimesh

    mesh = trimesh.Trimesh(vertices=vertices, faces=triangles, process=False)
    if not mesh.is_watertight or not mesh.is_winding_consistent:
        raise RuntimeError("generated boulder is not a closed, consistently wound mesh")
    path.parent.mkdir(parents=True, exist_ok=True)
    mesh.export(str(path), file_type="stl")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="STL file to write")
    args = parser.parse_args(argv)
    v, t = boulder()
    write_stl(args.output, v, t)
    print(f"wrote {args.output}: {len(v)} vertices, {len(t)} triangles, "
          f"{args.output.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
