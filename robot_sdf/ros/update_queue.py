"""A lossless, per-id ordered queue of world updates drained by one worker thread.

Why: the middleware hands ``~/mesh_obstacles`` messages to one callback; when that callback
builds a BVH (tens of ms to seconds) the subscription's history overflows and messages are
dropped without a trace. Here the callback only enqueues (O(1)), and a worker applies the
updates in arrival order, which keeps every id's updates in the order they were sent.

The one liberty taken: a geometry update (ADD) for an id whose previous queued update is also
an ADD not yet started replaces that queued one in place (last wins: an ADD replaces geometry
and pose, so applying the older one first would change nothing that stays). Each such
replacement is counted (``coalesced``). Nothing else is merged or dropped.

Memory is bounded by ``max_pending_bytes``: a producer faster than the worker blocks the
enqueuing thread (and so, with a reliable KEEP_ALL subscription, the middleware's flow
control slows the publisher) instead of dropping anything. The module imports no ROS package.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable


@dataclass
class _Entry:
    key: Hashable
    item: Any
    supersedable: bool
    nbytes: int
    enqueued: float
    version: Any = None
    started: bool = False


@dataclass
class QueueStats:
    """Counters since start: enqueued, applied (the worker ran them, whatever the outcome),
    coalesced (older queued geometry replaced by a newer one of the same id), pending now,
    pending_bytes now, blocked (puts that waited for room), max_pending_bytes seen."""

    enqueued: int = 0
    applied: int = 0
    coalesced: int = 0
    pending: int = 0
    pending_bytes: int = 0
    blocked: int = 0
    peak_pending_bytes: int = 0
    latencies: deque = field(default_factory=lambda: deque(maxlen=2000))


class UpdateQueue:
    """FIFO of updates keyed by obstacle (``key``), applied by ``apply(item)`` on a worker thread.

    apply: called with each item in order; exceptions are passed to ``on_error(item, exc)``
    (the worker never dies). max_pending_bytes: puts block while more than this is queued
    (a single item larger than the bound is still accepted when nothing else is pending).
    nice: raise the worker thread's nice value by this much (Linux), so that on a loaded CPU
    the threads answering queries are scheduled before a long BVH build.
    """

    def __init__(self, apply: Callable[[Any], None], on_error: Callable[[Any, BaseException], None],
                 max_pending_bytes: int = 512 * 2**20, name: str = "world_updates", nice: int = 0) -> None:
        self._apply = apply
        self._on_error = on_error
        self._max_bytes = int(max_pending_bytes)
        self._nice = int(nice)
        self._cond = threading.Condition()
        self._order: deque[_Entry] = deque()
        self._last: dict[Hashable, _Entry] = {}
        self._stats = QueueStats()
        self._closed = False
        self._busy = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # -------------------------------------------------------------- producer side
    def put(self, key: Hashable, item: Any, supersedable: bool = False, nbytes: int = 0,
            timeout: float | None = None, version: Any = None) -> bool:
        """Queue ``item`` for ``key``; returns False only when closed or ``timeout`` ran out.

        supersedable: True for a full geometry update, which replaces the previous queued
        update of the same key when that is supersedable too and not yet started.
        version: orderable (a message stamp) or None; when both updates of a supersession have
        one, the newer version stays whichever arrived last (racing producers: the later
        stamp wins, as the node's stale-stamp rule has it).
        """
        now = time.monotonic()
        with self._cond:
            if self._closed:
                return False
            last = self._last.get(key)
            if supersedable and last is not None and last.supersedable and not last.started:
                if version is not None and last.version is not None and version < last.version:
                    item, nbytes, version = last.item, last.nbytes, last.version  # the queued one is newer
                self._stats.pending_bytes += nbytes - last.nbytes
                last.item, last.nbytes, last.version = item, nbytes, version  # keeps its place
                self._stats.coalesced += 1
                self._stats.enqueued += 1
                self._cond.notify_all()
                return True
            if self._stats.pending and self._stats.pending_bytes + nbytes > self._max_bytes:
                self._stats.blocked += 1
                deadline = None if timeout is None else now + timeout
                while (self._stats.pending and self._stats.pending_bytes + nbytes > self._max_bytes
                       and not self._closed):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        return False
                    self._cond.wait(remaining)
                if self._closed:
                    return False
            entry = _Entry(key, item, supersedable, nbytes, now, version)
            self._order.append(entry)
            self._last[key] = entry
            self._stats.enqueued += 1
            self._stats.pending += 1
            self._stats.pending_bytes += nbytes
            self._stats.peak_pending_bytes = max(self._stats.peak_pending_bytes, self._stats.pending_bytes)
            self._cond.notify_all()
            return True

    # -------------------------------------------------------------- worker
    def _run(self) -> None:
        if self._nice:
            try:  # Linux: per-thread nice value; queries then win the CPU over BVH builds
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
            except (AttributeError, OSError):
                pass
        while True:
            with self._cond:
                while not self._order and not self._closed:
                    self._cond.wait()
                if not self._order:
                    return  # closed and drained
                entry = self._order.popleft()
                entry.started = True
                if self._last.get(entry.key) is entry:
                    del self._last[entry.key]
                self._busy = True
            try:
                self._apply(entry.item)
            except BaseException as exc:  # noqa: BLE001 - the worker must survive any update
                try:
                    self._on_error(entry.item, exc)
                except BaseException:  # noqa: BLE001
                    pass
            finally:
                entry.item = None  # release the message (it may hold a big mesh) right away
                with self._cond:
                    self._busy = False
                    self._stats.applied += 1
                    self._stats.pending -= 1
                    self._stats.pending_bytes -= entry.nbytes
                    self._stats.latencies.append(time.monotonic() - entry.enqueued)
                    self._cond.notify_all()

    # -------------------------------------------------------------- control and inspection
    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until everything queued so far was applied; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._order or self._busy:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def stats(self) -> QueueStats:
        """A copy of the counters (latencies: enqueue -> applied [s] of the last 2000 updates)."""
        with self._cond:
            s = self._stats
            return QueueStats(s.enqueued, s.applied, s.coalesced, s.pending, s.pending_bytes, s.blocked,
                              s.peak_pending_bytes, deque(s.latencies, maxlen=s.latencies.maxlen))

    def close(self, timeout: float = 5.0) -> None:
        """Stop accepting; the worker finishes what is queued (up to ``timeout``) and exits."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)


class LatencyWindow:
    """Thread-safe window of the last ``size`` latencies [s] with percentiles."""

    def __init__(self, size: int = 2000) -> None:
        self._lock = threading.Lock()
        self._values: deque[float] = deque(maxlen=size)

    def record(self, seconds: float) -> None:
        with self._lock:
            self._values.append(float(seconds))

    def percentiles(self) -> tuple[float, float, float]:
        """(p50, p99, max) [s] over the window; zeros when empty."""
        with self._lock:
            values = sorted(self._values)
        if not values:
            return 0.0, 0.0, 0.0
        def pick(q: float) -> float:
            return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]
        return pick(0.5), pick(0.99), values[-1]
