"""robot_sdf.ros.node_process: the node's process stops cleanly on SIGINT.

The node is started the way ``ros2 launch`` starts it (launch_ros' Node action: ``--ros-args
--log-level info -r __node:=sdf_server --params-file <file>``, stdout and stderr not a
terminal) and stopped the way the launcher stops it, with one SIGINT. A clean stop exits with
code 0 and writes nothing to stderr but the node's own INFO lines: under ``ros2 launch`` every
stderr line is shown to the operator, and a stray "The following exception was never retrieved"
or a thread's traceback reads as a crash.

The shutdown is tested while the node is busy, because the races it had only show then: its
periodic publishers run at 100 Hz (a timer callback handed to an executor thread at almost any
moment), clients call a service continuously, and poses and transforms stream into the
world-update and transform threads.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray
from geometry_msgs.msg import TransformStamped
from sensor_msgs.msg import PointCloud2
from visualization_msgs.msg import MarkerArray

import reference as ref
import ros_helpers as rh
from robot_sdf.ros.conversions import float32_array, make_mesh_obstacle, make_obstacle_pose
from robot_sdf.ros.frames import tf2_msgs_available
from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
from robot_sdf_interfaces.srv import QuerySignedDistance

# The node's own log lines (rcutils' default format, no colour) and Warp's notice on a machine
# without a CUDA driver: everything else on stderr is a failure.
_OWN_LINE = re.compile(r"^\[(DEBUG|INFO)\] \[\d+\.\d+\] \[sdf_server[\w.]*\]: ")
_WARP_NOTICE = re.compile(r"^Warp CUDA warning: Could not find or load the NVIDIA CUDA driver")
FAST_HZ = 100.0


def _start_as_ros2_launch_does(tmp_path, domain: int):
    params = rh.write_params(tmp_path / "params.yaml", {
        "device": "cpu", "marker_rate_hz": FAST_HZ, "slice_rate_hz": FAST_HZ, "diagnostics_rate_hz": FAST_HZ,
        "slice_resolution": 0.05})
    cmd = [sys.executable, "-m", "robot_sdf.ros.sdf_server", "--ros-args", "--log-level", "info",
           "-r", "__node:=sdf_server", "--params-file", str(params)]
    out = open(tmp_path / "stdout.txt", "w")
    err = open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen(cmd, env=rh.ros_env(domain), cwd=rh.REPO, stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL)
    out.close()
    err.close()
    return proc


def _stream(harness, stop: threading.Event) -> None:
    """Poses of 'box' and transforms of 'gripper' at ~200 Hz until ``stop`` (at most 120 s)."""
    poses = harness.publisher(ObstaclePose, "/sdf_server/obstacle_poses", 10)
    if tf2_msgs_available():
        from tf2_msgs.msg import TFMessage

        tf_pub = harness.publisher(TFMessage, "/tf", 100)
        send_tf = lambda t: tf_pub.publish(TFMessage(transforms=[t]))  # noqa: E731
    else:
        tf_pub = harness.publisher(TransformStamped, "/sdf_server/transforms", 100)
        send_tf = tf_pub.publish
    deadline = time.monotonic() + 120.0
    k = 0
    while not stop.is_set() and time.monotonic() < deadline:
        k += 1
        poses.publish(make_obstacle_pose("box", np.array([0.01 * (k % 50), 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])))
        t = TransformStamped()
        t.header.frame_id, t.child_frame_id = "world", "gripper"
        t.header.stamp = harness.node.get_clock().now().to_msg()
        t.transform.rotation.w = 1.0
        send_tf(t)
        stop.wait(0.005)


def _call_continuously(harness, client, stop: threading.Event) -> None:
    """Keep one signed-distance request in flight until ``stop`` (at most 120 s)."""
    request = QuerySignedDistance.Request(points=float32_array(np.zeros((200, 3), np.float32).reshape(-1)))
    deadline = time.monotonic() + 120.0
    while not stop.is_set() and time.monotonic() < deadline:
        done = threading.Event()
        client.call_async(request).add_done_callback(lambda _: done.set())
        done.wait(1.0)


def test_sigint_under_load_exits_0_and_writes_no_exception_to_stderr(tmp_path):
    domain = rh.domain_id(71)
    harness = rh.RosHarness(domain, "shutdown_test")
    proc = _start_as_ros2_launch_does(tmp_path, domain)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        client = harness.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
        deadline = time.monotonic() + rh.SERVICE_TIMEOUT_S
        while not client.wait_for_service(timeout_sec=0.2):  # the node is up: its services exist
            assert proc.poll() is None, f"node exited with {proc.returncode}:\n{(tmp_path / 'stderr.txt').read_text()}"
            assert time.monotonic() < deadline, "the node's services did not appear"
        # subscribers, so that the periodic publishers do their work (they skip it for nobody)
        markers = harness.subscribe(MarkerArray, "/sdf_server/markers", rh.MARKER_QOS)
        diagnostics = harness.subscribe(DiagnosticArray, "/diagnostics")
        harness.subscribe(PointCloud2, "/sdf_server/distance_slice")
        meshes = harness.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", rh.MESH_QOS)
        v, t = ref.box((0.2, 0.2, 0.2))
        meshes.publish(make_mesh_obstacle("box", v, t))
        rh.wait_until(lambda: harness.signed_distance(client, [[0.0, 0.0, 0.0]])[1] >= 1, 60.0, what="the box")
        threads = [threading.Thread(target=_stream, args=(harness, stop), daemon=True),
                   threading.Thread(target=_call_continuously, args=(harness, client, stop), daemon=True)]
        for thread in threads:
            thread.start()
        # the load is flowing when markers and diagnostics arrive, newer than the box
        markers.wait_for(lambda m: len(m.markers) > 0, 60.0)
        n = len(diagnostics.snapshot())
        rh.wait_until(lambda: len(diagnostics.snapshot()) >= n + 20, 60.0, what="20 more diagnostics messages")
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=10.0)
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10.0)
        harness.close()
    stderr = (tmp_path / "stderr.txt").read_text()
    assert code == 0, f"exit code {code} after SIGINT:\n{stderr}"
    assert "never retrieved" not in stderr and "Traceback" not in stderr, stderr
    foreign = [line for line in stderr.splitlines() if not (_OWN_LINE.match(line) or _WARP_NOTICE.match(line))]
    assert foreign == [], "stderr lines other than the node's own INFO lines:\n" + "\n".join(foreign)
    assert "ready:" in stderr  # the check above read the node's real log


# The console script's main in a fresh interpreter whose rclpy.init ends the process with
# status 3: a --help that starts the node shows as that status instead of a node left running.
_MAIN_WITHOUT_RCLPY_INIT = """
import sys
import rclpy

