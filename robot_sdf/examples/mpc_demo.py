"""MPC demo: an MPPI-controlled base drives through the demo world using robot_sdf collision costs.

    mpc_demo                      # through a running node's services (/sdf_server)
    mpc_demo --in-process         # same numbers with a MeshWorld in this process
    python -m robot_sdf.examples.demo   # starts the node, runs this, draws the figures

Every control step: move the sliding obstacle (ObstaclePose on /sdf_server/obstacle_poses, or
world.set_pose in-process), plan with MPPI (robot_sdf.examples.mppi: all rollouts' swept sphere
costs in one ~/evaluate_swept_sphere_cost request, plus gradient steps on the mean), execute the
first control. A referee MeshWorld in this process, independent of the planner's cost backend,
measures the clearance of the executed pose: min over spheres of (signed distance of the centre -
radius). Writes <out>/mpc_log.jsonl (one JSON object per step) and <out>/summary.json.
Runs are deterministic (seeded sampling; the obstacle moves with simulated time).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robot_sdf.examples.backends import (
    InProcessBackend,
    ServiceBackend,
    config_path,
    read_node_params,
)
from robot_sdf.examples.mppi import MpcConfig, Mppi
from robot_sdf.examples.robot import SphereRobot
from robot_sdf.examples.scenario import Scenario, load_scenario

LOG_NAME = "mpc_log.jsonl"
SUMMARY_NAME = "summary.json"
# The referee searches this far [m], so clearances up to it are reported exactly.
REFEREE_MAX_DISTANCE = 2.0


class Referee:
    """Independent clearance check: a MeshWorld of its own (robust ray-vote sign test)."""

    def __init__(self, scenario: Scenario) -> None:
        from robot_sdf import MeshWorld
        from robot_sdf.scene import apply_scene

        self.world = MeshWorld(device="cpu", sign_method="default", max_distance=REFEREE_MAX_DISTANCE)
        apply_scene(self.world, scenario.obstacles)

    def move(self, obstacle_id: str, pose: np.ndarray, env: int = 0) -> None:
        self.world.set_pose(obstacle_id, pose, env=env)

    def clearance(self, spheres: np.ndarray) -> np.ndarray:
        """(n,) signed distance of each sphere centre minus its radius [m]; < 0 = collision."""
        with torch.no_grad():
            dist, _ = self.world.signed_distance(torch.as_tensor(spheres[:, :3], dtype=torch.float32))
        return dist.cpu().numpy().astype(np.float64) - spheres[:, 3]


def _round(a, digits: int = 4):
    return np.round(np.asarray(a, dtype=np.float64), digits).tolist()


def run_mpc(scenario: Scenario, backend, config: MpcConfig, robot: SphereRobot | None = None,
            max_steps: int = 300, out_dir: Path | None = None, sample_every: int = 10,
            progress=print, mode: str = "", realtime: bool = False) -> dict[str, Any]:
    """Drive from scenario.start to scenario.goal; returns the summary (also written to out_dir).

    backend: InProcessBackend or ServiceBackend; progress: callable for status lines (or None);
    sample_every: log the best sampled rollouts every this many steps (0 = never);
    realtime: never run ahead of the simulated clock (to watch the run in rviz).
    """
    robot = robot or SphereRobot()
    referee = Referee(scenario)
    mpc = Mppi(robot, scenario.goal, config, backend.collision)
    state = scenario.start.astype(np.float64).copy()
    control = np.zeros(3)
    rows: list[dict[str, Any]] = []
    path = [state[:2].copy()]
    log_file = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(out_dir / LOG_NAME, "w")
    wall0 = time.perf_counter()
    reached = False
    try:
        for k in range(max_steps + 1):
            t = k * config.dt
            poses = scenario.poses_at(t)
            for m in scenario.moving:
                backend.move(m.id, poses[m.id], m.env)
                referee.move(m.id, poses[m.id], m.env)
            revision = backend.sync()
            spheres = robot.spheres_np(state)
            clear = referee.clearance(spheres)
            goal_dist = float(np.linalg.norm(state[:2] - scenario.goal))
            row: dict[str, Any] = {
                "step": k, "t": round(t, 6), "x": float(state[0]), "y": float(state[1]),
                "yaw": float(state[2]), "goal_distance": goal_dist,
                "min_clearance": float(clear.min()), "sphere_clearance": _round(clear),
                "collision": bool(clear.min() < 0.0), "world_revision": int(revision),
                "obstacle_poses": {oid: _round(p, 6) for oid, p in poses.items()},
            }
            reached = goal_dist <= scenario.goal_tolerance
            if not reached and k < max_steps:
                t0 = time.perf_counter()
                res = mpc.step(state, control)
                step_time = time.perf_counter() - t0
                if res.world_revision < revision:
                    raise RuntimeError(f"step {k}: cost computed against world revision "
                                       f"{res.world_revision}, older than {revision}")
                row["world_revision"] = int(res.world_revision)
                control = res.control
                row.update({
                    "control": _round(control, 6), "latency_s": res.latency_s,
                    "gradient_latency_s": res.gradient_latency_s,
                    "gradient_steps_accepted": res.gradient_accepted, "step_time_s": step_time,
                    "cost": res.cost_mean, "collision_cost": res.collision_cost_mean,
                    "plan": _round(res.plan[:, :2]),
                })
                if sample_every > 0 and k % sample_every == 0:
                    row["samples"] = _round(res.samples[:, :, :2], 3)
                backend.publish_markers(spheres, res.plan, np.array(path), scenario.goal, robot.height)
                # Execute the first control: the same kinematics as the plan (explicit Euler).
                state = state + control * config.dt
                path.append(state[:2].copy())
            rows.append(row)
            if log_file is not None:
                log_file.write(json.dumps(row) + "\n")
            if progress and (k % 20 == 0 or reached):
                lat = f", service {1e3 * row['latency_s']:.1f} ms" if "latency_s" in row else ""
                progress(f"  step {k:3d}  t={t:5.1f} s  pos=({state[0]:+.2f}, {state[1]:+.2f})  "
                         f"goal {goal_dist:.2f} m  clearance {row['min_clearance']:+.3f} m{lat}")
            if reached:
                break
            if realtime:
                time.sleep(max(0.0, wall0 + (k + 1) * config.dt - time.perf_counter()))
    finally:
        if log_file is not None:
            log_file.close()
    summary = summarize(rows, scenario, config, time.perf_counter() - wall0, mode, backend.device)
    summary["repeated_requests"] = int(getattr(backend, "stale_requests", 0))
    if out_dir is not None:
        (out_dir / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"p50": math.nan, "p95": math.nan, "max": math.nan}
    a = np.asarray(values) * 1e3
    return {"p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)), "max": float(a.max())}


def summarize(rows: list[dict[str, Any]], scenario: Scenario, config: MpcConfig, wall_s: float,
              mode: str, device: str) -> dict[str, Any]:
    """Summary of a run's log rows (all figures recomputed from the rows)."""
    clear = np.array([r["min_clearance"] for r in rows])
    worst = int(np.argmin(clear))
    xy = np.array([[r["x"], r["y"]] for r in rows])
    planned = [r for r in rows if "latency_s" in r]
    last = rows[-1]
    return {
        "mode": mode, "device": device, "scene": str(scenario.path),
        "goal_reached": bool(last["goal_distance"] <= scenario.goal_tolerance),
        "steps": len(planned), "sim_time_s": last["t"], "wall_time_s": wall_s,
        "final_position": [last["x"], last["y"], last["yaw"]], "goal": scenario.goal.tolist(),
        "final_goal_distance": last["goal_distance"],
        "path_length_m": float(np.linalg.norm(np.diff(xy, axis=0), axis=1).sum()),
        "min_clearance_m": float(clear[worst]), "min_clearance_step": worst,
        "collision_steps": int(sum(r["collision"] for r in rows)),
        "service_latency_ms": _percentiles([r["latency_s"] for r in planned]),
        "gradient_latency_ms": _percentiles([x for r in planned for x in r["gradient_latency_s"]]),
        "control_step_ms": _percentiles([r["step_time_s"] for r in planned]),
        "world_revision": [rows[0]["world_revision"], last["world_revision"]],
        "spheres_per_request": config.rollouts * (config.horizon + 1) * SphereRobot().num_spheres,
        "config": asdict(config),
    }


