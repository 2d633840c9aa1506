"""``python -m bench.tf_bench [--quick] [--node-repo PATH]``: a frame that does not exist must not
delay the other updates.

A perception node publishing in a camera frame before its transform is broadcast (normal at
start-up): 30 MeshObstacle ADDs per second (3 ids at 10 Hz) in a frame tf does not know, while
valid ADDs of other ids (a small box, a new id each, world frame) arrive at 10 Hz. Quiet blocks
(valid ADDs alone) and flood blocks alternate so that both see the same machine load; the table
gives publish -> applied of the valid ADDs (wall-clock stamp here at publish against the node's
log stamp of the applied ADD, same machine clock) and the ratio of the p99s.

``--node-repo`` runs the node from another checkout (e.g. the main branch, for the figure before
a change); the default is this one. Own ROS domain, loopback discovery.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import yaml

from robot_sdf.ros.server_process import reserve_domain_id

REPO = Path(__file__).resolve().parents[1]
FLOOD_IDS = ("camera_person", "camera_chair", "camera_table")
FLOOD_HZ_PER_ID = 10.0
VALID_HZ = 10.0


def _start_node(repo: Path, workdir: Path, namespace: str) -> tuple[subprocess.Popen, Path]:
    from bench.ros_bench import _child_env

    params = workdir / "params.yaml"
    params.write_text(yaml.safe_dump({"/**": {"ros__parameters": {
        "device": "cpu", "max_distance": 0.5, "marker_rate_hz": 0.0, "slice_rate_hz": 0.0, "tf_timeout": 0.1}}}))
    log = workdir / "sdf_server.log"
    env = _child_env()
    env["PYTHONPATH"] = os.pathsep.join([str(repo)] + [p for p in env["PYTHONPATH"].split(os.pathsep) if p])
    proc = subprocess.Popen([sys.executable, "-m", "robot_sdf.ros.sdf_server", "--ros-args", "-r",
                             f"__ns:={namespace}", "--params-file", str(params)],
                            cwd=repo, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)
    return proc, log


def _message(name: str, frame: str, x: float, v: np.ndarray, t: np.ndarray):
    """MeshObstacle ADD of the box (v, t) at x, in ``frame``, stamped now."""
    from bench.ros_bench import mesh_message

    msg = mesh_message(name, v, t, np.array([x, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
    msg.header.frame_id = frame
    msg.header.stamp.sec, msg.header.stamp.nanosec = divmod(time.time_ns(), 1_000_000_000)
    return msg


def _flood(publisher, stop: threading.Event, v, t, sent: list[int]) -> None:
    period = 1.0 / (FLOOD_HZ_PER_ID * len(FLOOD_IDS))
    k = 0
    next_at = time.monotonic()
    while not stop.is_set():
        publisher.publish(_message(FLOOD_IDS[k % len(FLOOD_IDS)], "camera_optical", 0.0, v, t))
        k += 1
        next_at += period
        stop.wait(max(0.0, next_at - time.monotonic()))
    sent.append(k)


def run(quick: bool = False, node_repo: Path = REPO) -> None:
    import rclpy
    from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

    from bench import Stats, emit, load_average, scenes, section, table
    from bench.ros_bench import _APPLIED_RE
    from robot_sdf_interfaces.msg import MeshObstacle

    section("Unresolvable frames: 30 msgs/s in a frame tf does not know, valid ADDs of other ids alongside")
    namespace = f"/robot_sdf_tf_bench_{os.getpid()}"
    blocks, per_block = (2, 10) if quick else (8, 50)
    v, t = scenes.box((0.2, 0.2, 0.2), 0.2)
    with tempfile.TemporaryDirectory(prefix="robot_sdf_tf_bench_") as tmp:
        proc, log = _start_node(Path(node_repo), Path(tmp), namespace)
        rclpy.init()
        node = rclpy.create_node("tf_bench", namespace=namespace)
        qos = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        valid_pub = node.create_publisher(MeshObstacle, f"{namespace}/sdf_server/mesh_obstacles", qos)
        flood_pub = node.create_publisher(MeshObstacle, f"{namespace}/sdf_server/mesh_obstacles", qos)
        published: dict[str, tuple[str, float]] = {}
        flood_sent: list[int] = []
        try:
            deadline = time.monotonic() + 120.0
            while "ready:" not in log.read_text():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sdf_server did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)
            while valid_pub.get_subscription_count() == 0 or flood_pub.get_subscription_count() == 0:
                time.sleep(0.05)
            time.sleep(1.0)  # discovery settles
            for k in range(10):  # warm-up ADDs (first-use costs), not counted
                valid_pub.publish(_message(f"warmup_{k}", "world", -5.0 - 0.01 * k, v, t))
                time.sleep(1.0 / VALID_HZ)
            n = 0
            for b in range(blocks):
                kind = "quiet" if b % 2 == 0 else "flood"
                stop = threading.Event()
                flooder = None
                if kind == "flood":
                    flooder = threading.Thread(target=_flood, args=(flood_pub, stop, v, t, flood_sent), daemon=True)
                    flooder.start()
                    time.sleep(1.0)  # the flood runs before the valid ADDs start
                next_at = time.monotonic()
                for _ in range(per_block):
                    name = f"valid_{n}"
                    msg = _message(name, "world", 5.0 + 0.01 * n, v, t)
                    published[name] = (kind, time.time())
                    valid_pub.publish(msg)
                    n += 1
                    next_at += 1.0 / VALID_HZ
                    time.sleep(max(0.0, next_at - time.monotonic()))
                time.sleep(1.0)  # the last ADDs of the block apply
                stop.set()
                if flooder is not None:
                    flooder.join()
            time.sleep(2.0)
        finally:
            node.destroy_node()
            rclpy.try_shutdown()
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        text = log.read_text()
    latencies: dict[str, list[float]] = {"quiet": [], "flood": []}
    for line in text.splitlines():
        m = _APPLIED_RE.search(line)
        if m is not None and m.group(2) in published:
            kind, wall = published[m.group(2)]
            latencies[kind].append(float(m.group(1)) - wall)
    rejected = sum(1 for line in text.splitlines() if "rejected MeshObstacle ADD 'camera_" in line)
    rows = []
    for kind in ("quiet", "flood"):
        values = latencies[kind]
        expected = sum(1 for k, _ in published.values() if k == kind)
        p95, p99 = (np.percentile(values, [95, 99]) if values else (float("nan"),) * 2)
        rows.append([kind, f"{len(values)}/{expected}", Stats.of(values).ms() if values else "n/a",
                     f"{1e3 * p95:.1f}", f"{1e3 * p99:.1f}"])
    p95, p99 = ({k: float(np.percentile(x, q)) if x else float("nan") for k, x in latencies.items()} for q in (95, 99))
    emit(table(["valid ADDs", "applied/published", "publish -> applied ms", "p95 ms", "p99 ms"], rows))
    emit(f"\nflood / quiet p99: {p99['flood'] / p99['quiet']:.2f} (target <= 2), p95: "
         f"{p95['flood'] / p95['quiet']:.2f}; flood messages sent "
         f"{sum(flood_sent)}, rejection log lines {rejected} (identical ones within 1 s are folded); "
         f"node from {node_repo}; load average {load_average()}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tf_bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="few messages (smoke test)")
    parser.add_argument("--node-repo", type=Path, default=REPO, help="checkout to run the node from")
    args = parser.parse_args(argv)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    os.environ["ROS_DOMAIN_ID"] = str(reserve_domain_id(1 + (os.getpid() * 17 + 29) % 100))
    run(args.quick, args.node_repo.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
