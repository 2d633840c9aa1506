"""sdf_server never loses a mesh update: bursts, a fast stream on one id, racing publishers,
same-topology refits over ROS (short versions of what bench/soak.py runs for longer).

One node process for the module; its world is observed through the services (revision and
signed distances against exact box distances) and /diagnostics (queue counters).
"""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from diagnostic_msgs.msg import DiagnosticArray

import reference as ref
import ros_helpers as rh
from robot_sdf.ros.conversions import MESH_OBSTACLE_QOS, float32_array, make_mesh_obstacle
from robot_sdf_interfaces.msg import MeshObstacle
from robot_sdf_interfaces.srv import QuerySignedDistance

DOMAIN = rh.domain_id(41)
TETRA_V = np.array([[0, 0, 0], [0.1, 0, 0], [0, 0.1, 0], [0, 0, 0.1]], np.float32)
TETRA_T = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]], np.uint32)
MAX_D = 0.5
# Node RSS a round of test_memory_returns_after_removing_big_meshes adds when remove_mesh keeps
# its slots (measured: 245-270 MB per round), and the bound on two rounds' growth (30% of two leaks).
LEAK_PER_ROUND_MB = 250.0
TWO_ROUND_GROWTH_MB = 0.3 * 2 * LEAK_PER_ROUND_MB


class Node:
    def __init__(self, tmp) -> None:
        self.ros = rh.RosHarness(DOMAIN, "sdf_reliability")
        self.node = rh.NodeProcess(dict(device="cpu", num_envs=2, mesh_capacity=64, max_distance=MAX_D,
                                        marker_rate_hz=0.0, slice_rate_hz=0.0, diagnostics_rate_hz=10.0, geometry_cache_mb=0),
                                   tmp, DOMAIN)
        try:
            self.sd = self.ros.client(QuerySignedDistance, "/sdf_server/query_signed_distance")
            self.diag = self.ros.subscribe(DiagnosticArray, "/diagnostics")
            rh.wait_for_services(self.node, [self.sd])
        except BaseException:
            self.close()
            raise

    def query(self, points, env=0):
        req = QuerySignedDistance.Request(env=env, max_distance=0.0)
        req.points = float32_array(np.asarray(points, np.float32).reshape(-1))
        resp = self.ros.call(self.sd, req)
        assert resp.success, resp.message
        return np.frombuffer(resp.distance, np.float32).copy(), resp.world_revision

    def revision(self) -> int:
        return self.query([100.0, 100.0, 100.0])[1]

    def diagnostics(self) -> dict[str, str]:
        """The node's counters as of a /diagnostics message stamped after this call: the newest one
        received may be older than what the services already showed (seen under load: 300
        updates behind)."""
        now_ns = time.time_ns()

        def fresh(m) -> bool:
            stamp_ns = m.header.stamp.sec * 1_000_000_000 + m.header.stamp.nanosec
            return stamp_ns >= now_ns and any(s.name.endswith("mesh world") for s in m.status)

        msg = self.diag.wait_for(fresh, 60.0)
        return {kv.key: kv.value for kv in msg.status[0].values}

    def settled(self, enqueued: int, timeout=60.0) -> dict[str, str]:
        """Diagnostics once ``enqueued`` updates were received in all and the queue is empty."""
        def idle():
            d = self.diagnostics()
            done = int(d["updates_applied"]) + int(d["updates_coalesced"])
            return d if int(d["updates_enqueued"]) >= enqueued and d["updates_pending"] == "0" \
                and int(d["updates_enqueued"]) == done else None
        return rh.wait_until(idle, timeout, 0.2, "an empty update queue")

    def close(self) -> None:
        code = self.node.stop()
        self.ros.close()
        assert code == 0, self.node.log()


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    n = Node(tmp_path_factory.mktemp("ros_reliability"))
    try:
        yield n
    finally:
        n.close()


_SYNC = iter(range(1_000_000))


def _publisher(node, qos=MESH_OBSTACLE_QOS):
    """A publisher the node's reader has matched too. Seeing the subscription on the publisher's
    side is not enough: until the reader has matched the writer, only transient_local (the last
    100 messages) would deliver what is sent, and a burst is longer. The handshake: a REMOVE of
    an unknown id (rejected, changes nothing) repeated until the node logs its rejection."""
    pub = node.ros.publisher(MeshObstacle, "/sdf_server/mesh_obstacles", qos)
    rh.wait_for_matched(pub)
    probe = f"sync{next(_SYNC)}"

    def seen():
        pub.publish(make_mesh_obstacle(probe, None, None, operation=MeshObstacle.REMOVE))
        time.sleep(0.2)
        return f"no mesh '{probe}'" in node.node.log()

    rh.wait_until(seen, 60.0, 0.0, what="the node's reader to match the publisher")
    return pub


