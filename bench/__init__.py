"""robot_sdf benchmarks (``python -m bench``): shared timing, table and machine-description helpers.

Benchmarks are not tests: they print Markdown tables (a run replaces docs/results.md).
Timing policy: every compared case gets a warm-up call, then the cases are run round-robin,
one call each per round (the starting case rotates from round to round), so that a burst of
load from other processes hits all of them alike and their ratios stay meaningful; the tables
report the median (and the 25th-75th percentile spread) of the per-call wall times.
"""
from __future__ import annotations

import os
import platform
import random
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Stats:
    """Wall times of one case [s]: median, quartiles, minimum, and the number of timed calls."""

    median: float
    p25: float
    p75: float
    minimum: float
    reps: int

    @classmethod
    def of(cls, samples: Sequence[float]) -> "Stats":
        s = sorted(samples)
        if len(s) >= 4:
            q = statistics.quantiles(s, n=4)
            p25, p75 = q[0], q[2]
        else:
            p25, p75 = s[0], s[-1]
        return cls(statistics.median(s), p25, p75, s[0], len(s))

    def ms(self) -> str:
        """``median (p25-p75)`` in milliseconds."""
        return f"{fmt_ms(self.median)} ({fmt_ms(self.p25)}-{fmt_ms(self.p75)})"


def fmt_ms(seconds: float) -> str:
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def fmt_rate(per_s: float) -> str:
    """A throughput like 1.23 M/s."""
    for scale, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{per_s / scale:.2f} {unit}/s"
    return f"{per_s:.1f} /s"


def measure(cases: dict[str, Callable[[], object]], reps: int, warmup: int = 1,
            sync: Callable[[], None] | None = None, budget_s: float | None = None,
            min_reps: int = 3, shuffle: bool = False) -> dict[str, Stats]:
    """Time each callable ``reps`` times, interleaved round-robin after ``warmup`` calls each.

    shuffle: a new (seeded) order every round instead of a rotation of one cyclic order, in which
    each case always follows the same case: where cases share memory (the twins shared by raw
    tensors of the same content) the one that follows its sharer finds it in the caches, which
    moved a 3 ms ratio by 10-35 % (docs/history/benchmarks.md).

    sync: called after each call before the clock stops (e.g. torch.cuda.synchronize).
    budget_s: when given, the number of rounds is cut so that the whole measurement takes about
    this long (estimated from the last warm-up round; at least ``min_reps`` rounds), to keep slow
    cases affordable on a shared machine.
    Returns name -> Stats of the per-call wall times [s].
    """
    names = list(cases)
    per_round = 0.0
    for w in range(max(warmup, 1)):
        per_round = 0.0
        for name in names:
            t0 = time.perf_counter()
            cases[name]()
            if sync is not None:
                sync()
            per_round += time.perf_counter() - t0
    if budget_s is not None and per_round > 0:
        reps = max(min_reps, min(reps, int(budget_s / per_round)))
    samples: dict[str, list[float]] = {n: [] for n in names}
    rng = random.Random(20241124)
    for r in range(reps):
        order = rng.sample(names, len(names)) if shuffle else [names[(r + k) % len(names)] for k in range(len(names))]
        for name in order:
            t0 = time.perf_counter()
            cases[name]()
            if sync is not None:
                sync()
            samples[name].append(time.perf_counter() - t0)
    return {n: Stats.of(samples[n]) for n in names}


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table with the columns padded for reading in a terminal."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells[1:]]
    return "\n".join(lines)


def section(title: str) -> None:
    print(f"\n### {title}\n", flush=True)


def emit(text: str) -> None:
    print(text, flush=True)


def load_average() -> str:
    """The 1/5/15-minute load averages (Linux), e.g. '1.92 1.40 0.80'."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "n/a"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def machine_description(device: str) -> list[tuple[str, str]]:
    """(key, value) lines: CPU, cores, memory, Python/torch/warp/open3d versions, device name."""
    import torch
    import warp as wp

    try:
        import open3d

        o3d_version = open3d.__version__
    except ImportError:
        o3d_version = "not installed"
    mem = "n/a"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    from robot_sdf.launch import cpu_threads

    lines = [
        ("CPU", cpu_model()),
        ("cores", f"{usable_cores()} usable ({os.cpu_count()} online); robot_sdf CPU launch threads: {cpu_threads()}"),
        ("memory", mem),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("python", platform.python_version()),
        ("torch", f"{torch.__version__} (intra-op threads {torch.get_num_threads()})"),
        ("warp", wp.__version__),
        ("open3d", o3d_version),
    ]
    if device.startswith("cuda"):
        lines.append(("device", f"{device}: {torch.cuda.get_device_name(torch.device(device))}"))
    else:
        lines.append(("device", f"cpu ({cpu_model()})"))
    lines.append(("load average at start", load_average()))
    return lines
