"""Arm demo (``make arm-demo``): a Franka Panda among obstacles, driven by a gradient-based MPC.

    python -m robot_sdf.examples.arm_demo [--in-process] [--seed 0] [--out arm_out]

1. expands the Panda URDF of the rtb-data package (robot_sdf.examples.panda) and loads its
   fitted spheres (config/panda_spheres.yaml) into robot_sdf.robot.RobotModel;
2. starts ``sdf_server`` with config/arm_world.yaml (table, crate, shelf, a moving ball) in its
   own ROS_DOMAIN_ID, unless ``--in-process`` (a MeshWorld in this process, same parameters);
3. runs the receding-horizon controller of robot_sdf.examples.arm_mpc: every collision cost and
   gradient comes from ``~/evaluate_swept_sphere_cost`` through the client's remote autograd
   Function (robot_sdf.ros.client.remote_swept_sphere_cost), or world.swept_sphere_cost
   in-process, back-propagated through the kinematics to the joint angles; the ball moves by
   ``~/obstacle_poses`` (world.set_pose in-process) before each step;
4. writes arm_out/: summary.json, verification.npz, arm_log.jsonl, keyframes.png,
   clearance.png (and sdf_server.log on the ROS path).

A referee MeshWorld of its own measures the clearance of every executed state (signed distance
of each sphere centre minus its radius). Both paths compute bit-identical costs, so they follow
the same trajectory. Exit status 0 when the goal was reached with no collision.
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
import yaml

from robot_sdf.examples.arm_mpc import ArmMpc, ArmMpcConfig
from robot_sdf.examples.backends import config_path, read_node_params
from robot_sdf.examples.scenario import MovingObstacle, parse_moving

SUMMARY_NAME = "summary.json"
LOG_NAME = "arm_log.jsonl"
NPZ_NAME = "verification.npz"
NODE_LOG = "sdf_server.log"


def say(msg: str) -> None:
    print(msg, flush=True)


class ArmScene:
    """Obstacles (robot_sdf.scene) plus the ``arm_demo:`` section of the same file."""

    def __init__(self, path: str | Path) -> None:
        from robot_sdf.scene import load_scene

        self.path = Path(path)
        self.obstacles = load_scene(self.path)
        data = yaml.safe_load(self.path.read_text()) or {}
        section = data.get("arm_demo")
        if not isinstance(section, dict):
            raise ValueError(f"{self.path}: no 'arm_demo:' section (start, goal, moving)")
        self.frame = str(data.get("frame", "world"))
        self.start = np.asarray(section["start"], dtype=np.float64)
        self.goal = np.asarray(section["goal"], dtype=np.float64)
        self.goal_tolerance = float(section.get("goal_tolerance", 0.05))
        self.base_pose = np.asarray(section.get("base_pose", [0, 0, 0, 1, 0, 0, 0]), dtype=np.float64)
        if self.start.shape != self.goal.shape or self.base_pose.shape != (7,):
            raise ValueError(f"{self.path}: arm_demo.start and goal need one angle per joint, base_pose 7 numbers")
        self.moving: list[MovingObstacle] = parse_moving(section.get("moving"), self.obstacles, f"{self.path}: arm_demo")

    def poses_at(self, t: float) -> dict[str, np.ndarray]:
        """Pose (7,) of every obstacle at simulated time t [s] (static ones at their scene pose)."""
        poses = {spec.id: np.asarray(spec.pose, dtype=np.float64) for spec in self.obstacles}
        poses.update({m.id: m.pose(t) for m in self.moving})
        return poses


class SummedGradientCost(torch.autograd.Function):
    """world.evaluate_swept_sphere_cost as an autograd Function with the remote Function's
    backward (grad_output * the gradient of the summed cost). The controller differentiates
    cost.sum(), where this is exact (as world.swept_sphere_cost's chain rule is); the arithmetic
    is the same as over ROS, so both paths compute bit-identical plans."""

    @staticmethod
    def forward(ctx, spheres, world, config):
        want = bool(ctx.needs_input_grad[0])
        cost, grad = world.evaluate_swept_sphere_cost(
            spheres.detach(), activation_distance=config.activation_distance, weight=1.0,
            sweep_steps=config.sweep_steps, speed_dt=config.dt, compute_gradient=want)
        ctx.save_for_backward(grad if want else None)
        return cost.to(spheres.dtype)

    @staticmethod
    def backward(ctx, grad_output):
        (gradient,) = ctx.saved_tensors
        g = grad_output[..., None] * gradient.to(grad_output.dtype)
        return torch.cat([g, torch.zeros_like(g[..., :1])], dim=-1), None, None


class InProcessCosts:
    """The swept cost of a MeshWorld built with the node's parameters (see SummedGradientCost)."""

    def __init__(self, scene: ArmScene, params: dict[str, Any], config: ArmMpcConfig) -> None:
        from robot_sdf import MeshWorld
        from robot_sdf.scene import apply_scene

        self.world = MeshWorld(device=str(params.get("device", "auto")), num_envs=int(params.get("num_envs", 1)),
                               mesh_capacity=int(params.get("mesh_capacity", 16)),
                               sign_method=str(params.get("sign_method", "default")),
                               max_distance=float(params.get("max_distance", 0.5)))
        apply_scene(self.world, scene.obstacles)
        self.device = self.world.device
        self.config = config

    def collision(self, spheres: torch.Tensor) -> torch.Tensor:
        return SummedGradientCost.apply(spheres, self.world, self.config)

    def move(self, obstacle_id: str, pose: np.ndarray) -> None:
        self.world.set_pose(obstacle_id, pose)

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass


class ServiceCosts:
    """The node's swept cost service through remote_swept_sphere_cost (autograd over ROS)."""

    def __init__(self, scene: ArmScene, config: ArmMpcConfig, server: str, timeout_s: float) -> None:
        from robot_sdf.examples.backends import ServiceBackend

        self.config = config
        initial = {(spec.id, spec.env): spec.pose for spec in scene.obstacles}
        # ServiceBackend: the client, the pose publisher and the revision bookkeeping.
        self.backend = ServiceBackend(server, scene.frame, config.activation_distance, config.sweep_steps, config.dt,
                                      timeout_s=timeout_s, initial_poses=initial)
        self.client = self.backend.client
        self.device = torch.device("cpu")
        self.timeout_s = timeout_s

    def collision(self, spheres: torch.Tensor) -> torch.Tensor:
        from robot_sdf.ros.client import remote_swept_sphere_cost

        c = self.config
        return remote_swept_sphere_cost(self.client, spheres, sweep_steps=c.sweep_steps, speed_dt=c.dt,
                                        activation_distance=c.activation_distance, weight=1.0)

    def move(self, obstacle_id: str, pose: np.ndarray) -> None:
        self.backend.move(obstacle_id, pose)

    def sync(self) -> None:
        """Wait until the node has applied every pose sent so far, so that each request of this
        step sees the same world as the in-process path (revisions only grow)."""
        expected = self.backend.sync()
        deadline = time.monotonic() + self.timeout_s
        while int(self.client.signed_distance(torch.zeros((1, 3))).world_revision) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node did not apply the obstacle poses within {self.timeout_s:.0f} s")
            time.sleep(0.002)

    def close(self) -> None:
        self.backend.close()


def load_robot(out_dir: Path, spheres: Path | None, device) -> "RobotModel":  # noqa: F821
    from robot_sdf.examples.panda import LOCKED_JOINTS, panda_urdf
    from robot_sdf.robot import RobotModel

    urdf = panda_urdf(out_dir / "panda.urdf")
    # panda_link0 never moves and rests on its mount (the table's plane): its spheres are left out.
    return RobotModel(urdf, spheres or config_path("panda_spheres.yaml"), device=device,
                      locked_joints=LOCKED_JOINTS, exclude_links=("panda_link0",))


def _percentile_ms(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values) * 1e3, q)) if values else math.nan


