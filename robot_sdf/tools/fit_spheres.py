"""fit_spheres: collision spheres for every link of a URDF, placed with robot_sdf's signed distance.

    fit_spheres robot.urdf --output spheres.yaml [--tolerance 0.01 | --spheres 6] [--overshoot 0.01]
    fit_spheres robot.urdf --check spheres.yaml --plot spheres.png     # measure and draw a (hand-edited) file

Per link, the link's geometry (collision elements, or visual ones with ``--geometry visual``; mesh
files, boxes, cylinders, spheres, all in the link frame) becomes one MeshWorld mesh. Candidate
centres are grid points inside it (signed distance < 0, robot_sdf's own sign test, so open or
multi-part meshes work through the winding number); a candidate's radius is its depth plus the
allowed overshoot. A greedy cover then picks, one sphere at a time, the candidate that most
reduces the uncovered surface (sum over surface samples of the gap to the union of spheres,
beyond the tolerance), until the coverage is within the tolerance or the sphere budget is spent.

Reported per link (also written into the YAML under ``fit:``):
- coverage: the largest distance from a point of the link's surface (dense samples, a different
  set from the one the greedy cover used) to the union of spheres [m]; 0 = fully enclosed;
- overshoot: how far the spheres reach outside the mesh: the largest signed distance of points
  on the sphere surfaces [m] (bounded by the --overshoot allowance).
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

# Grid points inside the link's bounding box used as candidate centres (before the inside test).
GRID_POINTS = 24_000
# Candidates and surface samples of the greedy cover (their product bounds its memory: 4 bytes each).
MAX_CANDIDATES = 3000
COVER_SAMPLES = 3000
# Surface samples of the reported coverage, and points per sphere of the reported overshoot.
REPORT_SAMPLES = 20_000
SPHERE_POINTS = 256


@dataclass
class LinkFit:
    """Spheres (k, 4) in the link frame [m] and their measured quality [m]."""

    spheres: np.ndarray
    coverage: float
    overshoot: float
    triangles: int
    sign_method: str
    surface: np.ndarray | None = None  # (m, 3) surface samples [m], for pictures


def surface_samples(vertices: np.ndarray, triangles: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n points uniformly distributed over the mesh surface (area-weighted), (n, 3) float64."""
    v = vertices.astype(np.float64)
    a, b, c = v[triangles[:, 0]], v[triangles[:, 1]], v[triangles[:, 2]]
    area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
    if not np.isfinite(area).all() or area.sum() <= 0:
        raise ValueError("mesh has no surface area")
    tri = rng.choice(len(triangles), size=n, p=area / area.sum())
    u, w = rng.random(n), rng.random(n)
    flip = u + w > 1
    u[flip], w[flip] = 1 - u[flip], 1 - w[flip]
    return a[tri] + u[:, None] * (b[tri] - a[tri]) + w[:, None] * (c[tri] - a[tri])


def sphere_points(n: int) -> np.ndarray:
    """(n, 3) unit vectors spread evenly over the sphere (Fibonacci lattice)."""
    i = np.arange(n) + 0.5
    z = 1 - 2 * i / n
    phi = np.pi * (1 + 5 ** 0.5) * i
    r = np.sqrt(1 - z * z)
    return np.stack([r * np.cos(phi), r * np.sin(phi), z], axis=1)


def union_gap(points: np.ndarray, spheres: np.ndarray) -> np.ndarray:
    """(m,) distance of each point to the union of spheres (k, 4); 0 inside one; inf for k = 0."""
    if len(spheres) == 0:
        return np.full(len(points), np.inf)
    d = np.linalg.norm(points[:, None, :] - spheres[None, :, :3], axis=2) - spheres[None, :, 3]
    return np.maximum(d.min(axis=1), 0.0)


def _excess_gaps(cand: np.ndarray, points: np.ndarray, tol: float) -> np.ndarray:
    """(candidates, points) float32: gap from each point to each candidate sphere, less tol, >= 0."""
    d = np.linalg.norm(points[None, :, :] - cand[:, None, :3], axis=2) - cand[:, 3:4]
    return np.maximum(d - tol, 0.0).astype(np.float32)


