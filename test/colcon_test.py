"""The ROS 2 workspace build: colcon builds both packages, and the install runs.

The module builds ``build/colcon_ws`` from this checkout with the README's command
(``colcon build --paths <repo> <repo>/robot_sdf_interfaces``; incremental, a few seconds when
nothing changed), reads the workspace environment from its ``local_setup.sh`` (what
``source install/setup.bash`` gives a user), finds the shipped files through ament_index and
starts ``lib/robot_sdf/sdf_server`` from the install with that environment.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import ros_helpers as rh

WORKSPACE = rh.REPO / "build" / "colcon_ws"
INSTALL = WORKSPACE / "install"
DOMAIN = rh.domain_id(89)  # 61 is demo_test's
PACKAGES = ("robot_sdf", "robot_sdf_interfaces")
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
    for attempt in range(2):
        WORKSPACE.mkdir(parents=True, exist_ok=True)
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


def test_installed_sdf_server_runs_the_shipped_demo_config(workspace, tmp_path):
    """lib/robot_sdf/sdf_server with the workspace environment, started from an unrelated working
    directory: the config comes from the share directory and its relative scene_file is found
    through ament_index; the wall it loads answers a distance query like the exact box distance."""
    from robot_sdf_interfaces.srv import QuerySignedDistance

    share = INSTALL / "robot_sdf" / "share" / "robot_sdf"
    params = share / "config" / "demo_sdf_server.yaml"
    assert yaml.safe_load(params.read_text())["sdf_server"]["ros__parameters"]["scene_file"] == \
        "config/demo_world.yaml"
    env = dict(workspace, ROS_DOMAIN_ID=str(DOMAIN), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               PYTHONUNBUFFERED="1", RCUTILS_COLORIZED_OUTPUT="0")
    node = rh.ServerProcess(params, tmp_path / "installed_sdf_server.log", env, cwd=tmp_path,
                            executable=[str(INSTALL / "robot_sdf" / "lib" / "robot_sdf" / "sdf_server")],
                            ros_args=["-p", "device:=cpu", "-p", "slice_rate_hz:=0.0", "-p", "marker_rate_hz:=0.0"])
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
    finally:
        if harness is not None:
            harness.close()
        code = node.stop()
    assert code == 0, node.log()