def _no_init(*args, **kwargs):
    print("rclpy.init called", file=sys.stderr, flush=True)
    raise SystemExit(3)

rclpy.init = _no_init
from robot_sdf.ros.{module} import main
sys.argv = {argv!r}
sys.exit(main())
"""


@pytest.mark.parametrize("module, argv", [
    ("sdf_server", ["sdf_server", "--help"]),
    ("sdf_server", ["sdf_server", "--ros-args", "-p", "device:=cpu", "--", "-h"]),
    ("lifecycle", ["sdf_server_managed", "-h"]),
])
def test_help_prints_usage_and_exits_0_without_starting_rclpy(module, argv):
    """``sdf_server --help`` (and -h, and the managed variant's) prints the usage, how to pass
    ROS arguments and every parameter the node declares, and exits 0 without initialising
    rclpy."""
    from robot_sdf.ros.parameters import PARAMETERS

    code = _MAIN_WITHOUT_RCLPY_INIT.format(module=module, argv=argv)
    out = subprocess.run([sys.executable, "-c", code], env=rh.ros_env(0), cwd=rh.REPO, capture_output=True,
                         text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stderr
    assert "rclpy.init called" not in out.stderr
    assert out.stdout.startswith(f"usage: {argv[0]} "), out.stdout[:200]
    assert "--ros-args" in out.stdout and "--params-file" in out.stdout and "-p name:=value" in out.stdout
    for spec in PARAMETERS:
        assert re.search(rf"^  {spec.name}\b", out.stdout, re.M), spec.name


def test_help_flag_is_looked_for_outside_the_ros_arguments():
    from robot_sdf.ros.node_process import help_requested

    assert help_requested(["sdf_server", "--help"]) and help_requested(["sdf_server", "-h"])
    assert help_requested(["sdf_server", "--ros-args", "-p", "a:=1", "--", "--help"])
    assert not help_requested(["sdf_server"])
    assert not help_requested(["sdf_server", "--ros-args", "-r", "__node:=-h"])
    assert not help_requested(["sdf_server", "--ros-args", "-p", "state_dir:=--help"])
