"""``python -m bench [--quick] [--only core|ros|tf] [--device cpu|cuda]``: run the benchmarks.

Prints the machine description, then Markdown tables (see docs/benchmarking.md for what each
number means). ``--quick`` shrinks every size and repetition count so that the whole run takes
seconds to tens of seconds: a smoke test of the benchmark code, not a measurement.
"""
from __future__ import annotations

import argparse
import os
import sys
import time


def _private_ros_env() -> int:
    """DDS discovery on loopback and a ROS domain of our own, before anything imports rclpy."""
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    from robot_sdf.ros.server_process import reserve_domain_id

    domain = reserve_domain_id(1 + (os.getpid() * 13 + 61) % 100)
    os.environ["ROS_DOMAIN_ID"] = str(domain)
    return domain


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions (smoke test)")
    parser.add_argument("--only", choices=("core", "ros", "tf"), help="run only this part")
    parser.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    parser.add_argument("--tables", help="comma-separated core tables to run (default: all), e.g. "
                        "real_mesh_table; an unknown name lists the known ones")
    parser.add_argument("--spheres", help="comma-separated sphere counts of real_mesh_table "
                        "(default 1000,100000; --quick 1000,6240)")
    args = parser.parse_args(argv)
    only_tables = [t.strip() for t in args.tables.split(",") if t.strip()] if args.tables else None
    try:
        real_spheres = tuple(int(x) for x in args.spheres.split(",")) if args.spheres else None
    except ValueError:
        parser.error(f"--spheres takes comma-separated integers, got {args.spheres!r}")
    if real_spheres is not None and min(real_spheres) < 1:
        parser.error("--spheres: counts must be positive")
    domain = _private_ros_env()

    import torch
    import warp as wp

    # Warp's INFO log (init banner, one line per module load) would interleave with the tables.
    wp.config.log_level = wp.LOG_WARNING
    device = args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {device}: CUDA is not available to torch")
    if device not in ("cpu",) and not device.startswith("cuda"):
        parser.error(f"--device must be cpu, cuda or cuda:N, got {device}")

    from bench import emit, machine_description, table

    emit(f"# robot_sdf benchmarks{' (--quick: smoke test, not a measurement)' if args.quick else ''}\n")
    emit(table(["machine", ""], machine_description(device)))
    emit(f"\nROS_DOMAIN_ID={domain}, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST")
    t0 = time.perf_counter()
    if args.only in (None, "core"):
        from bench import core_bench

        unknown = sorted(set(only_tables or ()) - set(core_bench.tables()))
        if unknown:
            parser.error(f"--tables: unknown {', '.join(unknown)}; known: {', '.join(core_bench.tables())}")
        emit("\n## Core (in-process)")
        core_bench.run(device, args.quick, only_tables, real_spheres)
    if args.only in (None, "ros"):
        from bench import ros_bench

        emit("\n## ROS 2 node")
        ros_bench.run(device, args.quick)
    if args.only in (None, "tf"):
        from bench import tf_bench

        tf_bench.run(args.quick)
    from bench import load_average

    emit(f"\nTotal benchmark time {time.perf_counter() - t0:.0f} s; load average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
