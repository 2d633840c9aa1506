"""Ahead-of-time CUDA build of robot_sdf's Warp kernels, and what each kernel needs from an SM.

    python -m robot_sdf.tools.cuda_build [--arch 87 89 90] [--cache-dir DIR]

Warp compiles a module for a GPU architecture with its bundled NVRTC even where no CUDA driver
(and no GPU) is present, so a kernel that does not compile for CUDA shows up on any machine
(test/cuda_build_test.py runs this in ``make test``). The cubins land in a cache directory whose
file names carry Warp's content hash of the module, so an unchanged module is not compiled again.

Resources are read from each cubin's ELF: the ``.nv.info`` section holds per-kernel attributes
(EIATTR_REGCOUNT: registers per thread; EIATTR_FRAME_SIZE: bytes of local-memory stack frame per
thread, i.e. spills plus local arrays) and ``.nv.shared.<kernel>`` is the kernel's static shared
memory per block. Spill bytes themselves are only reported by ptxas (``bench/cuda_resources.py``).
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import warp as wp

PACKAGE_DIR = Path(__file__).resolve().parents[1]
# Jetson Orin, RTX 40 / L4 / L40, H100 / H200.
ARCHS = (87, 89, 90)
# Warp's default launch block size (threads per block) unless a kernel sets its own.
BLOCK_DIM = 256


# ------------------------------------------------------------------------------------ discovery
def _defines_kernels(source: str) -> bool:
    """True if the source uses ``wp.kernel``/``warp.kernel`` (decorator, call or ``wp.kernel(...)``)."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr == "kernel" and isinstance(node.value, ast.Name)
                and node.value.id in ("wp", "warp")):
            return True
    return False


def kernel_module_names(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Dotted names of the robot_sdf modules whose source defines Warp kernels (sorted).

    Found from the source (no import), so a module added later is included without a list to
    keep up to date, and the ROS or example modules are imported only if they hold kernels.
    """
    names = []
    for path in sorted(package_dir.rglob("*.py")):
        if _defines_kernels(path.read_text(encoding="utf-8")):
            rel = path.relative_to(package_dir.parent).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            names.append(".".join(parts))
    return names


def kernel_modules(package_dir: Path = PACKAGE_DIR) -> list[wp.Module]:
    """The Warp modules that hold robot_sdf's kernels, sorted by name (imports the modules that
    define them). A kernel belongs to the Warp module named after its Python module unless it
    names another one, so the modules are taken from the module-level kernel objects."""
    modules: dict[str, wp.Module] = {}
    for name in kernel_module_names(package_dir):
        for value in vars(importlib.import_module(name)).values():
            if isinstance(value, wp.Kernel):
                modules[value.module.name] = value.module
    return [modules[n] for n in sorted(modules)]


def enable_backward(module: wp.Module) -> bool:
    """The module's ``enable_backward`` option as its kernels are compiled."""
    return bool(module.resolve_options(wp.config)["enable_backward"])


# ---------------------------------------------------------------------------------------- build
def default_cache_dir() -> Path:
    """Where cubins are kept: $ROBOT_SDF_CUDA_BUILD_DIR, else beside Warp's own kernel cache
    (a directory per Warp version)."""
    env = os.environ.get("ROBOT_SDF_CUDA_BUILD_DIR")
    if env:
        return Path(env)
    wp.init()
    return Path(wp.config.kernel_cache_dir) / "robot_sdf_aot"


def build(module: wp.Module, arch: int, cache_dir: Path, use_ptx: bool = False) -> Path:
    """Compile ``module`` for sm_<arch> (cubin, or PTX with use_ptx) into ``cache_dir/<module>``;
    returns the file. Raises if any kernel of the module fails to compile (NVRTC's log is
    printed by Warp). A file already there for the module's current hash is reused."""
    out_dir = Path(cache_dir) / module.name
    (path,) = wp.compile_aot_module(module, arch=arch, use_ptx=use_ptx, module_dir=out_dir)
    return Path(path)


