"""The two kernel sets side by side: native (C++ that reads Warp's internals, on the Warp releases
it was checked against) and portable (pure Warp, what any other Warp gets), on rtb-data's real
meshes (bench.scenes.real_robot_meshes) as MeshWorld (auto) and as raw tensors passed as they are:
plain fwd+bwd on the sphere mix of bench.scenes.mixed_spheres and swept fwd+bwd (sweep_steps 4)
on MPPI-like rollouts.

The set is chosen once per process (robot_sdf.kernels.mesh_queries, ROBOT_SDF_KERNELS), so each
measurement is a child process (``python -m bench.kernel_sets --child``) timing every case
interleaved; children of the two sets alternate, and the table gives each case's median over
all children's repetitions. One thread a case on the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import numpy as np

SETS = ("native", "portable")
CASES = ("plain, MeshWorld", "swept, MeshWorld", "plain, raw tensors", "swept, raw tensors")


def _child(device: str, count: int, reps: int) -> dict[str, list[float]]:
    """Seconds per call of every case, ``reps`` interleaved rounds after a warm-up (this process's
    kernel set)."""
    from bench import measure, scenes
    from bench.core_bench import Bench, TensorWorld, _one_thread, build_world
    from bench.real_bench import RawRunner, SnapshotRunner, rollout_shape
    from robot_sdf import SignMethod

    meshes = scenes.real_robot_meshes()
    world = build_world(meshes, device, SignMethod.AUTO)
    raw = TensorWorld(meshes, device, 0.0)
    spheres, _ = scenes.mixed_spheres(meshes, count)
    rollouts = scenes.mpc_rollouts(*rollout_shape(count), workspace=scenes.scene_box(meshes, scenes.ANYWHERE_MARGIN))
    runners = {"MeshWorld": (SnapshotRunner(world, spheres), SnapshotRunner(world, rollouts)),
               "raw tensors": (RawRunner(raw, spheres), RawRunner(raw, rollouts))}
    cases = {}
    for name, (plain, swept) in runners.items():
        cases[f"plain, {name}"] = plain.forward_backward
        cases[f"swept, {name}"] = swept.swept_forward_backward
    if device == "cpu":
        cases = {k: (lambda f=f: _one_thread(f)) for k, f in cases.items()}
    sync = Bench(device, True).sync
    samples: dict[str, list[float]] = {k: [] for k in cases}

    def timed(name, fn):
        import time

        def run():
            t = time.perf_counter()
            fn()
            if sync is not None:
                sync()
            samples[name].append(time.perf_counter() - t)
        return run

    measure({k: timed(k, f) for k, f in cases.items()}, reps, warmup=1, sync=None, min_reps=reps, shuffle=True)
    return {k: v[1:] for k, v in samples.items()}  # the first call of each is the warm-up


def kernel_sets(b) -> None:
    """The table (module docstring), from alternating child processes of the two sets."""
    from bench import Stats, cpu_model, emit, section, table
    from robot_sdf.kernels import mesh_queries, warp_release

    count = 1_000 if b.quick else 20_000
    rounds, reps = (1, 2) if b.quick else (3, 5)
    section(f"Kernel sets on {b.device} ({cpu_model() if b.device == 'cpu' else b.device}): native against "
            f"portable (pure Warp), real robot meshes, {count:,} spheres")
    if not warp_release.WARP_CHECKED:
        emit("skipped: this Warp is not one native was checked against, so only the portable set runs here")
        return
    samples = {(s, c): [] for s in SETS for c in CASES}
    for _ in range(rounds):
        for kernel_set in SETS:
            env = dict(os.environ, ROBOT_SDF_KERNELS=kernel_set)
            done = subprocess.run([sys.executable, "-m", "bench.kernel_sets", "--child", "--device", b.device,
                                   "--count", str(count), "--reps", str(reps)], env=env, capture_output=True,
                                  text=True, timeout=1800)
            if done.returncode != 0:
                emit(f"{kernel_set}: the child failed ({done.returncode}): {done.stderr.strip()[-400:]}")
                return
            for case, times in json.loads(done.stdout.strip().splitlines()[-1]).items():
                samples[(kernel_set, case)].extend(times)
    rows = []
    for case in CASES:
        native, portable = (Stats.of(samples[(s, case)]) for s in SETS)
        rows.append([case, native.ms(), portable.ms(), f"{portable.median / native.median:.2f}"])
    emit(table(["fwd+bwd", "native ms (p25-p75)", "portable ms (p25-p75)", "portable / native"], rows))
    emit(f"{rounds} child processes per set, alternating, {reps} interleaved repetitions each; this process's own set: "
         f"{'native' if mesh_queries.NATIVE else 'portable'}.")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", action="store_true", help="time this process's kernel set, print JSON")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--count", type=int, default=20_000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    if not args.child:
        from bench.core_bench import Bench

        kernel_sets(Bench(args.device, False))
        return 0
    import warp as wp

    wp.config.log_level = wp.LOG_WARNING
    result = _child(args.device, args.count, args.reps)
    print(json.dumps({k: [float(x) for x in np.asarray(v)] for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
