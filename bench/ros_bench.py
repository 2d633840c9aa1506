"""ROS 2 benchmarks: service round trips of the real sdf_server node against a middleware floor,
and the latency of mesh updates.

Processes (all on loopback, in the private ROS domain that ``python -m bench`` picks, under the
namespace /robot_sdf_bench_<pid> so that no other node can answer our calls):

- the node: ``python -m robot_sdf.ros.sdf_server --ros-args -r __ns:=<ns> --params-file <yaml>``
  (device, sign method and distances as the core benchmark), fed the standard scene as
  MeshObstacle messages (flat float32[]/uint32[] fields);
- the echo: ``python -m bench.ros_bench --echo <ns>``, an rclpy node that answers
  EvaluateSphereCost with a response of the same payload (n costs + 3n gradient floats, built
  by whole-buffer copies of the request) on the same executor type as the node
  (MultiThreadedExecutor, reentrant group): the floor of middleware + rclpy for that payload;
- this process: the client (one SingleThreadedExecutor spun in the calling thread), and the
  in-process core for comparison.
"""
from __future__ import annotations

import argparse
import array
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from bench import Stats, emit, fmt_ms, load_average, measure, section, table
from bench import scenes

REPO = Path(__file__).resolve().parents[1]
SIGN = "normal"  # as in the core tables: the standard scene's meshes are closed
CALL_TIMEOUT_S = 120.0
UPDATE_TRIANGLES = 10_000
LOG_FORMAT = "[{severity}] [{time}] [{name}]: {message}"
_APPLIED_RE = re.compile(r"\[INFO\] \[(\d+\.\d+)\] \[[^\]]*\]: MeshObstacle ADD '([^']+)' env \d+: .*-> revision (\d+)")


def _namespace() -> str:
    return f"/robot_sdf_bench_{os.getpid()}"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST", PYTHONUNBUFFERED="1",
               RCUTILS_CONSOLE_OUTPUT_FORMAT=LOG_FORMAT, RCUTILS_COLORIZED_OUTPUT="0",
               RCUTILS_LOGGING_BUFFERED_STREAM="0")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


# ------------------------------------------------------------------------------------ echo side
def echo_main(namespace: str) -> int:
    """Serve ``<namespace>/echo/evaluate_sphere_cost`` with a same-size response until SIGINT."""
    import rclpy
    from rclpy.callback_groups import ReentrantCallbackGroup
    from rclpy.executors import ExternalShutdownException, MultiThreadedExecutor

    from robot_sdf_interfaces.srv import EvaluateSphereCost

    rclpy.init()
    node = rclpy.create_node("echo", namespace=namespace)

    def handle(request, response):
        flat = np.frombuffer(request.spheres, dtype=np.float32).reshape(-1, 4)
        response.cost = array.array("f", np.ascontiguousarray(flat[:, 3]).tobytes())
        if request.compute_gradient:
            response.gradient = array.array("f", np.ascontiguousarray(flat[:, :3]).tobytes())
        response.success = True
        return response

    node.create_service(EvaluateSphereCost, "~/evaluate_sphere_cost", handle,
                        callback_group=ReentrantCallbackGroup())
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        executor.shutdown()
        node.destroy_node()
        rclpy.try_shutdown()
    return 0


# ---------------------------------------------------------------------------------- client side
class Processes:
    """The node and echo subprocesses; their output goes to log files in ``workdir``."""

    def __init__(self, workdir: Path, device: str, namespace: str):
        params = {"/**": {"ros__parameters": {
            "device": device, "sign_method": SIGN, "max_distance": scenes.MAX_DIST,
            "activation_distance": scenes.ACTIVATION, "weight": 1.0, "max_spheres_per_request": 2_000_000,
            "mesh_capacity": 16}}}
        self.params_file = workdir / "sdf_server_params.yaml"
        self.params_file.write_text(yaml.safe_dump(params))
        self.node_log = workdir / "sdf_server.log"
        self.echo_log = workdir / "echo.log"
        env = _child_env()
        self.node = subprocess.Popen(
            [sys.executable, "-m", "robot_sdf.ros.sdf_server", "--ros-args", "-r", f"__ns:={namespace}",
             "--params-file", str(self.params_file)],
            cwd=REPO, env=env, stdout=open(self.node_log, "w"), stderr=subprocess.STDOUT)
        self.echo = subprocess.Popen([sys.executable, "-m", "bench.ros_bench", "--echo", namespace],
                                     cwd=REPO, env=env, stdout=open(self.echo_log, "w"), stderr=subprocess.STDOUT)

    def check_alive(self) -> None:
        for name, p, log in (("sdf_server", self.node, self.node_log), ("echo", self.echo, self.echo_log)):
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{log.read_text()[-3000:]}")

    def stop(self) -> None:
        for p in (self.node, self.echo):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in (self.node, self.echo):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


