"""render_slice: save a running sdf_server's distance slice as a PNG.

    render_slice [--server /sdf_server] [--output distance_slice.png] [--timeout 10]

Subscribes to ``<server>/distance_slice`` (sensor_msgs/PointCloud2 with float32 fields x, y, z,
distance; the node computes it only while someone subscribes), waits for one cloud, and draws the
signed distance on the slice plane as a colour map (red inside, blue outside) with the zero
contour. The cloud is decoded with numpy from ``msg.data`` using each field's offset and the
cloud's point_step/row_step (no sensor_msgs_py needed). Exit status: 0 written, 1 no cloud within
the timeout, 2 bad cloud.

The drawing helpers (parse_cloud, grid_from_points, draw_distance_map) import no ROS module.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

FLOAT32 = 7  # sensor_msgs/PointField.FLOAT32
REQUIRED_FIELDS = ("x", "y", "z", "distance")
AXES = "xyz"


def parse_cloud(msg) -> np.ndarray:
    """PointCloud2 -> (N, 4) float32 array of x, y, z, distance [m].

    Reads each field at its byte offset inside every point_step-sized record (rows of row_step
    bytes, so padded clouds work too). Raises ValueError when a field is missing or not float32.
    """
    fields = {f.name: f for f in msg.fields}
    missing = [n for n in REQUIRED_FIELDS if n not in fields]
    if missing:
        raise ValueError(f"cloud lacks field(s) {missing}; has {sorted(fields)}")
    for name in REQUIRED_FIELDS:
        f = fields[name]
        if f.datatype != FLOAT32 or f.count != 1:
            raise ValueError(f"field {name!r} must be one float32 (datatype {FLOAT32}), "
                             f"got datatype {f.datatype} x {f.count}")
        if f.offset + 4 > msg.point_step:
            raise ValueError(f"field {name!r} at offset {f.offset} exceeds point_step {msg.point_step}")
    n = int(msg.width) * int(msg.height)
    raw = np.frombuffer(msg.data, dtype=np.uint8)
    if n == 0:
        return np.zeros((0, 4), np.float32)
    if raw.size < msg.row_step * msg.height or msg.row_step < msg.width * msg.point_step:
        raise ValueError(f"cloud data holds {raw.size} bytes, expected {msg.height} rows of {msg.row_step}")
    records = raw[: msg.row_step * msg.height].reshape(msg.height, msg.row_step)
    records = records[:, : msg.width * msg.point_step].reshape(n, msg.point_step)
    dtype = np.dtype(">f4" if msg.is_bigendian else "<f4")
    out = np.empty((n, 4), np.float32)
    for i, name in enumerate(REQUIRED_FIELDS):
        off = fields[name].offset
        out[:, i] = np.ascontiguousarray(records[:, off:off + 4]).view(dtype).reshape(n)
    return out


def grid_from_points(cloud: np.ndarray, decimals: int = 5):
    """Scattered slice points (N, 4) -> image of the plane.

    The plane's normal is the coordinate with the smallest spread; the other two become the image
    axes (in x, y, z order). Returns (axis names (u, v), us (nu,), vs (nv,), image (nv, nu) with
    NaN where no point fell, offset along the normal [m], normal axis name).
    """
    if cloud.shape[0] == 0:
        raise ValueError("empty cloud")
    spread = cloud[:, :3].max(axis=0) - cloud[:, :3].min(axis=0)
    normal = int(np.argmin(spread))
    iu, iv = [i for i in range(3) if i != normal]
    us = np.unique(np.round(cloud[:, iu], decimals))
    vs = np.unique(np.round(cloud[:, iv], decimals))
    img = np.full((vs.size, us.size), np.nan, np.float32)
    cols = np.searchsorted(us, np.round(cloud[:, iu], decimals))
    rows = np.searchsorted(vs, np.round(cloud[:, iv], decimals))
    img[rows, cols] = cloud[:, 3]
    return (AXES[iu], AXES[iv]), us, vs, img, float(np.median(cloud[:, normal])), AXES[normal]


def draw_distance_map(ax, us: np.ndarray, vs: np.ndarray, dist: np.ndarray, vmax: float | None = None):
    """Colour map of a distance image (nv, nu) on axes us, vs: red inside, white at 0, blue outside,
    with the zero contour in black and a few distance contours. Returns the image (for a colour bar)."""
    from matplotlib.colors import TwoSlopeNorm

    finite = dist[np.isfinite(dist)]
    vmin = min(float(finite.min()) if finite.size else -0.05, -0.05)
    vmax = vmax or max(float(finite.max()) if finite.size else 0.05, 0.05)
    im = ax.imshow(dist, origin="lower", extent=(us[0], us[-1], vs[0], vs[-1]), cmap="RdBu",
                   norm=TwoSlopeNorm(vmin=vmin, vcenter=0.0, vmax=vmax), interpolation="bilinear", zorder=1)
    if us.size > 1 and vs.size > 1:
        levels = [lv for lv in (0.1, 0.2, 0.3, 0.4) if lv < vmax]
        if levels:
            cs = ax.contour(us, vs, dist, levels=levels, colors="#20406a", linewidths=0.5, alpha=0.6, zorder=2)
            ax.clabel(cs, fmt="%.1f m", fontsize=7)
        if finite.size and finite.min() < 0.0 < finite.max():
            ax.contour(us, vs, dist, levels=[0.0], colors="black", linewidths=1.6, zorder=3)
    return im


def render(cloud: np.ndarray, output: Path, title: str = "", source: str = "") -> Path:
    """Write the PNG of a parsed cloud (N, 4); source (e.g. the topic) goes into the default title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    (an, bn), us, vs, img, offset, normal = grid_from_points(cloud)
    width = 9.0
    height = min(max(width * (vs[-1] - vs[0]) / max(us[-1] - us[0], 1e-9), 3.0), 12.0) + 1.2
    fig, ax = plt.subplots(figsize=(width + 1.5, height))
    im = draw_distance_map(ax, us, vs, img)
    ax.set_aspect("equal")
    ax.set_xlabel(f"{an} [m]")
    ax.set_ylabel(f"{bn} [m]")
    cb = fig.colorbar(im, ax=ax, fraction=0.03, pad=0.02)
    cb.set_label("signed distance [m] (negative inside)")
    ax.legend(handles=[Line2D([], [], color="black", lw=1.6, label="zero level (obstacle surface)")],
              loc="upper left", bbox_to_anchor=(0.0, -0.1), fontsize=9, frameon=False)
    ax.set_title(title or f"{source + ': ' if source else ''}signed distance on the {an}{bn} plane at "
                          f"{normal} = {offset:.3f} m ({cloud.shape[0]} points)", fontsize=11)
    fig.tight_layout()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=120)
    plt.close(fig)
    return output


