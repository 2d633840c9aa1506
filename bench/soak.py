"""``make soak`` / ``python -m bench.soak``: load, fault and memory checks of a real sdf_server.

Everything runs on loopback (ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST) in a private ROS domain;
every process this script starts is stopped by its pid before it returns.

Parts (``--only`` picks some, default all):

- ``load``: for ``--duration`` seconds, mesh ADDs at ``--mesh-hz`` (a deforming perception mesh:
  same-topology updates refit, every 10th changes topology), ObstaclePose at ``--pose-hz``, and
  ``--clients`` clients calling evaluate_sphere_cost (1000 spheres) at ``--client-hz`` each.
  Prints calls answered/failed, latency percentiles, publish->applied percentiles (the node's
  stamp->applied window, sampled every second), node RSS over time, lost updates (published vs
  received by the node, and the final geometry against the last one published) and torn
  responses (two answers at the same world revision to the same request that differ, or arrays
  of the wrong length).
- ``faults``: a client SIGKILLed mid-request (2M spheres); the node SIGKILLed and restarted with
  a state_dir (its answers before and after must be identical); a producer (ScenePublisher)
  SIGKILLed and replaced; two producers racing on one id (the later stamp must win).
- ``burst``: ``--burst`` distinct ids published back to back, all must be applied.
- ``memory``: node RSS empty, peak and after 10M- and 50M-sphere requests (refused by the size
  limit, then accepted with the limit raised), after 40 distinct 200k-triangle meshes were
  ADDed and REMOVEd, and for a 5M-triangle mesh refused by max_triangles_per_mesh.
- ``perception``: a room of 1024 block meshes; ``--blocks-per-tick`` (50) changed blocks
  re-published (ADD of new geometry per block id) at ``--perception-hz`` (10) for ``--duration``
  seconds while ``--clients`` clients query; query p50/p99 against the same room when quiet
  (``--perception-quiet`` seconds first), publish->applied percentiles, lost updates.
- ``stall``: 1000-sphere query latency while a 1M-triangle mesh is being added, against its
  quiet p99.
"""
from __future__ import annotations

import argparse
import hashlib
import json
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
NODE = "/sdf_server"
MAX_D = 0.5
GEOMETRY_CACHE_MB = 16  # the node's default


# ------------------------------------------------------------------------------ processes
def child_env(domain: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1",
               RCUTILS_LOGGING_BUFFERED_STREAM="0", RCUTILS_COLORIZED_OUTPUT="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


class NodeProc:
    """sdf_server as a subprocess with a params file in ``workdir``."""

    def __init__(self, workdir: Path, domain: int, params: dict, tag: str = "node") -> None:
        from robot_sdf.ros.server_process import ServerProcess

        workdir.mkdir(parents=True, exist_ok=True)
        pf = workdir / f"{tag}_params.yaml"
        pf.write_text(yaml.safe_dump({"sdf_server": {"ros__parameters": params}}))
        self.server = ServerProcess(pf, workdir / f"{tag}.log", child_env(domain), cwd=REPO)
        self.server.wait_ready(120)

    @property
    def pid(self) -> int:
        return self.server.proc.pid

    def rss_mb(self) -> float:
        return _status_kb(self.pid, "VmRSS") / 1024

    def peak_mb(self) -> float:
        return _status_kb(self.pid, "VmHWM") / 1024

    def reset_peak(self) -> None:
        try:
            Path(f"/proc/{self.pid}/clear_refs").write_text("5")
        except OSError:
            pass

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        self.server.proc.wait(10)
        self.server.stop()

    def stop(self) -> int:
        return self.server.stop()


def _status_kb(pid: int, key: str) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return float(line.split()[1])
    except OSError:
        pass
    return float("nan")


def handshake(pub, node: NodeProc, tag: str) -> int:
    """Wait until the node's reader has matched ``pub`` (not only the publisher the reader): a
    REMOVE of an unknown id, repeated until the node logs its rejection (changes nothing)."""
    from robot_sdf.ros.conversions import make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle

    deadline = time.monotonic() + 30
    sent = 0
    while f"no mesh 'sync_{tag}'" not in node.server.log():
        if time.monotonic() > deadline:
            raise RuntimeError("the node never received the handshake")
        pub.publish(make_mesh_obstacle(f"sync_{tag}", None, None, operation=MeshObstacle.REMOVE))
        sent += 1
        time.sleep(0.2)
    return sent  # every one reaches the node (transient_local covers the early ones)


def pct(values, qs=(50, 99)) -> str:
    if len(values) == 0:
        return "n/a"
    a = 1e3 * np.asarray(values)
    return ", ".join(f"p{q} {np.percentile(a, q):.1f}" for q in qs) + f", max {a.max():.1f} ms (n={len(a)})"


# ------------------------------------------------------------------------------ ROS side
class Ros:
    """One rclpy context + node spun in a background thread; blocking service calls."""

    def __init__(self, domain: int, name: str = "soak") -> None:
        import rclpy
        from rclpy.executors import MultiThreadedExecutor

        self.rclpy = rclpy
        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=domain)
        self.node = rclpy.create_node(f"{name}_{os.getpid()}", context=self.context)
        self.executor = MultiThreadedExecutor(num_threads=4, context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self._spin, daemon=True)
        self.thread.start()

    def _spin(self) -> None:
        try:
            self.executor.spin()
        except Exception:  # noqa: BLE001 - shut down
            pass

    def call(self, client, request, timeout: float = 30.0):
        done = threading.Event()
        future = client.call_async(request)
        future.add_done_callback(lambda _: done.set())
        if not done.wait(timeout):
            client.remove_pending_request(future)
            return None
        return future.result()

    def close(self) -> None:
        self.executor.shutdown(timeout_sec=2.0)
        self.node.destroy_node()
        self.rclpy.try_shutdown(context=self.context)


