"""Depth frames into the world, on rtb-data's real meshes: accuracy against the exact meshes and
speed beside Open3D's CPU TSDF on the same frames.

Scene: five manufacturers' meshes (bench.real_meshes) standing on a table (a 1.2 x 1.2 m slab) and
two boxes, seen by a simulated depth camera (robot_sdf.perception.simulated_camera: sigma = 1 mm
+ 2 mm z^2, 1 % of the pixels dropped) from 30 views around the table. Accuracy (2 cm voxels,
320x240): signed-distance error of points within 5 cm of a true surface, points >= 3 cm inside
read inside, free space 1-5 cm and beyond 5 cm read free, against exact distances to the true
meshes (MeshWorld of the true meshes with its exact sign). Speed, per frame, median over the
views after one warm-up: robot_sdf's integrate, its surface + world update (the frame to a world
that answers), and Open3D's ScalableTSDFVolume integrate and mesh extraction on the same frames,
at 320x240 and 640x480 with 2 cm and 1 cm voxels; and a 30,000-point lidar scan.

``perception_node``: the perception demo's camera streamed into a real sdf_server (15 Hz): the
node's own stamp -> world answering latency, fusion time, frames fused, its RSS; ``python -m
bench.perception_bench --rate 30 --duration 600`` runs it alone, for as long as asked.
"""
from __future__ import annotations

import time

import numpy as np
import torch

from bench import cpu_model, emit, section, table

NAMES = ("kr3_link4_visual", "kr120_link2_visual", "puma560_link3_visual", "panda_link0_visual", "vx300s_gripper")


def scene() -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """(world-frame parts [(vertices, triangles)], workspace lower, upper)."""
    from bench import real_meshes
    from robot_sdf.io import box_mesh

    rng = np.random.default_rng(5)
    parts = []
    spots = [(-0.35, -0.3), (0.3, -0.35), (-0.3, 0.3), (0.35, 0.3), (0.0, 0.0)]
    for name, (x, y) in zip(NAMES, spots):
        v, t = real_meshes.load(name)
        v = v.astype(np.float64)
        scale = 0.3 / max(np.ptp(v, axis=0).max(), 1e-6)  # about 30 cm across
        v = (v - v.mean(axis=0)) * min(scale, 1.0)
        angle = rng.uniform(0, 2 * np.pi)
        rot = np.array([[np.cos(angle), -np.sin(angle), 0], [np.sin(angle), np.cos(angle), 0], [0, 0, 1]])
        v = v @ rot.T
        v += [x, y, -v[:, 2].min()]
        parts.append((v, t.astype(np.int64)))
    for size, centre in (((0.15, 0.1, 0.2), (0.05, -0.55, 0.1)), ((0.1, 0.25, 0.08), (-0.6, 0.0, 0.04))):
        v, t = box_mesh(size)
        parts.append((v.astype(np.float64) + centre, t.astype(np.int64)))
    v, t = box_mesh((1.4, 1.4, 0.05))
    parts.append((v.astype(np.float64) + [0.0, 0.0, -0.025], t.astype(np.int64)))
    return parts, np.array([-0.8, -0.8, -0.1]), np.array([0.8, 0.8, 0.6])


def views(count: int = 30):
    from robot_sdf.perception.simulated_camera import look_at

    for i in range(count):
        a = 2 * np.pi * i / count
        yield look_at([1.4 * np.cos(a), 1.4 * np.sin(a), 0.7 + 0.3 * np.sin(2 * a)], [0.0, 0.0, 0.1])


def _truth(parts, device="cpu"):
    from robot_sdf import MeshWorld

    world = MeshWorld(device=device, max_distance=1.0, sign_method="winding_number")
    for k, (v, t) in enumerate(parts):
        world.add_mesh(f"true_{k}", v, t)
    return world


def fused_world(b, frames, max_distance: float):
    """(a MeshWorld holding the fusion of ``frames`` at 2 cm voxels, its DepthFusion)."""
    from robot_sdf import MeshWorld
    from robot_sdf.perception import DepthFusion

    _, lower, upper = scene()
    world = MeshWorld(device=b.device, max_distance=max_distance)
    fusion = DepthFusion(world, lower, upper, voxel_size=0.02)
    for depth, intrinsics, pose in frames:
        fusion.integrate(depth, intrinsics, pose)
    fusion.update_world()
    return world, fusion


