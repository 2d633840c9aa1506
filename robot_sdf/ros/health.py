"""Diagnostics of the sdf_server node: what went wrong recently and how badly, request
statistics, and the /diagnostics status that reports them.

HealthMonitor: the node reports events as they happen; ``status()`` sums up those within the
last ``window_s`` seconds:

- ERROR: internal errors (an exception that is not a refusal of bad input: a device error such
  as CUDA out of memory, a kernel failure, a bug) in a service, an update or a publisher;
- WARN: rejected topic messages, failed (refused) service requests, requests slower than
  ``slow_request_s``;
- OK otherwise.

The message names each kind with its count and the latest reason, so an operator reading
``ros2 topic echo /diagnostics`` (or rqt_robot_monitor) sees why.

RequestStats counts service requests and their latencies; diagnostic_status() builds the
node's DiagnosticStatus from both. HealthMonitor and RequestStats are pure Python and
thread-safe.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
from diagnostic_msgs.msg import DiagnosticStatus, KeyValue

OK, WARN, ERROR = 0, 1, 2  # the values of diagnostic_msgs/DiagnosticStatus levels
_MAX_EVENTS = 10_000  # per kind: bounded memory under any input rate


@dataclass(frozen=True)
class Event:
    time_s: float
    source: str  # what the event concerns: a message description or a service name
    reason: str


class HealthMonitor:
    """Recent problems of the node. window_s: how long an event counts [s]; slow_request_s:
    latency above which a request counts as slow [s] (0 = never). Both may be changed at run time."""

    KINDS = ("internal_errors", "rejected_messages", "failed_requests", "slow_requests")
    _TEXT = {"internal_errors": "internal error", "rejected_messages": "rejected message",
             "failed_requests": "failed request", "slow_requests": "slow request"}

    def __init__(self, window_s: float = 10.0, slow_request_s: float = 1.0, clock=time.monotonic) -> None:
        self.window_s = float(window_s)
        self.slow_request_s = float(slow_request_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._events: dict[str, deque[Event]] = {k: deque(maxlen=_MAX_EVENTS) for k in self.KINDS}

    def _add(self, kind: str, source: str, reason: str) -> None:
        with self._lock:
            self._events[kind].append(Event(self._clock(), source, reason))

    def internal_error(self, source: str, reason: str) -> None:
        self._add("internal_errors", source, reason)

    def rejected(self, source: str, reason: str) -> None:
        self._add("rejected_messages", source, reason)

    def request_failed(self, service: str, reason: str) -> None:
        self._add("failed_requests", service, reason)

    def request_done(self, service: str, latency_s: float) -> None:
        """Record a served request; counts as slow when beyond slow_request_s."""
        if self.slow_request_s > 0 and latency_s > self.slow_request_s:
            self._add("slow_requests", service,
                      f"{1e3 * latency_s:.1f} ms > {1e3 * self.slow_request_s:.1f} ms")

    def recent(self) -> dict[str, list[Event]]:
        """Events of each kind within the window, oldest first."""
        cutoff = self._clock() - self.window_s
        with self._lock:
            for q in self._events.values():
                while q and q[0].time_s < cutoff:
                    q.popleft()
            return {k: list(q) for k, q in self._events.items()}

    def status(self) -> tuple[int, str, dict[str, int]]:
        """(level OK/WARN/ERROR, message, counts per kind within the window)."""
        recent = self.recent()
        counts = {k: len(v) for k, v in recent.items()}
        parts = []
        for kind in self.KINDS:
            events = recent[kind]
            if events:
                last = events[-1]
                noun = self._TEXT[kind] + ("s" if len(events) > 1 else "")
                parts.append(f"{len(events)} {noun} in the last {self.window_s:g} s "
                             f"(latest: {last.source}: {last.reason})")
        if counts["internal_errors"]:
            level = ERROR
        elif parts:
            level = WARN
        else:
            level = OK
        return level, "; ".join(parts), counts


class RequestStats:
    """Thread-safe request counters and latency percentiles for the diagnostics."""

    def __init__(self, window: int = 1000) -> None:
        self._lock = threading.Lock()
        self._latencies: deque[float] = deque(maxlen=window)
        self.total = 0
        self.failed = 0
        self._since_report = 0
        self._last_report = time.monotonic()

    def record(self, latency_s: float, ok: bool) -> None:
        with self._lock:
            self.total += 1
            self._since_report += 1
            self.failed += 0 if ok else 1
            if ok:
                self._latencies.append(latency_s)

    def report(self) -> tuple[float, float, float]:
        """Request rate [Hz] since the last report, latency p50 and p95 [s] over the window."""
        with self._lock:
            now = time.monotonic()
            rate = self._since_report / max(now - self._last_report, 1e-9)
            self._since_report, self._last_report = 0, now
            lat = np.array(self._latencies) if self._latencies else np.zeros(1)
        return rate, float(np.percentile(lat, 50)), float(np.percentile(lat, 95))


def diagnostic_status(name: str, world, config, requests: RequestStats, health: HealthMonitor,
                      rejected_messages: int, details: dict[str, str]) -> DiagnosticStatus:
    """The node's status for /diagnostics: level and message from ``health`` (or the world's
    mesh count and revision when all is well), then key values: the world (``world``, a
    MeshWorld, with ``config``'s sign_method and num_envs), the requests (rate since the
    previous call, latency p50/p95 [ms]), ``rejected_messages`` (topic messages rejected since
    start), the recent problems per kind and ``details`` (update queue, state, heap trims)."""
    rate, p50, p95 = requests.report()
    level, problems, recent = health.status()
    n_mesh = world.mesh_count()
    rev = world.revision
    values = {
        "device": str(world.device), "sign_method": config.sign_method,
        "num_envs": config.num_envs, "mesh_count": n_mesh, "revision": rev,
        "requests_total": requests.total, "requests_failed": requests.failed,
        "request_rate_hz": f"{rate:.3f}", "latency_p50_ms": f"{1e3 * p50:.3f}",
        "latency_p95_ms": f"{1e3 * p95:.3f}", "rejected_messages": rejected_messages,
        "window_s": f"{health.window_s:g}",
        **{f"recent_{kind}": n for kind, n in recent.items()},
        **details,
    }
    return DiagnosticStatus(level=bytes([level]), name=name, hardware_id=str(world.device),
                            message=problems or f"{n_mesh} meshes, revision {rev}",
                            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