def _sd_client(ros: Ros):
    from robot_sdf_interfaces.srv import QuerySignedDistance

    cli = ros.node.create_client(QuerySignedDistance, f"{NODE}/query_signed_distance")
    cli.wait_for_service(timeout_sec=60)
    return cli


def distances(ros: Ros, cli, points, retries: int = 4):
    from robot_sdf.ros.conversions import float32_array
    from robot_sdf_interfaces.srv import QuerySignedDistance

    req = QuerySignedDistance.Request(points=float32_array(np.asarray(points, np.float32).reshape(-1)))
    for _ in range(retries):  # the first response after a (re)start can be lost (ROS 2 service race)
        resp = ros.call(cli, req, timeout=5.0)
        if resp is not None:
            assert resp.success, resp.message
            return np.frombuffer(resp.distance, np.float32).copy(), int(resp.world_revision)
    raise RuntimeError("no answer from query_signed_distance")


def _cost_request(spheres: np.ndarray):
    from robot_sdf.ros.conversions import float32_array
    from robot_sdf_interfaces.srv import EvaluateSphereCost

    req = EvaluateSphereCost.Request()
    req.batch, req.horizon, req.spheres_per_step = 1, 1, int(spheres.shape[0])
    req.spheres = float32_array(spheres.reshape(-1))
    req.compute_gradient = True
    return req


def _box(size):
    h = np.asarray(size, np.float32) / 2
    v = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], np.float32) * h
    t = np.array([[0, 1, 3], [0, 3, 2], [4, 6, 7], [4, 7, 5], [0, 4, 5], [0, 5, 1],
                  [2, 3, 7], [2, 7, 6], [0, 2, 6], [0, 6, 4], [1, 5, 7], [1, 7, 3]], np.uint32)
    return v, t


def _grid_sheet(n: int, phase: float, rows: int | None = None):
    """A deforming sheet (perception-like open mesh) with 2 n^2 triangles; rows changes topology."""
    rows = rows or n
    x, y = np.meshgrid(np.linspace(-0.5, 0.5, n + 1), np.linspace(-0.5, 0.5, rows + 1), indexing="ij")
    z = 0.05 * np.sin(6 * x + phase) * np.cos(4 * y)
    v = np.stack([x, y, z], -1).reshape(-1, 3).astype(np.float32)
    idx = np.arange((n + 1) * (rows + 1)).reshape(n + 1, rows + 1)
    a, b, c, d = idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]
    t = np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3), np.stack([a, c, d], -1).reshape(-1, 3)]).astype(np.uint32)
    return v, t