def read_log(path: str | Path) -> list[dict[str, Any]]:
    """Rows of an mpc_log.jsonl file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def make_backend(in_process: bool, scenario: Scenario, params_file: Path, config: MpcConfig,
                 server: str = "/sdf_server", timeout_s: float = 30.0):
    """InProcessBackend with the node's parameters from params_file, or a ServiceBackend."""
    common = dict(activation_distance=config.activation_distance, sweep_steps=config.sweep_steps,
                  speed_dt=config.dt)
    if in_process:
        return InProcessBackend(scenario.obstacles, read_node_params(params_file), **common)
    initial = {(spec.id, spec.env): spec.pose for spec in scenario.obstacles}
    return ServiceBackend(server, scenario.frame, timeout_s=timeout_s, initial_poses=initial, **common)


def add_mpc_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by mpc_demo and the demo runner."""
    parser.add_argument("--in-process", action="store_true",
                        help="use a MeshWorld in this process instead of the node's services")
    parser.add_argument("--scene", type=Path, default=None,
                        help="scene YAML with a demo: section (default config/demo_world.yaml)")
    parser.add_argument("--params", type=Path, default=None,
                        help="node parameter file; its device/sign_method/max_distance also build the "
                             "in-process world (default config/demo_sdf_server.yaml)")
    parser.add_argument("--server", default="/sdf_server", help="node name (default /sdf_server)")
    parser.add_argument("--out", type=Path, default=Path("demo_out"), help="output directory")
    parser.add_argument("--max-steps", type=int, default=300, help="give up after this many steps")
    parser.add_argument("--rollouts", type=int, default=MpcConfig.rollouts)
    parser.add_argument("--horizon", type=int, default=MpcConfig.horizon)
    parser.add_argument("--gradient-steps", type=int, default=MpcConfig.gradient_steps)
    parser.add_argument("--seed", type=int, default=MpcConfig.seed)
    parser.add_argument("--timeout", type=float, default=30.0, help="service wait/response timeout [s]")
    parser.add_argument("--realtime", action="store_true",
                        help="pace the run at the simulated clock (dt per step), e.g. to watch it in rviz")


def mpc_config(args: argparse.Namespace) -> MpcConfig:
    return MpcConfig(rollouts=args.rollouts, horizon=args.horizon, gradient_steps=args.gradient_steps,
                     seed=args.seed)


def resolve_inputs(args: argparse.Namespace) -> tuple[Scenario, Path]:
    scene = args.scene or config_path("demo_world.yaml")
    params = args.params or config_path("demo_sdf_server.yaml")
    return load_scenario(scene), params


def format_summary(s: dict[str, Any]) -> str:
    lat = s["service_latency_ms"]
    return "\n".join([
        f"  mode               {s['mode']} (device {s['device']})",
        f"  goal reached       {'yes' if s['goal_reached'] else 'NO'} after {s['steps']} steps "
        f"({s['sim_time_s']:.1f} s simulated, {s['wall_time_s']:.1f} s wall), path {s['path_length_m']:.2f} m",
        f"  min clearance      {1e3 * s['min_clearance_m']:.1f} mm (step {s['min_clearance_step']})",
        f"  collisions         {s['collision_steps']} steps",
        f"  cost request       {s['spheres_per_request']} spheres; latency p50 {lat['p50']:.1f} ms, "
        f"p95 {lat['p95']:.1f} ms, max {lat['max']:.1f} ms",
        f"  control step       p50 {s['control_step_ms']['p50']:.1f} ms (MPPI + gradient steps)",
    ])


def main(argv: list[str] | None = None) -> int:
    """Console script mpc_demo. Exit 0 when the goal is reached without collision, 1 otherwise,
    2 when the services cannot be reached."""
    parser = argparse.ArgumentParser(description="MPPI demo on robot_sdf collision costs "
                                                 "(needs a running sdf_server unless --in-process)")
    add_mpc_arguments(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    scenario, params = resolve_inputs(args)
    config = mpc_config(args)
    try:
        backend = make_backend(args.in_process, scenario, params, config, args.server, args.timeout)
    except (ImportError, RuntimeError) as exc:
        print(f"mpc_demo: cannot use the {args.server} services: {exc}\n"
              "  start the node first (python -m robot_sdf.examples.demo does), or use --in-process",
              file=sys.stderr)
        return 2
    mode = "in-process" if args.in_process else f"ROS services of {args.server}"
    try:
        summary = run_mpc(scenario, backend, config, max_steps=args.max_steps, out_dir=args.out, mode=mode,
                          realtime=args.realtime)
    finally:
        backend.close()
        if not args.in_process:
            import rclpy

            rclpy.try_shutdown()
    print(format_summary(summary))
    return 0 if summary["goal_reached"] and summary["collision_steps"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
