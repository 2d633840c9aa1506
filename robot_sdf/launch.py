"""How robot_sdf launches its query kernels: one launch layer, per device, one marshalling.

A launch's arguments are the kernel's own, in order: per-call buffers as contiguous torch tensors
(passed as flat 1-D arrays of the kernel argument's dtype), kept arguments as Warp launch
descriptors (``descriptor``) or struct values (``WorldValue``), scalars as Python numbers.

- CUDA: a recorded launch (``wp.launch(..., record_cmd=True)``) replayed on torch's current
  stream with new descriptors; a MeshWorld snapshot read there is fenced (snapshot_lifetime).
- CPU: Warp runs a launch serially, so a large one is split into contiguous chunks run from a
  thread pool (Warp releases the GIL while a CPU kernel runs); a small one calls the recorded
  launch's kernel hook with a persistent argument struct (_CpuCall).

The shortcuts write into Warp's private Launch objects and kernel hooks, so they run only on the
Warp releases robot_sdf._internals.WARP_SHORTCUTS lists; elsewhere every launch is Warp's public
``wp.launch`` (test/cuda_paths_test.py checks that both give the same results).

Launches that do not come here, and why: the builders of a mesh's data (mesh_analysis,
face_winding, mesh_classification, adoption) and of the slot index (slot_index), and perception's
kernels (robot_sdf.perception): they run once per world change, on Warp's own stream, where the
public ``wp.launch`` costs nothing that matters.
"""
from __future__ import annotations

import ctypes
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
import warp as wp

from robot_sdf import _internals, face_winding, kernels, mesh_analysis
from robot_sdf.cuda_streams import torch_stream
from robot_sdf.kernels.mesh_queries import CPU_SPHERES_PER_THREAD
from robot_sdf.snapshot_lifetime import graveyard

_CPU_MIN_SPHERES_PER_POOL_THREAD = 2048
# Small CPU launches go straight to the kernel hook (_CpuCall). False sends them through Warp's
# recorded launch, the path every CUDA launch takes, so that tests run it without a GPU.
CPU_DIRECT_CALLS = True
_cpu_pool: ThreadPoolExecutor | None = None
_cpu_pool_lock = threading.Lock()
_initialised = False


def cpu_threads() -> int:
    """Threads for Warp CPU launches: ROBOT_SDF_CPU_THREADS, else the cores this process may use."""
    env = os.environ.get("ROBOT_SDF_CPU_THREADS")
    if env:
        return max(1, int(env))
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def init_warp() -> None:
    """Initialise Warp once, quietly."""
    global _initialised
    if not _initialised:
        wp.config.log_level = wp.LOG_WARNING
        wp.init()
        _initialised = True


_loaded_devices: set[str] = set()
_warp_devices: dict[torch.device, object] = {}
_load_lock = threading.Lock()
_KERNEL_MODULES = tuple(dict.fromkeys(
    [k.module.name for k in (kernels.sphere_cost_kernel, kernels.swept_sphere_cost_kernel,
                             kernels.sphere_hessian_kernel, kernels.slot_boxes_kernel)]
    + [mesh_analysis.__name__, face_winding.__name__]))


def warp_device(device: torch.device):
    """The Warp device of a torch device, robot_sdf's kernels loaded on it (once, under a lock:
    Warp's module loading is not thread-safe and service threads may launch concurrently)."""
    wdev = _warp_devices.get(device)
    if wdev is not None:
        return wdev
    init_warp()
    wdev = wp.device_from_torch(device)
    if wdev.alias not in _loaded_devices:
        with _load_lock:
            if wdev.alias not in _loaded_devices:
                for module in _KERNEL_MODULES:
                    wp.load_module(module, device=wdev)
                _loaded_devices.add(wdev.alias)
    _warp_devices[device] = wdev
    return wdev


class _Launches(threading.local):
    """Recorded launches per (kernel, device) and per thread (a Launch holds its packed
    arguments, so two threads must not share one): [Launch, threads, _CpuCall or None]."""

    def __init__(self) -> None:
        self.by_kernel: dict[tuple, list] = {}


_launches = _Launches()
# Warp's launch descriptor type, taken from its public API (the class itself is not exported).
ArrayDescriptor = type(wp.from_torch(torch.zeros(1), return_ctype=True))


def _element_bytes(kernel) -> tuple:
    """Per argument of ``kernel``: the byte size of a 1-D array argument's element, else 0."""
    sizes = _element_sizes.get(kernel)
    if sizes is None:
        sizes = _element_sizes[kernel] = tuple(
            wp.types.type_size_in_bytes(a.type.dtype) if getattr(a.type, "ndim", 0) == 1 else 0
            for a in kernel.adj.args)
    return sizes


_element_sizes: dict = {}


