"""package.xml declares exactly the dependencies the code imports.

Every non-standard-library module imported by robot_sdf/ and launch/ (optional imports
included: they are used where installed) maps to a rosdep key: ROS packages by their own name
(tf2_ros is the module of package tf2_ros_py), Python libraries by the key below. torch and warp have no usable rosdep key: they are pip
dependencies, pinned in requirements.txt and named in a package.xml comment.
"""
from __future__ import annotations

import ast
import re
import sys
import xml.etree.ElementTree as ET

import ros_helpers as rh

# Python libraries -> rosdep keys (see the comments in package.xml).
PYTHON_KEYS = {"numpy": "python3-numpy", "yaml": "python3-yaml", "trimesh": "python3-trimesh-pip",
               "matplotlib": "python3-matplotlib", "scipy": "python3-scipy"}
# ROS modules whose package has another name.
ROS_MODULE_KEYS = {"tf2_ros": "tf2_ros_py"}
# pip-only dependencies -> their pip names in requirements.txt.
PIP_ONLY = {"torch": "torch", "warp": "warp-lang", "pytorch_kinematics": "pytorch-kinematics", "rtbdata": "rtb-data"}
SOURCES = [*sorted((rh.REPO / "robot_sdf").rglob("*.py")), *sorted((rh.REPO / "launch").glob("*.py"))]


def imported_top_level_modules() -> dict[str, list[str]]:
    """Top-level module -> files importing it, for every absolute import in SOURCES."""
    found: dict[str, list[str]] = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                found.setdefault(name.split(".")[0], []).append(str(path.relative_to(rh.REPO)))
    return found


def required_keys() -> set[str]:
    keys = set()
    for module in imported_top_level_modules():
        if module in sys.stdlib_module_names or module == "robot_sdf" or module in PIP_ONLY:
            continue
        keys.add(PYTHON_KEYS.get(module) or ROS_MODULE_KEYS.get(module, module))
    return keys


def declared(kind: tuple[str, ...] = ("depend", "exec_depend", "build_export_depend")) -> set[str]:
    root = ET.parse(rh.REPO / "package.xml").getroot()
    return {e.text.strip() for e in root if e.tag in kind}


def test_exec_dependencies_are_exactly_the_imports():
    need, have = required_keys(), declared()
    assert not need - have, f"imported but not declared in package.xml: {sorted(need - have)}"
    assert not have - need, f"declared in package.xml but imported nowhere: {sorted(have - need)}"


def test_scanner_sees_the_known_imports():
    """The import scan is not vacuous: it finds what the node and the launch file import."""
    modules = imported_top_level_modules()
    assert {"rclpy", "robot_sdf_interfaces", "launch_ros", "torch", "warp", "numpy"} <= set(modules)
    assert "std_srvs" not in modules


def test_pip_only_dependencies_are_pinned_and_documented():
    pins = dict(re.findall(r"^([A-Za-z0-9_.-]+)==(\S+)", (rh.REPO / "requirements.txt").read_text(), re.M))
    text = (rh.REPO / "package.xml").read_text()
    for module, pip_name in PIP_ONLY.items():
        assert pip_name in pins, f"{pip_name} is not pinned in requirements.txt"
        assert f"{pip_name}" in text or module in text, f"package.xml does not mention {pip_name}"


def test_test_dependencies():
    assert declared(("test_depend",)) == {"python3-pytest"}
