"""robot_sdf.ros.world_updates with robot_sdf._internals' logging shortcut and its public fallback.

An applied update's log line goes through rclpy's C logging entry point (a private use, see
robot_sdf._internals.info_logger). Each way that entry point can change (an rclpy version it
was not checked on, the function gone, its arguments changed) must leave the update applied,
not turn it into an internal error, and log the same line through the public logger.info.

Each case runs in a child process (rcutils writes to the process's stderr, and the cases patch
rclpy's implementation module; rclpy's own logger keeps the entry point as it is, as it would
after such a change), with a log format that also prints the reported caller: the shortcut
reports WorldUpdates._log_applied's first line, which tells that it was taken.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import ros_helpers as rh
from robot_sdf import _internals

_CHILD = r"""
import sys
import numpy as np
import rclpy
from rclpy.impl.implementation_singleton import rclpy_implementation

import reference as ref
from robot_sdf import MeshWorld, _internals
from robot_sdf.ros.conversions import make_mesh_obstacle
from robot_sdf.ros.frames import FrameResolver
from robot_sdf.ros.health import HealthMonitor
from robot_sdf.ros.parameters import PARAMETERS, validate_values
from robot_sdf.ros.world_updates import WorldUpdates
from robot_sdf_interfaces.msg import MeshObstacle

import rclpy.impl.rcutils_logger as rcutils_logger

entry = rclpy_implementation.rclpy_logging_rcutils_log


class RclpysOwnView:  # what rclpy's own logger calls: the entry point as it is (rclpy changes with it)

    def __getattr__(self, name):
        return entry if name == "rclpy_logging_rcutils_log" else getattr(rclpy_implementation, name)


case = sys.argv[1]
if case == "unchecked_version":
    _internals.rclpy_shortcuts = lambda: False
elif case in ("entry_point_gone", "arguments_changed"):
    rcutils_logger._rclpy = RclpysOwnView()
    if case == "entry_point_gone":
        del rclpy_implementation.rclpy_logging_rcutils_log
    else:
        rclpy_implementation.rclpy_logging_rcutils_log = lambda severity, name, message: None

class Trim:
    def request(self):
        pass

rclpy.init()
config = validate_values(dict({p.name: p.default for p in PARAMETERS}, device="cpu"))
world = MeshWorld(device="cpu")
health = HealthMonitor()
updates = WorldUpdates(world, config, FrameResolver("world", None, 0.1, False), rclpy.logging.get_logger("sdf_server"),
                       health, Trim(), on_applied=lambda: None)
v, t = ref.box((0.2, 0.2, 0.2))
updates.apply_mesh_update(make_mesh_obstacle("box", v, t))
added = world.has_mesh("box", 0)
updates.apply_mesh_update(make_mesh_obstacle("box", None, None, operation=MeshObstacle.REMOVE))
level, problems, counts = health.status()
print("RESULT", added, world.has_mesh("box", 0), updates.rejected, counts["internal_errors"], repr(problems))
"""
CASES = ("shortcut", "unchecked_version", "entry_point_gone", "arguments_changed")
_LINE = re.compile(r"^\[INFO\] \[sdf_server\]: (?P<message>.*) <(?P<caller>\w+):(?P<line>\d+)>$")


def _run(case: str) -> tuple[list[tuple[str, str, int]], str]:
    env = dict(rh.ros_env(rh.domain_id(72)), RCUTILS_CONSOLE_OUTPUT_FORMAT="[{severity}] [{name}]: {message} "
                                                                             "<{function_name}:{line_number}>")
    env["PYTHONPATH"] = os.pathsep.join([str(rh.TEST_DIR), env["PYTHONPATH"]])
    out = subprocess.run([sys.executable, "-c", _CHILD, case], capture_output=True, text=True, timeout=240,
                         env=env, cwd=rh.REPO)
    assert out.returncode == 0, out.stderr
    lines = [m for m in map(_LINE.match, out.stderr.splitlines()) if m]
    result = next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))
    return [(m["message"], m["caller"], int(m["line"])) for m in lines], result


def test_the_shortcut_is_gated_by_the_rclpy_version():
    from importlib.metadata import version

    minor = ".".join(version("rclpy").split(".")[:2])
    assert _internals.rclpy_shortcuts() == (minor in _internals.SUPPORTED_RCLPY)


@pytest.mark.timeout(600)
def test_every_change_of_the_entry_point_still_applies_the_update_and_logs_the_same_line():
    from robot_sdf.ros.world_updates import WorldUpdates

    runs = {case: _run(case) for case in CASES}
    expected = ["MeshObstacle ADD 'box' env 0: 8 vertices, 12 triangles -> revision 1",
                "MeshObstacle REMOVE 'box' env 0: revision 2"]
    for case, (lines, result) in runs.items():
        # applied (present after the ADD, gone after the REMOVE), nothing rejected, no internal error
        assert result == "RESULT True False 0 0 ''", (case, result)
        assert [message for message, _, _ in lines] == expected, case
    first_line = WorldUpdates._log_applied.__code__.co_firstlineno
    shortcut = {(caller, line) for _, caller, line in runs["shortcut"][0]}
    if _internals.rclpy_shortcuts():
        assert shortcut == {("_log_applied", first_line)}
    for case in CASES[1:]:  # the public logger reports where logger.info was called instead
        assert all((caller, line) != ("_log_applied", first_line) for _, caller, line in runs[case][0]), case