# ------------------------------------------------------------------------------ load
def run_load(workdir: Path, domain: int, args) -> dict:
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle, make_obstacle_pose
    from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose
    from robot_sdf_interfaces.srv import EvaluateSphereCost

    print(f"\n## Load: {args.duration:.0f} s, mesh ADDs {args.mesh_hz} Hz, poses {args.pose_hz} Hz, "
          f"{args.clients} clients x {args.client_hz} Hz x 1000 spheres")
    node = NodeProc(workdir / "load", domain, dict(device="cpu", marker_rate_hz=2.0, slice_rate_hz=0.0,
                                                   diagnostics_rate_hz=1.0, max_distance=MAX_D))
    ros = Ros(domain)
    try:
        mesh_pub = ros.node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
        pose_pub = ros.node.create_publisher(ObstaclePose, f"{NODE}/obstacle_poses", 10)
        diags: list[dict] = []
        ros.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: diags.append({kv.key: kv.value for kv in m.status[0].values}) if m.status else None,
            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        sd = _sd_client(ros)
        while mesh_pub.get_subscription_count() == 0:
            time.sleep(0.05)
        handshakes = handshake(mesh_pub, node, "load")
        bv, bt = _box((0.3, 0.3, 0.3))
        mesh_pub.publish(make_mesh_obstacle("mover", bv, bt, [1.0, 0, 0.3, 1, 0, 0, 0]))
        clients = [ros.node.create_client(EvaluateSphereCost, f"{NODE}/evaluate_sphere_cost") for _ in range(args.clients)]
        for c in clients:
            c.wait_for_service(timeout_sec=60)
        rng = np.random.default_rng(0)
        spheres = np.concatenate([rng.uniform(-0.7, 1.3, (1000, 3)), np.full((1000, 1), 0.05)], 1).astype(np.float32)
        spheres[:, 2] = rng.uniform(-0.2, 0.5, 1000)
        request = _cost_request(spheres)
        stop = threading.Event()
        stats = {"published": 0, "poses": 0, "last": None}
        latencies = [[] for _ in clients]
        failed = [0] * len(clients)
        answers: dict[int, str] = {}
        torn = [0]
        answers_lock = threading.Lock()
        rss: list[tuple[float, float]] = []
        t_start = time.monotonic()

        def producer():
            k = 0
            while not stop.is_set():
                rows = 40 if k % 10 == 9 else 30  # every 10th: new topology (rebuild), else refit
                v, t = _grid_sheet(30, 0.1 * k, rows)
                msg = make_mesh_obstacle("perception", v, t, [0.0, 0.0, 0.0, 1, 0, 0, 0])
                # stamped right before publishing: publish -> applied excludes building the message
                msg.header.stamp = ros.node.get_clock().now().to_msg()
                mesh_pub.publish(msg)
                stats["published"] += 1
                stats["last"] = (v, t)
                k += 1
                stop.wait(1.0 / args.mesh_hz)

        def poser():
            k = 0
            while not stop.is_set():
                pose_pub.publish(make_obstacle_pose("mover", [1.0 + 0.1 * np.sin(0.05 * k), 0, 0.3, 1, 0, 0, 0]))
                stats["poses"] += 1
                k += 1
                stop.wait(1.0 / args.pose_hz)

        def client(i):
            while not stop.is_set():
                t0 = time.perf_counter()
                resp = ros.call(clients[i], request, timeout=10.0)
                dt = time.perf_counter() - t0
                if resp is None or not resp.success:
                    failed[i] += 1
                else:
                    latencies[i].append(dt)
                    if len(resp.cost) != 1000 or len(resp.gradient) != 3000:
                        torn[0] += 1
                    else:
                        digest = hashlib.blake2b(bytes(resp.cost) + bytes(resp.gradient), digest_size=16).hexdigest()
                        with answers_lock:
                            seen = answers.setdefault(int(resp.world_revision), digest)
                            torn[0] += seen != digest
                stop.wait(max(0.0, 1.0 / args.client_hz - dt))

        def sampler():
            while not stop.is_set():
                rss.append((time.monotonic() - t_start, node.rss_mb()))
                stop.wait(1.0)

        threads = [threading.Thread(target=f, daemon=True) for f in (producer, poser, sampler)]
        threads += [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(clients))]
        for th in threads:
            th.start()
        time.sleep(args.duration)
        stop.set()
        for th in threads:
            th.join(15)
        # let the queue drain, then the final check
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            time.sleep(1.2)
            if diags and diags[-1]["updates_pending"] == "0":
                break
        final = diags[-1] if diags else {}
        received = int(final.get("updates_enqueued", 0)) - 1 - handshakes  # minus "mover" and handshakes
        v, t = stats["last"]
        pts = v[::97] + np.array([0.0, 0.0, 0.02], np.float32)
        got, _ = distances(ros, sd, pts)
        # the last sheet's distance at points 2 cm above its own vertices: <= 2 cm, > 0
        final_ok = bool(np.all(got <= 0.0201) and np.all(got > 0.0))
        calls = sum(len(x) for x in latencies)
        p99s = [float(d.get("update_applied_p99_ms", "nan")) for d in diags]
        maxes = [float(d.get("update_applied_max_ms", "nan")) for d in diags]
        print(f"- calls answered {calls}, failed {sum(failed)}; latency {pct(np.concatenate(latencies))}")
        print(f"- mesh updates published {stats['published']}, received by the node {received}, lost "
              f"{stats['published'] - received}; coalesced {final.get('updates_coalesced')}, stale skipped "
              f"{final.get('updates_stale_skipped')}; final geometry is the last published: {final_ok}")
        print(f"- poses published {stats['poses']} (best effort)")
        print(f"- publish->applied (node window at the end): p50 {final.get('update_applied_p50_ms')} ms, "
              f"p99 {final.get('update_applied_p99_ms')} ms, max {final.get('update_applied_max_ms')} ms; "
              f"worst per-second p99 {np.nanmax(p99s) if p99s else float('nan'):.1f} ms, "
              f"worst max {np.nanmax(maxes) if maxes else float('nan'):.1f} ms")
        print(f"- of which publish->received (subscription callback): p50 {final.get('update_received_p50_ms')} ms, "
              f"p99 {final.get('update_received_p99_ms')} ms, max {final.get('update_received_max_ms')} ms; "
              f"apply time per update p50 {final.get('update_apply_p50_ms')} ms, p99 {final.get('update_apply_p99_ms')} "
              f"ms, max {final.get('update_apply_max_ms')} ms")
        print(f"- torn responses {torn[0]} (distinct revisions answered {len(answers)})")
        step = max(1, len(rss) // 10)
        print("- node RSS MB over time: " + ", ".join(f"{t:.0f}s {m:.0f}" for t, m in rss[::step]))
        return {"failed": sum(failed), "lost": stats["published"] - received, "torn": torn[0], "final_ok": final_ok}
    finally:
        ros.close()
        node.stop()


# ------------------------------------------------------------------------------ perception stream
def _room_blocks() -> tuple[list[str], np.ndarray]:
    """(ids, (N,3) centres) of the blocks of a 8 x 8 m room: the floor (16 x 16 blocks of 0.5 m)
    and four walls (16 columns x 12 rows each): 1024 blocks, as a TSDF/mesh-block mapper meshes a
    room (one mesh per block)."""
    g = 0.5 * (np.arange(16) - 7.5)
    centres = [(x, y, 0.0) for x in g for y in g]
    for row in range(12):
        z = 0.25 + 0.5 * row
        centres += [(x, -4.0, z) for x in g] + [(x, 4.0, z) for x in g]
        centres += [(-4.0, y, z) for y in g] + [(4.0, y, z) for y in g]
    return [f"block{i}" for i in range(len(centres))], np.asarray(centres, np.float64)


def _block_mesh(rng: np.random.Generator):
    """A block's surface piece: a closed 0.45 x 0.45 x 0.08 m slab whose corners move by up to
    1 cm on every re-mesh (new content: the node builds a new geometry for every ADD)."""
    v, t = _box((0.45, 0.45, 0.08))
    return (v + rng.uniform(-0.01, 0.01, v.shape)).astype(np.float32), t


def run_perception(workdir: Path, domain: int, args) -> dict:
    """Perception soak: a perception-style producer keeps ~1000 block meshes of a room and re-publishes
    ``--blocks-per-tick`` changed blocks (ADD of new geometry per block id) at ``--perception-hz``
    while clients query; query latency against the same world when it is quiet."""
    from diagnostic_msgs.msg import DiagnosticArray
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle
    from robot_sdf_interfaces.srv import EvaluateSphereCost

    rng = np.random.default_rng(14)
    ids, centres = _room_blocks()
    quiet_s, stream_s = args.perception_quiet, args.duration
    print(f"\n## Perception stream: {len(ids)} block meshes, {args.blocks_per_tick} changed blocks re-published "
          f"at {args.perception_hz:g} Hz for {stream_s:.0f} s ({quiet_s:.0f} s quiet before), {args.clients} clients "
          f"x {args.client_hz:g} Hz x 1000 spheres")
    node = NodeProc(workdir / "perception", domain, dict(device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0,
                                                         diagnostics_rate_hz=1.0, max_distance=MAX_D,
                                                         mesh_capacity=len(ids) + 16))
    ros = Ros(domain, "perception")
    try:
        pub = ros.node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
        diags: list[dict] = []
        ros.node.create_subscription(
            DiagnosticArray, "/diagnostics",
            lambda m: diags.append({kv.key: kv.value for kv in m.status[0].values}) if m.status else None,
            QoSProfile(depth=100, reliability=ReliabilityPolicy.RELIABLE))
        sd = _sd_client(ros)
        while pub.get_subscription_count() == 0:
            time.sleep(0.05)
        handshakes = handshake(pub, node, "perception")
        t0 = time.perf_counter()
        for name, c in zip(ids, centres):
            pub.publish(make_mesh_obstacle(name, *_block_mesh(rng), [*c, 1, 0, 0, 0]))
        rev = 0
        deadline = time.monotonic() + 300
        while rev < len(ids) and time.monotonic() < deadline:
            time.sleep(0.5)
            rev = distances(ros, sd, [[100, 100, 100]])[1]
        print(f"- room of {len(ids)} blocks applied (revision {rev}) {time.perf_counter() - t0:.1f} s after the "
              "first ADD")
        clients = [ros.node.create_client(EvaluateSphereCost, f"{NODE}/evaluate_sphere_cost")
                   for _ in range(args.clients)]
        for c in clients:
            c.wait_for_service(timeout_sec=60)
        # A robot in the middle of the room, its spheres down to the floor blocks.
        spheres = np.concatenate([rng.uniform([-1.0, -1.0, 0.0], [1.0, 1.0, 1.2], (1000, 3)),
                                  np.full((1000, 1), 0.05)], 1).astype(np.float32)
        request = _cost_request(spheres)
        phase = {"name": "quiet"}
        latencies: dict[str, list[float]] = {"quiet": [], "stream": []}
        failed = [0]
        stop = threading.Event()
        streaming = threading.Event()
        published = [0]

        def client(i):
            while not stop.is_set():
                t_call = time.perf_counter()
                resp = ros.call(clients[i], request, timeout=10.0)
                dt = time.perf_counter() - t_call
                if resp is None or not resp.success:
                    failed[0] += 1
                else:
                    latencies[phase["name"]].append(dt)
                stop.wait(max(0.0, 1.0 / args.client_hz - dt))

        def producer():
            streaming.wait()
            period = 1.0 / args.perception_hz
            next_tick = time.monotonic()
            while not stop.is_set():
                for k in rng.choice(len(ids), args.blocks_per_tick, replace=False):
                    msg = make_mesh_obstacle(ids[k], *_block_mesh(rng), [*centres[k], 1, 0, 0, 0])
                    msg.header.stamp = ros.node.get_clock().now().to_msg()
                    pub.publish(msg)
                    published[0] += 1
                next_tick += period
                stop.wait(max(0.0, next_tick - time.monotonic()))

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(clients))]
        threads.append(threading.Thread(target=producer, daemon=True))
        for th in threads:
            th.start()
        time.sleep(quiet_s)
        n_diag = len(diags)
        phase["name"] = "stream"
        streaming.set()
        time.sleep(stream_s)
        stop.set()
        for th in threads:
            th.join(15)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(1.2)
            if diags and diags[-1].get("updates_pending") == "0":
                break
        final = diags[-1] if diags else {}
        stream_diags = diags[n_diag:]
        received = int(final.get("updates_enqueued", 0)) - len(ids) - handshakes
        p50s = [float(d.get("update_applied_p50_ms", "nan")) for d in stream_diags]
        p99s = [float(d.get("update_applied_p99_ms", "nan")) for d in stream_diags]
        quiet_p99 = float(np.percentile(latencies["quiet"], 99)) if latencies["quiet"] else float("nan")
        stream_p99 = float(np.percentile(latencies["stream"], 99)) if latencies["stream"] else float("nan")
        print(f"- query latency quiet: {pct(latencies['quiet'])}")
        print(f"- query latency while streaming: {pct(latencies['stream'])}; p99 stream / quiet "
              f"{stream_p99 / quiet_p99:.2f}x; failed calls {failed[0]}")
        print(f"- block ADDs published {published[0]}, received by the node {received}, coalesced "
              f"{final.get('updates_coalesced')}, stale skipped {final.get('updates_stale_skipped')}")
        print(f"- publish->applied (node window at the end of the stream): p50 {final.get('update_applied_p50_ms')} ms, "
              f"p99 {final.get('update_applied_p99_ms')} ms, max {final.get('update_applied_max_ms')} ms; "
              f"per-second windows during the stream: median p50 {np.nanmedian(p50s) if p50s else float('nan'):.1f} ms, "
              f"worst p99 {np.nanmax(p99s) if p99s else float('nan'):.1f} ms")
        print(f"- apply time per update p50 {final.get('update_apply_p50_ms')} ms, p99 "
              f"{final.get('update_apply_p99_ms')} ms; publish->received p50 {final.get('update_received_p50_ms')} ms, "
              f"p99 {final.get('update_received_p99_ms')} ms")
        return {"failed": failed[0], "lost": published[0] - received}
    finally:
        ros.close()
        node.stop()


