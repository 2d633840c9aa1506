"""``python -m bench.cuda_resources [--arch 87 89 90]``: per-kernel GPU resources, no GPU needed.

Compiles every robot_sdf Warp kernel module for each architecture (robot_sdf.tools.cuda_build,
cached) and prints a Markdown table: registers per thread and stack frame read from the cubin,
spill stores/loads from ``ptxas -v`` on Warp's PTX of the same module (ptxas of the
nvidia-cuda-nvcc pin in requirements-bench.txt, the CUDA release of Warp's NVRTC; "n/a" without
one), static shared memory per block, and the occupancy they imply on an H100 for Warp's default
256-thread blocks. Device functions that ptxas kept out of line and that spill are listed after
their module's kernels (their spills are paid on every call).
"""
from __future__ import annotations

import argparse
import re
import sys


def _join(by_arch: dict, value) -> str:
    """One cell for every arch: the value, or "a, b, c" where the arches differ."""
    cells = [str(value(*v)) if isinstance(v, tuple) else str(value(v, None)) for v in by_arch.values()]
    return cells[0] if len(set(cells)) == 1 else ", ".join(cells)


def _demangle(name: str) -> str:
    """The Warp function's name in a mangled device-function symbol (<len><name> after the
    module's file hash), else the symbol."""
    m = re.search(r"_cu_[0-9a-f]{8}(\d+)", name)
    if not m:
        return name
    return name[m.end():m.end() + int(m.group(1))]


def main(argv: list[str] | None = None) -> int:
    import warp as wp

    from robot_sdf.tools import cuda_build as cb

    parser = argparse.ArgumentParser(prog="python -m bench.cuda_resources", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(cb.ARCHS))
    parser.add_argument("--block-dim", type=int, default=cb.BLOCK_DIM, help="threads per block for the occupancy")
    args = parser.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    modules = cb.kernel_modules()
    cubins = cb.build_all(modules, args.arch)
    ptxas = cb.find_ptxas()
    release = "none: spills n/a"
    if ptxas is not None:
        import subprocess

        release = subprocess.run([ptxas, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    print(f"Warp {wp.config.version}; ptxas {release}; occupancy on {cb.H100.name} with {args.block_dim}-thread blocks\n")
    occ_arch = 90 if 90 in args.arch else args.arch[-1]
    archs = "/".join(str(a) for a in args.arch)
    print(f"| module | kernel | registers (sm_{archs}) | stack frame, B | spill stores / loads, B"
          f" | shared / block, B (sm_{occ_arch}) | H100 blocks / SM | H100 warps / SM (occupancy) | limited by |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|")
    out_of_line: dict[str, dict[int, object]] = {}
    for module in modules:
        rows: dict[str, dict[int, tuple]] = {}
        for arch in args.arch:
            spills = {}
            if ptxas is not None:
                ptx = cb.build(module, arch, cb.default_cache_dir(), use_ptx=True)
                try:
                    for f in cb.ptxas_resources(ptx, arch, ptxas):
                        spills[f.name] = f
                        if not f.entry and (f.spill_stores or f.spill_loads):
                            out_of_line.setdefault(f"{module.name} | device function `{_demangle(f.name)}`", {})[arch] = f
                except RuntimeError as e:
                    print(f"<!-- {module.name} sm_{arch}: {e} -->")
            for k in cb.read_cubin(cubins[(module.name, arch)]):
                label = k.kernel + (" (backward)" if k.backward else "")
                rows.setdefault(label, {})[arch] = (k, spills.get(k.name))
        for label, by_arch in rows.items():
            k_occ = by_arch[occ_arch][0]
            o = cb.occupancy(k_occ.registers, k_occ.shared, args.block_dim)
            print(f"| {module.name} | {label} | {_join(by_arch, lambda k, f: k.registers)} "
                  f"| {_join(by_arch, lambda k, f: k.stack_frame)} "
                  f"| {_join(by_arch, lambda k, f: f'{f.spill_stores} / {f.spill_loads}' if f else 'n/a')} "
                  f"| {k_occ.shared} | {o.blocks} | {o.warps} ({o.fraction:.1%}) | {o.limiter} |")
    for label, by_arch in out_of_line.items():
        print(f"| {label} | | {_join(by_arch, lambda f, _: f.stack_frame)} "
              f"| {_join(by_arch, lambda f, _: f'{f.spill_stores} / {f.spill_loads}')} | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
