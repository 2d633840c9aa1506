"""Figures of a demo run, drawn from its log (mpc_log.jsonl) and the scenario (matplotlib, Agg).

- top_view.png: obstacle footprints (projected mesh triangles), the sliding obstacle at the
  times the robot is drawn, executed path coloured by time, MPPI mean plans and samples, start, goal;
- distance_slice.png: signed distance in the robot's plane (z = robot height) at the step of the
  smallest clearance, colour map with the zero contour, the robot there and its path;
- clearance.png: minimum clearance over time with the zero line, and the service latency.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.collections import LineCollection, PolyCollection  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Circle, Patch  # noqa: E402

from robot_sdf.examples.robot import SphereRobot  # noqa: E402
from robot_sdf.examples.scenario import Scenario, transform  # noqa: E402
from robot_sdf.tools.render_slice import draw_distance_map  # noqa: E402

STATIC_COLOR = "#6f6a64"
MOVING_COLOR = "#e07b24"
PATH_CMAP = "viridis"
DPI = 130


def footprint(vertices: np.ndarray, triangles: np.ndarray, pose) -> np.ndarray:
    """(T,3,2) xy corners of a mesh's triangles in the world: drawn filled, they give its footprint."""
    return transform(pose, vertices)[triangles][:, :, :2]


def _draw_static_obstacles(ax, scenario: Scenario) -> None:
    """Footprints of the obstacles that do not move, at their scene poses."""
    moving = {m.id for m in scenario.moving}
    for spec in scenario.obstacles:
        if spec.id not in moving:
            tris = footprint(spec.vertices, spec.triangles, spec.pose)
            ax.add_collection(PolyCollection(tris, facecolors=STATIC_COLOR, edgecolors=STATIC_COLOR,
                                             linewidths=0.3, zorder=2))


def _label_obstacles(ax, scenario: Scenario) -> None:
    """Name each static obstacle at its centre (and the file it came from, for mesh files)."""
    moving = {m.id for m in scenario.moving}
    for spec in scenario.obstacles:
        if spec.id in moving:
            continue
        centre = transform(spec.pose, spec.vertices)[:, :2].mean(axis=0)
        text = spec.id.replace("_", " ")
        if spec.source and not spec.source.startswith("primitive"):
            text += f"\n({Path(spec.source).name})"
        ax.text(centre[0], centre[1], text, ha="center", va="center", fontsize=7.5, color="white",
                zorder=8, linespacing=1.1)


def _robot_circles(ax, robot: SphereRobot, state, color, alpha: float, lw: float = 1.0, zorder: int = 4,
                   fill: bool = False) -> None:
    for x, y, _, r in robot.spheres_np(state):
        ax.add_patch(Circle((x, y), r, facecolor=color if fill else "none", edgecolor=color,
                            alpha=alpha, lw=lw, zorder=zorder))


def _frame(ax, scenario: Scenario) -> None:
    xmin, xmax, ymin, ymax = scenario.bounds(margin=0.25)
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    ax.set_aspect("equal")
    ax.set_xlabel("x [m]")
    ax.set_ylabel("y [m]")
    ax.grid(True, color="#dddddd", lw=0.5, zorder=0)


def _start_goal(ax, scenario: Scenario) -> None:
    ax.plot(*scenario.start[:2], marker="o", ms=9, color="#2a9d8f", mec="white", mew=1.5, zorder=7)
    ax.add_patch(Circle(scenario.goal, scenario.goal_tolerance, facecolor="#ffd166", edgecolor="#b8860b",
                        lw=1.0, zorder=6))
    ax.plot(*scenario.goal, marker="*", ms=16, color="#e9c46a", mec="#8a6d1f", mew=1.0, zorder=7)