def accuracy(b, frames) -> list[list[str]]:
    parts, lower, upper = scene()
    world, _ = fused_world(b, frames, 1.0)
    rng = np.random.default_rng(2)
    points = rng.uniform(lower + 0.05, upper - 0.05, size=(20_000 if b.quick else 100_000, 3))
    truth = _truth(parts, b.device).signed_distance(torch.tensor(points, dtype=torch.float32), 0, 1.0)[0]
    sd = world.signed_distance(torch.tensor(points, dtype=torch.float32), 0, 1.0)[0]
    truth, sd = truth.cpu().numpy(), sd.cpu().numpy()
    near = np.abs(truth) < 0.05
    error = np.abs(sd - truth)[near]
    deep, free_near, far = truth <= -0.03, (truth > 0.01) & (truth < 0.05), truth >= 0.05
    return [["points within 5 cm of a surface: |error| median / p95", "<= 10 / 20 mm",
             f"{1e3 * np.median(error):.1f} / {1e3 * np.percentile(error, 95):.1f} mm ({near.sum():,} points)"],
            [">= 3 cm inside read inside", ">= 95 %", f"{100 * (sd[deep] < 0).mean():.1f} % ({deep.sum():,})"],
            ["free 1-5 cm from every surface read free", ">= 95 %",
             f"{100 * (sd[free_near] > 0).mean():.1f} % ({free_near.sum():,})"],
            ["free beyond 5 cm read occupied", "<= 0.1 %", f"{100 * (sd[far] <= 0).mean():.2f} % ({far.sum():,})"]]


