"""Every Warp module of robot_sdf compiles to cubin for real GPUs, here without a GPU.

Warp's bundled NVRTC builds for a named architecture with no CUDA driver present, so a kernel
that does not compile for CUDA fails here, in `make test`, not on a robot. Architectures:
sm_87 (Jetson Orin), sm_89 (RTX 40, L4, L40), sm_90 (H100, H200). The cubins are cached
(robot_sdf.tools.cuda_build.default_cache_dir, keyed by Warp's content hash of each module):
about 105 s of CPU time per architecture on a cold cache on the 2-core CI machine (2-core Intel
Xeon, measured), twice that in wall time when the machine is loaded, a fraction of a second warm.
Per-kernel registers, spills and occupancy: bench/cuda_resources.py, docs/history/benchmarks.md.
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import warp as wp

from robot_sdf.tools import cuda_build

REPO = Path(__file__).resolve().parents[1]
# A cold build of the three architectures takes 5-11 min of wall time (module docstring): more
# than setup.cfg's per-test limit, which is for hangs, not for this compile.
pytestmark = pytest.mark.timeout(1500)


def _grep_kernel_modules() -> set[str]:
    """Modules with a ``@wp.kernel`` decorator line, by plain text search (the reference for the
    tool's own discovery)."""
    found = set()
    for path in (REPO / "robot_sdf").rglob("*.py"):
        if re.search(r"^\s*@(wp|warp)\.kernel\b", path.read_text(encoding="utf-8"), re.MULTILINE):
            found.add(".".join(path.relative_to(REPO).with_suffix("").parts))
    return found


@pytest.fixture(scope="module")
def built():
    """(Warp modules, {(module name, arch): cubin}) for every kernel module and arch."""
    modules = cuda_build.kernel_modules()
    return modules, cuda_build.build_all(modules, cuda_build.ARCHS)


def test_every_kernel_module_is_found():
    grep = _grep_kernel_modules()
    # Modules with kernels today, so that the search itself cannot come back empty.
    assert {"robot_sdf.kernels.plain_cost", "robot_sdf.kernels.swept", "robot_sdf.mesh_analysis"} <= grep
    assert set(cuda_build.kernel_module_names()) >= grep
    # Their kernels' Warp modules are built (the kernels package's kernels share one, robot_sdf.kernels).
    warp_modules = {k.module.name for name in grep for k in vars(importlib.import_module(name)).values()
                    if isinstance(k, wp.Kernel)}
    assert {"robot_sdf.kernels", "robot_sdf.mesh_analysis"} <= warp_modules
    assert {m.name for m in cuda_build.kernel_modules()} >= warp_modules


@pytest.mark.parametrize("arch", cuda_build.ARCHS)
def test_kernel_modules_compile_to_cubin(built, arch):
    modules, paths = built
    for module in modules:
        path = paths[(module.name, arch)]
        assert path.name.endswith(f".sm{arch}.cubin"), path
        entries = cuda_build.read_cubin(path)
        # Every kernel of the module is in the cubin, with a register count a launch of Warp's
        # default 256-thread blocks can get (255 per thread at most).
        assert {k.kernel for k in entries if not k.backward} == set(module.kernels), path
        for k in entries:
            assert 0 < k.registers <= 255, k


def test_kernel_modules_generate_no_adjoints(built):
    """Gradients are analytic (robot_sdf.kernels) or not needed (build-time mesh analysis): no module
    generates Warp's adjoint kernels, which would double the compile and the cubin."""
    modules, paths = built
    for module in modules:
        assert cuda_build.enable_backward(module) is False, module.name
        for arch in cuda_build.ARCHS:
            assert not [k.name for k in cuda_build.read_cubin(paths[(module.name, arch)]) if k.backward]


# A device function whose CUDA body does not compile: Warp's Python codegen accepts it, so only
# NVRTC can reject it (what a typo in a func_native snippet or a Warp regression would do).
@wp.func_native("""return not_a_cuda_function(x);""")
def _broken_native(x: float) -> float: ...


@wp.kernel(module="unique", enable_backward=False)
def _broken_kernel(a: wp.array(dtype=float)):
    a[wp.tid()] = _broken_native(a[wp.tid()])


def test_a_kernel_that_does_not_compile_for_cuda_fails_the_build(tmp_path):
    with pytest.raises(Exception, match="(?i)build failed|compil|nvrtc"):
        cuda_build.build(_broken_kernel.module, 90, tmp_path)
    assert not list(tmp_path.rglob("*.cubin"))


def test_cubin_resources_match_ptxas(tmp_path):
    """The ELF reader agrees with ptxas -v on the same module (the smallest kernel module,
    assembled from Warp's PTX for sm_90): registers and stack frame of every entry."""
    ptxas = cuda_build.find_ptxas()
    if ptxas is None:
        pytest.skip("no ptxas (the nvidia-cuda-nvcc pin of requirements-bench.txt provides one)")
    module = wp.get_module("robot_sdf.mesh_analysis")
    cubin = cuda_build.read_cubin(cuda_build.build(module, 90, cuda_build.default_cache_dir()))
    ptx = cuda_build.build(module, 90, tmp_path, use_ptx=True)
    try:
        reported = {f.name: f for f in cuda_build.ptxas_resources(ptx, 90, ptxas) if f.entry}
    except RuntimeError as e:
        if "version" in str(e).lower():
            pytest.skip(f"ptxas older than Warp's PTX: {e}")
        raise
    assert reported and set(reported) == {k.name for k in cubin}
    for k in cubin:
        assert (k.registers, k.stack_frame) == (reported[k.name].registers, reported[k.name].stack_frame), k.name


def test_occupancy_of_known_register_counts():
    """H100 figures worked by hand: 256-thread blocks (8 warps), 65536 registers per SM,
    registers allocated per warp in units of 256, 64 warps per SM."""
    # 255 registers -> 256 per thread, 8192 per warp: 8 warps fit, one block.
    assert (cuda_build.occupancy(255, 0).warps, cuda_build.occupancy(255, 0).limiter) == (8, "registers")
    # 64 registers -> 2048 per warp: 32 warps, four blocks.
    assert cuda_build.occupancy(64, 0).blocks == 4
    # 32 registers: 64 warps by registers, also the warp limit.
    assert cuda_build.occupancy(32, 0).fraction == 1.0
    # 40 registers -> 1280 per warp: 51 warps -> 6 whole blocks (48 warps).
    assert cuda_build.occupancy(40, 0).warps == 48
    # Shared memory: 34816 bytes per block -> 6 blocks in 233472 bytes.
    assert cuda_build.occupancy(24, 34816) == cuda_build.Occupancy(6, 48, 0.75, "shared memory")


def test_launch_bounds_match_the_launches():
    """A kernel declaring CUDA launch bounds fails to launch with larger blocks, and only a GPU
    would show it: declared bounds must be the block size robot_sdf launches with, Warp's CUDA
    default (no launch in the package names a block_dim)."""
    import ast

    bounded = 0
    for module in cuda_build.kernel_modules():
        for kernel in module.kernels.values():
            bounds = kernel.options.get("launch_bounds")
            if bounds is not None:
                bounded += 1
                assert (bounds if isinstance(bounds, int) else bounds[0]) == cuda_build.BLOCK_DIM, kernel.key
    assert bounded >= 2  # the two query kernels (shared-memory spilling needs the bounds)
    for path in (REPO / "robot_sdf").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "launch":
                assert "block_dim" not in {k.arg for k in node.keywords}, f"{path}:{node.lineno}"
