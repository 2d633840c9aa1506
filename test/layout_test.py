"""Import picture of the package: the core never loads ROS; world -> cost is one-way.

The core modules are imported in a fresh interpreter (this process has rclpy loaded already by
other tests) and its sys.modules is inspected afterwards.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "robot_sdf"
# The kernels package, in its dependency order: a module imports only modules before it.
KERNEL_MODULES = ("robot_sdf.kernels.warp_release", "robot_sdf.kernels.sign_data", "robot_sdf.kernels.closest_point",
                  "robot_sdf.kernels.portable", "robot_sdf.kernels.native", "robot_sdf.kernels.native_winding",
                  "robot_sdf.kernels.mesh_queries",
                  "robot_sdf.kernels.winding", "robot_sdf.kernels.signed_distance", "robot_sdf.kernels.slot_walk",
                  "robot_sdf.kernels.plain_cost", "robot_sdf.kernels.swept_slot", "robot_sdf.kernels.swept",
                  "robot_sdf.kernels.hessian")
CORE_MODULES = ("robot_sdf", "robot_sdf.kernels", *KERNEL_MODULES, "robot_sdf.warp_primitives", "robot_sdf.world",
                "robot_sdf.cost", "robot_sdf.geometry", "robot_sdf.io", "robot_sdf.scene",
                "robot_sdf.types", "robot_sdf.robot", "robot_sdf.tools.fit_spheres",
                "robot_sdf.ros")  # robot_sdf.ros itself imports nothing


def _is_ros_module(name: str) -> bool:
    top = name.split(".")[0]
    return (top in ("rclpy", "rosidl_parser", "rosidl_runtime_py", "tf2_ros", "ament_index_python",
                    "builtin_interfaces", "rcl_interfaces")
            or top.endswith("_msgs") or top.endswith("_srvs") or top.endswith("_interfaces"))


def test_core_imports_no_ros_module():
    code = ("import importlib, json, sys\n"
            f"for m in {CORE_MODULES!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    env_path = {"PYTHONPATH": str(REPO)}
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, **env_path), cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "robot_sdf.world" in loaded and "warp" in loaded  # the import really happened
    ros = [m for m in loaded if _is_ros_module(m)]
    assert ros == [], f"core modules loaded ROS modules: {ros}"


def test_ros_module_check_catches_a_ros_import():
    """The predicate above is not vacuous: it flags what the ROS layer loads."""
    assert _is_ros_module("rclpy.node") and _is_ros_module("geometry_msgs.msg")
    assert _is_ros_module("robot_sdf_interfaces.msg") and not _is_ros_module("robot_sdf.world")


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_client_lives_in_the_ros_layer():
    assert not (PACKAGE / "client.py").exists()
    assert (PACKAGE / "ros" / "client.py").is_file()


def test_cost_does_not_import_world_nor_touch_its_private_parts():
    imported = _imports(PACKAGE / "cost.py")
    assert not any(n == "robot_sdf.world" or n.startswith("robot_sdf.world.") for n in imported)
    tree = ast.parse((PACKAGE / "cost.py").read_text())
    private = sorted({n.attr for n in ast.walk(tree)
                      if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                      and n.value.id == "world" and n.attr.startswith("_")})
    assert private == [], f"cost.py uses private MeshWorld members: {private}"


def test_mesh_validation_lives_in_geometry():
    from robot_sdf import geometry, world

    assert not hasattr(world, "validate_mesh")
    import numpy as np
    import pytest

    v = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0]], dtype=np.float32)
    vv, tt = geometry.validate_mesh(v, [[0, 1, 2]])
    assert vv.dtype == np.float32 and tt.tolist() == [[0, 1, 2]]
    with pytest.raises(ValueError, match="non-zero area"):
        geometry.validate_mesh(np.zeros((3, 3)), [[0, 1, 2]])


def _discovered_core_modules() -> list[str]:
    """Every module of the core as it is on disk: robot_sdf/*.py and the kernels package (the ROS
    layer, the examples and the tools are other subpackages), so a module added later is covered
    without editing a list."""
    core = ["robot_sdf" if p.name == "__init__.py" else f"robot_sdf.{p.stem}" for p in PACKAGE.glob("*.py")]
    kernels = ["robot_sdf.kernels" if p.name == "__init__.py" else f"robot_sdf.kernels.{p.stem}"
               for p in (PACKAGE / "kernels").glob("*.py")]
    return sorted(core + kernels)


def test_every_core_module_imports_no_ros_module():
    modules = _discovered_core_modules()
    # the discovery found the core and the kernels
    assert {"robot_sdf", "robot_sdf.world", "robot_sdf.warp_primitives", "robot_sdf.kernels.native"} <= set(modules)
    code = ("import importlib, json, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))\n")
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=str(REPO)), cwd=REPO)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(modules) <= set(loaded)
    ros = [m for m in loaded if _is_ros_module(m)]
    assert ros == [], f"core modules loaded ROS modules: {ros}"


def test_kernel_modules_are_listed_in_dependency_order():
    """KERNEL_MODULES names every module of the kernels package, and each imports robot_sdf
    modules listed before it only (no cycle, the reading order of the package's docstring)."""
    on_disk = {f"robot_sdf.kernels.{p.stem}" for p in (PACKAGE / "kernels").glob("*.py") if p.name != "__init__.py"}
    assert set(KERNEL_MODULES) == on_disk
    for i, name in enumerate(KERNEL_MODULES):
        imported = {n for n in _imports(PACKAGE / "kernels" / f"{name.rsplit('.', 1)[1]}.py")
                    if n.startswith("robot_sdf.")}
        used = {n for n in imported if n in KERNEL_MODULES or not n.startswith("robot_sdf.kernels.")}
        later = sorted(n for n in used if n not in KERNEL_MODULES[:i])
        assert not later, f"{name} imports {later}, not listed before it"



def _module_graph() -> dict[str, set[str]]:
    """robot_sdf module -> the robot_sdf modules it imports anywhere in its file (function-level
    imports included): ``from robot_sdf import x`` counts as importing robot_sdf.x when x is a
    module."""
    files = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): p
             for p in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = set()
        for imported in _imports(path):
            if imported in files and imported != name and not name.startswith(imported + "."):
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycle_lazy_or_not():
    """The modules of robot_sdf import each other in one direction only, counting imports inside
    functions (a cycle hidden by a lazy import is still a cycle)."""
    graph = _module_graph()
    assert graph["robot_sdf.cost"] >= {"robot_sdf.ops", "robot_sdf.cost_inputs"}  # the graph is read
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph))}"
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_kernel_modules_are_short_and_tested():
    """No kernel module above 800 lines; each has its own test file test/<module>_test.py."""
    for name in KERNEL_MODULES:
        stem = name.rsplit(".", 1)[1]
        lines = len((PACKAGE / "kernels" / f"{stem}.py").read_text().splitlines())
        assert lines <= 800, f"{name}: {lines} lines"
        assert (REPO / "test" / f"{stem}_test.py").is_file(), f"{name} has no test/{stem}_test.py"