class _CpuCall:
    """A recorded CPU launch called through its kernel hook with a persistent argument struct (what
    Warp's own replay does, minus building a fresh struct per call): an argument is written only
    when it is not the object written last; a tensor goes straight into its array's fields."""

    def __init__(self, cmd) -> None:
        self.cmd = cmd
        fields = [(arg.label, type(value)) for arg, value in zip(cmd.kernel.adj.args, cmd.params[1:])]
        self.names = [name for name, _ in fields]
        self.struct = type("RobotSdfArgs", (ctypes.Structure,), {"_fields_": fields})()
        self.struct_ref = ctypes.byref(self.struct)
        self.last: list = [None] * len(fields)
        self.hook = cmd.hooks.forward
        # (data, shape) views into the struct of each 1-D array argument, with its element size.
        self.flat: dict[int, tuple] = {}
        for i, size in enumerate(_element_bytes(cmd.kernel)):
            if size and fields[i][1] is ArrayDescriptor:
                view = getattr(self.struct, self.names[i])
                self.flat[i] = (view, view.shape, size)

    def __call__(self, args: list) -> None:
        struct, last, names = self.struct, self.last, self.names
        for i, value in enumerate(args):
            if value is last[i]:  # kept arguments and small numbers, as written last time
                continue
            if isinstance(value, torch.Tensor):
                view, shape, size = self.flat[i]
                view.data = value.data_ptr()
                shape[0] = value.numel() * value.element_size() // size
                if last[i] is not _FLAT:
                    view.ndim, view.strides[0], last[i] = 1, size, _FLAT
            else:
                setattr(struct, names[i], value.__ctype__() if isinstance(value, wp.array) else value)
                last[i] = value
        self.hook(ctypes.byref(self.cmd.bounds), self.struct_ref)


_FLAT = object()  # _CpuCall.last of an argument that a tensor was written to


def _replay(kernel, wdev, threads: int, args: list, stream=None) -> None:
    """Launch ``kernel`` over ``threads`` threads with ``args`` through a recorded launch reused
    across calls (Warp's public launch where the shortcuts are not checked)."""
    if not _internals.WARP_SHORTCUTS:
        wp.launch(kernel, dim=threads, inputs=_described(kernel, args), device=wdev, stream=stream)
        return
    entry = _launches.by_kernel.get((kernel, wdev.alias))
    if entry is None:
        # A first launch may load the kernel's module: under the load lock (pool threads
        # recording at once would load it concurrently, which crashes Warp).
        with _load_lock:
            cmd = wp.launch(kernel, dim=threads, inputs=_described(kernel, args), device=wdev, record_cmd=True)
        if not isinstance(cmd, wp.Launch) or cmd.fwd_args is None:
            raise RuntimeError(f"Warp did not record a reusable launch of {kernel.key}")
        direct = CPU_DIRECT_CALLS and wdev.is_cpu and cmd.block_dim <= 1 and not cmd.adjoint
        entry = _launches.by_kernel[(kernel, wdev.alias)] = [cmd, threads, _CpuCall(cmd) if direct else None]
    cmd, dim, direct = entry
    if dim != threads:
        cmd.set_dim(threads)
        entry[1] = threads
    if direct is not None:
        direct(args)
        return
    # params[0] is the launch bounds, params[i + 1] argument i: descriptors and struct values
    # replace their slot (and, on CUDA, its address); scalars are written in place.
    params, addresses, recorded = cmd.params, cmd.params_addr, cmd.fwd_args
    for i, value in enumerate(_described(kernel, args)):
        if isinstance(value, wp.array):
            value = value.__ctype__()
        if isinstance(value, ctypes.Structure):
            if params[i + 1] is not value:
                params[i + 1] = value
                if addresses:
                    addresses[i + 1] = ctypes.c_void_p(ctypes.addressof(value))
        else:
            params[i + 1].value = value
        recorded[i] = value
    cmd.launch(stream) if stream is not None else cmd.launch()


def _described(kernel, args: list) -> list:
    """``args`` with each tensor replaced by its flat descriptor."""
    sizes = _element_bytes(kernel)
    return [flat_descriptor(v, sizes[i]) if type(v) is torch.Tensor else v for i, v in enumerate(args)]


def argument_positions(kernel, *names: str) -> tuple[int, ...]:
    """Positions of the named arguments in ``kernel``'s signature."""
    labels = [arg.label for arg in kernel.adj.args]
    return tuple(labels.index(name) for name in names)


# The query kernels: on the CPU each thread handles a run of CPU_SPHERES_PER_THREAD spheres
# (kernels.slot_walk.thread_spheres); every other kernel, one item per thread.
_RUN_KERNELS = (kernels.sphere_cost_kernel, kernels.swept_sphere_cost_kernel, kernels.sphere_hessian_kernel)


