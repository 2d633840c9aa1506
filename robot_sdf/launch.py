"""How robot_sdf launches its Warp kernels: one launch layer for every kernel, per device.

- CUDA: a recorded launch (``wp.launch(..., record_cmd=True)``), replayed on torch's current
  stream with new argument descriptors.
- CPU: Warp runs a launch serially, so a large launch is split into contiguous chunks run from a
  thread pool (Warp releases the GIL while a CPU kernel runs); each chunk, and a small launch on
  the calling thread, calls the recorded launch's kernel hook with a persistent argument struct.

The shortcuts write into Warp's private Launch objects and kernel hooks: they are used only on
the Warp versions robot_sdf._internals.WARP_SHORTCUTS lists; elsewhere every launch is Warp's
public ``wp.launch`` (test/cuda_paths_test.py checks that both give the same results).
Array arguments travel as launch descriptors (Warp's array_t, built by ``descriptor``), struct
arguments as the struct's C value (a ctypes structure with ``__ctype__``, such as
WorldValue below: what Warp's launches take of a struct instance), scalars as
Python numbers matching the kernel's types.
"""
from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor

import torch
import warp as wp

from robot_sdf import _internals, face_winding, kernels, mesh_analysis
from robot_sdf.kernels.mesh_queries import CPU_SPHERES_PER_THREAD

_CPU_MIN_SPHERES_PER_POOL_THREAD = 2048
# CPU launches go straight to the kernel hook (_CpuCall). False sends them through Warp's
# recorded launch with its packed parameters instead, the path every CUDA launch takes, so that
# tests run that path on a machine without a GPU (test/cuda_paths_test.py).
CPU_DIRECT_CALLS = True
_cpu_pool: ThreadPoolExecutor | None = None
_cpu_pool_lock = threading.Lock()
_initialised = False


def cpu_threads() -> int:
    """Threads used for Warp CPU launches (Warp runs one CPU launch on one thread).

    ROBOT_SDF_CPU_THREADS overrides; default is the number of cores this process may use."""
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
# Warp views of torch streams, most recently used last. Bounded: a caller that makes a new torch
# stream per call must not grow it without limit (a view only wraps the handle; dropping it does
# not destroy torch's stream). Locked: service threads look streams up concurrently.
_streams: OrderedDict[tuple[int, int], wp.Stream] = OrderedDict()
_streams_lock = threading.Lock()
STREAM_CACHE_SIZE = 32


# The Python modules holding Warp kernels that robot_sdf launches (their functions are compiled
# into them): loaded once per device.
_KERNEL_MODULES = tuple(dict.fromkeys(
    [k.module.name for k in (kernels.sphere_cost_kernel, kernels.swept_sphere_cost_kernel,
                             kernels.sphere_hessian_kernel, kernels.slot_boxes_kernel)]
    + [mesh_analysis.__name__, face_winding.__name__]))


def warp_device(device: torch.device):
    """The Warp device of a torch device, with robot_sdf's kernels loaded on it.

    Warp's module loading is not thread-safe, so it happens once per device under a lock
    (service threads of a node may make their first launches concurrently)."""
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
    _warp_devices[device] = wdev  # only once its modules are loaded
    return wdev


def torch_stream(device: torch.device) -> wp.Stream:
    """Warp view of torch's current stream on ``device``, cached per stream handle."""
    ts = torch.cuda.current_stream(device)
    key = (device.index or 0, int(ts.cuda_stream))
    with _streams_lock:
        stream = _streams.get(key)
        if stream is not None:
            _streams.move_to_end(key)
            return stream
        stream = wp.stream_from_torch(ts)
        _streams[key] = stream
        while len(_streams) > STREAM_CACHE_SIZE:
            (index, handle), evicted = _streams.popitem(last=False)
            # What robot_sdf queued there may still run: queued_work_events covers it until done.
            event = _event_on(torch.cuda.ExternalStream(handle, device=torch.device("cuda", index)))
            if event is not None:
                _evicted_events.append((index, event))
            # A Warp wrapper of an external stream unregisters the stream inside Warp when it is
            # collected, for every wrapper of it (a caller's own wp.stream_from_torch included:
            # its graph captures would then fail as "unknown stream"). The evicted one lets go
            # without unregistering; Warp keeps one event per stream ever seen here.
            evicted.cuda_stream = None
        return stream


# (device index, event) recorded on streams evicted from _streams, until they have completed.
_evicted_events: list = []