# ------------------------------------------------------------------------------ faults
def producer_main(argv) -> int:
    """Subprocess: a ScenePublisher adding ``count`` boxes (or racing on one id) then idling."""
    p = argparse.ArgumentParser()
    p.add_argument("--tag", required=True)
    p.add_argument("--size", type=float, default=0.2)
    p.add_argument("--race", type=int, default=0)
    a = p.parse_args(argv)
    import rclpy

    from robot_sdf.ros.scene_publisher import ScenePublisher

    rclpy.init()
    node = rclpy.create_node(f"producer_{a.tag}")
    scene = ScenePublisher(node)
    while scene._publisher.get_subscription_count() == 0:
        rclpy.spin_once(node, timeout_sec=0.05)
    if a.race:
        for i in range(a.race):
            v, t = _box((a.size, a.size, a.size))
            scene.add("raced", v, t, [0, 3.0, 0, 1, 0, 0, 0])
            rclpy.spin_once(node, timeout_sec=0.002)
        stamp = scene._scene[(0, "raced")].add.header.stamp
        print(json.dumps({"size": a.size, "stamp": [stamp.sec, stamp.nanosec]}), flush=True)
    else:
        for i in range(3):
            v, t = _box((a.size, a.size, a.size))
            scene.add(f"prod{i}", v, t, [2.0 * i, -3.0, 0, 1, 0, 0, 0])
        print("ready", flush=True)
    try:
        rclpy.spin(node)
    except KeyboardInterrupt:
        pass
    return 0


