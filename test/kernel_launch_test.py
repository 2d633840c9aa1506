"""robot_sdf.launch: every way a kernel is launched on the CPU gives the same results, bit for bit,
and the reference's.

- one serial launch on the calling thread (direct call of the recorded launch's kernel hook);
- a large batch split into chunks run from the thread pool (each pool thread replays its own
  recorded launch);
- Warp's public ``wp.launch`` for everything (what robot_sdf falls back to on a Warp version
  whose private Launch objects it has not checked: _internals.WARP_SHORTCUTS off).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from conftest import build_warp_env, scalar
from robot_sdf import _internals, kernels, launch
from robot_sdf.kernels.mesh_queries import CPU_SPHERES_PER_THREAD
from robot_sdf.warp_primitives import Query
from swept_test import run_swept
from warp_primitives_test import COST_ATOL, ETA, MAX_DIST, np_, random_spheres, run_cost, scene_meshes

# Above 2 * launch._CPU_MIN_SPHERES_PER_POOL_THREAD: split into chunks when two threads are allowed.
BATCH = (2, 5, 521)  # not a whole number of a CPU thread's runs of spheres


def _evaluate(spheres: np.ndarray, wenv) -> tuple:
    """The three query kernels' outputs: plain cost, swept cost, Hessians."""
    _, cost, grad, sparsity = run_cost(spheres, wenv, "cpu")
    _, swept, swept_grad, _ = run_swept(spheres, wenv, "cpu", 2)
    hessian = Query(scalar(1.0, "cpu"), scalar(ETA, "cpu"), scalar(MAX_DIST, "cpu"), wenv.mesh_idx,
                    wenv.mesh_pose_inverse, wenv.mesh_enable, wenv.n_env_mesh).hessian(
        torch.tensor(spheres, dtype=torch.float32))
    return tuple(t.detach().numpy().copy() for t in (cost, grad, sparsity, swept, swept_grad, hessian))


@pytest.fixture
def fresh_launches(monkeypatch):
    monkeypatch.setattr(launch, "_launches", launch._Launches())


def test_serial_chunked_and_public_launches_agree(monkeypatch, fresh_launches):
    rng = np.random.default_rng(5)
    meshes = scene_meshes(7)
    wenv = build_warp_env([meshes], "cpu")
    spheres = random_spheres(rng, BATCH, meshes)
    assert np.prod(BATCH) >= 2 * launch._CPU_MIN_SPHERES_PER_POOL_THREAD

    chunks = []
    starts = []
    real_replay = launch._replay

    def replay(kernel, wdev, threads, args, stream=None):
        chunks.append(threads)
        starts.append(args[launch.argument_positions(kernel, "start")[0]])
        real_replay(kernel, wdev, threads, args, stream)

    monkeypatch.setattr(launch, "_replay", replay)
    monkeypatch.setenv("ROBOT_SDF_CPU_THREADS", "1")
    serial = _evaluate(spheres, wenv)
    # One launch of a thread per run of CPU_SPHERES_PER_THREAD spheres.
    whole = -(-int(np.prod(BATCH)) // CPU_SPHERES_PER_THREAD)
    assert chunks and all(c == whole for c in chunks)

    chunks.clear()
    starts.clear()
    monkeypatch.setenv("ROBOT_SDF_CPU_THREADS", "2")
    chunked = _evaluate(spheres, wenv)
    assert chunks and all(c < whole for c in chunks)  # the pool ran chunks
    # Each chunk starts a run (no thread's run reaches into the next chunk) and the chunks of a
    # launch cover every run once.
    assert all(s % CPU_SPHERES_PER_THREAD == 0 for s in starts) and sum(chunks) == 3 * whole

    monkeypatch.setattr(_internals, "WARP_SHORTCUTS", False)
    public = _evaluate(spheres, wenv)

    for a, b, c in zip(serial, chunked, public):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
    c_ref, _ = ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST)
    np.testing.assert_allclose(serial[0], c_ref, atol=COST_ATOL, rtol=1e-4)
    assert np.sum(serial[0] > 0) >= 100


