"""End-to-end tests of the MPC demo (robot_sdf.examples) and the render_slice tool.

The scenario is the shipped config/demo_world.yaml (the straight line start -> goal is blocked,
one obstacle slides across the corridor) with the test's own node parameters (device forced to
cpu). It runs twice:
- through ROS: `python -m robot_sdf.examples.demo` as a subprocess (it starts sdf_server itself,
  in this test's ROS domain, drives through the services, runs render_slice against the live
  node, stops it and draws the figures);
- in-process: the same MPC against a MeshWorld in this process.
Assertions come from each run's own log and are checked against an independent brute-force numpy
geometry (test/reference.py): goal reached, positive clearance at every executed pose, zero
collisions; both paths must produce the same trajectory; the pictures must be real PNGs with
content.
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
SCENE = REPO / "config" / "demo_world.yaml"
DEMO_PARAMS = REPO / "config" / "demo_sdf_server.yaml"
MAX_STEPS = 260
FIGURES = ("top_view.png", "distance_slice.png", "clearance.png", "node_distance_slice.png")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Module fixtures run whole demos (the ROS one alone has 240 s) inside the first test's limit.
pytestmark = pytest.mark.timeout(900)


@functools.cache
def _domain_id() -> int:
    # reserved on this machine: concurrent test runs never share a domain
    return reserve_domain_id(1 + (os.getpid() * 7 + 61) % 100)


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    """The demo's node parameters with device cpu and an absolute scene path."""
    data = yaml.safe_load(DEMO_PARAMS.read_text())
    params = data["sdf_server"]["ros__parameters"]
    params.update(device="cpu", scene_file=str(SCENE))
    path = tmp_path_factory.mktemp("demo_params") / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture(scope="module")