def _spawn_producer(domain: int, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "bench.soak", "--producer", *args], cwd=REPO,
                            env=child_env(domain), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def _stop(proc: subprocess.Popen, sig=signal.SIGINT) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def run_faults(workdir: Path, domain: int) -> dict:
    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle

    print("\n## Faults")
    state = workdir / "state"
    params = dict(device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0,
                  max_distance=MAX_D, state_dir=str(state))
    results = {}
    node = NodeProc(workdir / "faults", domain, params, "run1")
    ros = Ros(domain, "faults")
    producers: list[subprocess.Popen] = []
    try:
        sd = _sd_client(ros)
        pub = ros.node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
        while pub.get_subscription_count() == 0:
            time.sleep(0.05)
        handshake(pub, node, "faults")
        for i in range(8):
            v, t = _box((0.2 + 0.02 * i, 0.2, 0.2))
            pub.publish(make_mesh_obstacle(f"s{i}", v, t, [2.0 * i, 0, 0, 1, 0, 0, 0],
                                           stamp=ros.node.get_clock().now().to_msg()))
        probes = np.array([[2.0 * i + dx, 0.0, 0.0] for i in range(8) for dx in (0.0, 0.25)], np.float32)

        # 1. client SIGKILLed mid-request
        code = ("import sys,time,numpy as np,rclpy;sys.path.insert(0,'.');from bench.soak import _cost_request;"
                "from robot_sdf_interfaces.srv import EvaluateSphereCost as S;rclpy.init();n=rclpy.create_node('victim');"
                "c=n.create_client(S,'/sdf_server/evaluate_sphere_cost');c.wait_for_service(timeout_sec=30);"
                "s=np.zeros((2000000,4),np.float32);s[:,3]=0.05;c.call_async(_cost_request(s));print('sent',flush=True);"
                "rclpy.spin(n)")
        victim = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=child_env(domain), stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        victim.stdout.readline()
        time.sleep(0.3)
        victim.kill()
        victim.wait(10)
        time.sleep(1.0)
        before, _ = distances(ros, sd, probes)
        results["client killed"] = node.server.alive()
        print(f"- client SIGKILLed mid-request (2M spheres): node alive {node.server.alive()}, still answering: True")

        # 2. producer killed and replaced
        prod = _spawn_producer(domain, "--tag", "a", "--size", "0.2")
        producers.append(prod)
        prod.stdout.readline()
        pp = np.array([[2.0 * i, -3.0, 0.0] for i in range(3)], np.float32)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not np.allclose(distances(ros, sd, pp)[0], -0.1, atol=1e-4):
            time.sleep(0.2)
        prod.kill()
        prod.wait(10)
        time.sleep(1.0)
        kept = bool(np.allclose(distances(ros, sd, pp)[0], -0.1, atol=1e-4))
        repl = _spawn_producer(domain, "--tag", "b", "--size", "0.3")
        producers.append(repl)
        repl.stdout.readline()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not np.allclose(distances(ros, sd, pp)[0], -0.15, atol=1e-4):
            time.sleep(0.2)
        replaced = bool(np.allclose(distances(ros, sd, pp)[0], -0.15, atol=1e-4))
        results["producer replaced"] = kept and replaced
        print(f"- producer SIGKILLed: its obstacles kept {kept}; replacement's scene applied {replaced}")

        # 3. racing producers on one id
        racers = [_spawn_producer(domain, "--tag", f"r{k}", "--size", str(0.2 + 0.1 * k), "--race", "200")
                  for k in range(2)]
        producers += racers
        outs = [json.loads(r.stdout.readline()) for r in racers]
        winner = max(outs, key=lambda o: tuple(o["stamp"]))
        want = -winner["size"] / 2
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not np.isclose(distances(ros, sd, [[0, 3.0, 0]])[0][0], want, atol=1e-4):
            time.sleep(0.2)
        got = float(distances(ros, sd, [[0, 3.0, 0]])[0][0])
        results["race"] = bool(np.isclose(got, want, atol=1e-4))
        print(f"- racing producers (2 x 200 ADDs of one id): final = later stamp's geometry {results['race']} "
              f"(distance {got:.4f}, expected {want:.4f})")

        # 4. node SIGKILLed and restarted from state_dir
        before, rev = distances(ros, sd, np.concatenate([probes, pp, [[0, 3.0, 0]]]))
        time.sleep(1.0)  # the saver writes within 0.2 s of the last change
        node.kill()
        node = NodeProc(workdir / "faults", domain, params, "run2")
        after, _ = distances(ros, sd, np.concatenate([probes, pp, [[0, 3.0, 0]]]))
        results["restart"] = bool(np.array_equal(before, after))
        print(f"- node SIGKILLed and restarted with state_dir: identical answers {results['restart']}")
        return results
    finally:
        for p in producers:
            _stop(p)
        ros.close()
        node.stop()


