"""End-to-end tests of the arm demo (robot_sdf.examples.arm_demo): a Franka Panda from rtb-data
driven by the gradient-based MPC through a real sdf_server, and in-process.

Checked against test/reference.py from the run's own verification.npz: at every executed state
every sphere keeps a positive brute-force clearance to every obstacle (at its logged pose); the
goal is reached; the joint and speed limits hold; both paths drive bit-identical trajectories.
The run is the shipped scene with seed 0 (about 30 control steps, a few seconds per path here).
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import reference as ref
from robot_sdf.ros.server_process import reserve_domain_id

REPO = Path(__file__).resolve().parents[1]
SCENE = REPO / "config" / "arm_world.yaml"
PARAMS = REPO / "config" / "arm_sdf_server.yaml"
MAX_STEPS = 80
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@functools.cache
def _domain_id() -> int:
    # reserved on this machine: concurrent test runs never share a domain
    return reserve_domain_id(1 + (os.getpid() * 11 + 37) % 100)


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    data = yaml.safe_load(PARAMS.read_text())
    data["sdf_server"]["ros__parameters"].update(device="cpu", scene_file=str(SCENE))
    path = tmp_path_factory.mktemp("arm_params") / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _run(out: Path, params_file: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "robot_sdf.examples.arm_demo", "--out", str(out), "--params", str(params_file),
           "--scene", str(SCENE), "--seed", "0", "--max-steps", str(MAX_STEPS), *extra]
    # Own session: if the demo hangs, its whole process group (the node included) is ended.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def ros_run(tmp_path_factory, params_file):
    out = tmp_path_factory.mktemp("arm_ros")
    return out, _run(out, params_file, "--domain-id", str(_domain_id()))


@pytest.fixture(scope="module")
def inprocess_run(tmp_path_factory, params_file):
    out = tmp_path_factory.mktemp("arm_inprocess")
    return out, _run(out, params_file, "--in-process", "--no-figures")


def _reference_clearance(data) -> np.ndarray:
    """(T,) min over spheres and obstacles of brute-force signed distance - radius."""
    from robot_sdf.scene import load_scene

    spheres = data["spheres"].astype(np.float64)
    t, n, _ = spheres.shape
    sd = np.full((t, n), np.inf)
    for spec in load_scene(SCENE):
        # Geometry from the scene file itself; the npz must carry the same.
        np.testing.assert_allclose(data[f"vertices_{spec.id}"], spec.vertices, atol=1e-6)
        np.testing.assert_array_equal(data[f"triangles_{spec.id}"], spec.triangles)
        poses = data[f"poses_{spec.id}"]
        assert poses.shape == (t, 7)
        local = np.stack([ref.transform_points(ref.pose_inverse(poses[i]), spheres[i, :, :3]) for i in range(t)])
        d, _, _ = ref.signed_distance(local.reshape(-1, 3), spec.vertices.astype(np.float64),
                                      spec.triangles.astype(np.int64))
        sd = np.minimum(sd, d.reshape(t, n))
    return np.min(sd - spheres[..., 3], axis=1)


def _check(out: Path, proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    data = np.load(out / "verification.npz")
    scene = yaml.safe_load(SCENE.read_text())["arm_demo"]
    assert summary["goal_reached"] is True and summary["collisions"] == 0
    assert 0 < summary["steps"] < MAX_STEPS
    assert summary["solve_ms_p95"] >= summary["solve_ms_p50"] > 0
    q = data["q"]
    assert data["spheres"].shape == (len(q), 37, 4) and summary["steps"] == len(q) - 1
    assert np.abs(q[-1] - np.asarray(scene["goal"])).max() <= scene["goal_tolerance"]
    np.testing.assert_allclose(q[0], scene["start"])
    # Joint limits (Franka's URDF) and the controller's speed limit (0.4 x the URDF velocity limits).
    lower = np.array([-2.8973, -1.7628, -2.8973, -3.0718, -2.8973, -0.0175, -2.8973])
    upper = np.array([2.8973, 1.7628, 2.8973, -0.0698, 2.8973, 3.7525, 2.8973])
    assert np.all(q >= lower - 1e-9) and np.all(q <= upper + 1e-9)
    vmax = 0.4 * np.array([2.175, 2.175, 2.175, 2.175, 2.61, 2.61, 2.61])
    assert np.all(np.abs(np.diff(q, axis=0)) / 0.1 <= vmax + 1e-5)
    # No executed sphere penetrates any obstacle, by brute force; the run's own figure agrees.
    brute = _reference_clearance(data)
    assert brute.min() > 0.0
    np.testing.assert_allclose(data["min_clearance"], brute, atol=2e-3)
    assert summary["min_clearance_m"] == pytest.approx(brute.min(), abs=2e-3)
    # No self-collision among the checked pairs (links two or more moving joints apart).
    pairs, sph = data["self_pairs"], data["spheres"].astype(np.float64)
    assert len(pairs) > 100 and summary["self_collisions"] == 0
    gap = (np.linalg.norm(sph[:, pairs[:, 0], :3] - sph[:, pairs[:, 1], :3], axis=-1)
           - sph[:, pairs[:, 0], 3] - sph[:, pairs[:, 1], 3])
    assert gap.min() > 0 and summary["min_self_clearance_m"] == pytest.approx(gap.min(), abs=1e-5)
    # The ball really moved during the run.
    ball = data["poses_ball"][:, 1]
    assert ball.max() - ball.min() > 0.1
    return summary


def test_ros_path_reaches_goal_without_collision(ros_run):
    out, proc = ros_run
    summary = _check(out, proc)
    assert summary["mode"].startswith("ROS services")
    for name in ("keyframes.png", "clearance.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def test_in_process_path_reaches_goal_without_collision(inprocess_run):
    out, proc = inprocess_run
    assert _check(out, proc)["mode"] == "in-process"


def test_both_paths_drive_the_same_trajectory(ros_run, inprocess_run):
    a = np.load(ros_run[0] / "verification.npz")
    b = np.load(inprocess_run[0] / "verification.npz")
    np.testing.assert_array_equal(a["q"], b["q"])
    np.testing.assert_array_equal(a["spheres"], b["spheres"])


def test_straight_joint_line_hits_the_crate(tmp_path):
    """The scene is not trivial: interpolating the joints from start to goal drives the hand
    through the crate (brute-force clearance < 0)."""
    import torch

    from robot_sdf.examples.arm_demo import load_robot
    from robot_sdf.scene import load_scene

    scene = yaml.safe_load(SCENE.read_text())["arm_demo"]
    robot = load_robot(tmp_path, None, "cpu")
    s = np.linspace(0.0, 1.0, 21)[:, None]
    q = (1 - s) * np.asarray(scene["start"]) + s * np.asarray(scene["goal"])
    spheres = robot.spheres(torch.tensor(q, dtype=torch.float32)).numpy().astype(np.float64).reshape(-1, 4)
    crate = next(spec for spec in load_scene(SCENE) if spec.id == "crate")
    local = ref.transform_points(ref.pose_inverse(crate.pose), spheres[:, :3])
    sd, _, _ = ref.signed_distance(local, crate.vertices.astype(np.float64), crate.triangles.astype(np.int64))
    assert (sd - spheres[:, 3]).min() < -0.02
