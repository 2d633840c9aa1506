"""launch/sdf_server.launch.py and config/sdf_server.yaml are consistent with the node.

Without the `launch` package (the pip ROS wheels lack it) the launch file is checked
statically: it parses, names the right package/executable (setup.py's console script) and an
existing config file, and declares the `config` and `device` arguments. With `launch`
installed it is also imported and its description built. The shipped YAML must set exactly the
parameters the node declares, each with a comment, with values of the declared types that pass
the node's validation; a node started in-process from that file must report those values.
"""
from __future__ import annotations

import ast
import importlib.util
import re

import pytest
import rclpy
import yaml

import ros_helpers as rh
from robot_sdf.ros.parameters import DYNAMIC_PARAMETERS, PARAMETER_NAMES, PARAMETERS, validate_values

LAUNCH_FILE = rh.REPO / "launch" / "sdf_server.launch.py"


def _has_launch() -> bool:
    # find_spec("launch") is no test: the repository's launch/ folder is a namespace package.
    try:
        from launch import LaunchDescription  # noqa: F401
        from launch_ros.actions import Node  # noqa: F401
    except ImportError:
        return False
    return True


HAS_LAUNCH = _has_launch()
CONFIG_FILE = rh.REPO / "config" / "sdf_server.yaml"


def _launch_ast() -> ast.Module:
    return ast.parse(LAUNCH_FILE.read_text(), filename=str(LAUNCH_FILE))


def _module_constants(tree: ast.Module) -> dict[str, object]:
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = node.value.value
    return out


def _console_scripts() -> dict[str, str]:
    """name -> 'module:function' of setup.py's console_scripts (read without running setup)."""
    tree = ast.parse((rh.REPO / "setup.py").read_text())
    scripts = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            m = re.fullmatch(r"\s*([\w-]+)\s*=\s*([\w.]+:\w+)\s*", node.value)
            if m:
                scripts[m.group(1)] = m.group(2)
    return scripts


def test_launch_file_static():
    tree = _launch_ast()
    consts = _module_constants(tree)
    assert consts["PACKAGE"] == "robot_sdf"
    assert (rh.REPO / "config" / consts["CONFIG_NAME"]).is_file()
    assert any(isinstance(n, ast.FunctionDef) and n.name == "generate_launch_description" for n in tree.body)
    declared = {n.args[0].value for n in ast.walk(tree)
                if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "DeclareLaunchArgument"}
    assert {"config", "device"} <= declared
    # the executable it starts is setup.py's console script, pointing at the node's main()
    scripts = _console_scripts()
    assert scripts.get(consts["EXECUTABLE"]) == "robot_sdf.ros.sdf_server:main"
    assert scripts.get(consts["MANAGED_EXECUTABLE"]) == "robot_sdf.ros.lifecycle:main"
    from robot_sdf.ros import sdf_server

    assert callable(sdf_server.main)


@pytest.mark.skipif(not HAS_LAUNCH, reason="launch/launch_ros not installed (pip ROS wheels); "
                                            "checked statically and with stand-ins instead")