def ros_run(tmp_path_factory, params_file):
    out = tmp_path_factory.mktemp("demo_ros")
    env = dict(os.environ, ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    cmd = [sys.executable, "-m", "robot_sdf.examples.demo", "--out", str(out), "--params", str(params_file),
           "--scene", str(SCENE), "--domain-id", str(_domain_id()), "--max-steps", str(MAX_STEPS)]
    # Own session: if the demo hangs, its whole process group (the node included) is ended.
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    return out, subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


@pytest.fixture(scope="module")
def inprocess_run(tmp_path_factory, params_file):
    from robot_sdf.examples.mpc_demo import make_backend, run_mpc
    from robot_sdf.examples.mppi import MpcConfig
    from robot_sdf.examples.scenario import load_scenario

    out = tmp_path_factory.mktemp("demo_inprocess")
    scenario = load_scenario(SCENE)
    config = MpcConfig()
    backend = make_backend(True, scenario, params_file, config)
    try:
        summary = run_mpc(scenario, backend, config, max_steps=MAX_STEPS, out_dir=out, progress=None,
                          mode="in-process")
    finally:
        backend.close()
    return out, summary


def _rows(out: Path) -> list[dict]:
    with open(out / "mpc_log.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def _reference_world():
    """Obstacles as reference meshes (geometry from the scene file), keyed by id."""
    from robot_sdf.scene import load_scene

    return {s.id: ref.RefMesh(s.vertices.astype(np.float64), s.triangles.astype(np.int64), s.pose.copy())
            for s in load_scene(SCENE)}


def _robot_spheres(x: float, y: float, yaw: float) -> np.ndarray:
    """(n,4) spheres of the demo robot, recomputed here from its documented geometry."""
    from robot_sdf.examples.robot import SphereRobot

    robot = SphereRobot()
    off = np.asarray(robot.offsets, dtype=np.float64)
    c, s = np.cos(yaw), np.sin(yaw)
    centres = np.stack([x + c * off[:, 0] - s * off[:, 1], y + s * off[:, 0] + c * off[:, 1],
                        np.full(len(off), robot.height)], axis=1)
    return np.concatenate([centres, np.asarray(robot.radii)[:, None]], axis=1)


def _reference_clearance(rows: list[dict]) -> np.ndarray:
    """Min over spheres of (brute-force signed distance - radius) at every logged pose (steps,)."""
    meshes = _reference_world()
    spheres = np.stack([_robot_spheres(r["x"], r["y"], r["yaw"]) for r in rows])  # (k, n, 4)
    k, n, _ = spheres.shape
    sd = np.full((k, n), np.inf)
    for oid, mesh in meshes.items():
        # Sphere centres in this mesh's frame, with the pose the log gives for each step (moving
        # obstacles) or the scene pose: one brute-force call per mesh for the whole run.
        local = np.empty((k, n, 3))
        for i, r in enumerate(rows):
            pose = np.asarray(r["obstacle_poses"].get(oid, mesh.pose), dtype=np.float64)
            local[i] = ref.transform_points(ref.pose_inverse(pose), spheres[i, :, :3])
        d, _, _ = ref.signed_distance(local.reshape(-1, 3), mesh.vertices, mesh.triangles)
        sd = np.minimum(sd, d.reshape(k, n))
    return np.min(sd - spheres[..., 3], axis=1)


def _check_run(rows: list[dict], summary: dict) -> None:
    from robot_sdf.examples.scenario import load_scenario

    scenario = load_scenario(SCENE)
    last = rows[-1]
    assert np.hypot(last["x"] - scenario.goal[0], last["y"] - scenario.goal[1]) <= scenario.goal_tolerance
    assert summary["goal_reached"] is True
    assert summary["steps"] == len(rows) - 1 < MAX_STEPS
    # Every executed pose is collision-free: by the run's own referee and by brute force.
    logged = np.array([r["min_clearance"] for r in rows])
    assert logged.min() > 0.0
    assert not any(r["collision"] for r in rows) and summary["collision_steps"] == 0
    brute = _reference_clearance(rows)
    np.testing.assert_allclose(logged, brute, atol=2e-3)
    assert brute.min() > 0.0
    assert summary["min_clearance_m"] == pytest.approx(brute.min(), abs=2e-3)
    # The executed motion respects the robot's speed limit (the controls were not faked).
    xy = np.array([[r["x"], r["y"]] for r in rows])
    speed = np.linalg.norm(np.diff(xy, axis=0), axis=1) / 0.1
    assert speed.max() <= 0.7 + 1e-6
    # The sliding obstacle really moved, one world revision per step, and every cost request
    # was answered for the world state of its step.
    ys = np.array([r["obstacle_poses"]["slider"][1] for r in rows])
    assert ys.max() - ys.min() > 0.5
    revs = np.array([r["world_revision"] for r in rows])
    assert np.all(np.diff(revs) == 1)
    lat = np.array([r["latency_s"] for r in rows[:-1]])
    assert np.all(lat > 0.0)


def test_scenario_straight_line_is_blocked():
    """The direct route start -> goal crosses an obstacle at the robot's height (brute force)."""
    from robot_sdf.examples.robot import SphereRobot
    from robot_sdf.examples.scenario import load_scenario

    scenario = load_scenario(SCENE)
    meshes = _reference_world()
    s = np.linspace(0.0, 1.0, 200)[:, None]
    line = (1 - s) * scenario.start[None, :2] + s * scenario.goal[None, :2]
    pts = np.concatenate([line, np.full((len(s), 1), SphereRobot().height)], axis=1)
    sd = np.min([m.signed_distance_world(pts)[0] for m in meshes.values()], axis=0)
    assert sd.min() < 0.0  # the centre line itself enters an obstacle (the pillar)


def test_ros_path_reaches_goal_without_collision(ros_run):
    out, proc = ros_run
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"].startswith("ROS services")
    assert summary["node_exit_status"] == 0
    assert summary["device"] == "cpu"
    _check_run(_rows(out), summary)
    assert "goal reached       yes" in proc.stdout


def test_in_process_path_reaches_goal_without_collision(inprocess_run):
    out, summary = inprocess_run
    _check_run(_rows(out), summary)


def test_both_paths_drive_the_same_trajectory(ros_run, inprocess_run):
    """Costs through the service equal the in-process ones, so the seeded runs coincide."""
    ros_rows, in_rows = _rows(ros_run[0]), _rows(inprocess_run[0])
    assert len(ros_rows) == len(in_rows)
    a = np.array([[r["x"], r["y"], r["yaw"]] for r in ros_rows])
    b = np.array([[r["x"], r["y"], r["yaw"]] for r in in_rows])
    np.testing.assert_allclose(a, b, atol=1e-4)
    assert [r["world_revision"] for r in ros_rows] == [r["world_revision"] for r in in_rows]


def _png_pixels(path: Path) -> np.ndarray:
    import matplotlib.image as mpimg

    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path.name} is not a PNG"
    return mpimg.imread(path)


@pytest.mark.parametrize("name", FIGURES)
def test_figures_are_real_pictures(ros_run, name):
    out, _ = ros_run
    path = out / name
    assert path.is_file(), f"{name} missing"
    assert path.stat().st_size > 20_000
    img = _png_pixels(path)
    assert img.ndim == 3 and img.shape[0] > 300 and img.shape[1] > 500
    rgb = img[..., :3].reshape(-1, 3)
    assert rgb.std(axis=0).max() > 0.1  # not a blank canvas
    packed = (rgb * 255).astype(np.uint32) @ np.array([1 << 16, 1 << 8, 1], dtype=np.uint32)
    assert np.unique(packed).size > 200  # real colour content


@pytest.mark.parametrize("name", ["distance_slice.png", "node_distance_slice.png"])
def test_distance_maps_show_inside_and_outside(ros_run, name):
    """Both distance maps use the diverging map: strongly red (inside) and blue (outside) pixels."""
    img = _png_pixels(ros_run[0] / name)[..., :3]
    red = (img[..., 0] > 0.55) & (img[..., 0] - img[..., 2] > 0.2)
    blue = (img[..., 2] > 0.5) & (img[..., 2] - img[..., 0] > 0.2)
    assert red.mean() > 0.01 and blue.mean() > 0.05


# ------------------------------------------------------------------ render_slice decoding


def _cloud(points: np.ndarray, dist: np.ndarray, point_step: int, offsets: dict[str, int], width: int,
           height: int, row_pad: int = 0):
    """A PointCloud2 with float32 fields at the given offsets, padded records and rows."""
    from sensor_msgs.msg import PointCloud2, PointField

    values = {"x": points[:, 0], "y": points[:, 1], "z": points[:, 2], "distance": dist}
    row_step = width * point_step + row_pad
    buf = np.zeros((height, row_step), np.uint8)
    for name, off in offsets.items():
        col = values[name].astype("<f4").reshape(height, width).view(np.uint8).reshape(height, width, 4)
        for k in range(width):
            buf[:, k * point_step + off:k * point_step + off + 4] = col[:, k]
    fields = [PointField(name=n, offset=o, datatype=PointField.FLOAT32, count=1) for n, o in offsets.items()]
    msg = PointCloud2(height=height, width=width, fields=fields, is_bigendian=False, point_step=point_step,
                      row_step=row_step, is_dense=True)
    msg.data = buf.tobytes()
    return msg


def test_render_slice_decodes_padded_clouds_by_field_offset():
    from robot_sdf.tools.render_slice import grid_from_points, parse_cloud

    rng = np.random.default_rng(3)
    h, w = 3, 5
    xs, zs = np.meshgrid(np.arange(w) * 0.1 - 0.2, np.arange(h) * 0.1 + 1.0)
    pts = np.stack([xs.ravel(), np.full(h * w, 0.7), zs.ravel()], axis=1)
    dist = rng.normal(size=h * w)
    # Fields out of order, 8 bytes of padding per point, 6 bytes per row.
    msg = _cloud(pts, dist, 24, {"distance": 0, "z": 8, "x": 12, "y": 16}, w, h, row_pad=6)
    cloud = parse_cloud(msg)
    np.testing.assert_array_equal(cloud[:, :3], pts.astype(np.float32))
    np.testing.assert_array_equal(cloud[:, 3], dist.astype(np.float32))
    (an, bn), us, vs, img, offset, normal = grid_from_points(cloud)
    assert (an, bn, normal) == ("x", "z", "y") and offset == pytest.approx(0.7)
    np.testing.assert_allclose(img, dist.reshape(h, w), rtol=1e-6)


def test_render_slice_rejects_clouds_without_distance():
    from robot_sdf.tools.render_slice import parse_cloud

    msg = _cloud(np.zeros((2, 3)), np.zeros(2), 16, {"x": 0, "y": 4, "z": 8}, 2, 1)
    with pytest.raises(ValueError, match="distance"):
        parse_cloud(msg)


def test_demo_says_clearly_when_ros_is_missing(tmp_path, monkeypatch, capsys, params_file):
    """Without the interface package the demo names the problem and runs in-process instead."""
    from robot_sdf.examples import demo

    monkeypatch.setitem(sys.modules, "robot_sdf_interfaces.msg", None)
    code = demo.main(["--out", str(tmp_path), "--params", str(params_file), "--scene", str(SCENE),
                      "--max-steps", "3", "--no-figures"])
    text = capsys.readouterr().out
    assert "ROS 2 is NOT available" in text and "robot_sdf_interfaces" in text
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["mode"] == "in-process (ROS unavailable)"
    assert summary["steps"] == 3 and code == 1  # 3 steps do not reach the goal


# ------------------------------------------------------------------ shipped assets


def test_rviz_config_shows_the_node_and_the_demo():
    data = yaml.safe_load((REPO / "config" / "demo.rviz").read_text())
    manager = data["Visualization Manager"]
    assert manager["Global Options"]["Fixed Frame"] == "world"
    displays = {d["Topic"]["Value"]: d for d in manager["Displays"] if "Topic" in d}
    assert displays["/sdf_server/markers"]["Class"] == "rviz_default_plugins/MarkerArray"
    cloud = displays["/sdf_server/distance_slice"]
    assert cloud["Class"] == "rviz_default_plugins/PointCloud2"
    assert cloud["Color Transformer"] == "Intensity" and cloud["Channel Name"] == "distance"
    assert displays["/mpc_demo/markers"]["Class"] == "rviz_default_plugins/MarkerArray"
    assert all(d["Enabled"] for d in displays.values())


def test_shipped_mesh_is_small_closed_and_reproducible():
    import trimesh

    from robot_sdf.tools.make_demo_mesh import boulder

    path = REPO / "config" / "meshes" / "boulder.stl"
    assert path.stat().st_size < 200_000
    mesh = trimesh.load(str(path), force="mesh", process=True)
    assert mesh.is_watertight and mesh.is_winding_consistent and mesh.volume > 0  # outward normals
    v, t = boulder()
    # STL stores float32 corners per triangle: compare the triangle soups, rows in one order.
    def soup(vertices, triangles):
        rows = np.round(np.asarray(vertices, dtype=np.float64)[triangles].reshape(-1, 9), 5)
        return rows[np.lexsort(rows.T[::-1])]

    assert len(mesh.faces) == len(t)
    np.testing.assert_allclose(soup(mesh.vertices, mesh.faces), soup(v, t), atol=2e-5)