# ------------------------------------------------------------------------------ burst
def run_burst(workdir: Path, domain: int, count: int) -> dict:
    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle

    print(f"\n## Burst: {count} distinct ids back to back")
    node = NodeProc(workdir / "burst", domain, dict(device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0,
                                                    diagnostics_rate_hz=0.0, mesh_capacity=count))
    ros = Ros(domain, "burst")
    try:
        sd = _sd_client(ros)
        pub = ros.node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
        while pub.get_subscription_count() == 0:
            time.sleep(0.05)
        handshake(pub, node, "burst")
        v, t = _box((0.1, 0.1, 0.1))
        t0 = time.perf_counter()
        for i in range(count):
            pub.publish(make_mesh_obstacle(f"b{i}", v, t, [0.3 * (i % 50), 0.3 * (i // 50), 5.0, 1, 0, 0, 0]))
        t_pub = time.perf_counter() - t0
        rev = 0
        deadline = time.monotonic() + 300
        while rev < count and time.monotonic() < deadline:
            time.sleep(0.5)
            rev = distances(ros, sd, [[100, 100, 100]])[1]
        centres = np.array([[0.3 * (i % 50), 0.3 * (i // 50), 5.0] for i in range(count)], np.float32)
        present = int(np.sum(np.isclose(distances(ros, sd, centres)[0], -0.05, atol=1e-4)))
        print(f"- published in {t_pub:.2f} s; revision {rev} after {time.perf_counter() - t0:.1f} s; "
              f"boxes present at their poses: {present} of {count}")
        return {"applied": present, "count": count}
    finally:
        ros.close()
        node.stop()


# ------------------------------------------------------------------------------ memory
def run_memory(workdir: Path, domain: int) -> dict:
    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle
    from robot_sdf_interfaces.srv import EvaluateSphereCost

    print("\n## Memory (node RSS, MB)")
    out = {}
    for limit in (2_000_000, 60_000_000):
        node = NodeProc(workdir / f"memory_{limit}", domain, dict(
            device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=0.0,
            max_spheres_per_request=limit), f"limit{limit}")
        ros = Ros(domain, "memory")
        try:
            cli = ros.node.create_client(EvaluateSphereCost, f"{NODE}/evaluate_sphere_cost")
            cli.wait_for_service(timeout_sec=60)
            ros.call(cli, _cost_request(np.array([[0, 0, 0, 0.1]], np.float32)), 30)
            time.sleep(1.0)
            empty = node.rss_mb()
            rows = [f"max_spheres_per_request {limit}: empty node {empty:.0f}"]
            for n in (10_000_000, 50_000_000):
                s = np.zeros((n, 4), np.float32)
                s[:, 0] = 50.0
                s[:, 3] = 0.05
                req = _cost_request(s)
                req.compute_gradient = False
                del s
                node.reset_peak()
                t0 = time.perf_counter()
                resp = ros.call(cli, req, timeout=600)
                dt = time.perf_counter() - t0
                del req
                time.sleep(2.0)
                ok = None if resp is None else resp.success
                rows.append(f"{n // 1_000_000}M spheres ({'answered' if ok else 'refused'} in {dt:.1f} s): "
                            f"peak {node.peak_mb():.0f}, after {node.rss_mb():.0f}")
                out[(limit, n)] = (node.peak_mb(), node.rss_mb(), empty)
                del resp
            print("- " + "; ".join(rows))
        finally:
            ros.close()
            node.stop()

    node = NodeProc(workdir / "memory_meshes", domain, dict(device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0,
                                                          diagnostics_rate_hz=0.0, mesh_capacity=64))
    ros = Ros(domain, "memory")
    try:
        sd = _sd_client(ros)
        pub = ros.node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
        while pub.get_subscription_count() == 0:
            time.sleep(0.05)
        time.sleep(1.0)
        empty = node.rss_mb()
        v, t = _grid_sheet(316, 0.0)  # 200k triangles
        rev = distances(ros, sd, [[100, 100, 100]])[1]
        peak = 0.0
        for i in range(40):
            pub.publish(make_mesh_obstacle(f"big{i}", v * np.float32(1 + 1e-3 * i), t, [0, 0, 0, 1, 0, 0, 0]))
            while distances(ros, sd, [[100, 100, 100]])[1] < rev + 1:
                time.sleep(0.05)
            rev += 1
            peak = max(peak, node.rss_mb())
        for i in range(40):
            pub.publish(make_mesh_obstacle(f"big{i}", None, None, operation=MeshObstacle.REMOVE))
        while distances(ros, sd, [[100, 100, 100]])[1] < rev + 40:
            time.sleep(0.1)
        time.sleep(2.0)
        after = node.rss_mb()
        print(f"- 40 distinct 200k-triangle meshes: empty {empty:.0f}, with all 40 {peak:.0f}, after REMOVE of all "
              f"{after:.0f} (+{after - empty:.0f}; geometry_cache_mb {GEOMETRY_CACHE_MB})")
        out["meshes"] = (empty, peak, after)
        v5, t5 = _grid_sheet(1582, 0.0)  # 5M triangles
        node.reset_peak()
        pub.publish(make_mesh_obstacle("huge", v5, t5, [0, 0, 0, 1, 0, 0, 0]))
        del v5, t5
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "more than max_" not in node.server.log():
            time.sleep(0.5)
        time.sleep(2.0)
        print(f"- 5M-triangle, 2.5M-vertex mesh (refused by the size limits): peak {node.peak_mb():.0f}, after "
              f"{node.rss_mb():.0f}; refused in log: {'more than max_' in node.server.log()}")
        return out
    finally:
        ros.close()
        node.stop()


# ------------------------------------------------------------------------------ stall
def bigmesh_main(argv) -> int:
    """Subprocess: publish one sheet of ``argv[0]`` triangles when a line arrives on stdin."""
    import rclpy

    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle

    rclpy.init()
    node = rclpy.create_node("big_mesh_producer")
    pub = node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
    n = int(round(np.sqrt(int(argv[0]) / 2)))
    v, t = _grid_sheet(n, 0.0)
    msg = make_mesh_obstacle("big", v + np.float32([0, 0, 3.0]), t, [0, 0, 0, 1, 0, 0, 0])
    while pub.get_subscription_count() == 0:
        rclpy.spin_once(node, timeout_sec=0.05)
    print(len(t), flush=True)
    sys.stdin.readline()
    pub.publish(msg)
    print("published", flush=True)
    end = time.monotonic() + 30
    while time.monotonic() < end:
        rclpy.spin_once(node, timeout_sec=0.1)
    return 0


def run_stall(workdir: Path, domain: int, triangles: int = 1_000_000) -> dict:
    """The big mesh comes from its own process (a perception node), as in a deployment: sent
    from the querying client's own participant, the 18 MB sample also delays that participant's
    service responses (measured: one query waited 2.2 s), which is the middleware, not the node."""
    from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, make_mesh_obstacle
    from robot_sdf_interfaces.msg import MeshObstacle
    from robot_sdf_interfaces.srv import EvaluateSphereCost

    print(f"\n## Stall: 1000-sphere query while a {triangles // 1000}k-triangle mesh (from another process) is added")
    node = NodeProc(workdir / "stall", domain, dict(device="cpu", marker_rate_hz=0.0, slice_rate_hz=0.0,
                                                    diagnostics_rate_hz=0.0))
    ros = Ros(domain, "stall")
    producer = subprocess.Popen([sys.executable, "-m", "bench.soak", "--bigmesh", str(triangles)], cwd=REPO,
                                env=child_env(domain), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
    try:
        cli = ros.node.create_client(EvaluateSphereCost, f"{NODE}/evaluate_sphere_cost")
        cli.wait_for_service(timeout_sec=60)
        pub = ros.node.create_publisher(MeshObstacle, f"{NODE}/mesh_obstacles", MESH_OBSTACLE_QOS)
        while pub.get_subscription_count() == 0:
            time.sleep(0.05)
        bv, bt = _box((0.4, 0.4, 0.4))
        pub.publish(make_mesh_obstacle("box", bv, bt, [0, 0, 0, 1, 0, 0, 0]))
        rng = np.random.default_rng(1)
        s = np.concatenate([rng.uniform(-0.5, 0.5, (1000, 3)), np.full((1000, 1), 0.05)], 1).astype(np.float32)
        req = _cost_request(s)
        n_tris = int(producer.stdout.readline())  # the producer is ready (and idle)
        time.sleep(1.0)
        quiet = []
        for _ in range(300):
            t0 = time.perf_counter()
            r = ros.call(cli, req)
            quiet.append(time.perf_counter() - t0)
        rev0 = r.world_revision
        busy = []
        t_pub = time.perf_counter()
        producer.stdin.write("go\n")
        producer.stdin.flush()
        rev = rev0
        while rev == rev0 and time.perf_counter() - t_pub < 120:
            t0 = time.perf_counter()
            r = ros.call(cli, req)
            busy.append(time.perf_counter() - t0)
            rev = r.world_revision
        applied = time.perf_counter() - t_pub
        q99 = np.percentile(quiet, 99)
        print(f"- quiet: {pct(quiet)}")
        print(f"- during the {n_tris // 1000}k-triangle ADD (applied {applied:.2f} s after the go): {pct(busy)}; "
              f"p99 / quiet p99 = {np.percentile(busy, 99) / q99:.2f}, worst / quiet p99 = {max(busy) / q99:.2f}")
        return {"ratio": max(busy) / q99}
    finally:
        _stop(producer)
        ros.close()
        node.stop()


def _descendants(pid: int) -> list[int]:
    """Pids of every process below ``pid`` (from /proc), children first."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _start_watchdog(seconds: float) -> None:
    """Bound the whole run: some phases wait for the middleware (a publisher matching, a node
    answering) without a deadline of their own; past ``seconds`` every process this run
    started is SIGKILLed by pid and the run exits with status 2."""
    def abort() -> None:
        print(f"\nsoak aborted: still running after {seconds:.0f} s (--timeout); killing child processes",
              flush=True)
        for pid in _descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(2)

    timer = threading.Timer(seconds, abort)
    timer.daemon = True
    timer.start()


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--producer":
        return producer_main(argv[1:])
    if argv and argv[0] == "--bigmesh":
        return bigmesh_main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of load (default 60)")
    parser.add_argument("--mesh-hz", type=float, default=30.0)
    parser.add_argument("--pose-hz", type=float, default=50.0)
    parser.add_argument("--client-hz", type=float, default=50.0)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--perception-hz", type=float, default=10.0, help="perception stream: ticks per second")
    parser.add_argument("--blocks-per-tick", type=int, default=50, help="perception stream: blocks re-meshed per tick")
    parser.add_argument("--perception-quiet", type=float, default=20.0,
                        help="perception stream: seconds of queries against the quiet room first")
    parser.add_argument("--only", nargs="+", choices=("load", "faults", "burst", "memory", "stall", "perception"),
                        default=["load", "perception", "faults", "burst", "memory", "stall"])
    parser.add_argument("--timeout", type=float, default=None,
                        help="seconds after which the whole run is aborted, every child process killed by pid "
                             "and the exit status is 2 (default: duration + 900)")
    args = parser.parse_args(argv)
    _start_watchdog(args.timeout if args.timeout is not None else args.duration + 900.0)
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    domain = reserve_domain_id(1 + (os.getpid() * 17 + 29) % 100)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    print(f"# robot_sdf soak (ROS_DOMAIN_ID={domain}, loopback only; load average {os.getloadavg()[0]:.2f})")
    t0 = time.monotonic()
    ok = True
    with tempfile.TemporaryDirectory(prefix="robot_sdf_soak_") as tmp:
        tmp = Path(tmp)
        if "load" in args.only:
            r = run_load(tmp, domain, args)
            ok &= r["lost"] == 0 and r["torn"] == 0 and r["final_ok"]
        if "perception" in args.only:
            r = run_perception(tmp, 1 + (domain + 7) % 100, args)
            ok &= r["failed"] == 0 and r["lost"] == 0
        if "faults" in args.only:
            ok &= all(run_faults(tmp, domain).values())
        if "burst" in args.only:
            r = run_burst(tmp, 1 + domain % 100, args.burst)  # a domain of its own: no leftovers
            ok &= r["applied"] == r["count"]
        if "stall" in args.only:
            run_stall(tmp, domain)
        if "memory" in args.only:
            run_memory(tmp, domain)
    print(f"\nsoak finished in {time.monotonic() - t0:.0f} s: {'OK' if ok else 'FAILURES'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