def prune(module: wp.Module, cache_dir: Path, min_age_s: float = 86400.0) -> None:
    """Drop the cached files of the module's other versions (content hashes) not written for
    ``min_age_s``: a checkout with another version of the module may be building right now."""
    out_dir = Path(cache_dir) / module.name
    current = module.get_module_identifier()
    now = time.time()
    for f in out_dir.glob("*") if out_dir.is_dir() else ():
        try:
            if not f.name.startswith(current + ".") and now - f.stat().st_mtime > min_age_s:
                f.unlink()
        except OSError:  # removed meanwhile
            pass


def build_all(modules, archs=ARCHS, cache_dir: Path | None = None, use_ptx: bool = False) -> dict[tuple[str, int], Path]:
    """Compile every module for every arch, one after the other (three archs from three threads
    took 1.5x as long on 2 cores); {(module name, arch): file}."""
    cache_dir = default_cache_dir() if cache_dir is None else Path(cache_dir)
    for m in modules:
        prune(m, cache_dir)
    return {(m.name, a): build(m, a, cache_dir, use_ptx) for m in modules for a in archs}


# ----------------------------------------------------------------------------------- cubin (ELF)
EIATTR_FRAME_SIZE = 0x11
EIATTR_REGCOUNT = 0x2F
EIFMT_SVAL = 0x04  # attribute with a 16-bit payload size, then the payload
SHT_SYMTAB = 2


@dataclass
class KernelResources:
    """What one compiled kernel entry needs per thread / per block."""

    name: str  # the cubin's entry name (Warp: <kernel>_<hash>_cuda_kernel_forward|backward)
    registers: int  # registers per thread
    stack_frame: int  # bytes of local memory per thread (spills + local arrays)
    shared: int  # bytes of static shared memory per block (section size, as the driver reserves it)

    @property
    def kernel(self) -> str:
        """The Warp kernel's name (the entry name less hash and pass)."""
        base = self.name.rsplit("_cuda_kernel_", 1)[0]
        return base.rsplit("_", 1)[0]

    @property
    def backward(self) -> bool:
        return self.name.endswith("_cuda_kernel_backward")


def _cstr(data: bytes, offset: int) -> str:
    return data[offset:data.index(b"\0", offset)].decode()


def read_cubin(path: Path) -> list[KernelResources]:
    """Per-entry resources of a CUDA cubin (ELF64), sorted by entry name."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError(f"{path}: not an ELF64 cubin")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    sections = []
    for i in range(shnum):
        name, kind, _, _, off, size, link, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        sections.append((name, kind, off, size, link))
    names_off = sections[shstrndx][2]
    named = {_cstr(data, names_off + s[0]): s for s in sections}
    symtab = next(s for s in sections if s[1] == SHT_SYMTAB)
    strtab_off = sections[symtab[4]][2]
    symbols = [_cstr(data, strtab_off + struct.unpack_from("<I", data, symtab[2] + 24 * i)[0])
               for i in range(symtab[3] // 24)]
    entries = [n[len(".text."):] for n in named if n.startswith(".text.") and "_cuda_kernel_" in n]
    regs: dict[str, int] = {}
    frame: dict[str, int] = {}
    _, _, off, size, _ = named[".nv.info"]
    end = off + size
    while off < end:
        fmt, attr = data[off], data[off + 1]
        if fmt != EIFMT_SVAL:
            off += 4
            continue
        (n,) = struct.unpack_from("<H", data, off + 2)
        if attr in (EIATTR_REGCOUNT, EIATTR_FRAME_SIZE) and n == 8:
            sym, value = struct.unpack_from("<II", data, off + 4)
            (regs if attr == EIATTR_REGCOUNT else frame)[symbols[sym]] = value
        off += 4 + n
    return sorted(
        (KernelResources(e, regs[e], frame.get(e, 0), named.get(".nv.shared." + e, (0, 0, 0, 0, 0))[3])
         for e in entries), key=lambda k: k.name)


# ---------------------------------------------------------------------------------------- ptxas
@dataclass
class PtxasFunction:
    """ptxas -v's figures for one function (an entry, or a device function it calls)."""

    name: str
    entry: bool
    stack_frame: int = 0  # bytes per thread
    spill_stores: int = 0  # bytes per thread
    spill_loads: int = 0  # bytes per thread
    registers: int | None = None  # entries only
    shared: int | None = None  # entries only (bytes per block, without the driver's reservation)


