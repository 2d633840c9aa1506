"""Perception demo (``make perception-demo``): a depth camera is all the node knows of the world.

    python -m robot_sdf.examples.perception_demo [--out perception_out] [--quick]

1. starts ``sdf_server`` with one depth camera (num_cameras 1, 2 cm voxels) and no obstacles,
   in its own ROS_DOMAIN_ID, the camera's frame given by its static_transforms;
2. streams a simulated depth camera (robot_sdf.examples.perception_scene: rtb-data meshes on a
   table, RealSense-like noise, 1 % of the pixels dropped) as sensor_msgs/Image (32FC1) and
   CameraInfo on camera_0/depth/image and camera_0/depth/camera_info at 15 Hz;
3. once the box on the table has been seen for a second, measures the node's signed distances
   (``~/query_signed_distance``) against the exact distances to the true meshes;
4. sets the box sliding across the table and drives a Franka Panda from one side of it to the
   other with the gradient MPC of robot_sdf.examples.arm_mpc, every cost from
   ``~/evaluate_swept_sphere_cost``; the box moves on the controller's clock (0.1 s a step, as
   the arm demo's ball), so what the arm meets does not depend on how fast this machine solves,
   and each step waits until the node's world shows the box's new place (two frames fused), so
   what it plans against does not depend on how far the node lags; the camera streams on the
   wall clock; the latency of the frames (from a frame's stamp until the
   world answers with it) is the node's own figure in its /diagnostics;
5. referees every executed state against the true meshes (the box where it was then, and where
   it went during the next step) and writes perception_out/: summary.json, reconstruction.png,
   distance_slice.png, clearance.png, sdf_server.log.

Exit status 0 when the goal was reached, no sphere ever touched a true mesh and the accuracy is
within its bounds (median <= 10 mm, p95 <= 20 mm).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import yaml

from robot_sdf.examples import perception_scene as scene

SUMMARY_NAME = "summary.json"
NODE_LOG = "sdf_server.log"
NODE_PARAMS = "sdf_server_params.yaml"
MEDIAN_BOUND_M, P95_BOUND_M = 0.010, 0.020
NEAR_SURFACE_M = 0.05  # accuracy is measured on points this close to a true surface
SEEN_BEHIND_M = 0.03  # ... that the camera saw: in front of its first surface or this far behind


def say(msg: str) -> None:
    print(msg, flush=True)


def node_params(device: str) -> dict:
    pose = " ".join(f"{x:.9f}" for x in scene.CAMERA_POSE)
    return dict(world_frame="world", device=device, max_distance=0.5, num_cameras=1, voxel_size=0.02,
                perception_workspace_lower=list(scene.WORKSPACE_LOWER),
                perception_workspace_upper=list(scene.WORKSPACE_UPPER),
                static_transforms=f"world {scene.CAMERA_FRAME} {pose}",
                marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=1.0)


def start_node(out: Path, device: str, timeout_s: float):
    from robot_sdf.ros.server_process import ServerProcess

    params = out / NODE_PARAMS
    params.write_text(yaml.safe_dump({"sdf_server": {"ros__parameters": node_params(device)}}, sort_keys=False))
    env = dict(os.environ, PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    node = ServerProcess(params, out / NODE_LOG, env)
    node.wait_ready(timeout_s)
    return node


# m: about the map's p95 error (1 cm) and what the box moves in the frames the world lags behind.
PERCEPTION_MARGIN = 0.015
RADIUS_ONLY = torch.tensor([0.0, 0.0, 0.0, 1.0])


class NodeCosts:
    """The node's swept sphere cost as the MPC's differentiable collision term (arm_demo's
    SummedGradientCost over ``evaluate_swept_sphere_cost``)."""

    def __init__(self, client, config) -> None:
        self.client, self.config = client, config

    def evaluate_swept_sphere_cost(self, spheres, activation_distance, weight, sweep_steps, speed_dt,
                                   compute_gradient):
        # The world lags the box by up to a step and reads surfaces within the map's error: the
        # spheres keep PERCEPTION_MARGIN more clearance than they would from a known mesh.
        spheres = torch.where(spheres[..., 3:] >= 0.0, spheres + PERCEPTION_MARGIN * RADIUS_ONLY, spheres)
        res = self.client.swept_sphere_cost(spheres, sweep_steps=sweep_steps, speed_dt=speed_dt,
                                            enable_speed_metric=False, activation_distance=activation_distance,
                                            weight=weight, compute_gradient=compute_gradient)
        return res.cost, res.gradient

    def collision(self, spheres: torch.Tensor) -> torch.Tensor:
        from robot_sdf.examples.arm_demo import SummedGradientCost

        return SummedGradientCost.apply(spheres, self, self.config)


def node_distance(client, points: np.ndarray) -> np.ndarray:
    res = client.signed_distance(torch.as_tensor(points, dtype=torch.float32), max_distance=0.5)
    return res.distance.numpy().astype(np.float64)


def accuracy(client, truth, camera_scene, count: int) -> dict:
    """|node - exact| signed distance of random points near a true surface that the camera saw
    (the box at rest), and how often free space 1-5 cm from every surface reads free."""
    rng = np.random.default_rng(3)
    points = rng.uniform(scene.WORKSPACE_LOWER, scene.WORKSPACE_UPPER, size=(count, 3))
    points = points[camera_scene.seen(points, 0.0, SEEN_BEHIND_M)]
    exact = truth.signed_distance(points, scene.box_pose(0.0))
    measured = node_distance(client, points)
    near = np.abs(exact) < NEAR_SURFACE_M
    error = np.abs(measured - exact)[near]
    free = (exact > 0.01) & (exact < 0.05)
    return {"points": int(near.sum()), "median_m": float(np.median(error)),
            "p95_m": float(np.percentile(error, 95)), "free_1_5cm_read_free": float((measured[free] > 0).mean())}


@dataclass
class Drive:
    """What the arm did: box time [s] at each executed state, its spheres, solve times."""

    times: list[float] = field(default_factory=list)
    spheres: list[np.ndarray] = field(default_factory=list)
    solve_s: list[float] = field(default_factory=list)
    reached: bool = False


def drive(robot, mpc, box_clock: list[float], max_steps: int, progress, world_caught_up) -> Drive:
    """Receding-horizon control from START to GOAL (arm_demo's loop); ``box_clock[0]``, the
    time the camera shows the box at, advances by a step's dt once the step is executed, and
    ``world_caught_up()`` returns once the node's world shows the box there: what the controller
    plans against then does not depend on how far the node is behind its camera."""
    goal = np.asarray(scene.GOAL)
    lower, upper = robot.lower.cpu().numpy(), robot.upper.cpu().numpy()
    q, result = np.asarray(scene.START, dtype=np.float64), Drive()
    for k in range(max_steps + 1):
        with torch.no_grad():
            spheres = robot.spheres(torch.as_tensor(q, dtype=robot.dtype))
        result.times.append(box_clock[0])
        result.spheres.append(spheres.numpy().astype(np.float64))
        error = float(np.abs(q - goal).max())
        result.reached = error <= 0.05
        if result.reached or k == max_steps:
            break
        step = mpc.step(q)
        result.solve_s.append(step.solve_s)
        q = np.clip(q + step.velocity * mpc.config.dt, lower, upper)
        box_clock[0] += mpc.config.dt
        world_caught_up()
        if k % 10 == 0:
            progress(f"  step {k:3d}  box t={result.times[-1]:5.1f} s  joint error {error:.3f} rad  "
                     f"solve {1e3 * step.solve_s:.0f} ms")
    return result


def true_clearance(truth, run: Drive, samples_per_s: float = 30.0) -> np.ndarray:
    """(steps,) smallest exact clearance (distance - radius) of each executed state's spheres,
    over the box's poses from that state's time to the next one's (both move during a step)."""
    ends = run.times[1:] + run.times[-1:]
    clearance = []
    for start, end, spheres in zip(run.times, ends, run.spheres):
        times = np.linspace(start, end, max(2, int(math.ceil((end - start) * samples_per_s)) + 1))
        clearance.append(min(float((truth.signed_distance(spheres[:, :3], scene.box_pose(t)) - spheres[:, 3]).min())
                             for t in times))
    return np.asarray(clearance)


def node_latency(diagnostics, published: int, stopped_ns: int, drain_s: float = 1.5) -> dict:
    """The node's frame figures from a status stamped ``drain_s`` after the stream stopped (the
    frames still queued then have been fused)."""
    values = diagnostics.after(stopped_ns + int(drain_s * 1e9))
    fused = int(values.get("perception_frames_fused", 0))
    return {"p50_ms": float(values.get("perception_stamp_to_world_p50_ms", "nan")),
            "p99_ms": float(values.get("perception_stamp_to_world_p99_ms", "nan")),
            "fuse_p50_ms": float(values.get("perception_fuse_p50_ms", "nan")),
            "frames_published": published, "frames_fused": fused}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    except OSError:
        pass
    return f"{os.cpu_count()} cores"


def run(args) -> dict:
    from robot_sdf.examples.arm_demo import load_robot
    from robot_sdf.examples.arm_mpc import ArmMpc, ArmMpcConfig
    from robot_sdf.examples.depth_stream import DepthStream, NodeDiagnostics, fuse_first_frame
    from robot_sdf.ros.client import SdfClient

    parts = scene.static_parts()
    truth = scene.Truth(parts)
    camera_scene = scene.DepthCameraScene.build(parts, args.width, args.height)
    rng = np.random.default_rng(args.seed)
    box_clock = [0.0]  # the controller's time [s]: the box's pose the camera shows

    say(f"[1/5] starting sdf_server (ROS_DOMAIN_ID={os.environ['ROS_DOMAIN_ID']}, one depth camera, no obstacles) ...")
    node = start_node(args.out, args.device, args.node_timeout)
    client = stream = None
    try:
        client = SdfClient(server="/sdf_server", timeout_s=args.timeout)
        if not client.wait_for_services(args.timeout):
            raise RuntimeError("the node's services did not appear")

        def revision() -> int:
            return int(client.signed_distance(torch.zeros((1, 3))).world_revision)

        diagnostics = NodeDiagnostics(client.node)
        stream = DepthStream(client.node, camera_scene.camera, lambda ns: camera_scene.frame(box_clock[0], rng),
                             scene.CAMERA_FRAME, args.rate)
        stream.wait_for_node(args.timeout)
        say(f"[2/5] streaming {args.width}x{args.height} depth frames at {args.rate:g} Hz ...")
        first = fuse_first_frame(stream, revision)
        stream.start()
        wait_revision(revision, first + int(args.rate * args.settle_s))
        say("[3/5] accuracy against the exact distances to the true meshes ...")
        acc = accuracy(client, truth, camera_scene, args.accuracy_points)
        say(f"      {acc['points']:,} points within 5 cm of a surface the camera saw: |error| median "
            f"{1e3 * acc['median_m']:.1f} mm, p95 {1e3 * acc['p95_m']:.1f} mm")
        snapshot = None if args.no_figures else figure_queries(client, truth, 0.0)
        robot = load_robot(args.out, None, torch.device("cpu"))
        config = ArmMpcConfig(samples=args.samples)
        mpc = ArmMpc(robot, np.asarray(scene.GOAL), config, NodeCosts(client, config).collision)
        mpc.warm_up(np.asarray(scene.START))
        say(f"[4/5] the box slides; driving the Panda ({robot.num_spheres} spheres) through "
            "/sdf_server/evaluate_swept_sphere_cost ...")
        # Two frames fused after the box moved: the second was the newest frame when the first
        # one's fusion ended, after the move, so it shows the box where it is (or one frame less).
        arm = drive(robot, mpc, box_clock, args.max_steps, say, lambda: wait_revision(revision, revision() + 2))
        stream.stop()
        latency = node_latency(diagnostics, stream.published, time.time_ns())
        end = None if args.no_figures else figure_queries(client, truth, box_clock[0])
    finally:
        if stream is not None:
            stream.stop()
        if client is not None:
            client.close()
        code = node.stop()
        import rclpy

        rclpy.try_shutdown()
    say(f"      sdf_server stopped (exit status {code})")
    clearance = true_clearance(truth, arm)
    summary = {
        "goal_reached": arm.reached, "steps": len(arm.solve_s), "min_true_clearance_m": float(clearance.min()),
        "collisions": int((clearance < 0).sum()), "box_travel_m": float(np.ptp([scene.box_pose(t)[1] for t in arm.times])),
        "solve_ms_p50": float(np.median(arm.solve_s) * 1e3) if arm.solve_s else math.nan,
        "accuracy": acc, "latency": latency, "rate_hz": args.rate, "frames_late": stream.late,
        "camera": f"{args.width}x{args.height}", "cpu": cpu_name(), "node_exit_status": code,
    }
    if not args.no_figures:
        from robot_sdf.examples.perception_plots import make_figures

        say("[5/5] drawing figures ...")
        for path in make_figures(args.out, snapshot, end, arm.times, clearance):
            say(f"      {path}")
    return summary


def wait_revision(revision, at_least: int, timeout_s: float = 60.0) -> None:
    """Until the world's revision reaches ``at_least`` (each fused frame is one revision)."""
    deadline = time.monotonic() + timeout_s
    while revision() < at_least:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the world did not reach revision {at_least} in {timeout_s:.0f} s")
        time.sleep(0.02)


def figure_queries(client, truth, t: float) -> dict:
    """The node's and the exact signed distances the figures show, the box at time t."""
    from robot_sdf.examples.perception_plots import figure_grids

    grids = figure_grids(scene.box_pose(t))
    return {name: (grid, node_distance(client, grid.reshape(-1, 3)).reshape(grid.shape[:-1]),
                   truth.signed_distance(grid.reshape(-1, 3), scene.box_pose(t)).reshape(grid.shape[:-1]))
            for name, grid in grids.items()} | {"t": t}


def report(summary: dict, out: Path) -> None:
    acc, lat = summary["accuracy"], summary["latency"]
    say(f"summary ({out / SUMMARY_NAME}; {summary['cpu']}):")
    say(f"  goal reached    {'yes' if summary['goal_reached'] else 'NO'} after {summary['steps']} steps "
        f"(solve p50 {summary['solve_ms_p50']:.0f} ms), the box slid {summary['box_travel_m']:.2f} m meanwhile")
    say(f"  true clearance  min {1e3 * summary['min_true_clearance_m']:+.1f} mm over every executed state; "
        f"collisions {summary['collisions']}")
    say(f"  accuracy        |error| median {1e3 * acc['median_m']:.1f} mm, p95 {1e3 * acc['p95_m']:.1f} mm "
        f"({acc['points']:,} seen points within 5 cm of a surface; bounds 10 / 20 mm); free 1-5 cm read free "
        f"{100 * acc['free_1_5cm_read_free']:.1f} %")
    say(f"  latency         a frame's stamp -> the world answering with it, {summary['rate_hz']:g} Hz while the MPC "
        f"queried: p50 {lat['p50_ms']:.0f} ms, p99 {lat['p99_ms']:.0f} ms (the node's figures; fusion p50 "
        f"{lat['fuse_p50_ms']:.0f} ms; {lat['frames_fused']} of {lat['frames_published']} frames fused, "
        "the node keeps only the newest when behind)")


def passed(summary: dict) -> bool:
    acc = summary["accuracy"]
    return (summary["goal_reached"] and summary["collisions"] == 0 and acc["median_m"] <= MEDIAN_BOUND_M
            and acc["p95_m"] <= P95_BOUND_M)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("perception_out"), help="output directory")
    parser.add_argument("--quick", action="store_true",
                        help="a short run for tests: fewer MPC samples and accuracy points, no figures")
    parser.add_argument("--rate", type=float, default=15.0, help="depth frames per second (default 15)")
    parser.add_argument("--width", type=int, default=320)
    parser.add_argument("--height", type=int, default=240)
    parser.add_argument("--settle-s", type=float, default=1.0, help="seconds of frames before the accuracy")
    parser.add_argument("--max-steps", type=int, default=120, help="give up after this many control steps")
    parser.add_argument("--device", default="auto", help="the node's device (auto, cpu, cuda:N)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sensor noise")
    parser.add_argument("--timeout", type=float, default=30.0, help="service wait/response timeout [s]")
    parser.add_argument("--node-timeout", type=float, default=90.0, help="seconds to wait for the node to start")
    parser.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: reserved from the pid)")
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    args = parser.parse_args(argv)
    args.samples, args.accuracy_points = (8, 20_000) if args.quick else (16, 60_000)
    args.no_figures = args.no_figures or args.quick
    from robot_sdf.examples.demo import default_domain_id, ros_problem

    problem = ros_problem()
    if problem is not None:
        say(f"ROS 2 is not available here ({problem}): the perception demo needs it")
        return 2
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ["ROS_DOMAIN_ID"] = str(args.domain_id if args.domain_id is not None else default_domain_id())
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / SUMMARY_NAME).unlink(missing_ok=True)
    from robot_sdf.launch import init_warp

    init_warp()
    t0 = time.perf_counter()
    try:
        summary = run(args)
    except RuntimeError as exc:
        say(f"perception demo failed: {exc}")
        return 2
    summary["total_time_s"] = time.perf_counter() - t0
    (args.out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    report(summary, args.out)
    return 0 if passed(summary) else 1


if __name__ == "__main__":
    sys.exit(main())
