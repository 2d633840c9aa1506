"""Figures of the arm demo, drawn from its own outputs (verification.npz and arm_log.jsonl).

keyframes.png: top (x-y) and side (x-z) views of the obstacles and the arm's spheres at a few key
frames (each frame and the moving obstacle at that time in one colour); clearance.png: the
smallest sphere clearance and the solve time of every control step over the run.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from robot_sdf.examples.scenario import transform


def _key_frames(n: int, count: int = 4) -> list[int]:
    return sorted({int(round(i * (n - 1) / (count - 1))) for i in range(count)})


def _draw_obstacle(ax, vertices, pose, axes: tuple[int, int], color, alpha) -> None:
    """The outline (convex hull) of the obstacle's projection; the demo's obstacles are convex."""
    from matplotlib.patches import Polygon
    from scipy.spatial import ConvexHull

    world = transform(pose, vertices)[:, list(axes)]
    hull = world[ConvexHull(world).vertices]
    ax.add_patch(Polygon(hull, closed=True, facecolor=color, edgecolor=color, alpha=alpha, lw=1.0))


def make_figures(npz_path: Path, log_path: Path, scene, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Circle

    data = np.load(npz_path)
    spheres = data["spheres"]
    frames = _key_frames(len(spheres))
    colors = plt.cm.viridis(np.linspace(0.0, 0.9, len(frames)))
    moving = {m.id for m in scene.moving}
    fig, axs = plt.subplots(1, 2, figsize=(13, 5.8))
    for ax, axes, title in ((axs[0], (0, 1), "top view (x-y)"), (axs[1], (0, 2), "side view (x-z)")):
        for spec in scene.obstacles:
            v, poses = data[f"vertices_{spec.id}"], data[f"poses_{spec.id}"]
            if spec.id in moving:
                for f, c in zip(frames, colors):
                    _draw_obstacle(ax, v, poses[f], axes, c, 0.5)
            else:
                _draw_obstacle(ax, v, poses[0], axes, "0.5", 0.3)
        for f, c in zip(frames, colors):
            for x in spheres[f]:
                ax.add_patch(Circle((x[axes[0]], x[axes[1]]), x[3], facecolor=c, edgecolor=c, alpha=0.25, lw=0.5))
        hand = spheres[:, -10:, :3].mean(axis=1)  # the last links (hand, fingers): the tool's path
        ax.plot(hand[:, axes[0]], hand[:, axes[1]], "r-", lw=1.2, label="hand path")
        ax.set_aspect("equal")
        ax.autoscale_view()
        ax.set_xlabel("xyz"[axes[0]] + " [m]")
        ax.set_ylabel("xyz"[axes[1]] + " [m]")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    t = data["t"]
    handles = [plt.Line2D([], [], color=c, lw=6, alpha=0.5, label=f"t = {t[f]:.1f} s") for f, c in zip(frames, colors)]
    axs[0].legend(handles=handles + [plt.Line2D([], [], color="r", label="hand path")], loc="lower left", fontsize=8)
    fig.suptitle("Franka Panda spheres at key frames (grey: static obstacles; coloured: the moving ball then)")
    fig.tight_layout()
    key_png = out_dir / "keyframes.png"
    fig.savefig(key_png, dpi=110)
    plt.close(fig)

    rows = [json.loads(line) for line in open(log_path) if line.strip()]
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    a1.plot([r["t"] for r in rows], [1e3 * r["min_clearance"] for r in rows], "b.-")
    a1.axhline(0.0, color="r", lw=1)
    a1.set_ylabel("min sphere clearance [mm]")
    a1.grid(alpha=0.3)
    solved = [r for r in rows if "solve_ms" in r]
    a2.plot([r["t"] for r in solved], [r["solve_ms"] for r in solved], "k.-")
    a2.set_ylabel("solve time per step [ms]")
    a2.set_xlabel("simulated time [s]")
    a2.grid(alpha=0.3)
    fig.suptitle("Arm demo: clearance of the executed states and controller solve time")
    fig.tight_layout()
    clear_png = out_dir / "clearance.png"
    fig.savefig(clear_png, dpi=110)
    plt.close(fig)
    return [key_png, clear_png]
