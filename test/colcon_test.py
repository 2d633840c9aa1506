"""The ROS 2 workspace build: colcon builds both packages, and the install runs.

The module builds ``build/colcon_ws-<venv name>`` from this checkout with the command of
docs/install.md (``colcon build --paths <repo> <repo>/robot_sdf_interfaces``; incremental, a few
seconds when nothing changed), reads the workspace environment from its ``local_setup.sh`` (what
``source install/setup.bash`` gives a user), finds the shipped files through ament_index and runs
every console script of setup.py from the install with that environment: the nodes serve (and
render_slice draws a started node's slice), fit_spheres fits a small URDF, the others print their
usage. requirements.txt, the pinned pip-only runtime dependencies that the workspace install adds
to ROS 2, is checked against what robot_sdf imports.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

import numpy as np
import pytest
import yaml
from packaging.requirements import Requirement

import ros_helpers as rh
from package_xml_test import imported_top_level_modules

# One workspace per venv (as `make colcon`): CMake caches the interpreter it found.
WORKSPACE = rh.REPO / "build" / f"colcon_ws-{Path(sys.prefix).name.removeprefix('.')}"
INSTALL = WORKSPACE / "install"
SCRIPTS = INSTALL / "robot_sdf" / "lib" / "robot_sdf"
DOMAIN = rh.domain_id(89)  # 61 is demo_test's
PACKAGES = ("robot_sdf", "robot_sdf_interfaces")
# Console scripts that start a node (rclpy takes their ROS arguments; their own -h/--help prints
# the usage and the parameters): the tests also start them and talk to them.
NODE_SCRIPTS = ("sdf_server", "sdf_server_managed")
# The module fixture builds the workspace (a 600 s limit per attempt, at most two attempts)
# inside the first test's time limit.
pytestmark = pytest.mark.timeout(1800)


def colcon_command() -> list[str]:
    """The workspace build, as in the README and `make colcon` (run in WORKSPACE)."""
    return [sys.executable, "-m", "colcon", "--log-base", "log", "build",
            "--paths", str(rh.REPO), str(rh.REPO / "robot_sdf_interfaces"),
            "--build-base", "build", "--install-base", "install", "--event-handlers", "console_direct-"]


def _clean_env() -> dict[str, str]:
    """This environment without anything a sourced workspace or this checkout would add."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "COLCON_PREFIX_PATH", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _workspace_env() -> dict[str, str]:
    """The environment after `. install/local_setup.sh` (the colcon-generated script itself)."""
    out = subprocess.run(["bash", "-c", f". '{INSTALL / 'local_setup.sh'}' && env -0"], env=_clean_env(),
                         capture_output=True, check=True, timeout=60)
    pairs = (item.split("=", 1) for item in out.stdout.decode().split("\0") if "=" in item)
    return dict(pairs)


@pytest.fixture(scope="module")
def workspace() -> dict[str, str]:
    assert shutil.which("cmake"), "cmake is needed for robot_sdf_interfaces"
    interpreter = WORKSPACE / ".python"
    if WORKSPACE.exists() and (not interpreter.is_file() or interpreter.read_text().strip() != sys.executable):
        shutil.rmtree(WORKSPACE)  # built by another interpreter: its CMake caches point there
    for attempt in range(2):
        WORKSPACE.mkdir(parents=True, exist_ok=True)
        interpreter.write_text(sys.executable + "\n")
        t0 = time.perf_counter()
        out = subprocess.run(colcon_command(), cwd=WORKSPACE, env=_clean_env(), capture_output=True, text=True,
                             timeout=600)
        elapsed = time.perf_counter() - t0
        if out.returncode == 0 or attempt:
            break
        # a CMake cache of another checkout path or an older toolchain: build from scratch once
        shutil.rmtree(WORKSPACE)
    assert out.returncode == 0, f"colcon build failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    print(f"\ncolcon build of {', '.join(PACKAGES)}: {elapsed:.1f} s")
    return _workspace_env()