def top_view(rows: list[dict[str, Any]], scenario: Scenario, summary: dict[str, Any], path: Path,
             robot: SphereRobot | None = None, snapshot_every_s: float = 2.0) -> Path:
    """Top view of the run (see module doc)."""
    robot = robot or SphereRobot()
    xy = np.array([[r["x"], r["y"]] for r in rows])
    t = np.array([r["t"] for r in rows])
    cmap = plt.get_cmap(PATH_CMAP)
    tnorm = plt.Normalize(0.0, max(t[-1], 1e-6))
    fig, ax = plt.subplots(figsize=(11.5, 7.2))
    _frame(ax, scenario)
    # Static obstacles, plus each moving obstacle's travel range as a hatched band with an arrow.
    for m in scenario.moving:
        spec = scenario.obstacle(m.id)
        ends = []
        for s in (-1.0, 1.0):
            pose = np.array(m.base_pose)
            pose[:3] += m.amplitude * s * m.axis
            ends.append(footprint(spec.vertices, spec.triangles, pose))
        band = _outline(np.concatenate(ends))
        ax.fill(band[:, 0], band[:, 1], facecolor=MOVING_COLOR, alpha=0.10, edgecolor=MOVING_COLOR,
                hatch="///", lw=0.8, zorder=1)
        a, b = (m.base_pose[:2] + s * m.amplitude * m.axis[:2] for s in (-1.0, 1.0))
        ax.annotate("", xy=b, xytext=a, arrowprops=dict(arrowstyle="<|-|>", color=MOVING_COLOR, lw=1.5),
                    zorder=3)
        label = f"{m.id}: slides {2 * m.amplitude:.1f} m, period {m.period:g} s"
        ax.text(float(np.mean(band[:, 0])), float(band[:, 1].max()) + 0.04, label, ha="center", va="bottom",
                fontsize=8.5, color="#a0521a", zorder=8,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.7, pad=1.0))
    _draw_static_obstacles(ax, scenario)
    _label_obstacles(ax, scenario)
    # Robot and slider snapshots at the same times, in the same colour.
    stride = max(1, int(round(snapshot_every_s / max(t[1] - t[0], 1e-9)))) if len(t) > 1 else 1
    snaps = list(range(0, len(rows), stride))
    if snaps[-1] != len(rows) - 1:
        snaps.append(len(rows) - 1)
    for i in snaps:
        color = cmap(tnorm(t[i]))
        for oid, pose in rows[i]["obstacle_poses"].items():
            spec = scenario.obstacle(oid)
            tris = footprint(spec.vertices, spec.triangles, pose)
            hull = _outline(tris)
            ax.fill(hull[:, 0], hull[:, 1], facecolor=color, alpha=0.22, edgecolor="none", zorder=2)
            ax.plot(hull[:, 0], hull[:, 1], color=color, lw=1.4, zorder=3)
        _robot_circles(ax, robot, [rows[i]["x"], rows[i]["y"], rows[i]["yaw"]], color, 0.9, lw=1.1)
    # Sampled rollouts and mean plans.
    for r in rows:
        for s in r.get("samples", []):
            s = np.asarray(s)
            ax.plot(s[:, 0], s[:, 1], color="#9aa5b1", lw=0.5, alpha=0.35, zorder=3)
    plan_every = max(1, len(rows) // 12)
    for r in rows[::plan_every]:
        if "plan" in r:
            p = np.asarray(r["plan"])
            p = np.vstack([[r["x"], r["y"]], p])
            ax.plot(p[:, 0], p[:, 1], color="#2b9348", lw=1.2, ls="--", alpha=0.9, zorder=5)
    # Executed path coloured by time.
    seg = np.stack([xy[:-1], xy[1:]], axis=1)
    lc = LineCollection(seg, cmap=PATH_CMAP, norm=tnorm, lw=3.0, zorder=6)
    lc.set_array(t[:-1])
    ax.add_collection(lc)
    _start_goal(ax, scenario)
    cb = fig.colorbar(lc, ax=ax, fraction=0.025, pad=0.01)
    cb.set_label("time [s]")
    handles = [
        Patch(facecolor=STATIC_COLOR, label="static obstacles (mesh footprints)"),
        Patch(facecolor=MOVING_COLOR, alpha=0.25, hatch="///", edgecolor=MOVING_COLOR,
              label="sliding block: travel range"),
        Patch(facecolor="none", edgecolor=cmap(0.6), label="sliding block at the robot's snapshot times"),
        Line2D([], [], color=cmap(0.6), lw=3, label="executed path"),
        Line2D([], [], color=cmap(0.6), marker="o", mfc="none", ls="none", ms=8, label="robot spheres (every "
               f"{snapshot_every_s:g} s)"),
        Line2D([], [], color="#2b9348", ls="--", lw=1.2, label="MPPI mean plan (2 s horizon)"),
        Line2D([], [], color="#9aa5b1", lw=0.8, label="best sampled rollouts"),
        Line2D([], [], color="#2a9d8f", marker="o", ls="none", ms=8, label="start"),
        Line2D([], [], color="#e9c46a", marker="*", ls="none", ms=13, mec="#8a6d1f", label="goal"),
    ]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.09), ncol=3, fontsize=8.5,
              frameon=False)
    ok = "reached" if summary.get("goal_reached") else "NOT reached"
    ax.set_title(f"robot_sdf MPC demo, top view: goal {ok} in {summary.get('sim_time_s', t[-1]):.1f} s, "
                 f"min clearance {1e3 * summary.get('min_clearance_m', np.nan):.0f} mm, "
                 f"{summary.get('collision_steps', 0)} collisions  [{summary.get('mode', '')}]", fontsize=10.5)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def _outline(tris: np.ndarray) -> np.ndarray:
    """Closed convex hull (k+1, 2) of a footprint's points (the demo's moving block is convex)."""
    pts = tris.reshape(-1, 2)
    pts = np.unique(np.round(pts, 6), axis=0)
    if len(pts) < 3:
        return pts
    # Andrew's monotone chain.
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]

    def half(points):
        out = []
        for p in points:
            while len(out) >= 2 and np.cross(out[-1] - out[-2], p - out[-2]) <= 0:
                out.pop()
            out.append(p)
        return out

    lower, upper = half(pts), half(pts[::-1])
    hull = np.array(lower[:-1] + upper[:-1])
    return np.vstack([hull, hull[:1]])