class Client:
    """rclpy client node: service calls spun to completion in the calling thread."""

    def __init__(self, namespace: str, procs: Processes):
        import rclpy
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

        from robot_sdf_interfaces.msg import MeshObstacle
        from robot_sdf_interfaces.srv import EvaluateSphereCost

        rclpy.init()
        self.rclpy = rclpy
        self.procs = procs
        self.node = rclpy.create_node("bench_client", namespace=namespace)
        self.executor = SingleThreadedExecutor()
        self.executor.add_node(self.node)
        self.server = self.node.create_client(EvaluateSphereCost, f"{namespace}/sdf_server/evaluate_sphere_cost")
        self.echo = self.node.create_client(EvaluateSphereCost, f"{namespace}/echo/evaluate_sphere_cost")
        qos = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST, reliability=ReliabilityPolicy.RELIABLE,
                         durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self.meshes = self.node.create_publisher(MeshObstacle, f"{namespace}/sdf_server/mesh_obstacles", qos)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        for cli in (self.server, self.echo):
            while not cli.wait_for_service(timeout_sec=0.5):
                self.procs.check_alive()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"service {cli.srv_name} did not appear within {timeout_s} s")

    def call(self, cli, request):
        future = cli.call_async(request)
        self.executor.spin_until_future_complete(future, timeout_sec=CALL_TIMEOUT_S)
        if not future.done():
            cli.remove_pending_request(future)
            self.procs.check_alive()
            raise RuntimeError(f"no response from {cli.srv_name} within {CALL_TIMEOUT_S} s")
        return future.result()

    def close(self) -> None:
        self.executor.shutdown()
        self.node.destroy_node()
        self.rclpy.try_shutdown()


def cost_request(spheres: np.ndarray, compute_gradient: bool = True):
    """EvaluateSphereCost request for spheres (n,4): batch 1, horizon 1, n spheres per step."""
    from robot_sdf_interfaces.srv import EvaluateSphereCost

    req = EvaluateSphereCost.Request()
    req.batch, req.horizon, req.spheres_per_step = 1, 1, int(spheres.shape[0])
    req.spheres = array.array("f", np.ascontiguousarray(spheres, np.float32).tobytes())
    req.activation_distance = scenes.ACTIVATION
    req.weight = 1.0
    req.compute_gradient = compute_gradient
    return req


def mesh_message(name: str, vertices: np.ndarray, triangles: np.ndarray, pose: np.ndarray):
    """MeshObstacle ADD with the flat geometry fields (the fast path of docs/design.md "Messages and services")."""
    from geometry_msgs.msg import Point, Pose, Quaternion
    from std_msgs.msg import Header

    from robot_sdf_interfaces.msg import MeshObstacle

    msg = MeshObstacle()
    msg.header = Header(frame_id="world")
    msg.id = name
    msg.env = 0
    msg.operation = MeshObstacle.ADD
    p = [float(x) for x in pose]
    msg.pose = Pose(position=Point(x=p[0], y=p[1], z=p[2]), orientation=Quaternion(w=p[3], x=p[4], y=p[5], z=p[6]))
    msg.vertices = array.array("f", np.ascontiguousarray(vertices, np.float32).tobytes())
    msg.triangles = array.array("I", np.ascontiguousarray(triangles, np.uint32).tobytes())
    return msg


def remove_message(name: str):
    from std_msgs.msg import Header

    from robot_sdf_interfaces.msg import MeshObstacle

    msg = MeshObstacle()
    msg.header = Header(frame_id="world")
    msg.id = name
    msg.operation = MeshObstacle.REMOVE
    return msg


