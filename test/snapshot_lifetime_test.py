"""robot_sdf.snapshot_lifetime's bookkeeping, with torch's CUDA events and streams replaced by
stand-ins whose completion the test sets (the CUDA behaviour itself: test/cuda_hazards_test.py,
on a GPU): a snapshot read on two streams keeps its geometries until both readers' kernels have
run, whichever finishes first."""
from __future__ import annotations

import gc
import weakref

import pytest
import torch

from robot_sdf import snapshot_lifetime


class _Event:
    """A CUDA event stand-in: complete once the test says so."""

    def __init__(self) -> None:
        self.done = False

    def record(self, stream) -> None:
        self.stream = stream

    def query(self) -> bool:
        return self.done


class _Stream:
    def __init__(self, handle: int) -> None:
        self.cuda_stream = handle


class _Geometry:
    """Something a snapshot keeps alive (weak-referenceable, as a Warp mesh is)."""


@pytest.fixture
def fake_cuda(monkeypatch):
    streams = {"current": _Stream(1)}
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: streams["current"])
    snapshot_lifetime.graveyard.purge()
    yield streams


@pytest.mark.parametrize("first_done", ["first reader", "second reader"])
def test_a_snapshot_read_on_two_streams_outlives_both_readers(fake_cuda, first_done):
    geometry = _Geometry()
    alive = weakref.ref(geometry)
    retention = snapshot_lifetime.Retention((geometry,), (), ready=_Event(), device="cuda:0")
    events = []
    for handle in (1, 2):
        fake_cuda["current"] = _Stream(handle)
        retention.after_use()
        events.append(retention.events[handle])
    assert len(set(map(id, events))) == 2
    finished, running = events if first_done == "first reader" else events[::-1]
    finished.done = True
    del geometry, retention
    gc.collect()
    assert alive() is not None  # the other reader's kernel may still read it
    snapshot_lifetime.graveyard.purge()
    assert alive() is not None
    running.done = True
    snapshot_lifetime.graveyard.purge()
    gc.collect()
    assert alive() is None


def test_a_snapshot_whose_readers_have_run_is_freed_at_once(fake_cuda):
    geometry = _Geometry()
    alive = weakref.ref(geometry)
    retention = snapshot_lifetime.Retention((geometry,), (), ready=_Event(), device="cuda:0")
    retention.after_use()
    retention.events[1].done = True
    del geometry, retention
    gc.collect()
    assert alive() is None and len(snapshot_lifetime.graveyard) == 0


class _Capture:
    """torch.cuda.stream's stand-in: makes its stream current for is_current_stream_capturing."""

    def __init__(self, state, stream):
        self.state, self.stream = state, stream

    def __enter__(self):
        self.state["in"] = self.stream

    def __exit__(self, *exc):
        self.state["in"] = None


@pytest.fixture
def fake_streams(monkeypatch, fake_cuda):
    from robot_sdf import cuda_streams

    state = {"in": None, "capturing": set()}
    monkeypatch.setattr(torch.cuda, "ExternalStream", lambda handle, device=None: _Stream(handle))
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: _Capture(state, stream))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                        lambda: state["in"] is not None and state["in"].cuda_stream in state["capturing"])
    monkeypatch.setattr(cuda_streams, "_streams", {(0, 11): object(), (0, 12): object(), (1, 13): object()})
    monkeypatch.setattr(cuda_streams, "_evicted_events", [])
    fake_cuda["current"] = _Stream(7)
    return state


def test_queued_work_events_cover_every_stream_robot_sdf_launched_on(fake_streams):
    """One event per stream of the device that robot_sdf launched on, torch's current one too, and
    the pending events of streams that left the cache; none of another device's streams; None
    while one of them captures a graph."""
    from robot_sdf import cuda_streams

    left, done = _Event(), _Event()
    done.done = True
    cuda_streams._evicted_events.extend([(0, left), (0, done), (1, _Event())])
    events = cuda_streams.queued_work_events(torch.device("cuda", 0))
    recorded = sorted(e.stream.cuda_stream for e in events if hasattr(e, "stream"))
    assert recorded == [7, 11, 12] and left in events and done not in events and len(events) == 4
    assert [e for _, e in cuda_streams._evicted_events if e is done] == []  # completed ones are let go
    fake_streams["capturing"].add(12)
    assert cuda_streams.queued_work_events(torch.device("cuda", 0)) is None


def test_a_dropped_twin_waits_for_the_queued_work(monkeypatch, fake_cuda):
    """adoption.retire: with events, the twin's mesh lives in the graveyard until they complete
    (no device synchronisation); without (a capture), it waits in release_retired's list."""
    from robot_sdf import adoption

    event = _Event()
    answer = {"events": (event,)}
    monkeypatch.setattr(adoption, "queued_work_events", lambda device: answer["events"])

    class _CudaDevice:
        is_cpu = False

        def __str__(self):
            return "cuda:0"

    mesh = _Geometry()
    alive = weakref.ref(mesh)
    adoption.retire(_CudaDevice(), mesh, ())
    del mesh
    gc.collect()
    snapshot_lifetime.graveyard.purge()
    assert alive() is not None and not adoption._retired
    event.done = True
    snapshot_lifetime.graveyard.purge()
    gc.collect()
    assert alive() is None
    answer["events"] = None
    adoption.retire(_CudaDevice(), _Geometry(), ())
    assert len(adoption._retired) == 1
    adoption._retired.clear()