def _event_on(stream):
    """An event recorded now on ``stream`` (a torch stream), or None while it captures a graph
    (an event recorded there would become part of the graph)."""
    with torch.cuda.stream(stream):
        if torch.cuda.is_current_stream_capturing():
            return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def queued_work_events(device: torch.device) -> tuple | None:
    """Events that complete once every kernel robot_sdf has queued on ``device`` so far has run:
    one recorded now on each stream robot_sdf launches on there (the cached ones and torch's
    current one), and those recorded when a stream left the cache, while pending. None when one
    of those streams is capturing a CUDA graph, or the cache is being changed under this call
    (a collection during an update): the caller then falls back to a device synchronisation."""
    index = device.index or 0
    try:
        handles = {handle for (i, handle) in tuple(_streams) if i == index}
        _evicted_events[:] = [(i, event) for i, event in tuple(_evicted_events) if not event.query()]
        pending = [event for i, event in _evicted_events if i == index]
    except RuntimeError:
        return None
    handles.add(int(torch.cuda.current_stream(device).cuda_stream))
    events = []
    for handle in handles:
        event = _event_on(torch.cuda.ExternalStream(handle, device=device))
        if event is None:
            return None
        events.append(event)
    return tuple(events + pending)


def warp_torch_stream(wdev, device: torch.device) -> torch.cuda.ExternalStream:
    """Warp's current stream on ``wdev`` (where BVH builds and refits run) as a torch stream."""
    return torch.cuda.ExternalStream(wp.get_stream(wdev).cuda_stream, device=device)


class _Launches(threading.local):
    """Recorded Warp launches (``wp.launch(..., record_cmd=True)``), one per kernel and device and
    per thread (a Launch holds its packed arguments, so two threads must not share one).

    Re-running a recorded launch with new argument descriptors skips wp.launch's per-argument
    type dispatch and packing, most of the fixed cost of a small evaluation."""

    def __init__(self) -> None:
        self.by_kernel: dict[tuple, tuple[object, int]] = {}


_launches = _Launches()


# _CpuCall.last entry of an argument that set_flats wrote (a 1-D descriptor already in place).
_FLAT = object()


class _CpuCall:
    """A recorded CPU launch called through its kernel hook with a persistent argument struct
    (what Warp's own replay does, minus building and filling a fresh struct on every call): only
    the arguments that changed since the last call are written.

    Two ways to fill it: ``__call__(args)`` with the whole argument list (descriptors, struct
    values, wp.arrays, numbers), or, for the per-call fast path, ``set_constants`` (a tuple of values reused across
    calls, written only when a different tuple comes), ``set_flats`` (contiguous tensors written
    straight into 1-D array arguments, no descriptor objects) and ``set_values``, then
    ``run()``."""

    def __init__(self, cmd) -> None:
        self.cmd = cmd
        fields = [(arg.label, type(value)) for arg, value in zip(cmd.kernel.adj.args, cmd.params[1:])]
        self.names = [name for name, _ in fields]
        self.struct = type("RobotSdfArgs", (ctypes.Structure,), {"_fields_": fields})()
        self.struct_ref = ctypes.byref(self.struct)
        self.last: list = [None] * len(fields)
        self.hook = cmd.hooks.forward
        self.constants = None
        # Views sharing the struct's memory (data, shape, strides) of its 1-D array arguments, with
        # the element size in bytes of each: what set_flats writes.
        self.flat_views: dict[int, tuple] = {}
        for i, arg in enumerate(cmd.kernel.adj.args):
            if fields[i][1] is ArrayDescriptor and getattr(arg.type, "ndim", 0) == 1:
                view = getattr(self.struct, arg.label)
                self.flat_views[i] = (view, view.shape, view.strides,
                                      wp.types.type_size_in_bytes(arg.type.dtype))

    def __call__(self, args: list) -> None:
        struct, last, names = self.struct, self.last, self.names
        self.constants = None
        for i, value in enumerate(args):
            if value is not last[i]:
                if isinstance(value, wp.array):
                    value = value.__ctype__()
                setattr(struct, names[i], value)
                last[i] = value
        self.run()

    def set_constants(self, positions: tuple, values: tuple) -> None:
        """Write ``values`` (descriptors, struct values or numbers) to the arguments at ``positions``, unless this
        very tuple was the last one written (callers keep one tuple per set of world tensors, and
        never pass those positions to set_flats or set_values)."""
        if values is self.constants:
            return
        self.set_values(positions, values)
        self.constants = values

    def set_flats(self, positions: tuple, tensors: tuple) -> None:
        """Point the 1-D array arguments at ``positions`` at contiguous tensors (their bytes, as
        elements of the kernel's dtype). The caller keeps the tensors alive until run() returns."""
        views, last = self.flat_views, self.last
        for i, t in zip(positions, tensors):
            view, shape, strides, element = views[i]
            view.data = t.data_ptr()
            shape[0] = t.numel() * t.element_size() // element
            if last[i] is not _FLAT:  # rank and stride stay from the previous set_flats
                view.ndim = 1
                strides[0] = element
                last[i] = _FLAT

    def set_values(self, positions: tuple, values: tuple) -> None:
        """Write ``values`` (numbers, or descriptors) to the arguments at ``positions``."""
        struct, last, names = self.struct, self.last, self.names
        for i, value in zip(positions, values):
            if value is not last[i]:
                setattr(struct, names[i], value)
                last[i] = value

    def run(self) -> None:
        self.hook(ctypes.byref(self.cmd.bounds), self.struct_ref)


