"""The robot_sdf demo (``make demo``): node + MPC through the services + figures, in one command.

    python -m robot_sdf.examples.demo [--in-process] [--out demo_out] [...mpc_demo options]

1. starts ``python -m robot_sdf.ros.sdf_server --ros-args --params-file <demo params>`` as a
   subprocess, in its own ROS_DOMAIN_ID with ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST, loading
   config/demo_world.yaml;
2. drives the MPPI robot from start to goal with every collision cost coming from
   ``/sdf_server/evaluate_swept_sphere_cost`` while the sliding block moves
   (``/sdf_server/obstacle_poses``);
3. saves the node's own ``~/distance_slice`` with render_slice, stops the node;
4. writes demo_out/: top_view.png, distance_slice.png, clearance.png, node_distance_slice.png,
   summary.json, mpc_log.jsonl, sdf_server.log; prints a summary.

``--in-process`` skips ROS (MeshWorld in this process, same numbers). Without a usable ROS 2
Python environment the demo says so and runs in-process. Exit status 0 when the goal was reached
with no collision.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from robot_sdf.examples.backends import read_node_params, resolve_scene_file
from robot_sdf.ros.server_process import ServerProcess
from robot_sdf.examples.mpc_demo import (
    add_mpc_arguments,
    format_summary,
    make_backend,
    mpc_config,
    read_log,
    resolve_inputs,
    run_mpc,
    LOG_NAME,
    SUMMARY_NAME,
)

NODE_LOG = "sdf_server.log"
NODE_PARAMS = "sdf_server_params.yaml"


def say(msg: str) -> None:
    print(msg, flush=True)


def ros_problem() -> str | None:
    """Why the ROS path cannot run here, or None when rclpy and the interfaces import."""
    try:
        import rclpy  # noqa: F401

        from robot_sdf_interfaces.msg import ObstaclePose  # noqa: F401
        from robot_sdf_interfaces.srv import EvaluateSweptSphereCost  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: no ROS here
        return f"{type(exc).__name__}: {exc}"
    return None


def default_domain_id() -> int:
    """A ROS domain id in 1..100 reserved for this process on this machine (derived from the
    pid, the next free one if another run holds it), so concurrent runs do not meet."""
    from robot_sdf.ros.server_process import reserve_domain_id

    return reserve_domain_id(1 + (os.getpid() * 13 + 29) % 100)


def write_node_params(params_file: Path, out_dir: Path) -> Path:
    """Copy of the node parameters with scene_file made absolute (the node may run anywhere)."""
    params = read_node_params(params_file)
    scene = resolve_scene_file(params, params_file)
    if scene is not None:
        params["scene_file"] = str(scene)
    path = out_dir / NODE_PARAMS
    path.write_text(yaml.safe_dump({"sdf_server": {"ros__parameters": params}}, sort_keys=False))
    return path


def render_node_slice(server: str, output: Path, env: dict[str, str], timeout_s: float = 15.0) -> bool:
    """Run the render_slice tool against the running node; True when it wrote the PNG."""
    cmd = [sys.executable, "-m", "robot_sdf.tools.render_slice", "--server", server, "--output", str(output),
           "--timeout", str(timeout_s)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s + 60)
    text = (proc.stdout + proc.stderr).strip().splitlines()
    say("  " + (text[-1] if text else f"render_slice exited with {proc.returncode}"))
    return proc.returncode == 0


def run_ros(args, scenario, params_file: Path, config) -> dict:
    domain = args.domain_id if args.domain_id is not None else default_domain_id()
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    env = dict(os.environ, PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    node_params = write_node_params(params_file, args.out)
    say(f"[1/4] starting sdf_server (ROS_DOMAIN_ID={domain}, discovery on localhost, "
        f"scene {scenario.path.name}) ...")
    t0 = time.perf_counter()
    node = ServerProcess(node_params, args.out / NODE_LOG, env)
    backend = None
    try:
        node.wait_ready(args.node_timeout)
        say(f"      node ready after {time.perf_counter() - t0:.1f} s (device {node.device()}); "
            f"log: {args.out / NODE_LOG}")
        say("[2/4] driving through /sdf_server/evaluate_swept_sphere_cost ...")
        backend = make_backend(False, scenario, params_file, config, args.server, args.timeout)
        summary = run_mpc(scenario, backend, config, max_steps=args.max_steps, out_dir=args.out, progress=say,
                          mode=f"ROS services of {args.server}", realtime=args.realtime)
        if summary["device"] == "unknown" and node.device():
            summary["device"] = node.device()
        backend.close()
        backend = None
        say("[3/4] saving the node's own distance slice (render_slice) ...")
        summary["node_slice_png"] = render_node_slice(args.server, args.out / "node_distance_slice.png", env)
    finally:
        if backend is not None:
            backend.close()
        code = node.stop()
        import rclpy

        rclpy.try_shutdown()
    say(f"      sdf_server stopped (exit status {code})")
    summary["node_exit_status"] = code
    return summary


def run_in_process(args, scenario, params_file: Path, config, note: str = "") -> dict:
    say(f"[1/4] building the MeshWorld in this process{note} ...")
    backend = make_backend(True, scenario, params_file, config)
    say(f"[2/4] driving with world.evaluate_swept_sphere_cost (device {backend.device}) ...")
    try:
        summary = run_mpc(scenario, backend, config, max_steps=args.max_steps, out_dir=args.out, progress=say,
                          mode="in-process" + note, realtime=args.realtime)
    finally:
        backend.close()
    say("[3/4] (no node: no node distance slice)")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_mpc_arguments(parser)
    parser.add_argument("--domain-id", type=int, default=None,
                        help="ROS_DOMAIN_ID for the node and the demo (default: derived from the pid, 1..100)")
    parser.add_argument("--node-timeout", type=float, default=90.0, help="seconds to wait for the node to start")
    parser.add_argument("--no-figures", action="store_true", help="skip the PNG figures")
    args = parser.parse_args(argv)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    t_start = time.perf_counter()
    scenario, params_file = resolve_inputs(args)
    config = mpc_config(args)
    args.out.mkdir(parents=True, exist_ok=True)
    for stale in ("top_view.png", "distance_slice.png", "clearance.png", "node_distance_slice.png",
                  SUMMARY_NAME, LOG_NAME):
        (args.out / stale).unlink(missing_ok=True)
    say(f"robot_sdf demo: MPPI ({config.rollouts} rollouts x {config.horizon} steps, "
        f"{config.gradient_steps} gradient step(s)) from {scenario.start[:2].tolist()} to "
        f"{scenario.goal.tolist()}; output in {args.out}/")
    from robot_sdf.launch import init_warp

    init_warp()  # any Warp notice (e.g. "no CUDA driver") shows up here, not amid the progress lines
    if args.in_process:
        summary = run_in_process(args, scenario, params_file, config)
    else:
        problem = ros_problem()
        if problem is not None:
            say("=" * 78)
            say("ROS 2 is NOT available here, so the service path cannot run:")
            say(f"  {problem}")
            say("  (needs rclpy and robot_sdf_interfaces: `make venv` installs both)")
            say("Running the same MPC IN-PROCESS instead (pass --in-process to skip this check).")
            say("=" * 78)
            summary = run_in_process(args, scenario, params_file, config, note=" (ROS unavailable)")
        else:
            try:
                summary = run_ros(args, scenario, params_file, config)
            except RuntimeError as exc:
                say(f"demo failed on the ROS path: {exc}")
                return 2
    if not args.no_figures:
        say("[4/4] drawing figures ...")
        from robot_sdf.examples.plots import make_figures

        rows = read_log(args.out / LOG_NAME)
        for path in make_figures(rows, scenario, summary, args.out, config.activation_distance):
            say(f"      {path}")
    summary["total_time_s"] = time.perf_counter() - t_start
    (args.out / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    say("summary:")
    say(format_summary(summary))
    say(f"  total demo time    {summary['total_time_s']:.1f} s; details in {args.out / SUMMARY_NAME}")
    ok = summary["goal_reached"] and summary["collision_steps"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
