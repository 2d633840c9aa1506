"""How long a MeshWorld snapshot keeps its meshes and tensors, and what waits for whom on CUDA.

A snapshot names Warp meshes by address and owns the small tensors the kernels read; on CUDA the
kernels run on the caller's stream and may still be queued when the caller drops the snapshot.
Retention keeps a snapshot's geometries and tensors, and hands them to the graveyard when they may
still be read; StreamTracker remembers the last evaluation per stream, so that an in-place refit
waits for those instead of synchronising the whole device. Never a host wait.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch


class Retention:
    """What a snapshot keeps alive, and on CUDA for how long.

    A snapshot names Warp meshes (by address) and owns small tensors that kernels read on the
    caller's stream. On the CPU kernels have run when the launch returns; on CUDA they may still
    be queued when the caller drops the snapshot, so ``after_use`` records an event on the
    caller's stream (the last one per stream: readers on several streams each keep theirs) and,
    when the snapshot is collected before those events have completed, its geometries and tensors
    move to a graveyard that lets go of them once they have (checked on every later collection
    and world change; never a host wait). ``ready`` is an event on Warp's stream
    recorded at publication, after every BVH build or refit this snapshot depends on: evaluations
    make their stream wait for it (stream-ordered, instead of a whole-device sync).
    """

    __slots__ = ("geometries", "tensors", "events", "ready", "tracker", "device")

    def __init__(self, geometries: tuple, tensors: tuple, ready=None, tracker=None, device=None):
        self.geometries = geometries
        self.tensors = tensors
        self.events: dict[int, object] = {}  # CUDA stream handle -> its last reader's event
        self.ready = ready  # None on the CPU: kernels there have run when the launch returns
        self.tracker = tracker
        self.device = device

    def before_use(self) -> None:
        if self.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready)

    def after_use(self) -> None:
        if self.ready is None:
            return
        stream = torch.cuda.current_stream(self.device)
        event = torch.cuda.Event()
        event.record(stream)
        self.events[int(stream.cuda_stream)] = event
        if self.tracker is not None:
            self.tracker.note(stream, event)

    def __del__(self) -> None:
        try:
            pending = tuple(event for event in self.events.values() if not event.query())
            if pending:
                graveyard.add(pending, self.geometries, self.tensors)
            graveyard.purge()
        except Exception:  # pragma: no cover - interpreter shutdown (module globals gone)
            pass


class _Graveyard:
    """Geometries and tensors of collected snapshots whose last kernels may still run (CUDA)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: list[tuple] = []

    def add(self, events: tuple, geometries: tuple, tensors: tuple) -> None:
        """Keep ``geometries`` and ``tensors`` until every CUDA event of ``events`` has completed."""
        with self._lock:
            self._entries.append((events, geometries, tensors))

    def purge(self) -> None:
        if not self._entries:
            return
        with self._lock:
            done, pending = [], []
            for entry in self._entries:
                (done if all(event.query() for event in entry[0]) else pending).append(entry)
            self._entries = pending
        del done  # geometries are freed here, outside the lock

    def __len__(self) -> int:
        return len(self._entries)


graveyard = _Graveyard()


class StreamTracker:
    """The last evaluation event per CUDA stream that read this world: an in-place refit makes
    Warp's stream wait for them instead of synchronising the whole device. Bounded."""

    _MAX_STREAMS = 32

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: OrderedDict[int, object] = OrderedDict()

    def note(self, stream, event) -> None:
        with self._lock:
            key = int(stream.cuda_stream)
            self._events[key] = event
            self._events.move_to_end(key)
            while len(self._events) > self._MAX_STREAMS:
                self._events.popitem(last=False)

    def make_wait(self, stream) -> None:
        """Make ``stream`` (a torch stream) wait for every recorded evaluation."""
        with self._lock:
            events = list(self._events.values())
        for event in events:
            stream.wait_event(event)