def _replay(kernel, wdev, threads: int, args: list, stream=None) -> None:
    """Launch ``kernel`` over ``threads`` threads with ``args`` (its whole argument list, array
    arguments as descriptors or wp.arrays, scalars as Python numbers) through a recorded launch
    reused across calls."""
    if not _internals.WARP_SHORTCUTS:
        # Warp's public launch: the recorded-launch shortcuts below write into Warp's private
        # Launch object, checked only on the versions robot_sdf._internals lists.
        wp.launch(kernel, dim=threads, inputs=args, device=wdev, stream=stream)
        return
    key = (kernel, wdev.alias)
    entry = _launches.by_kernel.get(key)
    if entry is None:
        # A thread's first launch of a kernel may load its Warp module (a caller's own, or one
        # changed since it was loaded): under the load lock, since pool threads recording their
        # first launches at once would load it concurrently, which crashes Warp.
        with _load_lock:
            cmd = wp.launch(kernel, dim=threads, inputs=args, device=wdev, record_cmd=True)
        if not isinstance(cmd, wp.Launch) or cmd.fwd_args is None:
            raise RuntimeError(f"Warp did not record a reusable launch of {kernel.key}")
        # CPU kernels without thread blocks go straight to their hook (Warp's invoke path).
        fast = _CpuCall(cmd) if CPU_DIRECT_CALLS and wdev.is_cpu and cmd.block_dim <= 1 and not cmd.adjoint else None
        _launches.by_kernel[key] = [cmd, threads, fast]
        if fast is not None:
            fast(args)
        else:
            cmd.launch(stream) if stream is not None else cmd.launch()
        return
    cmd, dim, fast = entry
    if dim != threads:
        cmd.set_dim(threads)
        entry[1] = threads
    if fast is not None:
        fast(args)
        return
    # The packed argument list: params[0] is the launch bounds, params[i + 1] argument i. Array
    # descriptors and struct values replace their slot (and, on CUDA, its address); scalars are
    # written in place.
    params, addresses, recorded = cmd.params, cmd.params_addr, cmd.fwd_args
    for i, value in enumerate(args):
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


def argument_positions(kernel, *names: str) -> tuple[int, ...]:
    """Positions of the named arguments in ``kernel``'s signature (for _CpuCall's setters)."""
    labels = [arg.label for arg in kernel.adj.args]
    return tuple(labels.index(name) for name in names)


# The query kernels: on the CPU each of their threads handles a run of CPU_SPHERES_PER_THREAD
# spheres (kernels.slot_walk.thread_spheres); every other kernel, one item per thread.
_RUN_KERNELS = (kernels.sphere_cost_kernel, kernels.swept_sphere_cost_kernel, kernels.sphere_hessian_kernel)


def kernel_threads(kernel, count: int, device: torch.device) -> int:
    """Threads of ``kernel``'s launch over ``count`` items: one per item, except for the query
    kernels on the CPU, one per run of CPU_SPHERES_PER_THREAD spheres."""
    if device.type == "cuda" or kernel not in _RUN_KERNELS:
        return count
    return (count + CPU_SPHERES_PER_THREAD - 1) // CPU_SPHERES_PER_THREAD


def direct_cpu_call(kernel, device: torch.device, total: int) -> _CpuCall | None:
    """This thread's direct call of ``kernel`` on the CPU, set to ``total`` spheres, when the
    launch runs as one serial chunk and an earlier launch through _launch has recorded it; else
    None (launch through _launch)."""
    if device.type != "cpu" or total == 0 or total >= 2 * _CPU_MIN_SPHERES_PER_POOL_THREAD \
            or not _internals.WARP_SHORTCUTS:
        return None
    entry = _launches.by_kernel.get((kernel, warp_device(device).alias))
    if entry is None or entry[2] is None:
        return None
    dim = kernel_threads(kernel, total, device)
    if entry[1] != dim:
        entry[0].set_dim(dim)
        entry[1] = dim
    return entry[2]