def capture(server: str = "/sdf_server", timeout_s: float = 10.0):
    """Wait for one PointCloud2 on <server>/distance_slice; returns it or None after timeout_s.

    Uses a private rclpy context, so it can run inside a process that already uses rclpy.
    """
    import rclpy
    from rclpy.executors import SingleThreadedExecutor
    from sensor_msgs.msg import PointCloud2

    context = rclpy.Context()
    rclpy.init(context=context)
    received: list = []
    try:
        node = rclpy.create_node(f"render_slice_{os.getpid()}", context=context)
        topic = f"{server.rstrip('/')}/distance_slice"
        node.create_subscription(PointCloud2, topic, received.append, 1)
        executor = SingleThreadedExecutor(context=context)
        executor.add_node(node)
        deadline = time.monotonic() + timeout_s
        while not received and time.monotonic() < deadline:
            executor.spin_once(timeout_sec=0.1)
        executor.shutdown()
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
    return received[0] if received else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Save a running sdf_server's ~/distance_slice as a PNG.")
    parser.add_argument("--server", default="/sdf_server", help="node name (default /sdf_server)")
    parser.add_argument("--output", type=Path, default=Path("distance_slice.png"), help="PNG file to write")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for a cloud")
    args = parser.parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    msg = capture(args.server, args.timeout)
    topic = f"{args.server.rstrip('/')}/distance_slice"
    if msg is None:
        print(f"render_slice: no PointCloud2 on {topic} within {args.timeout:g} s (is the node running, "
              "with slice_rate_hz > 0, in this ROS_DOMAIN_ID?)", file=sys.stderr)
        return 1
    try:
        cloud = parse_cloud(msg)
        out = render(cloud, args.output, source=topic)
    except ValueError as exc:
        print(f"render_slice: cannot use the cloud on {topic}: {exc}", file=sys.stderr)
        return 2
    d = cloud[:, 3]
    print(f"render_slice: wrote {out} ({cloud.shape[0]} points, distance {d.min():+.3f} .. {d.max():+.3f} m)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
