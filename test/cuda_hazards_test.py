"""CUDA stream and lifetime hazards of MeshWorld evaluations. Skipped without a GPU.

- a snapshot dropped right after its kernels are queued keeps its meshes and tensors until that
  work has run (the geometry is replaced and evicted from the cache at once);
- builds and refits order themselves with events: neither torch.cuda.synchronize nor a Warp
  device sync is called, and evaluations on a non-default stream see the new BVH;
- the Warp stream cache stays bounded when callers use many streams from several threads.
Expected values come from the numpy reference (test/reference.py).
"""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
import warp as wp

import reference as ref
from conftest import CUDA_USABLE
from robot_sdf import MeshWorld, cuda_streams, snapshot_lifetime

pytestmark = pytest.mark.skipif(not CUDA_USABLE, reason="no CUDA device visible to both torch and Warp")
DEVICE = "cuda:0"
ETA, MAX_DIST = 0.05, 0.5
BOX_V, BOX_T = ref.box((0.3, 0.3, 0.3))
POSE = np.array([0.1, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def _spheres(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.uniform(-0.4, 0.4, size=(n, 3))
    r = rng.uniform(0.0, 0.05, size=(n, 1))
    return np.concatenate([p, r], axis=1)[None, None].astype(np.float32)


def _ref_cost(spheres, vertices, pose=POSE):
    return ref.sphere_cost(spheres.astype(np.float64), [[ref.RefMesh(vertices, BOX_T, pose)]], ETA, 1.0, MAX_DIST)[0]


@pytest.fixture
def no_device_sync(monkeypatch):
    """Fail the test if anything synchronises the whole device."""
    def refuse(*_args, **_kwargs):
        raise AssertionError("whole-device synchronisation on the update path")

    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    monkeypatch.setattr(wp, "synchronize_device", refuse)
    monkeypatch.setattr(wp, "synchronize", refuse)


def test_dropped_snapshot_outlives_its_queued_work():
    world = MeshWorld(device=DEVICE, sign_method="normal", max_distance=MAX_DIST, geometry_cache_size=0)
    world.add_mesh("box", BOX_V, BOX_T, POSE)
    spheres = _spheres(200_000)
    s = torch.from_numpy(spheres).to(DEVICE)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # keep the stream busy so the evaluation is still queued
        cost, _ = world.evaluate_sphere_cost(s, ETA, 1.0, max_distance=MAX_DIST)
        # Replace the geometry: the old one has no user left and the cache keeps nothing.
        world.add_mesh("box", BOX_V * 1.5, BOX_T, POSE)
        assert len(snapshot_lifetime.graveyard) >= 1  # the old BVH waits for the queued evaluation
    side.synchronize()
    np.testing.assert_allclose(cost.cpu().double().numpy(), _ref_cost(spheres, BOX_V), atol=1e-4, rtol=1e-4)
    snapshot_lifetime.graveyard.purge()
    assert len(snapshot_lifetime.graveyard) == 0


def test_builds_and_refits_are_stream_ordered(no_device_sync):
    world = MeshWorld(device=DEVICE, sign_method="normal", max_distance=MAX_DIST)
    spheres = _spheres(20_000, seed=1)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        s = torch.from_numpy(spheres).to(DEVICE)
        world.add_mesh("box", BOX_V, BOX_T, POSE)
        first, _ = world.evaluate_sphere_cost(s, ETA, 1.0, max_distance=MAX_DIST)
        grown = BOX_V * np.array([1.5, 0.8, 1.2])
        world.update_vertices("box", grown)
        second, _ = world.evaluate_sphere_cost(s, ETA, 1.0, max_distance=MAX_DIST)
        first_host, second_host = first.cpu(), second.cpu()  # copies on the side stream, in order
    np.testing.assert_allclose(first_host.double().numpy(), _ref_cost(spheres, BOX_V), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(second_host.double().numpy(), _ref_cost(spheres, grown), atol=1e-4, rtol=1e-4)


def test_stream_cache_is_bounded_across_threads():
    world = MeshWorld(device=DEVICE, sign_method="normal", max_distance=MAX_DIST)
    world.add_mesh("box", BOX_V, BOX_T, POSE)
    spheres = _spheres(500, seed=2)
    expected = _ref_cost(spheres, BOX_V)
    errors = []

    def worker():
        try:
            for _ in range(20):
                stream = torch.cuda.Stream()
                with torch.cuda.stream(stream):
                    cost, _ = world.evaluate_sphere_cost(torch.from_numpy(spheres).to(DEVICE), ETA, 1.0,
                                                         max_distance=MAX_DIST)
                    got = cost.cpu().double().numpy()
                np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)
        except Exception as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(cuda_streams._streams) <= cuda_streams.STREAM_CACHE_SIZE