def launch_kernel(kernel, total: int, inputs_before_range: list, outputs: list, device: torch.device) -> None:
    """Launch ``kernel`` over ``total`` items (kernel_threads threads); its arguments end with
    (start, total, *outputs).

    Array arguments are launch descriptors (descriptor); scalars are Python ints/floats matching
    the kernel's types. On CUDA the launch goes on torch's current stream. On the CPU, Warp runs a
    launch serially, so large launches are split into contiguous chunks launched from a thread
    pool (Warp releases the GIL while a CPU kernel runs, so the chunks run on separate cores).
    """
    global _cpu_pool
    if total == 0:
        return
    wdev = warp_device(device)
    if device.type == "cuda":
        _replay(kernel, wdev, total, [*inputs_before_range, 0, total, *outputs], torch_stream(device))
        return
    threads = 1 if total < 2 * _CPU_MIN_SPHERES_PER_POOL_THREAD else min(cpu_threads(), total // _CPU_MIN_SPHERES_PER_POOL_THREAD)
    if threads == 1:
        _replay(kernel, wdev, kernel_threads(kernel, total, device), [*inputs_before_range, 0, total, *outputs])
        return
    if not _internals.WARP_SHORTCUTS:
        # Each pool thread calls Warp's public launch, which may load the kernel's module: load it
        # here first, one loader at a time (see _replay).
        with _load_lock:
            wp.load_module(kernel.module, device=wdev)
    with _cpu_pool_lock:
        if _cpu_pool is None or _cpu_pool._max_workers < threads:
            _cpu_pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="robot_sdf_warp")
        pool = _cpu_pool
    chunk = (total + threads - 1) // threads
    if kernel in _RUN_KERNELS:
        # Whole runs of spheres, so that no kernel thread's run crosses into the next chunk.
        chunk = kernel_threads(kernel, chunk, device) * CPU_SPHERES_PER_THREAD
    # Each pool thread replays its own recorded launch (_launches is per thread).
    futures = [pool.submit(_replay, kernel, wdev, kernel_threads(kernel, min(chunk, total - start), device),
                           [*inputs_before_range, start, total, *outputs])
               for start in range(0, total, chunk)]
    for f in futures:
        f.result()


# Warp's launch descriptor type, taken from its public API (the class itself is not exported).
ArrayDescriptor = type(wp.from_torch(torch.zeros(1), return_ctype=True))


def descriptor(t: torch.Tensor, dtype=None):
    """Launch descriptor (Warp's array_t) of a tensor whose dtype already matches the kernel's.

    Built directly from the pointer, shape and strides: wp.from_torch(return_ctype=True) computes
    the same structure with several times the Python work. ``dtype`` a Warp vector type (vec3,
    vec4): the last dimension must be its length and contiguous, and is folded into the element.
    """
    shape = t.shape
    size = t.element_size()
    strides = t.stride()
    if dtype is not None and hasattr(dtype, "_length_"):
        length = dtype._length_
        if shape[-1] != length or strides[-1] != 1:
            raise ValueError(f"cannot view a tensor of shape {tuple(shape)} and strides {strides} as {dtype.__name__}")
        shape, strides = shape[:-1], strides[:-1]
        if not shape:
            shape, strides = (1,), (length,)
    return ArrayDescriptor(t.data_ptr(), 0, len(shape), shape, [x * size for x in strides])


def owning_descriptor(t: torch.Tensor, dtype=None):
    """Descriptor of a tensor made for this call only (a converted copy): the descriptor keeps it
    alive until the launch has used it (a descriptor alone holds just the address)."""
    desc = descriptor(t, dtype)
    desc.owner = t
    return desc


def flat_descriptor(t: torch.Tensor, element_bytes: int):
    """Descriptor of a contiguous tensor as a 1-D array of elements of ``element_bytes`` bytes
    (e.g. 16 for vec4 over (..., 4) float32): the cheapest form, for per-call buffers."""
    return ArrayDescriptor(t.data_ptr(), 0, 1, (t.numel() * t.element_size() // element_bytes,), (element_bytes,))


class WorldValue(kernels.World.ctype):
    """kernels.World as a launch argument: the struct's C value, its array fields launch
    descriptors. Warp's launches take it through ``__ctype__`` (as they take a wp.struct
    instance); the direct CPU call copies it into its argument struct. ``keep`` holds the
    descriptors it was filled from (and so the converted copies they own) for as long as it lives."""

    def __ctype__(self):
        return self


def world_value(world: tuple, code: int, slot_signs, slot_bvh) -> WorldValue:
    """The World of the four world descriptors (mesh_idx, pose_inv, mesh_enable, n_env_mesh), the
    sign code, the per-slot sign descriptor and the slot-BVH descriptor."""
    value = WorldValue()
    value.mesh_idx, value.pose_inv, value.mesh_enable, value.n_env_mesh = world
    value.sign_method = code
    value.slot_sign = slot_signs
    value.slot_bvh = slot_bvh
    value.keep = (world, slot_signs, slot_bvh)
    return value
