"""robot_sdf.ros.update_queue (no ROS needed): order per key, last-wins coalescing, bounded bytes."""
from __future__ import annotations

import threading
import time

from robot_sdf.ros.update_queue import LatencyWindow, UpdateQueue


def _recorder(gate: threading.Event | None = None):
    """(applied items, apply function, event set once the worker has taken its first item)."""
    applied, lock, started = [], threading.Lock(), threading.Event()

    def apply(item):
        started.set()
        if gate is not None:
            assert gate.wait(60), "the test never opened the gate"
        with lock:
            applied.append(item)

    return applied, apply, started


def _wait_until(predicate, timeout: float = 60.0) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_every_item_applied_in_order_per_key():
    applied, apply, _ = _recorder()
    q = UpdateQueue(apply, lambda item, exc: None)
    items = [(k % 7, i) for i, k in enumerate(range(2000))]
    for key, i in items:
        q.put(key, (key, i))
    assert q.wait_idle(60)
    assert sorted(applied) == sorted(items)
    for key in range(7):
        seq = [i for k, i in applied if k == key]
        assert seq == sorted(seq)
    s = q.stats()
    assert (s.enqueued, s.applied, s.coalesced, s.pending) == (2000, 2000, 0, 0)
    q.close()


def test_newer_geometry_supersedes_a_queued_one_and_nothing_else():
    gate = threading.Event()
    applied, apply, started = _recorder(gate=gate)
    q = UpdateQueue(apply, lambda item, exc: None)
    q.put("a", "a-add-0", supersedable=True)   # taken by the worker at once, blocked on the gate
    assert started.wait(60)
    q.put("a", "a-add-1", supersedable=True)
    q.put("b", "b-add-1", supersedable=True)
    q.put("a", "a-add-2", supersedable=True)   # replaces a-add-1 (queued, not started)
    q.put("a", "a-move-3")                      # not supersedable: appended
    q.put("a", "a-add-4", supersedable=True)   # last entry of "a" is a MOVE: appended
    q.put("a", "a-add-5", supersedable=True)   # replaces a-add-4
    gate.set()
    assert q.wait_idle(60)
    assert applied == ["a-add-0", "a-add-2", "b-add-1", "a-move-3", "a-add-5"]
    s = q.stats()
    assert s.coalesced == 2 and s.enqueued == 7 and s.applied == 5
    q.close()


def test_a_newer_version_survives_a_later_arriving_older_one():
    gate = threading.Event()
    applied, apply, started = _recorder(gate=gate)
    q = UpdateQueue(apply, lambda item, exc: None)
    q.put("x", "first", supersedable=True, version=(1, 0))
    assert started.wait(60)  # the worker holds "first"
    q.put("x", "stamp 5", supersedable=True, version=(5, 0))
    q.put("x", "stamp 3 (arrives later, older)", supersedable=True, version=(3, 0))
    q.put("x", "unstamped", supersedable=True, version=None)  # no version: arrival order
    q.put("y", "y stamp 2", supersedable=True, version=(2, 0))
    q.put("y", "y stamp 4", supersedable=True, version=(4, 0))
    gate.set()
    assert q.wait_idle(60)
    assert applied == ["first", "unstamped", "y stamp 4"]
    assert q.stats().coalesced == 3
    q.close()


def test_errors_do_not_stop_the_worker():
    errors = []

    def apply(item):
        if item == 2:
            raise RuntimeError("boom")

    q = UpdateQueue(apply, lambda item, exc: errors.append((item, str(exc))))
    for i in range(5):
        q.put(i, i)
    assert q.wait_idle(60)
    assert errors == [(2, "boom")] and q.stats().applied == 5
    q.close()


def test_puts_block_instead_of_dropping_when_the_byte_bound_is_reached():
    gate = threading.Event()
    applied, apply, started = _recorder(gate=gate)
    q = UpdateQueue(apply, lambda item, exc: None, max_pending_bytes=1000)
    q.put(0, 0, nbytes=600)  # being applied (blocked on the gate)
    assert started.wait(60)
    assert not q.put(1, 1, nbytes=600, timeout=0.2)  # full: times out, nothing queued
    done = threading.Event()
    threading.Thread(target=lambda: (q.put(2, 2, nbytes=600), done.set()), daemon=True).start()
    # stats() takes the queue's lock, which the blocked put gives up only inside its wait.
    assert _wait_until(lambda: q.stats().blocked == 2)
    assert not done.is_set()  # waits for room
    gate.set()
    assert done.wait(60)
    assert q.wait_idle(60)
    assert applied == [0, 2] and q.stats().blocked == 2 and q.stats().pending_bytes == 0
    q.close()


def test_latency_window():
    w = LatencyWindow(size=100)
    assert w.percentiles() == (0.0, 0.0, 0.0)
    for i in range(1, 101):
        w.record(i / 1000)
    p50, p99, worst = w.percentiles()
    assert abs(p50 - 0.05) <= 0.001 and abs(p99 - 0.099) <= 0.001 and worst == 0.1
