"""Figures of the perception demo (matplotlib, Agg): what the node reconstructed beside the truth,
signed-distance slices, and the arm's exact clearance over time. The node's values come from its
``~/query_signed_distance`` on the grids of ``figure_grids``, the truth from the exact meshes."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from robot_sdf.examples import perception_scene as scene

GRID_STEP = 0.01  # m


def _axis(lo: float, hi: float, step: float = GRID_STEP) -> np.ndarray:
    return np.arange(lo, hi + 1e-9, step)


def figure_grids(box_pose: np.ndarray) -> dict[str, np.ndarray]:
    """Points (..., 3) of: ``columns`` (x, y, z) over the workspace for a height map (2 cm
    columns), ``slice_xz`` through the box along the robot's axis, ``slice_yz`` along the box's
    path."""
    lo, hi = np.asarray(scene.WORKSPACE_LOWER), np.asarray(scene.WORKSPACE_UPPER)
    x, y, z = _axis(lo[0], hi[0]), _axis(lo[1], hi[1]), _axis(lo[2], hi[2])
    columns = np.stack(np.meshgrid(x[::2], y[::2], z, indexing="ij"), axis=-1)
    xz = np.stack(np.meshgrid(x, [box_pose[1]], z, indexing="ij"), axis=-1)[:, 0]
    yz = np.stack(np.meshgrid([box_pose[0]], y, z, indexing="ij"), axis=-1)[0]
    return {"columns": columns, "slice_xz": xz, "slice_yz": yz}


def height_map(grid: np.ndarray, distance: np.ndarray) -> np.ndarray:
    """(nx, ny) height of the highest point inside (distance < 0) of each column; NaN: none."""
    z = grid[..., 2]
    inside = np.where(distance < 0, z, -np.inf).max(axis=-1)
    return np.where(np.isfinite(inside), inside, np.nan)


def _draw_heights(ax, grid, heights, title: str) -> None:
    extent = (grid[0, 0, 0, 1], grid[0, -1, 0, 1], grid[-1, 0, 0, 0], grid[0, 0, 0, 0])
    image = ax.imshow(heights, extent=extent, vmin=0.0, vmax=0.35, cmap="viridis")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("y [m]")
    ax.set_ylabel("x [m] (robot at 0)")
    return image


def _draw_slice(ax, grid, distance, exact, title: str, horizontal: int):
    """Signed distance in a plane (rows: the first grid axis), the exact zero level drawn over it."""
    h, v = grid[..., horizontal], grid[..., 2]
    image = ax.pcolormesh(h, v, np.clip(distance, -0.1, 0.3), cmap="RdBu", vmin=-0.3, vmax=0.3, shading="auto")
    ax.contour(h, v, exact, levels=[0.0], colors="k", linewidths=0.8)
    ax.contour(h, v, distance, levels=[0.0], colors="orange", linewidths=0.8, linestyles="--")
    ax.set_aspect("equal")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("xy"[horizontal] + " [m]")
    ax.set_ylabel("z [m]")
    return image


def reconstruction_figure(path: Path, moments: list[dict]) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(moments), 2, figsize=(9, 4.2 * len(moments)), squeeze=False)
    for row, moment in zip(axes, moments):
        grid, node, exact = moment["columns"]
        _draw_heights(row[0], grid, height_map(grid, node), f"node's world from the camera (box t = {moment['t']:.1f} s)")
        image = _draw_heights(row[1], grid, height_map(grid, exact), "the true meshes")
    fig.colorbar(image, ax=axes, label="height of the top surface [m]", shrink=0.8)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def slice_figure(path: Path, moments: list[dict]) -> Path:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(moments), 2, figsize=(11, 3.3 * len(moments)), squeeze=False)
    for row, moment, (key, horizontal) in zip(axes, moments, (("slice_xz", 0), ("slice_yz", 1))):
        grid, node, exact = moment[key]
        where = f"y = {grid[0, 0, 1]:.2f}" if horizontal == 0 else f"x = {grid[0, 0, 0]:.2f}"
        _draw_slice(row[0], grid, node, exact, f"node: signed distance at {where} (box t = {moment['t']:.1f} s)",
                    horizontal)
        image = _draw_slice(row[1], grid, exact, exact, "exact", horizontal)
    fig.colorbar(image, ax=axes, label="signed distance [m] (black: true surface, orange: node's zero level)")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def clearance_figure(path: Path, times: list[float], clearance: np.ndarray) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot(times, 1e3 * clearance, label="arm: smallest exact clearance")
    ax.axhline(0.0, color="k", linewidth=0.8)
    ax.set_xlabel("time since the box started sliding [s]")
    ax.set_ylabel("clearance [mm]")
    twin = ax.twinx()
    twin.plot(times, [scene.box_pose(t)[1] for t in times], color="tab:orange", label="box y")
    twin.set_ylabel("box y [m]")
    fig.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_figures(out: Path, settled: dict, end: dict, times: list[float], clearance: np.ndarray) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    return [reconstruction_figure(out / "reconstruction.png", [settled, end]),
            slice_figure(out / "distance_slice.png", [settled, end]),
            clearance_figure(out / "clearance.png", times, clearance)]