def _pose(x, y=0.0, z=0.0):
    return np.array([x, y, z, 1.0, 0.0, 0.0, 0.0])


# The failing case was 300 ids (100 applied); bench/soak.py --burst runs 1000 and more.
BURST = 300


def test_burst_of_distinct_ids_is_applied_whole(node):
    pub = _publisher(node)
    rev0 = node.revision()
    n = BURST
    t0 = time.perf_counter()
    for i in range(n):  # back to back, as fast as rclpy publishes
        pub.publish(make_mesh_obstacle(f"burst{i}", TETRA_V, TETRA_T, _pose(0.3 * (i % 40), 0.3 * (i // 40), 10.0)))
    rh.wait_until(lambda: node.revision() >= rev0 + n, 60.0, 0.2, what="every ADD")
    print(f"{n} ADDs applied {time.perf_counter() - t0:.2f} s after the first publish")
    assert node.revision() == rev0 + n
    # every tetrahedron is where its message put it: distance to its corner vertex is 0
    corners = np.array([[0.3 * (i % 40), 0.3 * (i // 40), 10.0] for i in range(0, n, 37)])
    d, _ = node.query(corners - [0.01, 0.01, 0.01])
    np.testing.assert_allclose(d, np.sqrt(3) * 0.01, atol=1e-4)
    # and removing them all is lossless too
    for i in range(n):
        pub.publish(make_mesh_obstacle(f"burst{i}", None, None, operation=MeshObstacle.REMOVE))
    rh.wait_until(lambda: node.revision() >= rev0 + 2 * n, 60.0, what="every REMOVE")
    assert "rejected MeshObstacle ADD" not in node.node.log() and "rejected MeshObstacle REMOVE 'burst" not in node.node.log()


def test_500_per_second_on_one_id_ends_with_the_last_message(node):
    pub = _publisher(node)
    box_v, box_t = ref.box((0.2, 0.2, 0.2))
    big_v = box_v * 2.0
    n, period = 500, 1.0 / 500
    base = int(node.settled(0)["updates_enqueued"])
    t0 = time.perf_counter()
    for i in range(n):
        # alternate topologies (rebuilds), sizes (refits) and poses: every message counts
        if i % 3 == 0:
            msg = make_mesh_obstacle("fast", TETRA_V, TETRA_T, _pose(0.001 * i, 5.0))
        else:
            msg = make_mesh_obstacle("fast", box_v if i % 3 == 1 else big_v, box_t, _pose(0.001 * i, 5.0))
        pub.publish(msg)
        time.sleep(max(0.0, t0 + (i + 1) * period - time.perf_counter()))
    d = node.settled(base + n)
    assert int(d["updates_enqueued"]) == base + n, d  # every message arrived
    # last message (i = 499, 499 % 3 == 1: the small box at x = 0.499): exact box distances
    pts = np.array([[0.499, 5.0, 0.0], [0.499 + 0.5, 5.0, 0.0], [0.499, 5.0, 0.35]])
    dist, _ = node.query(pts)
    want = rh.box_signed_distance(pts, (0.2, 0.2, 0.2), _pose(0.499, 5.0))
    np.testing.assert_allclose(dist, np.minimum(want, MAX_D), atol=1e-4)


def test_racing_publishers_lose_nothing(node):
    pubs = [_publisher(node) for _ in range(3)]
    rev0 = node.revision()
    per = 200

    def send(k):
        for i in range(per):
            pubs[k].publish(make_mesh_obstacle(f"race{k}_{i}", TETRA_V, TETRA_T, _pose(0.3 * i, -5.0 - k), env=k % 2))

    threads = [threading.Thread(target=send, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rh.wait_until(lambda: node.revision() >= rev0 + 3 * per, 60.0, what="every racing ADD")
    assert node.revision() == rev0 + 3 * per
    for k in range(3):
        pts = np.array([[0.3 * i - 0.01, -5.0 - k - 0.01, -0.01] for i in range(0, per, 19)])
        d, _ = node.query(pts, env=k % 2)
        np.testing.assert_allclose(d, np.sqrt(3) * 0.01, atol=1e-4)


def test_same_topology_add_refits_over_ros(node):
    pub = _publisher(node)
    v, t = ref.box((0.2, 0.2, 0.2))
    pub.publish(make_mesh_obstacle("deform", v, t, _pose(0.0, -20.0)))
    rh.wait_until(lambda: "MeshObstacle ADD 'deform'" in node.node.log(), 60.0, what="the first ADD")
    rev = node.revision()
    # identical triangles, new vertices and pose -> refit (waited for: a second ADD queued behind
    # it would supersede it)
    pub.publish(make_mesh_obstacle("deform", v * 1.5, t, _pose(0.1, -20.0)))
    rh.wait_until(lambda: node.revision() >= rev + 1, 60.0, what="the first refit")
    # vertices only (triangles empty) -> refit
    pub.publish(make_mesh_obstacle("deform", v * 2.0, None, _pose(0.2, -20.0)))
    rh.wait_until(lambda: node.revision() >= rev + 2, 60.0, what="two refits")
    log = node.node.log()
    assert log.count("same topology: refit") >= 2, log[-2000:]
    pts = np.array([[0.2, -20.0, 0.0], [0.2 + 0.5, -20.0, 0.1], [0.2, -20.0 + 0.3, 0.0]])
    d, _ = node.query(pts)
    want = rh.box_signed_distance(pts, (0.4, 0.4, 0.4), _pose(0.2, -20.0))
    np.testing.assert_allclose(d, np.minimum(want, MAX_D), atol=1e-4)
    # vertices only with a different vertex count: rejected, nothing changes
    before = node.revision()
    pub.publish(make_mesh_obstacle("deform", TETRA_V, None, _pose(0.0, -20.0)))
    rh.wait_until(lambda: "use add_mesh to change topology" in node.node.log(), 60.0, what="the rejection")
    assert node.revision() == before


def test_oversized_mesh_is_rejected_before_conversion(node):
    pub = _publisher(node)
    before = node.revision()
    v = np.zeros((2_000_001, 3), np.float32)
    pub.publish(make_mesh_obstacle("huge", v, TETRA_T, _pose(0.0)))
    rh.wait_until(lambda: "more than max_vertices_per_mesh" in node.node.log(), 60.0, what="the size rejection")
    assert node.revision() == before


def _rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def test_memory_returns_after_removing_big_meshes(node):
    """10 distinct 100k-triangle meshes ADDed and REMOVEd, three rounds with new geometry each.
    RSS is read once the node reports a heap trim that ran after the last REMOVE was applied
    (/diagnostics `heap_trim_revision`), so nothing here waits on time.

    - after round 1 the node's RSS gives back at least two thirds of what the ADDs took;
    - no round keeps its meshes: kept, the world's arrays, BVHs and sign data of 10 such meshes
      add ~LEAK_PER_ROUND_MB to every round (measured with remove_mesh holding its slots), so
      rounds 2 and 3 together would add twice that. Where one round settles depends on glibc's
      fragmentation in this process (a CI machine saw one round settle 66 MB above the one
      before; here rounds differ by up to 40 MB), so the bound is on the growth over two rounds
      (TWO_ROUND_GROWTH_MB), not on each round.
    This node runs with geometry_cache_mb=0, so the budget measures what leaks, not the cache
    (its byte bound is tested in world_memory_test.py)."""
    pub = _publisher(node)
    pid = node.node.proc.pid
    start = _rss_mb(pid)
    n = 224  # sheet of 2 * 224^2 = 100k triangles
    x, y = np.meshgrid(np.linspace(0, 1, n + 1), np.linspace(0, 1, n + 1), indexing="ij")
    v = np.stack([x, y, 0.01 * np.sin(5 * x)], -1).reshape(-1, 3).astype(np.float32)
    idx = np.arange((n + 1) ** 2).reshape(n + 1, n + 1)
    a, b, c, d = idx[:-1, :-1], idx[1:, :-1], idx[1:, 1:], idx[:-1, 1:]
    t = np.concatenate([np.stack([a, b, c], -1).reshape(-1, 3), np.stack([a, c, d], -1).reshape(-1, 3)])
    settled, full = [], []
    for round_ in range(3):
        rev = node.revision()
        for i in range(10):
            scale = np.float32(1 + 0.01 * i + 0.2 * round_)
            pub.publish(make_mesh_obstacle(f"big{i}", v * scale, t, _pose(0.0, 40.0 + 2 * i)))
        rh.wait_until(lambda: node.revision() >= rev + 10, 60.0, 0.2, what="10 big ADDs")
        full.append(_rss_mb(pid))
        for i in range(10):
            pub.publish(make_mesh_obstacle(f"big{i}", None, None, operation=MeshObstacle.REMOVE))
        rh.wait_until(lambda: node.revision() >= rev + 20, 60.0, 0.2, what="10 REMOVEs")
        node.diag.messages.clear()
        node.diag.wait_for(lambda m: any(s.name.endswith("mesh world") and int(
            {kv.key: kv.value for kv in s.values}["heap_trim_revision"]) >= rev + 20 for s in m.status), 60.0)
        settled.append(_rss_mb(pid))
        print(f"node RSS round {round_ + 1}: start {start:.0f} MB, with 10 x 100k triangles {full[-1]:.0f} MB, "
              f"after REMOVE and heap trim {settled[-1]:.0f} MB")
    assert full[0] > start + 60  # the meshes did take memory
    assert settled[0] < start + max(50.0, (full[0] - start) / 3.0), "round 1 kept its memory"
    assert settled[2] - settled[0] < TWO_ROUND_GROWTH_MB, "rounds 2 and 3 kept memory as a leak would"