def find_ptxas() -> str | None:
    """ptxas of the pinned bench extra (nvidia-cuda-nvcc, same CUDA release as Warp's NVRTC),
    else one on PATH; None when there is none."""
    import shutil

    for entry in sys.path:
        candidate = Path(entry) / "nvidia" / "cu13" / "bin" / "ptxas"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which("ptxas")


def ptxas_resources(ptx: Path, arch: int, ptxas: str) -> list[PtxasFunction]:
    """Assemble Warp's PTX for sm_<arch> with ``ptxas -v`` and parse its resource report.

    Raises RuntimeError with ptxas's output when it fails (e.g. an older ptxas than the PTX).
    """
    import re
    import subprocess
    import tempfile

    # Warp's PTX files end with the NUL of the C string they were copied from.
    text = Path(ptx).read_bytes().rstrip(b"\0")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "module.ptx"
        src.write_bytes(text)
        out = subprocess.run([ptxas, "-v", f"-arch=sm_{arch}", str(src), "-o", str(Path(tmp) / "module.cubin")],
                             capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"ptxas failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    functions: dict[str, PtxasFunction] = {}
    entry = current = None
    for line in (out.stdout + out.stderr).splitlines():
        if m := re.search(r"Compiling entry function '([^']+)'", line):
            entry = functions.setdefault(m.group(1), PtxasFunction(m.group(1), True))
        elif m := re.search(r"Function properties for (\S+)", line):
            current = functions.setdefault(m.group(1), PtxasFunction(m.group(1), False))
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            current.stack_frame, current.spill_stores, current.spill_loads = map(int, m.groups())
        elif m := re.search(r"Used (\d+) registers", line):
            entry.registers = int(m.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            entry.shared = int(smem.group(1)) if smem else 0
    return sorted(functions.values(), key=lambda f: (not f.entry, f.name))


# ------------------------------------------------------------------------------------ occupancy
@dataclass(frozen=True)
class SmLimits:
    """Per-SM limits of a GPU generation (CUDA occupancy calculator figures)."""

    name: str
    registers: int = 65536
    max_warps: int = 64
    max_blocks: int = 32
    shared: int = 233472  # usable shared memory per SM (bytes)
    register_unit: int = 256  # registers are allocated to a warp in units of this many


H100 = SmLimits("H100 (sm_90)")


@dataclass
class Occupancy:
    blocks: int  # resident blocks per SM
    warps: int  # resident warps per SM
    fraction: float  # warps / max_warps
    limiter: str  # "registers", "shared memory", "warps" or "blocks"


def occupancy(registers: int, shared: int, block_dim: int = BLOCK_DIM, sm: SmLimits = H100) -> Occupancy:
    """Resident blocks and warps per SM of a kernel using ``registers`` per thread and ``shared``
    bytes of shared memory per block, launched with ``block_dim`` threads per block."""
    warps_per_block = -(-block_dim // 32)
    regs_per_warp = -(-registers * 32 // sm.register_unit) * sm.register_unit
    limits = {
        "registers": (sm.registers // regs_per_warp) // warps_per_block if regs_per_warp else sm.max_blocks,
        "shared memory": sm.shared // shared if shared else sm.max_blocks,
        "warps": sm.max_warps // warps_per_block,
        "blocks": sm.max_blocks,
    }
    limiter = min(limits, key=limits.get)
    blocks = limits[limiter]
    return Occupancy(blocks, blocks * warps_per_block, blocks * warps_per_block / sm.max_warps, limiter)


# ----------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m robot_sdf.tools.cuda_build",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", type=int, nargs="+", default=list(ARCHS), help="SM architectures (default 87 89 90)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="cubin directory (default: beside Warp's kernel cache)")
    args = parser.parse_args(argv)
    wp.config.log_level = wp.LOG_WARNING
    wp.init()
    t0 = time.perf_counter()
    modules = kernel_modules()
    paths = build_all(modules, args.arch, args.cache_dir)
    print(f"compiled {len(modules)} modules for sm_{', sm_'.join(map(str, args.arch))} "
          f"in {time.perf_counter() - t0:.1f} s")
    for (name, arch), path in paths.items():
        for k in read_cubin(path):
            print(f"{name:28s} sm_{arch} {k.kernel:36s} {k.registers:4d} regs {k.stack_frame:6d} B stack "
                  f"{k.shared:6d} B smem{'  (backward)' if k.backward else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