def _both_pool_threads_at_once(monkeypatch, after_replay=None) -> None:
    """Two CPU launch threads, each pool thread held at a barrier until the other also replays a
    chunk: both take a chunk of every pooled launch (on a loaded machine one thread could otherwise
    finish its chunk and take the other's too) and start it at once. ``after_replay`` runs in the
    thread after each replay."""
    import threading

    real_replay = launch._replay
    both = threading.Barrier(2, timeout=60)

    def replay(kernel, wdev, total, args, stream=None):
        if threading.current_thread().name.startswith("robot_sdf_warp"):
            both.wait()
        real_replay(kernel, wdev, total, args, stream)
        if after_replay is not None:
            after_replay()

    monkeypatch.setattr(launch, "_replay", replay)
    monkeypatch.setenv("ROBOT_SDF_CPU_THREADS", "2")


def test_pool_threads_keep_launches_of_their_own(monkeypatch, fresh_launches):
    """A recorded launch holds its packed arguments: the pool's threads never share one."""
    import threading

    rng = np.random.default_rng(6)
    meshes = scene_meshes(8)
    wenv = build_warp_env([meshes], "cpu")
    spheres = random_spheres(rng, BATCH, meshes)
    seen: dict[int, set] = {}

    def record() -> None:
        seen.setdefault(threading.get_ident(), set()).update(id(e[0]) for e in launch._launches.by_kernel.values())

    _both_pool_threads_at_once(monkeypatch, record)
    _, cost, _, _ = run_cost(spheres, wenv, "cpu")
    assert np.isfinite(np_(cost)).all()
    records = list(seen.values())
    assert len(records) >= 2
    for i in range(len(records)):
        for j in range(i + 1, len(records)):
            assert not records[i] & records[j]


def test_a_kernel_new_to_the_device_is_loaded_before_the_pool_runs_it(monkeypatch, fresh_launches):
    """A kernel of a Warp module nothing has loaded yet (a caller's own, such as the cuRobo-style
    benchmark kernels), launched large enough to be split: both pool threads record their first
    launch of it at once (held at a barrier), and Warp must not load the module from both (that
    crashed the process)."""
    import warp as wp

    @wp.kernel(module="unique")
    def scaled(values: wp.array(dtype=float), factor: float, start: int, total: int, out: wp.array(dtype=float)):
        tid = wp.tid() + start
        if tid < total:
            out[tid] = values[tid] * factor

    _both_pool_threads_at_once(monkeypatch)
    values = torch.arange(4 * launch._CPU_MIN_SPHERES_PER_POOL_THREAD, dtype=torch.float32)
    out = torch.zeros_like(values)
    launch.launch_kernel(scaled, values.numel(), [launch.descriptor(values), 3.0], [launch.descriptor(out)],
                         torch.device("cpu"))
    np.testing.assert_array_equal(out.numpy(), values.numpy() * 3.0)


def test_a_small_launch_takes_the_direct_call_with_one_thread_per_run(monkeypatch, fresh_launches):
    """Below the pool's threshold a launch goes straight to the kernel hook (the second call on a
    thread); its recorded size must follow the sphere count in runs, and the last, partial run
    must be computed too."""
    rng = np.random.default_rng(9)
    meshes = scene_meshes(5)
    wenv = build_warp_env([meshes], "cpu")
    monkeypatch.setenv("ROBOT_SDF_CPU_THREADS", "1")
    for shape in ((1, 3, 100), (2, 5, 77)):  # recorded, then the direct call at a new size
        spheres = random_spheres(rng, shape, meshes)
        _, cost, _, _ = run_cost(spheres, wenv, "cpu")
        c_ref, _ = ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST)
        np.testing.assert_allclose(np_(cost), c_ref, atol=COST_ATOL, rtol=1e-4)
        threads = launch._launches.by_kernel[(kernels.sphere_cost_kernel, "cpu")][1]
        assert threads == -(-int(np.prod(shape)) // CPU_SPHERES_PER_THREAD)
