"""The perception demo (robot_sdf.examples.perception_demo) end to end in its quick mode: a real
sdf_server fed only by the simulated depth camera over real rclpy (sensor_msgs/Image and
CameraInfo), the Panda's MPC querying its cost service while a box slides across the table.

Checked from the run's summary.json, whose figures the demo computed against the exact meshes:
the goal is reached and no sphere of any executed state touches a true mesh (the box where it
was then); the node's signed distances near the surfaces the camera saw are within the
perception accuracy bounds; the node fused frames and reported their latency."""
from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from robot_sdf.ros.server_process import reserve_domain_id

REPO = Path(__file__).resolve().parents[1]


@functools.cache
def _domain_id() -> int:
    return reserve_domain_id(1 + (os.getpid() * 17 + 43) % 100)


@pytest.fixture(scope="module")
def summary(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("perception_demo")
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "robot_sdf.examples.perception_demo", "--quick", "--device", "cpu",
           "--out", str(out), "--domain-id", str(_domain_id())]
    # Own session: a hung demo is ended with its node (the whole process group).
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    path = out / "summary.json"
    assert path.is_file(), f"the demo wrote no summary (exit status {proc.returncode}):\n{output[-4000:]}"
    result = json.loads(path.read_text())
    result["exit_status"], result["output"] = proc.returncode, output
    return result


def test_the_arm_reaches_its_goal_without_touching_the_true_meshes(summary):
    assert summary["goal_reached"], summary["output"][-3000:]
    assert summary["collisions"] == 0 and summary["min_true_clearance_m"] > 0.0, summary["min_true_clearance_m"]
    assert summary["box_travel_m"] > 0.2  # the box did move while the arm drove
    assert summary["exit_status"] == 0 and summary["node_exit_status"] == 0


def test_the_node_world_from_the_camera_is_accurate(summary):
    acc = summary["accuracy"]
    assert acc["points"] > 1000
    assert acc["median_m"] <= 0.010 and acc["p95_m"] <= 0.020, acc


def test_the_node_reports_the_frames_latency(summary):
    latency = summary["latency"]
    assert 0 < latency["frames_fused"] <= latency["frames_published"]
    assert math.isfinite(latency["p50_ms"]) and 0.0 < latency["p50_ms"] <= latency["p99_ms"], latency
