"""The venv holds one ROS 2 distribution, the one it records, and rclpy runs from it.

`make venv` writes the distribution (jazzy or kilted) into ``<venv>/.robot_sdf-ros-distro`` and
installs requirements/<distro>.txt. These tests fail when the running rclpy, the ROS 2 native
libraries it loads or any installed ros-* wheel belong to another distribution (a venv mixed
by hand, a sourced ROS install on PYTHONPATH or LD_LIBRARY_PATH), and check that the Makefile
refuses to use a venv for the other distribution.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import distribution, distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

import ros_helpers as rh

RECORD = Path(sys.prefix) / ".robot_sdf-ros-distro"
DISTROS = ("jazzy", "kilted")
REQUIREMENTS = rh.REPO / "requirements"
# native libraries of ROS 2 itself (rcl, rmw, rcutils, rosidl, Fast DDS)
ROS_LIBRARY = re.compile(r"^lib(rcl|rmw|rcutils|rosidl|fastrtps|fastcdr)")


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """name -> version of the `name==version` lines of one requirements file (not its -r files)."""
    return {normalized(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", path.read_text(), re.M)}


def included(path: Path) -> list[Path]:
    """The requirements files `path` includes with -r, recursively, `path` first."""
    files = [path]
    for ref in re.findall(r"^-r\s+(\S+)", path.read_text(), re.M):
        files += included((path.parent / ref).resolve())
    return files


def expected_distro() -> str:
    """The distribution `make venv` recorded; $ROS_DISTRO where the environment was not built by make."""
    if RECORD.is_file():
        return RECORD.read_text().strip()
    if os.environ.get("ROS_DISTRO"):
        return os.environ["ROS_DISTRO"]
    pytest.fail(f"{RECORD} is missing and ROS_DISTRO is unset: which ROS 2 distribution should this be?")


def ros_wheels() -> dict[str, object]:
    """normalized name -> distribution of every installed ros-* wheel."""
    return {normalized(d.metadata["Name"]): d for d in distributions()
            if normalized(d.metadata["Name"]).startswith("ros-")}


def test_record_names_a_supported_distribution_and_agrees_with_the_environment():
    distro = expected_distro()
    assert distro in DISTROS, f"{distro!r} is not one of {DISTROS}"
    # make exports ROS_DISTRO; a shell sourced for another distribution says so here
    assert os.environ.get("ROS_DISTRO", distro) == distro, \
        f"ROS_DISTRO={os.environ['ROS_DISTRO']} but {sys.prefix} holds {distro}"


def test_every_pinned_ros_wheel_is_installed_at_its_pin():
    distro_pins = pins(REQUIREMENTS / f"{expected_distro()}.txt")
    assert "ros-rclpy" in distro_pins
    installed = ros_wheels()
    for name, version in distro_pins.items():
        assert name in installed, f"{name} is not installed"
        assert installed[name].version == version, f"{name} {installed[name].version}, pinned {version}"


def test_installed_ros_wheels_are_one_consistent_distribution():
    """Each ros-* wheel requires the others at compatible releases of its own distribution (~=):
    one wheel of the other distribution breaks some requirement here."""
    installed = ros_wheels()
    assert len(installed) > 30, sorted(installed)
    broken = []
    for name, dist in sorted(installed.items()):
        for text in dist.requires or []:
            req = Requirement(text)
            dep = normalized(req.name)
            if not dep.startswith("ros-") or (req.marker and not req.marker.evaluate({"extra": ""})):
                continue
            if dep not in installed or not req.specifier.contains(installed[dep].version, prereleases=True):
                broken.append(f"{name} {dist.version} needs {req}, has {getattr(installed.get(dep), 'version', None)}")
    assert not broken, "\n".join(broken)


def test_running_rclpy_and_its_native_libraries_come_from_the_pinned_wheels(tmp_path):
    """A fresh interpreter imports rclpy, starts a node and lists the shared libraries it mapped:
    rclpy's modules must be files of the ros-rclpy wheel pinned for the recorded distribution, and
    every ROS 2 native library must be a file of an installed ros-* wheel (not of a sourced
    /opt/ros/<distro>)."""
    rclpy_dist = distribution("ros-rclpy")
    assert rclpy_dist.version == pins(REQUIREMENTS / f"{expected_distro()}.txt")["ros-rclpy"]
    code = (
        "import rclpy\n"
        "from rclpy.impl.implementation_singleton import rclpy_implementation as impl\n"
        "rclpy.init(); node = rclpy.create_node('distro_test')\n"
        "print('module', rclpy.__file__); print('module', impl.__file__)\n"
        "for line in open('/proc/self/maps'):\n"
        "    if '.so' in line: print('mapped', line.split()[-1])\n"
        "node.destroy_node(); rclpy.shutdown()\n")
    out = subprocess.run([sys.executable, "-c", code], env=rh.ros_env(rh.domain_id(19)), cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = [line.split(" ", 1) for line in out.stdout.splitlines() if " " in line]
    modules = {Path(p).resolve() for kind, p in lines if kind == "module"}
    mapped = {Path(p).resolve() for kind, p in lines if kind == "mapped" and ROS_LIBRARY.match(Path(p).name)}

    rclpy_files = {Path(rclpy_dist.locate_file(f)).resolve() for f in rclpy_dist.files}
    assert len(modules) == 2 and modules <= rclpy_files, sorted(modules)
    wheel_files = {Path(d.locate_file(f)).resolve() for d in ros_wheels().values() for f in d.files or []}
    assert any(p.name == "librcl.so" for p in mapped), sorted(mapped)
    assert mapped <= wheel_files, f"not from the ros-* wheels: {sorted(mapped - wheel_files)}"


def test_requirements_pin_each_package_once_and_distributions_pin_only_ros_wheels():
    """requirements/<distro>.txt includes common.txt, which includes requirements.txt: the shared pins
    live in one place, and the distribution files differ only in their ros-* wheels."""
    for distro in DISTROS:
        chain = included(REQUIREMENTS / f"{distro}.txt")
        assert chain == [REQUIREMENTS / f"{distro}.txt", REQUIREMENTS / "common.txt", rh.REPO / "requirements.txt"]
        seen: dict[str, Path] = {}
        for path in chain:
            for name in pins(path):
                assert name not in seen, f"{name} pinned in {seen[name].name} and {path.name}"
                seen[name] = path
        own = pins(chain[0])
        assert own and all(name.startswith("ros-") for name in own), sorted(own)
        assert not any(name.startswith("ros-") for path in chain[1:] for name in pins(path))
    assert set(pins(REQUIREMENTS / "jazzy.txt")) != set(pins(REQUIREMENTS / "kilted.txt"))


# --- the Makefile's distribution check (parse time only: `make -n` runs nothing) ---

def make_dry_run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE") and k != "ROS_DISTRO"}
    return subprocess.run(["make", "-n", "-C", str(rh.REPO), *args], env=env, capture_output=True, text=True,
                          timeout=60)


needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


@needs_make
def test_make_refuses_this_venv_for_the_other_distribution():
    distro = expected_distro()
    other = next(d for d in DISTROS if d != distro)
    out = make_dry_run("test", f"VENV={sys.prefix}", f"ROS_DISTRO={other}")
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if "***" in line]
    assert len(errors) == 1, out.stderr
    assert f"holds ROS 2 {distro}, not {other}" in errors[0]
    assert f"ROS_DISTRO={distro}" in errors[0] and f"VENV=.venv-{other}" in errors[0]
    same = make_dry_run("test", f"VENV={sys.prefix}", f"ROS_DISTRO={distro}")
    assert same.returncode == 0, same.stderr


@needs_make
def test_make_knows_a_venv_without_record_by_its_rclpy(tmp_path):
    """A venv from before the record: its ros-rclpy version names the distribution. The stand-in
    venv's python answers the Makefile's version query with the Kilted pin."""
    kilted_rclpy = pins(REQUIREMENTS / "kilted.txt")["ros-rclpy"]
    venv = tmp_path / "old-venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(f"#!/bin/sh\necho {kilted_rclpy}\n")
    python.chmod(0o755)
    refused = make_dry_run("test", f"VENV={venv}")  # default distribution: jazzy
    assert refused.returncode != 0 and "holds ROS 2 kilted, not jazzy" in refused.stderr, refused.stderr
    adopted = make_dry_run("venv", f"VENV={venv}", "ROS_DISTRO=kilted")
    assert adopted.returncode == 0, adopted.stderr
    assert f"echo kilted > {venv}/.robot_sdf-ros-distro" in adopted.stdout
    assert "install -r requirements/kilted.txt" in adopted.stdout


@needs_make
def test_make_builds_jazzy_by_default_and_records_it(tmp_path):
    venv = tmp_path / "new-venv"
    out = make_dry_run("venv", f"VENV={venv}")
    assert out.returncode == 0, out.stderr
    assert f"echo jazzy > {venv}/.robot_sdf-ros-distro" in out.stdout
    assert "install -r requirements/jazzy.txt" in out.stdout and "kilted" not in out.stdout
    unknown = make_dry_run("venv", f"VENV={venv}", "ROS_DISTRO=humble")
    assert unknown.returncode != 0 and "ROS_DISTRO=humble is not one of: jazzy kilted" in unknown.stderr