def run(scene: ArmScene, costs, robot, config: ArmMpcConfig, max_steps: int, out_dir: Path,
        progress=say, mode: str = "") -> dict[str, Any]:
    """Drive from scene.start to scene.goal; writes the log and verification.npz, returns the summary."""
    from robot_sdf.examples.mpc_demo import Referee

    referee = Referee(scene)
    base = torch.as_tensor(scene.base_pose, dtype=robot.dtype, device=robot.device)
    mpc = ArmMpc(robot, scene.goal, config, costs.collision, base_pose=base)
    lower, upper = robot.lower.cpu().numpy(), robot.upper.cpu().numpy()
    q = scene.start.copy()
    mpc.warm_up(q)
    pairs = mpc.self_pairs.cpu().numpy()
    states, spheres_log, poses_log, clear_log, self_log, solve_s, rows = [], [], [], [], [], [], []
    reached = False
    wall0 = time.perf_counter()
    with open(out_dir / LOG_NAME, "w") as log:
        for k in range(max_steps + 1):
            t = k * config.dt
            poses = scene.poses_at(t)
            for m in scene.moving:
                costs.move(m.id, poses[m.id])
                referee.move(m.id, poses[m.id])
            costs.sync()
            with torch.no_grad():
                sph = robot.spheres(torch.as_tensor(q, dtype=robot.dtype, device=robot.device), base)
            sph = sph.cpu().numpy().astype(np.float64)
            clear = referee.clearance(sph)
            err = float(np.abs(q - scene.goal).max())
            states.append(q.copy())
            spheres_log.append(sph)
            poses_log.append(poses)
            clear_log.append(float(clear.min()))
            # Self-clearance: the smallest gap between the spheres of the checked pairs.
            self_log.append(float((np.linalg.norm(sph[pairs[:, 0], :3] - sph[pairs[:, 1], :3], axis=1)
                                   - sph[pairs[:, 0], 3] - sph[pairs[:, 1], 3]).min()) if len(pairs) else math.inf)
            row: dict[str, Any] = {"step": k, "t": round(t, 6), "q": np.round(q, 6).tolist(), "goal_error": err,
                                   "min_clearance": float(clear.min()), "worst_sphere": int(np.argmin(clear))}
            reached = err <= scene.goal_tolerance
            if not reached and k < max_steps:
                res = mpc.step(q)
                solve_s.append(res.solve_s)
                row.update({"solve_ms": 1e3 * res.solve_s, "cost": res.cost, "collision_cost": res.collision_cost,
                            "requests": res.requests, "velocity": np.round(res.velocity, 6).tolist()})
                q = np.clip(q + res.velocity * config.dt, lower, upper)
            rows.append(row)
            log.write(json.dumps(row) + "\n")
            if progress and (k % 10 == 0 or reached):
                solve = f"  solve {row['solve_ms']:.0f} ms" if "solve_ms" in row else ""
                progress(f"  step {k:3d}  t={t:4.1f} s  joint error {err:.3f} rad  "
                         f"clearance {1e3 * row['min_clearance']:+6.1f} mm{solve}")
            if reached:
                break
    wall = time.perf_counter() - wall0
    arrays: dict[str, np.ndarray] = {"spheres": np.asarray(spheres_log, dtype=np.float32),
                                     "q": np.asarray(states), "t": np.arange(len(states)) * config.dt,
                                     "min_clearance": np.asarray(clear_log), "self_pairs": pairs}
    for spec in scene.obstacles:
        arrays[f"vertices_{spec.id}"] = np.asarray(spec.vertices, dtype=np.float32)
        arrays[f"triangles_{spec.id}"] = np.asarray(spec.triangles, dtype=np.int32)
        arrays[f"poses_{spec.id}"] = np.asarray([p[spec.id] for p in poses_log])
    np.savez_compressed(out_dir / NPZ_NAME, **arrays)
    clear = np.asarray(clear_log)
    return {
        "goal_reached": bool(reached), "steps": len(solve_s), "min_clearance_m": float(clear.min()),
        "min_clearance_step": int(np.argmin(clear)), "solve_ms_p50": _percentile_ms(solve_s, 50),
        "solve_ms_p95": _percentile_ms(solve_s, 95), "collisions": int((clear < 0).sum()),
        "min_self_clearance_m": float(min(self_log)), "self_collisions": int((np.asarray(self_log) < 0).sum()),
        "self_collision_pairs": int(len(pairs)),
        "final_joint_error_rad": rows[-1]["goal_error"], "sim_time_s": rows[-1]["t"], "wall_time_s": wall,
        "mode": mode, "device": str(costs.device), "robot": "Franka Panda (rtb-data)",
        "num_spheres": robot.num_spheres, "requests_per_step": rows[0].get("requests", 0),
        "spheres_per_warm_start_request": config.samples * (config.horizon + 1) * robot.num_spheres,
        "scene": str(scene.path), "config": asdict(config),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--in-process", action="store_true", help="MeshWorld in this process instead of sdf_server")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed of the warm start (default 0)")
    parser.add_argument("--out", type=Path, default=Path("arm_out"), help="output directory (default arm_out)")
    parser.add_argument("--max-steps", type=int, default=150, help="give up after this many control steps")
    parser.add_argument("--scene", type=Path, default=None, help="scene YAML with an arm_demo: section")
    parser.add_argument("--params", type=Path, default=None, help="node parameter file (config/arm_sdf_server.yaml)")
    parser.add_argument("--spheres", type=Path, default=None, help="sphere file (config/panda_spheres.yaml)")
    parser.add_argument("--horizon", type=int, default=ArmMpcConfig.horizon)
    parser.add_argument("--samples", type=int, default=ArmMpcConfig.samples)
    parser.add_argument("--adam-steps", type=int, default=ArmMpcConfig.adam_steps)
    parser.add_argument("--server", default="/sdf_server", help="node name (default /sdf_server)")
    parser.add_argument("--timeout", type=float, default=30.0, help="service wait/response timeout [s]")
    parser.add_argument("--node-timeout", type=float, default=90.0, help="seconds to wait for the node to start")
    parser.add_argument("--domain-id", type=int, default=None, help="ROS_DOMAIN_ID (default: derived from the pid)")
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    t_start = time.perf_counter()
    scene = ArmScene(args.scene or config_path("arm_world.yaml"))
    params_file = args.params or config_path("arm_sdf_server.yaml")
    config = ArmMpcConfig(horizon=args.horizon, samples=args.samples, adam_steps=args.adam_steps, seed=args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in (SUMMARY_NAME, LOG_NAME, NPZ_NAME, "keyframes.png", "clearance.png"):
        (args.out / stale).unlink(missing_ok=True)
    from robot_sdf.launch import init_warp

    init_warp()
    say(f"robot_sdf arm demo: Franka Panda, {config.samples} warm-start samples + {config.adam_steps} Adam steps "
        f"over {config.horizon} x {config.dt} s per control step; output in {args.out}/")
    node = costs = None
    try:
        if args.in_process:
            costs = InProcessCosts(scene, read_node_params(params_file), config)
            mode = "in-process"
        else:
            from robot_sdf.examples.demo import default_domain_id, ros_problem, write_node_params
            from robot_sdf.ros.server_process import ServerProcess

            problem = ros_problem()
            if problem is not None:
                say(f"ROS 2 is not available here ({problem}); run with --in-process")
                return 2
            domain = args.domain_id if args.domain_id is not None else default_domain_id()
            os.environ["ROS_DOMAIN_ID"] = str(domain)
            env = dict(os.environ, PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
            say(f"[1/3] starting sdf_server (ROS_DOMAIN_ID={domain}, scene {scene.path.name}) ...")
            node = ServerProcess(write_node_params(params_file, args.out), args.out / NODE_LOG, env)
            node.wait_ready(args.node_timeout)
            costs = ServiceCosts(scene, config, args.server, args.timeout)
            mode = f"ROS services of {args.server}"
        robot = load_robot(args.out, args.spheres, costs.device)
        say(f"[2/3] driving ({mode}; {robot.num_spheres} spheres, {robot.dof} joints) ...")
        summary = run(scene, costs, robot, config, args.max_steps, args.out, mode=mode)
    except RuntimeError as exc:
        say(f"arm demo failed: {exc}")
        return 2
    finally:
        if costs is not None:
            costs.close()
        if node is not None:
            summary_code = node.stop()
            say(f"      sdf_server stopped (exit status {summary_code})")
            import rclpy

            rclpy.try_shutdown()
    if not args.no_figures:
        say("[3/3] drawing figures ...")
        from robot_sdf.examples.arm_plots import make_figures

        for path in make_figures(args.out / NPZ_NAME, args.out / LOG_NAME, scene, args.out):
            say(f"      {path}")
    summary["total_time_s"] = time.perf_counter() - t_start
    (args.out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    say(f"summary ({args.out / SUMMARY_NAME}):")
    say(f"  goal reached   {'yes' if summary['goal_reached'] else 'NO'} after {summary['steps']} steps "
        f"({summary['sim_time_s']:.1f} s simulated, {summary['wall_time_s']:.1f} s wall)")
    say(f"  min clearance  {1e3 * summary['min_clearance_m']:.1f} mm (step {summary['min_clearance_step']}); "
        f"collisions {summary['collisions']}")
    say(f"  solve time     p50 {summary['solve_ms_p50']:.0f} ms, p95 {summary['solve_ms_p95']:.0f} ms per control step "
        f"({summary['requests_per_step']} cost requests, device {summary['device']})")
    return 0 if summary["goal_reached"] and summary["collisions"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