def slice_grid(scenario: Scenario, resolution: float = 0.02) -> tuple[np.ndarray, np.ndarray]:
    """Grid axes (xs (nx,), ys (ny,)) [m] covering the scenario."""
    xmin, xmax, ymin, ymax = scenario.bounds(margin=0.25)
    return np.arange(xmin, xmax + 1e-9, resolution), np.arange(ymin, ymax + 1e-9, resolution)


def slice_distance(scenario: Scenario, poses: dict[str, list[float]], height: float,
                   xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """Signed distance (ny, nx) [m] on the plane z = height, with the moving obstacles at poses.

    Uses the core (robot_sdf.MeshWorld, ray-vote sign test), searching up to 1 m.
    """
    import torch

    from robot_sdf import MeshWorld
    from robot_sdf.scene import apply_scene

    world = MeshWorld(device="cpu", sign_method="default", max_distance=1.0)
    apply_scene(world, scenario.obstacles)
    for oid, pose in poses.items():
        world.set_pose(oid, np.asarray(pose))
    gx, gy = np.meshgrid(xs, ys)
    pts = np.stack([gx.ravel(), gy.ravel(), np.full(gx.size, height)], axis=1)
    with torch.no_grad():
        dist, _ = world.signed_distance(torch.as_tensor(pts, dtype=torch.float32))
    return dist.numpy().reshape(gx.shape)


def distance_slice(rows: list[dict[str, Any]], scenario: Scenario, summary: dict[str, Any], path: Path,
                   robot: SphereRobot | None = None) -> Path:
    """Signed distance on the robot's plane at the step of the smallest clearance (see module doc)."""
    robot = robot or SphereRobot()
    k = int(summary.get("min_clearance_step", int(np.argmin([r["min_clearance"] for r in rows]))))
    row = rows[k]
    xs, ys = slice_grid(scenario)
    dist = slice_distance(scenario, row["obstacle_poses"], robot.height, xs, ys)
    fig, ax = plt.subplots(figsize=(11.5, 6.8))
    im = draw_distance_map(ax, xs, ys, dist)
    _frame(ax, scenario)
    ax.grid(False)
    xy = np.array([[r["x"], r["y"]] for r in rows])
    # The map is a snapshot at step k; the slider stands elsewhere at other times, so the path
    # after k is drawn differently (it may cross where the slider is drawn).
    ax.plot(xy[: k + 1, 0], xy[: k + 1, 1], color="#ffb703", lw=2.2, zorder=4)
    ax.plot(xy[k:, 0], xy[k:, 1], color="#ffb703", lw=1.6, ls=(0, (4, 2)), alpha=0.85, zorder=4)
    _robot_circles(ax, robot, [row["x"], row["y"], row["yaw"]], "#fb8500", 1.0, lw=1.6, zorder=5)
    _start_goal(ax, scenario)
    cb = fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01)
    cb.set_label("signed distance [m] (negative inside)")
    handles = [Line2D([], [], color="black", lw=1.6, label="zero level (obstacle surface)"),
               Line2D([], [], color="#ffb703", lw=2.2, label="executed path up to this moment"),
               Line2D([], [], color="#ffb703", lw=1.6, ls=(0, (4, 2)), label="later path (slider moved by then)"),
               Line2D([], [], color="#fb8500", marker="o", mfc="none", ls="none", ms=9,
                      label=f"robot at t = {row['t']:.1f} s (clearance {1e3 * row['min_clearance']:.0f} mm)")]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, -0.09), ncol=2, fontsize=9, frameon=False)
    ax.set_title(f"signed distance in the robot's plane z = {robot.height:.2f} m at t = {row['t']:.1f} s "
                 "(tightest moment of the run)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def clearance_plot(rows: list[dict[str, Any]], summary: dict[str, Any], path: Path,
                   activation_distance: float | None = None) -> Path:
    """Minimum clearance over time (zero line, activation distance) and service latency per step."""
    t = np.array([r["t"] for r in rows])
    c = np.array([r["min_clearance"] for r in rows]) * 1e3
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(10, 6.2), sharex=True,
                                  gridspec_kw={"height_ratios": [2.2, 1.0]})
    ax.axhspan(min(c.min(), 0.0) - 50, 0.0, color="#e63946", alpha=0.12, lw=0)
    ax.axhline(0.0, color="#e63946", lw=1.5, label="contact (clearance 0)")
    if activation_distance:
        ax.axhline(1e3 * activation_distance, color="#6c757d", lw=1.0, ls="--",
                   label=f"activation distance ({1e3 * activation_distance:.0f} mm): cost starts")
    ax.plot(t, c, color="#1d3557", lw=2.0, label="min clearance of the robot's spheres")
    k = int(np.argmin(c))
    ax.plot(t[k], c[k], "o", color="#e63946", ms=7, zorder=5)
    ax.annotate(f"min {c[k]:.0f} mm at t = {t[k]:.1f} s", (t[k], c[k]), xytext=(10, 18),
                textcoords="offset points", fontsize=9, arrowprops=dict(arrowstyle="->", color="#444"))
    ax.set_ylabel("clearance [mm]")
    ax.set_ylim(min(c.min(), 0.0) - 40, max(c.max(), 100) * 1.08)
    ax.grid(True, color="#dddddd", lw=0.5)
    ax.legend(loc="upper right", fontsize=8.5)
    ax.set_title("clearance to the nearest obstacle surface (signed distance - sphere radius)", fontsize=11)
    lat_rows = [r for r in rows if "latency_s" in r]
    if lat_rows:
        tl = np.array([r["t"] for r in lat_rows])
        lat = np.array([r["latency_s"] for r in lat_rows]) * 1e3
        ax2.plot(tl, lat, color="#457b9d", lw=1.0, label="swept-cost request (all rollouts)")
        p = summary.get("service_latency_ms", {})
        if p:
            ax2.axhline(p["p50"], color="#457b9d", lw=0.8, ls=":", label=f"p50 {p['p50']:.1f} ms")
            ax2.axhline(p["p95"], color="#a8dadc", lw=0.8, ls="--", label=f"p95 {p['p95']:.1f} ms")
        ax2.set_ylim(0, max(lat.max() * 1.1, 1.0))
        ax2.legend(loc="upper right", fontsize=8, ncol=3)
    ax2.set_ylabel("latency [ms]")
    ax2.set_xlabel("time [s]")
    ax2.grid(True, color="#dddddd", lw=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def make_figures(rows: list[dict[str, Any]], scenario: Scenario, summary: dict[str, Any], out_dir: Path,
                 activation_distance: float | None = None) -> list[Path]:
    """Write top_view.png, distance_slice.png and clearance.png into out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [top_view(rows, scenario, summary, out_dir / "top_view.png"),
            distance_slice(rows, scenario, summary, out_dir / "distance_slice.png"),
            clearance_plot(rows, summary, out_dir / "clearance.png", activation_distance)]