def test_launch_description_builds():  # pragma: no cover - needs a ROS install
    from launch import LaunchContext
    from launch.actions import DeclareLaunchArgument

    spec = importlib.util.spec_from_file_location("sdf_server_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    description = module.generate_launch_description()
    args = {a.name: a for a in description.entities if isinstance(a, DeclareLaunchArgument)}
    assert {"config", "device"} <= set(args)
    context = LaunchContext()
    context.launch_configurations.update(config=str(CONFIG_FILE), device="cpu", log_level="info", managed="false")
    (node,) = module._node(context)
    assert node.node_executable == "sdf_server" and node.node_package == "robot_sdf"


class _Recorder:
    """Stands in for a launch action: keeps its constructor arguments."""

    def __init__(self, *args, **kwargs) -> None:
        self.args, self.kwargs = args, kwargs


class _LaunchConfiguration(_Recorder):
    def perform(self, context: dict) -> str:
        return context[self.args[0]]


@pytest.mark.skipif(HAS_LAUNCH, reason="the real launch package is tested instead")
def test_launch_logic_with_stand_in_modules(monkeypatch):
    """Run the launch file's own logic against recording stand-ins of the launch API it uses."""
    import sys
    import types

    for name, attrs in {
        "launch": {"LaunchDescription": _Recorder},
        "launch.actions": {"DeclareLaunchArgument": _Recorder, "OpaqueFunction": _Recorder},
        "launch.substitutions": {"LaunchConfiguration": _LaunchConfiguration},
        "launch_ros": {},
        "launch_ros.actions": {"Node": _Recorder},
    }.items():
        monkeypatch.setitem(sys.modules, name, types.SimpleNamespace(**attrs))
    spec = importlib.util.spec_from_file_location("sdf_server_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    (entities,) = module.generate_launch_description().args
    args = {e.args[0]: e.kwargs for e in entities if "default_value" in e.kwargs}
    assert set(args) == {"config", "device", "log_level", "managed"}
    from pathlib import Path

    assert Path(args["config"]["default_value"]).resolve() == CONFIG_FILE.resolve()
    assert args["device"]["default_value"] == ""
    opaque = entities[-1].kwargs["function"]
    assert args["managed"]["default_value"] == "false"
    for device, expected in (("", [str(CONFIG_FILE)]), ("cuda:1", [str(CONFIG_FILE), {"device": "cuda:1"}])):
        (node,) = opaque({"config": str(CONFIG_FILE), "device": device, "log_level": "warn", "managed": "false"})
        assert node.kwargs["package"] == "robot_sdf" and node.kwargs["executable"] == "sdf_server"
        assert node.kwargs["parameters"] == expected
        assert node.kwargs["ros_arguments"] == ["--log-level", "warn"]
    (node,) = opaque({"config": str(CONFIG_FILE), "device": "", "log_level": "info", "managed": "true"})
    assert node.kwargs["executable"] == "sdf_server_managed" and node.kwargs["name"] == "sdf_server"


def _config() -> dict:
    data = yaml.safe_load(CONFIG_FILE.read_text())
    assert list(data) == ["sdf_server"] and list(data["sdf_server"]) == ["ros__parameters"]
    return data["sdf_server"]["ros__parameters"]


def test_config_matches_declared_parameters():
    params = _config()
    assert set(params) == set(PARAMETER_NAMES)
    for spec in PARAMETERS:
        value = params[spec.name]
        assert type(value) is type(spec.default), f"{spec.name}: {value!r} is not {type(spec.default).__name__}"
        if isinstance(value, list):
            assert all(isinstance(x, float) for x in value), spec.name
    config = validate_values(params)
    assert config.scene_file == ""


def test_config_every_parameter_has_a_comment():
    lines = CONFIG_FILE.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^    (\w+):", line)
        if m:
            assert lines[i - 1].strip().startswith("#"), f"parameter '{m.group(1)}' has no comment above it"
    # "[run time]" in a parameter's comment block marks exactly the dynamic parameters
    marked = set()
    for i, line in enumerate(lines):
        m = re.match(r"^    (\w+):", line)
        if m:
            k = i - 1
            while k >= 0 and lines[k].strip().startswith("#"):
                if "[run time]" in lines[k]:
                    marked.add(m.group(1))
                k -= 1
    assert marked == set(DYNAMIC_PARAMETERS)
    text = CONFIG_FILE.read_text()
    for method in ("default", "normal", "winding_number", "parity"):
        assert re.search(rf"#\s+{method}\s", text), f"sign_method '{method}' not documented"


def test_node_starts_from_shipped_config():
    from robot_sdf.ros.sdf_server import SdfServer

    ctx = rclpy.Context()
    rclpy.init(args=["--ros-args", "--params-file", str(CONFIG_FILE), "-p", "device:=cpu"],
               context=ctx, domain_id=rh.domain_id(53))
    try:
        node = SdfServer(context=ctx)
        try:
            expected = dict(_config(), device="cpu")  # the command-line override wins
            names = set(node._parameters) - {"use_sim_time", "start_type_description_service"}
            assert names == set(expected)
            for name, value in expected.items():
                got = node.get_parameter(name).value
                assert (list(got) if isinstance(value, list) else got) == value, name
            for desc in node.describe_parameters(sorted(names)):
                assert desc.description and desc.read_only == (desc.name not in DYNAMIC_PARAMETERS), desc.name
            assert str(node.world.device) == "cpu"
        finally:
            node.destroy_node()
    finally:
        rclpy.try_shutdown(context=ctx)