# A sphere far from every obstacle: the cheapest possible evaluate call, used to poll the revision.
_POLL_SPHERE = np.array([[-20.0, -20.0, -20.0, 0.05]], np.float32)
# Where the update benchmark's mesh goes: far from the scene and from the poll sphere.
_UPDATE_POSE = np.array([20.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def wait_revision(client: Client, at_least: int, timeout_s: float = 60.0) -> tuple[int, int]:
    """Poll the node until its world_revision >= at_least; return (revision, number of polls)."""
    req = cost_request(_POLL_SPHERE, compute_gradient=False)
    deadline = time.monotonic() + timeout_s
    polls = 0
    while True:
        resp = client.call(client.server, req)
        polls += 1
        if resp.world_revision >= at_least:
            return int(resp.world_revision), polls
        if time.monotonic() > deadline:
            client.procs.check_alive()
            raise RuntimeError(f"world_revision stuck at {resp.world_revision}, expected >= {at_least}")


# ------------------------------------------------------------------------------------ benchmarks
def _core_call(world, spheres):
    """What the node computes for a request, in this process: cost and gradient of spheres
    (1,1,n,4) (a host tensor, moved to the world's device), brought back to host memory."""
    cost, grad = world.evaluate_sphere_cost(spheres, activation_distance=scenes.ACTIVATION, weight=1.0,
                                            compute_gradient=True)
    return cost.cpu(), grad.cpu()


def round_trips(client: Client, world, sizes: list[int], reps: int, meshes) -> None:
    import torch

    section("Service round trip: evaluate_sphere_cost with gradients vs. echo floor vs. in-process core")
    spheres = scenes.near_surface_spheres(meshes, max(sizes))
    cases, requests = {}, {}
    for n in sizes:
        s = spheres[:n]
        requests[n] = cost_request(s)
        tensor = torch.from_numpy(s.reshape(1, 1, n, 4).copy())
        cases[f"node {n}"] = (lambda r=requests[n]: client.call(client.server, r))
        cases[f"echo {n}"] = (lambda r=requests[n]: client.call(client.echo, r))
        cases[f"core {n}"] = (lambda t=tensor: _core_call(world, t))
    # The node computes what the in-process core computes.
    for n in sizes:
        resp = client.call(client.server, requests[n])
        if not resp.success:
            raise RuntimeError(f"sdf_server refused {n} spheres: {resp.message}")
        cost, grad = _core_call(world, torch.from_numpy(spheres[:n].reshape(1, 1, n, 4).copy()))
        dc = np.max(np.abs(np.frombuffer(resp.cost, np.float32) - cost.numpy().reshape(-1)))
        dg = np.max(np.abs(np.frombuffer(resp.gradient, np.float32) - grad.numpy().reshape(-1)))
        if dc > 1e-5 or dg > 1e-5:
            raise RuntimeError(f"node and in-process core disagree for {n} spheres: |dcost| {dc}, |dgrad| {dg}")
    res = measure(cases, reps, warmup=1, budget_s=None)
    rows = []
    for n in sizes:
        node, echo, core = res[f"node {n}"], res[f"echo {n}"], res[f"core {n}"]
        payload = (16 * n + 16 * n) / 2**20  # request 4 floats + response 1 + 3 floats per sphere
        rows.append([f"{n:,}", f"{payload:.2f}", node.ms(), echo.ms(), core.ms(),
                     fmt_ms(node.median - echo.median - core.median), f"{node.median / echo.median:.2f}",
                     f"{(node.median - core.median) / echo.median:.2f}"])
    emit(table(["spheres", "payload MiB", "node round trip ms", "echo floor ms", "in-process core ms",
                "node - echo - core ms", "node / echo", "(node - core) / echo"], rows))
    emit("\nTarget: 100k-sphere round trip <= 1.5 x echo floor. 'node - echo - core' is what the node adds "
         "beyond the middleware and the computation (request validation, tensor/array conversions); "
         "'(node - core) / echo' is the node's transport overhead relative to the floor, which is the part "
         "of the target the node controls when the computation itself dominates (CPU).")


def mesh_updates(client: Client, procs: Processes, world, count: int) -> None:
    import torch  # noqa: F401 - the world's tensors
    from rclpy.serialization import deserialize_message, serialize_message

    from robot_sdf.ros import conversions as conv
    from robot_sdf_interfaces.msg import MeshObstacle

    section(f"Mesh update latency: {UPDATE_TRIANGLES // 1000}k-triangle MeshObstacle ADD (new id) and replace "
            "(same id, new geometry)")
    v, t = scenes.torus_with_triangles(UPDATE_TRIANGLES)
    # Unique geometry per update: the world caches identical content and would skip the BVH build.
    messages = [[mesh_message(f"bench_update_{i}", v * np.float32(1.0 + 1e-4 * (2 * i + k)), t, _UPDATE_POSE)
                 for k in range(2)] for i in range(count)]
    revision, _ = wait_revision(client, 0)
    external: dict[str, list[float]] = {"ADD new id": [], "replace": []}
    polls: dict[str, list[int]] = {"ADD new id": [], "replace": []}
    published: dict[int, tuple[str, float]] = {}
    for i in range(count):
        for k, kind in enumerate(("ADD new id", "replace")):
            expected = revision + 1
            wall = time.time()
            t0 = time.perf_counter()
            client.meshes.publish(messages[i][k])
            revision, n_polls = wait_revision(client, expected)
            external[kind].append(time.perf_counter() - t0)
            polls[kind].append(n_polls)
            published[expected] = (kind, wall)
        client.meshes.publish(remove_message(f"bench_update_{i}"))
        revision, _ = wait_revision(client, revision + 1)
        time.sleep(0.05)

    # The same ADDs with nobody polling: the node's log stamps alone give publish -> applied, free
    # of the load that the polling requests put on the node's executor and on the CPU.
    quiet_wall: dict[str, float] = {}
    for i in range(count):
        msg = mesh_message(f"bench_quiet_{i}", v * np.float32(1.0 - 1e-4 * (i + 1)), t, _UPDATE_POSE)
        quiet_wall[msg.id] = time.time()
        client.meshes.publish(msg)
        time.sleep(0.3)
        client.meshes.publish(remove_message(msg.id))
        time.sleep(0.1)
    wait_revision(client, revision + 2 * count)

    # In-process: what the node's callback does after receipt (deserialize, mesh_arrays, add_mesh).
    raw = [[serialize_message(m) for m in pair] for pair in messages]
    deser: dict[str, list[float]] = {"ADD new id": [], "replace": []}
    apply: dict[str, list[float]] = {"ADD new id": [], "replace": []}
    for i in range(count):
        for k, kind in enumerate(("ADD new id", "replace")):
            t0 = time.perf_counter()
            msg = deserialize_message(raw[i][k], MeshObstacle)
            t1 = time.perf_counter()
            vv, tt = conv.mesh_arrays(msg)
            world.add_mesh(msg.id, vv, tt, pose=conv.pose_to_array(msg.pose))
            t2 = time.perf_counter()
            deser[kind].append(t1 - t0)
            apply[kind].append(t2 - t1)
        world.remove_mesh(f"bench_update_{i}")

    # The node logs each applied ADD with a wall-clock stamp: publish -> applied inside the node.
    procs.stop()
    applied: dict[str, list[float]] = {"ADD new id": [], "replace": [], "quiet": []}
    for line in procs.node_log.read_text().splitlines():
        m = _APPLIED_RE.search(line)
        if m is None:
            continue
        if m.group(2) in quiet_wall:
            applied["quiet"].append(float(m.group(1)) - quiet_wall[m.group(2)])
        elif int(m.group(3)) in published:
            kind, wall = published[int(m.group(3))]
            applied[kind].append(float(m.group(1)) - wall)

    rows = []
    for kind in ("ADD new id", "replace"):
        ext = Stats.of(external[kind])
        app = Stats.of(applied[kind]).ms() if applied[kind] else "n/a (no log line)"
        total = Stats.of([a + b for a, b in zip(deser[kind], apply[kind])])
        rows.append([kind, str(ext.reps), ext.ms(), f"{np.median(polls[kind]):.0f}", app,
                     Stats.of(deser[kind]).ms(), Stats.of(apply[kind]).ms(), total.ms()])
    quiet = Stats.of(applied["quiet"]).ms() if applied["quiet"] else "n/a (no log line)"
    rows.append(["ADD new id, nobody polling", str(count), "-", "-", quiet, "", "", ""])
    emit(table(["update", "n", "publish -> first response with new revision ms", "polls",
                "publish -> applied (node log) ms", "deserialize ms", "mesh_arrays + add_mesh ms",
                "receipt -> applied ms (in-process)"], rows))
    emit("\nTarget: update visible <= 5 ms after receipt for 10k triangles on CPU. The node does not report "
         "its receipt time, so 'receipt -> applied' is measured in this process on the node's own code path "
         "(rclpy deserialize_message of the serialized message, conversions.mesh_arrays, MeshWorld.add_mesh "
         "on the standard scene); 'publish -> applied' uses the wall-clock stamp of the node's INFO log line "
         "written right after add_mesh returns (same machine clock) and so also contains the DDS transfer.")


def _applied_stamps(procs: Processes) -> dict[int, float]:
    """Revision -> wall-clock stamp of the node's log line for every applied ADD so far."""
    out = {}
    for line in procs.node_log.read_text().splitlines():
        m = _APPLIED_RE.search(line)
        if m is not None:
            out[int(m.group(3))] = float(m.group(1))
    return out


def refit_vs_rebuild(client: Client, procs: Processes, sizes: list[int], reps: int) -> None:
    """ADD of an existing id with the same triangles (refit) against new triangles (rebuild),
    over ROS: publish -> applied from the node's log stamps, one update at a time."""
    section("Same topology -> refit over ROS: MeshObstacle ADD of an existing id, publish -> applied")
    rows = []
    for n in sizes:
        v, t = scenes.torus_with_triangles(n)
        # The same surface with its triangles listed in another order: a different topology
        # array, hence a rebuild (the content differs, so no cache hit either).
        shuffled = t[np.random.default_rng(n).permutation(len(t))]
        name = f"bench_refit_{n}"
        revision, _ = wait_revision(client, 0)
        client.meshes.publish(mesh_message(name, v, t, _UPDATE_POSE))
        revision, _ = wait_revision(client, revision + 1)
        times: dict[str, list[float]] = {"refit (same triangles)": [], "refit (vertices only)": [],
                                         "rebuild (new triangles)": []}
        current = t
        for i in range(reps):
            scale = np.float32(1.0 + 1e-3 * (i + 1))
            for kind in times:
                if kind.startswith("rebuild"):
                    current = shuffled if current is t else t
                    msg = mesh_message(name, v * scale, current, _UPDATE_POSE)
                else:
                    msg = mesh_message(name, v * scale * np.float32(1.0001 if "only" in kind else 1.0), current,
                                       _UPDATE_POSE)
                    if "only" in kind:
                        msg.triangles = array.array("I")
                wall = time.time()
                client.meshes.publish(msg)
                revision, _ = wait_revision(client, revision + 1)
                for _ in range(20):  # the log line is written right after the revision is published
                    stamp = _applied_stamps(procs).get(revision)
                    if stamp is not None:
                        times[kind].append(stamp - wall)
                        break
                    time.sleep(0.01)
        for kind, values in times.items():
            rows.append([f"{len(t) // 1000}k", kind, str(len(values)), Stats.of(values).ms() if values else "n/a"])
        client.meshes.publish(remove_message(name))
        wait_revision(client, revision + 1)
    emit(table(["triangles", "update", "n", "publish -> applied ms"], rows))
    emit("\nThe node refits (MeshWorld.update_vertices, same revision carries the new pose) when an ADD "
         "repeats an id's triangles or sends vertices only; any other ADD rebuilds the BVH.")


def run(device: str = "cpu", quick: bool = False) -> None:
    """Start the node and the echo, print the round-trip and mesh-update tables, stop them."""
    from bench.core_bench import build_world

    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    namespace = _namespace()
    meshes = scenes.standard_meshes()
    sizes = [1_000, 10_000] if quick else [1_000, 10_000, 100_000]
    reps = 3 if quick else 15
    updates = 2 if quick else 10
    with tempfile.TemporaryDirectory(prefix="robot_sdf_bench_") as tmp:
        procs = Processes(Path(tmp), device, namespace)
        client = None
        try:
            client = Client(namespace, procs)
            t0 = time.perf_counter()
            client.wait_ready()
            for m in meshes:
                client.meshes.publish(mesh_message(m.name, m.vertices, m.triangles, m.pose))
            revision, _ = wait_revision(client, len(meshes))
            emit(f"node {namespace}/sdf_server ready with the standard scene (revision {revision}) "
                 f"{time.perf_counter() - t0:.1f} s after start; device {device}, sign_method {SIGN}, "
                 f"max_distance {scenes.MAX_DIST} m")
            world = build_world(meshes, device)
            round_trips(client, world, sizes, reps, meshes)
            emit(f"\n(load average after this table: {load_average()})")
            refit_vs_rebuild(client, procs, [10_000] if quick else [10_000, 200_000], 2 if quick else 8)
            emit(f"\n(load average after this table: {load_average()})")
            mesh_updates(client, procs, world, updates)
            emit(f"\n(load average after this table: {load_average()})")
        finally:
            if client is not None:
                client.close()
            procs.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="internal: the echo service of the ROS benchmark")
    parser.add_argument("--echo", metavar="NAMESPACE", required=True)
    args = parser.parse_args(argv)
    return echo_main(args.echo)


if __name__ == "__main__":
    sys.exit(main())