def query_rows(b, frames) -> list[list[str]]:
    """Queries on the perceived world beside the same surface given to another world as an
    ordinary mesh (add_mesh, sign method auto): evaluate_sphere_cost of spheres over the
    workspace and the swept cost of trajectories through it, medians, interleaved."""
    import time

    from robot_sdf import MeshWorld
    from robot_sdf.perception.fusion import PERCEIVED_MESH

    _, lower, upper = scene()
    perceived, fusion = fused_world(b, frames, 0.2)
    given = MeshWorld(device=b.device, max_distance=0.2)
    vertices, triangles, pose, _ = perceived.mesh_geometry(PERCEIVED_MESH)
    given.add_mesh("given", vertices, triangles, pose)
    rng = np.random.default_rng(3)
    n = 5_000 if b.quick else 20_000
    centres = rng.uniform(lower + 0.05, upper - 0.05, size=(n, 3))
    spheres = torch.tensor(np.concatenate([centres, np.full((n, 1), 0.04)], 1), dtype=torch.float32,
                           device=b.device).reshape(1, 1, n, 4)
    start = rng.uniform(lower + 0.05, upper - 0.05, size=(n // 20, 3))
    path = start[None] + np.linspace(0.0, 0.3, 20)[:, None, None] * rng.normal(size=(1, n // 20, 3))
    walks = torch.tensor(np.concatenate([path, np.full(path.shape[:2] + (1,), 0.04)], -1), dtype=torch.float32,
                         device=b.device).reshape(1, 20, n // 20, 4)
    rows = []
    for label, call in (("plain, evaluate_sphere_cost", lambda w: w.evaluate_sphere_cost(spheres)),
                        ("swept (4 steps), evaluate_swept_sphere_cost",
                         lambda w: w.evaluate_swept_sphere_cost(walks, sweep_steps=4))):
        times: dict = {"perceived": [], "given": []}
        for world in (perceived, given):
            call(world)  # warm-up
        for _ in range(5 if b.quick else 15):
            for name, world in (("perceived", perceived), ("given", given)):
                t0 = time.perf_counter()
                call(world)
                if b.device != "cpu":
                    torch.cuda.synchronize()
                times[name].append(time.perf_counter() - t0)
        p, g = (1e3 * float(np.median(times[k])) for k in ("perceived", "given"))
        rows.append([label, f"{fusion.triangles:,}", f"{p:.2f}", f"{g:.2f}", f"{p / g:.2f}"])
    return rows


def render_frames(b, width: int, height: int, count: int):
    from robot_sdf.perception.simulated_camera import SimulatedDepthCamera, merge_meshes

    parts, _, _ = scene()
    vertices, triangles = merge_meshes(parts)
    camera = SimulatedDepthCamera(width, height, 0.9 * width, 0.9 * width, device=b.device)
    rng = np.random.default_rng(0)
    return [(camera.render(vertices, triangles, pose, rng), camera.intrinsics, pose)
            for pose in list(views())[:count]]


def speed_rows(b, frames, voxel: float, label: str) -> list[list[str]]:
    from robot_sdf import MeshWorld
    from robot_sdf.perception import DepthFusion

    _, lower, upper = scene()
    world = MeshWorld(device=b.device, max_distance=1.0)
    fusion = DepthFusion(world, lower, upper, voxel_size=voxel)
    integrate, update = [], []
    for k, (depth, intrinsics, pose) in enumerate(frames):
        t0 = time.perf_counter()
        fusion.integrate(depth, intrinsics, pose)
        if b.sync:
            b.sync()
        t1 = time.perf_counter()
        fusion.update_world()
        t2 = time.perf_counter()
        if k:
            integrate.append(t1 - t0)
            update.append(t2 - t1)
    rows = [[label, f"{voxel * 100:.0f} cm", "robot_sdf", f"{1e3 * np.median(integrate):.1f}",
             f"{1e3 * np.median(update):.1f}", f"{1e3 * (np.median(integrate) + np.median(update)):.1f}"]]
    from robot_sdf.geometry import quat_to_matrix

    o3d = _open3d()
    if o3d is None:
        rows.append([label, f"{voxel * 100:.0f} cm", "Open3D", "not installed", "", ""])
        return rows
    volume = o3d.pipelines.integration.ScalableTSDFVolume(
        voxel_length=voxel, sdf_trunc=4 * voxel, color_type=o3d.pipelines.integration.TSDFVolumeColorType.NoColor)
    integrate, extract = [], []
    for k, (depth, intrinsics, pose) in enumerate(frames):
        h, w = depth.shape
        fx, fy, cx, cy = intrinsics
        camera = o3d.camera.PinholeCameraIntrinsic(w, h, fx, fy, cx, cy)
        rgbd = o3d.geometry.RGBDImage.create_from_color_and_depth(
            o3d.geometry.Image(np.zeros((h, w, 3), np.uint8)), o3d.geometry.Image(depth.astype(np.float32)),
            depth_scale=1.0, depth_trunc=6.0, convert_rgb_to_intensity=False)
        m = np.eye(4)
        m[:3, :3], m[:3, 3] = quat_to_matrix(pose[3:]), pose[:3]
        t0 = time.perf_counter()
        volume.integrate(rgbd, camera, np.linalg.inv(m))
        t1 = time.perf_counter()
        volume.extract_triangle_mesh()
        t2 = time.perf_counter()
        if k:
            integrate.append(t1 - t0)
            extract.append(t2 - t1)
    rows.append([label, f"{voxel * 100:.0f} cm", "Open3D (CPU)", f"{1e3 * np.median(integrate):.1f}",
                 f"{1e3 * np.median(extract):.1f}", f"{1e3 * (np.median(integrate) + np.median(extract)):.1f}"])
    return rows


def _open3d():
    try:
        import open3d
    except ImportError:
        return None
    return open3d


def lidar_row(b, frames) -> list[str]:
    from robot_sdf.perception import TsdfVolume
    from robot_sdf.perception.simulated_camera import SimulatedDepthCamera

    height, width = frames[0][0].shape
    camera = SimulatedDepthCamera(width, height, *frames[0][1])  # to turn the frames into points

    _, lower, upper = scene()
    volume = TsdfVolume(lower, upper, voxel_size=0.02, device=b.device)
    rng = np.random.default_rng(4)
    times = []
    for k, (depth, _, pose) in enumerate(frames):
        cloud = camera.points(depth, pose)
        cloud = cloud[rng.choice(len(cloud), min(30_000, len(cloud)), replace=False)].astype(np.float32)
        t0 = time.perf_counter()
        volume.integrate_points(cloud, pose[:3])
        if b.sync:
            b.sync()
        if k:
            times.append(time.perf_counter() - t0)
    return ["lidar scan, 30,000 points", "2 cm", "robot_sdf", f"{1e3 * np.median(times):.1f}", "", ""]


def perception_fusion(b) -> None:
    """The tables (module docstring)."""
    count = 4 if b.quick else 12
    section(f"Depth frames into the world on {b.device} ({cpu_model() if b.device == 'cpu' else b.device}): "
            f"rtb-data meshes on a table, accuracy and speed")
    small = render_frames(b, 320, 240, 30)
    emit(table(["accuracy (30 views, 320x240, 2 cm voxels)", "target", "measured"], accuracy(b, small)))
    rows = []
    for width, height in ((320, 240), (640, 480)):
        frames = small[:count] if width == 320 else render_frames(b, width, height, count)
        for voxel in (0.02, 0.01):
            rows += speed_rows(b, frames, voxel, f"{width}x{height}")
    rows.append(lidar_row(b, small[:count]))
    emit("")
    emit(table(["frame", "voxel", "fusion", "integrate ms", "surface + world update ms (Open3D: mesh extraction)",
                "frame to answering world ms"], rows))
    emit("")
    emit(table(["query on the fused world (30 views, 2 cm)", "triangles", "perceived ms", "same surface as a mesh ms",
                "ratio"], query_rows(b, small)))
    emit(f"Medians over {count - 1} frames after one; workspace 1.6 x 1.6 x 0.7 m, dense grid (robot_sdf) against "
         "Open3D's hashed blocks. Goals on the 2-core CPU: 640x480 at 2 cm <= 50 ms, 320x240 <= 25 ms, "
         "a 30k-point scan <= 30 ms.")


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) / 1024.0
    return float("nan")


def stream_through_node(device: str, rate_hz: float, duration_s: float) -> dict:
    """The perception demo's camera (its box sliding on the wall clock) streamed at ``rate_hz`` for
    ``duration_s`` into a real sdf_server (the demo's parameters); the node's own figures
    (/diagnostics: frames fused, stamp -> world answering, fusion time) and its RSS once the
    first frame was fused and at the end."""
    import tempfile
    from pathlib import Path

    from robot_sdf.examples import perception_scene as scene
    from robot_sdf.examples.depth_stream import DepthStream, NodeDiagnostics, fuse_first_frame
    from robot_sdf.examples.perception_demo import start_node
    from robot_sdf.ros.client import SdfClient

    parts = scene.static_parts()
    camera_scene = scene.DepthCameraScene.build(parts)
    rng = np.random.default_rng(0)
    start_s = time.time()
    with tempfile.TemporaryDirectory(prefix="robot_sdf_perception_") as tmp:
        node = start_node(Path(tmp), device, 90.0)
        client = stream = None
        try:
            client = SdfClient(server="/sdf_server", timeout_s=30.0)
            client.wait_for_services(30.0)
            diagnostics = NodeDiagnostics(client.node)
            stream = DepthStream(client.node, camera_scene.camera,
                                 lambda ns: camera_scene.frame(ns * 1e-9 - start_s, rng), scene.CAMERA_FRAME, rate_hz)
            stream.wait_for_node(30.0)
            fuse_first_frame(stream, lambda: int(client.signed_distance(torch.zeros((1, 3))).world_revision))
            rss_start = _rss_mb(node.proc.pid)
            stream.start()
            stream_started = time.monotonic()
            time.sleep(duration_s)  # the stream runs on its own thread
            streamed_s = time.monotonic() - stream_started
            stream.stop()
            rss_end = _rss_mb(node.proc.pid)
            values = diagnostics.after(time.time_ns() + 1_500_000_000)  # the queued frames fused by then
        finally:
            if stream is not None:
                stream.stop()
            if client is not None:
                client.close()
            node.stop()
    return {"published": stream.published, "streamed_s": streamed_s, "late": stream.late, "values": values,
            "rss_start_mb": rss_start, "rss_end_mb": rss_end}


def perception_node(b, rate_hz: float = 15.0, duration_s: float | None = None) -> None:
    """Latency through the node (module docstring of robot_sdf.examples.depth_stream)."""
    duration_s = duration_s or (8.0 if b.quick else 30.0)
    section(f"Depth frames through a real sdf_server at {rate_hz:g} Hz for {duration_s:.0f} s (device {b.device}, "
            f"{cpu_model() if b.device == 'cpu' else b.device}): the perception demo's camera, 320x240, 2 cm voxels")
    r = stream_through_node(b.device, rate_hz, duration_s)
    v = r["values"]
    emit(table(["frames published / fused", "stamp -> world answering p50 / p99 / max ms",
                "fusion (integrate, surface, world update) p50 / p99 ms", "node RSS first frame -> end MB"],
               [[f"{r['published']} / {v.get('perception_frames_fused')}",
                 f"{float(v['perception_stamp_to_world_p50_ms']):.0f} / {float(v['perception_stamp_to_world_p99_ms']):.0f}"
                 f" / {float(v['perception_stamp_to_world_max_ms']):.0f}",
                 f"{float(v['perception_fuse_p50_ms']):.0f} / {float(v['perception_fuse_p99_ms']):.0f}",
                 f"{r['rss_start_mb']:.0f} -> {r['rss_end_mb']:.0f}"]]))
    emit(f"The node's own figures (its /diagnostics, every frame it fused; the first frame, which loads the kernels, "
         f"included); it keeps only the newest frame of a camera (queue depth 1) and drops the others when behind. "
         f"{r['late']} frames left the publisher late.")


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.perception_bench --rate 30 --duration 600``: the node table alone, e.g. a
    long stream for the node's RSS."""
    import argparse

    from bench import machine_description
    from bench.__main__ import _private_ros_env
    from bench.core_bench import Bench

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=15.0, help="frames per second (default 15)")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of stream (default 30)")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    _private_ros_env()
    emit(table(["machine", ""], machine_description(args.device)))
    perception_node(Bench(args.device, False), args.rate, args.duration)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