def test_both_packages_are_installed_and_the_environment_points_at_them(workspace):
    prefixes = workspace["AMENT_PREFIX_PATH"].split(os.pathsep)
    assert {str(INSTALL / p) for p in PACKAGES} <= set(prefixes)
    # where the workspace environment finds the packages (found, not imported: no torch start-up)
    code = ("from importlib.util import find_spec;"
            "print(find_spec('robot_sdf').origin); print(find_spec('robot_sdf_interfaces').origin)")
    out = subprocess.run([sys.executable, "-c", code], env=workspace, capture_output=True, text=True,
                         cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    core, interfaces = out.stdout.split()
    assert Path(core).is_relative_to(INSTALL / "robot_sdf"), core  # not the checkout, not the venv
    assert Path(interfaces).is_relative_to(INSTALL / "robot_sdf_interfaces"), interfaces


def test_ament_index_finds_config_launch_and_rviz_files(workspace, monkeypatch):
    from ament_index_python.packages import get_package_prefix, get_package_share_directory, get_packages_with_prefixes

    monkeypatch.setenv("AMENT_PREFIX_PATH", workspace["AMENT_PREFIX_PATH"])
    found = get_packages_with_prefixes()
    assert all(found.get(p) == str(INSTALL / p) for p in PACKAGES), found
    share = Path(get_package_share_directory("robot_sdf"))
    assert share == INSTALL / "robot_sdf" / "share" / "robot_sdf"
    for rel in ("config/sdf_server.yaml", "config/demo_sdf_server.yaml", "config/demo_world.yaml",
                "config/robot_sdf.rviz", "launch/sdf_server.launch.py", "package.xml"):
        assert (share / rel).read_bytes() == (rh.REPO / rel).read_bytes(), rel
    assert (Path(get_package_prefix("robot_sdf_interfaces")) / "share" / "robot_sdf_interfaces" / "msg"
            / "MeshObstacle.msg").is_file()
    for exe in ("sdf_server", "sdf_server_managed"):
        assert os.access(INSTALL / "robot_sdf" / "lib" / "robot_sdf" / exe, os.X_OK), exe


def console_scripts() -> list[str]:
    """Names of setup.py's console_scripts entry points."""
    tree = ast.parse((rh.REPO / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "console_scripts":
                    return [ast.literal_eval(item).split("=")[0].strip() for item in value.elts]
    raise AssertionError("setup.py declares no console_scripts")


def node_env(workspace: dict[str, str]) -> dict[str, str]:
    return dict(workspace, ROS_DOMAIN_ID=str(DOMAIN), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
                PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")


def test_installed_sdf_server_runs_the_shipped_demo_config_and_render_slice_draws_its_slice(workspace, tmp_path):
    """lib/robot_sdf/sdf_server with the workspace environment, started from an unrelated working
    directory: the config comes from the share directory and its relative scene_file is found
    through ament_index; the wall it loads answers a distance query like the exact box distance.
    lib/robot_sdf/render_slice then draws the node's distance slice."""
    from robot_sdf_interfaces.srv import QuerySignedDistance

    share = INSTALL / "robot_sdf" / "share" / "robot_sdf"
    params = share / "config" / "demo_sdf_server.yaml"
    config = yaml.safe_load(params.read_text())["sdf_server"]["ros__parameters"]
    assert config["scene_file"] == "config/demo_world.yaml"
    env = node_env(workspace)
    node = rh.ServerProcess(params, tmp_path / "installed_sdf_server.log", env, cwd=tmp_path,
                            executable=[str(SCRIPTS / "sdf_server")],
                            ros_args=["-p", "device:=cpu", "-p", "marker_rate_hz:=0.0"])
    harness = None
    try:
        node.wait_ready(120.0)
        harness = rh.RosHarness(DOMAIN, "colcon_test")
        client = harness.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        rh.wait_for_services(node, [client])
        # wall_north of config/demo_world.yaml: box 6.6 x 0.2 x 0.5 at (0, 1.9, 0.25)
        points = np.array([[-2.5, 1.6, 0.25], [-2.5, 1.75, 0.3], [-2.5, 1.9, 0.25]], dtype=np.float32)
        distance, _ = harness.signed_distance(client, points)
        expected = rh.box_signed_distance(points, (6.6, 0.2, 0.5), (0.0, 1.9, 0.25, 1.0, 0.0, 0.0, 0.0))
        np.testing.assert_allclose(distance, expected, atol=2e-3)

        png = tmp_path / "slice.png"
        out = subprocess.run([str(SCRIPTS / "render_slice"), "--server", "/sdf_server", "--output", str(png),
                              "--timeout", "60"], env=env, cwd=tmp_path, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
    finally:
        if harness is not None:
            harness.close()
        code = node.stop()
    assert code == 0, node.log()
    m = re.search(r"\((\d+) points, distance ([-+.\d]+) \.\. ([-+.\d]+) m\)", out.stdout)
    assert m, out.stdout
    columns, rows = (round(size / config["slice_resolution"]) + 1 for size in config["slice_size"])
    assert int(m.group(1)) == columns * rows
    # The slice (z = 0.25) cuts wall_north, 0.2 m thick, through its middle row of grid points
    # (y = 1.9): at least 0.1 m deep; the corridor has points beyond max_distance.
    assert float(m.group(2)) <= -0.1 + 2e-3
    assert float(m.group(3)) == pytest.approx(config["max_distance"], abs=1e-3)
    from matplotlib.image import imread

    rgb = imread(png)[..., :3]
    reddish = (rgb[..., 0] > 0.6) & (rgb[..., 2] < 0.4)  # inside obstacles
    bluish = (rgb[..., 2] > 0.6) & (rgb[..., 0] < 0.4)  # free space
    assert reddish.sum() > 100 and bluish.sum() > 1000, (reddish.sum(), bluish.sum())


def test_installed_sdf_server_managed_starts_unconfigured_and_stops_cleanly(workspace, tmp_path):
    from lifecycle_msgs.msg import State
    from lifecycle_msgs.srv import GetState

    params = INSTALL / "robot_sdf" / "share" / "robot_sdf" / "config" / "sdf_server.yaml"
    node = rh.ServerProcess(params, tmp_path / "installed_sdf_server_managed.log", node_env(workspace),
                            cwd=tmp_path, executable=[str(SCRIPTS / "sdf_server_managed")],
                            ros_args=["-p", "device:=cpu"])
    harness = None
    try:
        harness = rh.RosHarness(DOMAIN, "colcon_test_managed")
        get_state = harness.client(GetState, "/sdf_server/get_state")
        rh.wait_for_services(node, [get_state], timeout=120.0)
        # The client sees the service before the service's reply writer may have matched the
        # client: Fast DDS then drops the first reply ("failed to send response (timeout)", seen
        # on a loaded machine). GetState changes nothing, so asking again is safe.
        state = None
        for _ in range(3):
            try:
                state = harness.call(get_state, GetState.Request(), timeout=20.0)
                break
            except AssertionError:
                continue
        assert state is not None, node.log()
        assert state.current_state.id == State.PRIMARY_STATE_UNCONFIGURED
    finally:
        if harness is not None:
            harness.close()
        code = node.stop()
    assert code == 0, node.log()


def test_every_console_script_prints_its_usage_from_the_install(workspace, tmp_path):
    scripts = console_scripts()
    assert set(NODE_SCRIPTS) | {"fit_spheres", "render_slice"} <= set(scripts)
    for name in scripts:
        assert os.access(SCRIPTS / name, os.X_OK), name
    # started together: each spends its few seconds importing torch and Warp
    procs = {name: subprocess.Popen([str(SCRIPTS / name), "--help"], env=workspace, cwd=tmp_path, text=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE) for name in scripts}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=180)
        assert proc.returncode == 0, f"{name} --help: {stdout}{stderr}"
        assert stdout.startswith("usage: "), f"{name} --help: {stdout}"


BLOCK_URDF = """<?xml version="1.0"?>
<robot name="block">
  <link name="block">
    <collision><origin xyz="0.05 0 0.03" rpy="0 0 0"/><geometry><box size="0.2 0.1 0.06"/></geometry></collision>
  </link>
</robot>
"""
BLOCK_SIZE, BLOCK_POSE = (0.2, 0.1, 0.06), (0.05, 0.0, 0.03, 1.0, 0.0, 0.0, 0.0)


def test_installed_fit_spheres_fits_a_small_urdf(workspace, tmp_path):
    """fit_spheres from the install (pytorch_kinematics, trimesh and Warp imported in the workspace
    environment), its spheres checked against the exact box distance: centres inside, reach past
    the surface within the allowance, the reported coverage equal to a brute-force one."""
    urdf = tmp_path / "block.urdf"
    urdf.write_text(BLOCK_URDF)
    output = tmp_path / "block_spheres.yaml"
    overshoot = 0.005
    out = subprocess.run([str(SCRIPTS / "fit_spheres"), str(urdf), "--output", str(output), "--spheres", "4",
                          "--overshoot", str(overshoot)], env=workspace, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    written = yaml.safe_load(output.read_text())
    from robot_sdf.robot import load_spheres

    spheres = load_spheres(written)["block"]
    assert 1 <= len(spheres) <= 4
    depth = rh.box_signed_distance(spheres[:, :3], BLOCK_SIZE, BLOCK_POSE)
    assert np.all(depth < 0)
    assert np.all(spheres[:, 3] + depth <= overshoot + 1e-4)
    # coverage: the largest distance from the box surface to the union of spheres
    rng = np.random.default_rng(5)
    half = 0.5 * np.asarray(BLOCK_SIZE)
    points = rng.uniform(-half, half, size=(30_000, 3))
    face = rng.integers(0, 3, len(points))
    points[np.arange(len(points)), face] = np.where(rng.random(len(points)) < 0.5, -1, 1) * half[face]
    points += BLOCK_POSE[:3]
    gap = np.linalg.norm(points[:, None] - spheres[None, :, :3], axis=2) - spheres[None, :, 3]
    coverage = np.maximum(gap.min(axis=1), 0.0).max()
    assert written["fit"]["block"]["coverage_m"] == pytest.approx(coverage, abs=2e-3)


# --- requirements.txt: the pip-only runtime dependencies of the workspace install ---

def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_pins() -> dict[str, str]:
    text = (rh.REPO / "requirements.txt").read_text()
    assert not re.search(r"^-", text, re.M), "requirements.txt includes no other file"
    return {normalized(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", text, re.M)}


def test_runtime_requirements_pin_every_import_that_ros_does_not_provide():
    """Each third-party module robot_sdf imports comes from ROS 2 (a ros-* wheel here, a
    package.xml dependency on a ROS machine), from robot_sdf_interfaces, or from a distribution
    pinned in requirements.txt at the version installed in this venv."""
    pins = runtime_pins()
    providers = packages_distributions()
    checked = set()
    for module in imported_top_level_modules():
        if module in sys.stdlib_module_names or module in ("robot_sdf", "robot_sdf_interfaces"):
            continue
        dists = providers.get(module, [])
        if not dists or any(normalized(d).startswith("ros-") for d in dists):
            continue  # ROS 2 (optional modules, e.g. launch or tf2_ros, are not installed here)
        assert any(normalized(d) in pins for d in dists), f"{module} ({dists}) is not pinned in requirements.txt"
        checked.add(module)
    assert {"torch", "warp", "pytorch_kinematics", "trimesh", "rtbdata"} <= checked, checked
    for name, version in pins.items():
        assert distribution(name).version.split("+")[0] == version, f"{name}: installed {distribution(name).version}"


def test_runtime_requirements_pin_their_own_dependencies():
    """`pip install -r requirements.txt` resolves nothing unpinned: every dependency of a pinned
    distribution (as installed here) is pinned too."""
    pins = runtime_pins()
    missing = []
    for name in pins:
        for text in distribution(name).requires or []:
            req = Requirement(text)
            if req.marker and not req.marker.evaluate({"extra": ""}):
                continue
            if normalized(req.name) not in pins:
                missing.append(f"{name} needs {req}")
    assert not missing, "\n".join(missing)
