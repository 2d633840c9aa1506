"""robot_sdf.memory: TrimScheduler coalesces requests into trims on its thread and records the
mark read before each trim (what the node's `heap_trim_revision` diagnostic reports)."""
from __future__ import annotations

import time

from robot_sdf.memory import TrimScheduler


def _wait(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_trim_records_the_mark_read_before_it():
    value = [5]
    trims = TrimScheduler(delay_s=0.0, min_interval_s=0.0, mark=lambda: value[0])
    try:
        assert trims.trims == 0 and trims.last_mark is None
        trims.request()
        _wait(lambda: trims.trims >= 1)
        assert trims.last_mark == 5
        value[0] = 9
        trims.request()
        _wait(lambda: trims.trims >= 2)
        assert trims.last_mark == 9 and trims.trims == 2
    finally:
        trims.close()


def test_requests_within_the_interval_make_one_trim():
    trims = TrimScheduler(delay_s=0.0, min_interval_s=3600.0, mark=lambda: 1)
    try:
        trims.request()
        _wait(lambda: trims.trims == 1)
        trims.request()
        trims.request()  # due an hour after the first trim: not before close
        assert trims.trims == 1 and trims.last_mark == 1
    finally:
        trims.close()
    assert trims.trims == 1