def kernel_threads(kernel, count: int, device: torch.device) -> int:
    """Threads of ``kernel``'s launch over ``count`` items."""
    if device.type == "cuda" or kernel not in _RUN_KERNELS:
        return count
    return (count + CPU_SPHERES_PER_THREAD - 1) // CPU_SPHERES_PER_THREAD


def launch_kernel(kernel, total: int, inputs: list, outputs: list, device: torch.device, snapshot=None) -> None:
    """Launch ``kernel`` over ``total`` items; its arguments are ``inputs``, then (start, total),
    then ``outputs`` (module docstring). On CUDA it runs on torch's current stream; a MeshWorld
    ``snapshot`` it reads is fenced there (WorldSnapshot.before_use / after_use: the stream waits
    for the builds it depends on; its meshes live until the kernel has run). On the CPU a large
    launch runs in chunks from a thread pool; kernels have run when this returns."""
    global _cpu_pool
    if total == 0:
        return
    wdev = warp_device(device)
    if device.type == "cuda":
        graveyard.purge()  # what dropped snapshots and adopted meshes left, once their kernels ran
        if snapshot is not None:
            snapshot.before_use()
        _replay(kernel, wdev, total, [*inputs, 0, total, *outputs], torch_stream(device))
        if snapshot is not None:
            snapshot.after_use()
        return
    threads = 1 if total < 2 * _CPU_MIN_SPHERES_PER_POOL_THREAD \
        else min(cpu_threads(), total // _CPU_MIN_SPHERES_PER_POOL_THREAD)
    if threads == 1:
        _replay(kernel, wdev, kernel_threads(kernel, total, device), [*inputs, 0, total, *outputs])
        return
    if not _internals.WARP_SHORTCUTS:
        # Each pool thread calls Warp's public launch, which may load the module: load it first.
        with _load_lock:
            wp.load_module(kernel.module, device=wdev)
    with _cpu_pool_lock:
        if _cpu_pool is None or _cpu_pool._max_workers < threads:
            _cpu_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="robot_sdf_warp")
        pool = _cpu_pool
    chunk = (total + threads - 1) // threads
    if kernel in _RUN_KERNELS:  # whole runs, so that no thread's run crosses into the next chunk
        chunk = kernel_threads(kernel, chunk, device) * CPU_SPHERES_PER_THREAD
    futures = [pool.submit(_replay, kernel, wdev, kernel_threads(kernel, min(chunk, total - start), device),
                           [*inputs, start, total, *outputs])
               for start in range(0, total, chunk)]
    for f in futures:
        f.result()


def descriptor(t: torch.Tensor, dtype=None):
    """Launch descriptor (Warp's array_t) of a tensor whose dtype matches the kernel's, built from
    its pointer, shape and strides (a fraction of wp.from_torch's work). ``dtype`` a Warp vector
    type: the last dimension, contiguous, folds into the element."""
    shape, size, strides = t.shape, t.element_size(), t.stride()
    if dtype is not None and hasattr(dtype, "_length_"):
        length = dtype._length_
        if shape[-1] != length or strides[-1] != 1:
            raise ValueError(f"cannot view a tensor of shape {tuple(shape)} and strides {strides} as {dtype.__name__}")
        shape, strides = shape[:-1], strides[:-1]
        if not shape:
            shape, strides = (1,), (length,)
    return ArrayDescriptor(t.data_ptr(), 0, len(shape), shape, [x * size for x in strides])


def owning_descriptor(t: torch.Tensor, dtype=None):
    """Descriptor that keeps its tensor (a copy made for this call) alive until the launch."""
    desc = descriptor(t, dtype)
    desc.owner = t
    return desc


def flat_descriptor(t: torch.Tensor, element_bytes: int):
    """Descriptor of a contiguous tensor as a 1-D array of ``element_bytes``-byte elements."""
    return ArrayDescriptor(t.data_ptr(), 0, 1, (t.numel() * t.element_size() // element_bytes,), (element_bytes,))


class WorldValue(kernels.World.ctype):
    """kernels.World as a launch argument: the struct's C value, its arrays launch descriptors,
    taken by Warp's launches through ``__ctype__``. ``keep`` holds what it was filled from."""

    def __ctype__(self):
        return self


def world_value(world: tuple, code: int, slot_signs, slot_bvh) -> WorldValue:
    """The World of the four world descriptors (mesh_idx, pose_inv, mesh_enable, n_env_mesh), the
    sign code, the per-slot sign descriptor and the slot-BVH descriptor."""
    value = WorldValue()
    value.mesh_idx, value.pose_inv, value.mesh_enable, value.n_env_mesh = world
    value.sign_method, value.slot_sign, value.slot_bvh = code, slot_signs, slot_bvh
    value.keep = (world, slot_signs, slot_bvh)
    return value