def _signed_distance(world, points: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        d, _ = world.signed_distance(torch.as_tensor(points, dtype=torch.float32))
    return d.cpu().numpy().astype(np.float64)


def _link_world(vertices: np.ndarray, triangles: np.ndarray, device: str):
    """MeshWorld holding the link mesh (auto sign method), its sign method name and the
    diagonal of its bounding box [m] (the search distance)."""
    from robot_sdf import MeshWorld

    v = np.asarray(vertices, dtype=np.float64)
    diag = float(np.linalg.norm(np.maximum(v.max(axis=0) - v.min(axis=0), 1e-6)))
    world = MeshWorld(device=device, sign_method="auto", max_distance=max(diag, 1e-3))
    world.add_mesh("link", vertices, triangles)
    return world, world.mesh_sign_method("link").name.lower(), diag


def _report_points(vertices: np.ndarray, triangles: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.concatenate([surface_samples(vertices, triangles, REPORT_SAMPLES, rng),
                           np.asarray(vertices, dtype=np.float64)])


def _measure(world, report_pts: np.ndarray, spheres: np.ndarray) -> tuple[float, float]:
    """(coverage, overshoot) [m] of spheres (k, 4) on the link of ``world`` (see the module doc)."""
    if len(spheres) == 0:
        return math.inf, 0.0
    coverage = float(union_gap(report_pts, spheres).max())
    shell = (spheres[:, None, :3] + spheres[:, None, 3:4] * sphere_points(SPHERE_POINTS)[None]).reshape(-1, 3)
    return coverage, float(max(_signed_distance(world, shell).max(), 0.0))


def check_link(vertices: np.ndarray, triangles: np.ndarray, spheres: np.ndarray, seed: int = 0,
               device: str = "cpu") -> LinkFit:
    """The coverage and overshoot of given spheres (k, 4) (link frame) on one mesh, as fit_link
    reports them; coverage is inf without spheres."""
    world, method, _ = _link_world(vertices, triangles, device)
    report_pts = _report_points(vertices, triangles, np.random.default_rng(seed))
    spheres = np.asarray(spheres, dtype=np.float64).reshape(-1, 4)
    coverage, reach = _measure(world, report_pts, spheres)
    return LinkFit(spheres, coverage, reach, int(len(triangles)), method, report_pts[:: max(1, len(report_pts) // 4000)])


def fit_link(vertices: np.ndarray, triangles: np.ndarray, spheres: int | None = None,
             tolerance: float | None = None, overshoot: float = 0.01, max_spheres: int = 24,
             min_radius: float = 0.004, seed: int = 0, device: str = "cpu") -> LinkFit:
    """Fit spheres to one mesh (link frame). spheres: exact count (stops early only when the
    surface is fully covered); tolerance: stop once the coverage is within it [m] (at most
    max_spheres); overshoot: allowed reach outside the mesh [m]; min_radius: shallowest centre
    depth considered [m]. Without spheres and tolerance, tolerance = 0.01 m."""
    if spheres is None and tolerance is None:
        tolerance = 0.01
    if spheres is not None and int(spheres) < 1:
        raise ValueError(f"spheres per link must be >= 1, got {spheres}")
    if tolerance is not None and not (np.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be >= 0 m, got {tolerance}")
    if not (np.isfinite(overshoot) and overshoot >= 0):
        raise ValueError(f"overshoot must be >= 0 m, got {overshoot}")
    budget = int(spheres) if spheres is not None else int(max_spheres)
    tol = float(tolerance) if tolerance is not None and spheres is None else 0.0
    rng = np.random.default_rng(seed)
    v = np.asarray(vertices, dtype=np.float64)
    lo, hi = v.min(axis=0), v.max(axis=0)
    extent = np.maximum(hi - lo, 1e-6)
    world, method, diag = _link_world(vertices, triangles, device)

    # Candidate centres: grid points inside, at least min_radius deep. The spacing resolves the
    # thinnest extent of the link with a few points at least.
    step = min((np.prod(extent) / GRID_POINTS) ** (1 / 3), extent.min() / 6)
    axes = [np.arange(lo[i] + 0.5 * step, hi[i], step) for i in range(3)]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, 3)
    if len(grid) > 8 * GRID_POINTS:  # a very flat link: thin the grid, keep its resolution
        grid = grid[rng.choice(len(grid), 8 * GRID_POINTS, replace=False)]
    depth = -_signed_distance(world, grid)
    inside = depth >= min_radius
    if not inside.any():
        inside = depth > 0
    if not inside.any():
        raise ValueError("no grid point lies inside the mesh (is it a closed or consistently wound surface?)")
    centres, depth = grid[inside], depth[inside]
    if len(centres) > MAX_CANDIDATES:
        keep = rng.choice(len(centres), MAX_CANDIDATES, replace=False)
        centres, depth = centres[keep], depth[keep]
    cand = np.concatenate([centres, (depth + overshoot)[:, None]], axis=1)

    # Greedy cover: each step takes the candidate that removes most of the summed excess gap.
    # The coverage is then measured on a denser, independent sample set; where that finds a point
    # beyond the tolerance, those points join the cover set and the greedy cover goes on.
    samples = surface_samples(vertices, triangles, COVER_SAMPLES, rng)
    report_pts = _report_points(vertices, triangles, rng)
    gaps = _excess_gaps(cand, samples, tol)  # (candidates, samples)
    current = np.full(len(samples), np.float32(diag))
    chosen: list[int] = []
    for _ in range(4):
        while len(chosen) < budget:
            gain = (current[None, :] - np.minimum(current[None, :], gaps)).sum(axis=1)
            best = int(np.argmax(gain))
            if gain[best] <= 0:
                break
            chosen.append(best)
            current = np.minimum(current, gaps[best])
        missed = report_pts[union_gap(report_pts, cand[chosen]) > tol]
        if len(missed) == 0 or len(chosen) >= budget:
            break
        missed = missed[rng.choice(len(missed), min(len(missed), COVER_SAMPLES // 4), replace=False)]
        extra = _excess_gaps(cand, missed, tol)
        gaps = np.concatenate([gaps, extra], axis=1)
        current = np.concatenate([current, extra[chosen].min(axis=0) if chosen else np.full(len(missed), diag)])
    fitted = cand[chosen]
    coverage, reach = _measure(world, report_pts, fitted)
    return LinkFit(fitted, coverage, reach, int(len(triangles)), method, report_pts[:: max(1, len(report_pts) // 4000)])


def parse_package_dirs(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--package-dir expects NAME=DIR, got {item!r}")
        out[name] = path
    return out


def fit_robot(urdf_path: str | Path, geometry: str = "auto", links: list[str] | None = None,
              package_dirs: dict | None = None, progress=None, check: dict | None = None,
              **options) -> dict[str, LinkFit]:
    """LinkFit of every link with geometry (or of ``links``), in URDF order.

    geometry: 'collision', 'visual' or 'auto' (collision where a link has it, else visual);
    check: link -> (k, 4) spheres to measure instead of fitting (robot_sdf.robot.load_spheres);
    options: those of fit_link (with check: seed and device only).
    """
    from robot_sdf.robot import link_geometry, read_urdf

    urdf = read_urdf(urdf_path)
    names = [lk.name for lk in urdf.links]
    if links:
        unknown = sorted(set(links) - set(names))
        if unknown:
            raise ValueError(f"{urdf_path}: no link(s) {unknown}; links are {names}")
        names = [n for n in names if n in links]
    fits: dict[str, LinkFit] = {}
    for name in names:
        kinds = ["collision", "visual"] if geometry == "auto" else [geometry]
        mesh = None
        for kind in kinds:
            mesh = link_geometry(urdf, urdf_path, name, kind, package_dirs)
            if mesh is not None:
                break
        if mesh is None:
            continue
        t0 = time.perf_counter()
        if check is not None:
            fits[name] = check_link(*mesh, check.get(name, np.zeros((0, 4))), seed=options.get("seed", 0),
                                    device=options.get("device", "cpu"))
        else:
            fits[name] = fit_link(*mesh, **options)
        if progress:
            f = fits[name]
            progress(f"  {name:24s} {len(f.spheres):3d} spheres  coverage {1e3 * f.coverage:6.1f} mm  "
                     f"overshoot {1e3 * f.overshoot:5.1f} mm  ({f.triangles} triangles, {kind} geometry, "
                     f"sign {f.sign_method}, {time.perf_counter() - t0:.1f} s)")
    if not fits:
        raise ValueError(f"{urdf_path}: no link has {geometry} geometry")
    if check is not None:
        extra = sorted(set(check) - set(names))
        if extra:
            raise ValueError(f"sphere file names links that {urdf_path} does not have: {extra}")
    return fits


def plot_fits(fits: dict[str, LinkFit], path: Path) -> Path:
    """One row per link: the surface samples (grey) and the spheres (circles), seen along -y
    (x-z) and along z (x-y), in the link frame."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle

    fig, axs = plt.subplots(len(fits), 2, figsize=(8, 3.2 * len(fits)), squeeze=False)
    for row, (name, f) in zip(axs, fits.items()):
        for ax, (i, j) in zip(row, ((0, 2), (0, 1))):
            ax.plot(f.surface[:, i], f.surface[:, j], ".", color="0.6", ms=1)
            for x in f.spheres:
                ax.add_patch(Circle((x[i], x[j]), x[3], facecolor="tab:blue", edgecolor="tab:blue", alpha=0.2))
            ax.set_aspect("equal")
            ax.autoscale_view()
            ax.set_xlabel("xyz"[i] + " [m]")
            ax.set_ylabel("xyz"[j] + " [m]")
        row[0].set_title(f"{name}: {len(f.spheres)} spheres, coverage {1e3 * f.coverage:.1f} mm, "
                         f"overshoot {1e3 * f.overshoot:.1f} mm", fontsize=9, loc="left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fit_spheres", description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[1:]))
    parser.add_argument("urdf", type=Path, help="URDF file (expand xacro files first)")
    parser.add_argument("--output", "-o", type=Path, default=None, help="sphere YAML to write")
    parser.add_argument("--check", type=Path, default=None, metavar="SPHERES_YAML",
                        help="measure the coverage and overshoot of an existing (e.g. hand-edited) sphere file "
                             "instead of fitting")
    parser.add_argument("--plot", type=Path, default=None, metavar="PNG",
                        help="draw every link's surface and spheres (two views per link) into this PNG")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--spheres", type=int, default=None, help="spheres per link (exact budget)")
    mode.add_argument("--tolerance", type=float, default=None,
                      help="stop adding spheres once the coverage is within this [m] (default 0.01)")
    parser.add_argument("--max-spheres", type=int, default=24, help="cap per link with --tolerance (default 24)")
    parser.add_argument("--overshoot", type=float, default=0.01,
                        help="how far a sphere may reach outside the mesh [m] (default 0.01)")
    parser.add_argument("--geometry", choices=("auto", "collision", "visual"), default="auto",
                        help="link geometry to cover (auto: collision, else visual)")
    parser.add_argument("--links", nargs="*", default=None, help="only these links")
    parser.add_argument("--package-dir", action="append", default=[], metavar="NAME=DIR",
                        help="directory of ROS package NAME for package:// URIs (repeatable)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--device", default="cpu", help="device of the signed distance queries (default cpu)")
    args = parser.parse_args(argv)
    if args.output is None and args.check is None:
        parser.error("--output is required (or --check an existing sphere file)")
    from robot_sdf.robot import dump_spheres, load_spheres

    try:
        package_dirs = parse_package_dirs(args.package_dir)
        check = load_spheres(args.check) if args.check is not None else None
        what = f"checking {args.check}" if check is not None else "fitting"
        print(f"fit_spheres: {args.urdf} ({args.geometry} geometry), {what}", flush=True)
        fits = fit_robot(args.urdf, args.geometry, args.links, package_dirs, progress=lambda s: print(s, flush=True),
                         check=check, spheres=args.spheres, tolerance=args.tolerance, max_spheres=args.max_spheres,
                         overshoot=args.overshoot, seed=args.seed, device=args.device)
    except ValueError as exc:
        print(f"fit_spheres: error: {exc}", file=sys.stderr)
        return 2
    if args.plot is not None:
        print(f"drew {plot_fits(fits, args.plot)}")
    if args.output is None:
        return 0

    total = sum(len(f.spheres) for f in fits.values())
    mode_text = f"--spheres {args.spheres}" if args.spheres else f"--tolerance {args.tolerance or 0.01}"
    how = f"Checked by fit_spheres --check {args.check.name}" if args.check is not None else \
        f"Fitted by fit_spheres {mode_text}"
    header = (f"Collision spheres of {args.urdf.name}: per link, centre [m] in the link frame and radius [m].\n"
              f"{how} --overshoot {args.overshoot} --geometry {args.geometry} "
              f"--seed {args.seed}; edit freely\n(robot_sdf.robot.load_spheres reads only 'spheres:').")
    info = {"fit": {name: {"spheres": len(f.spheres), "coverage_m": round(f.coverage, 5),
                           "overshoot_m": round(f.overshoot, 5), "triangles": f.triangles,
                           "sign_method": f.sign_method} for name, f in fits.items()}}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(dump_spheres({n: f.spheres for n, f in fits.items()}, header, info))
    worst = max(fits.items(), key=lambda kv: kv[1].coverage)
    print(f"wrote {args.output}: {total} spheres on {len(fits)} links; worst coverage {1e3 * worst[1].coverage:.1f} mm "
          f"({worst[0]}), largest overshoot {1e3 * max(f.overshoot for f in fits.values()):.1f} mm")
    return 0


if __name__ == "__main__":
    sys.exit(main())
