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
