"""mesh_topology helpers that replace GIL-holding numpy calls: same results as numpy's own.

weld and sorted_unique exist so that analysing a million-triangle mesh never holds the GIL for
long (bench/soak.py --only stall measures the effect); here they are checked against np.unique.
"""
import numpy as np
import pytest

from robot_sdf import mesh_topology


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 50_000])
def test_weld_matches_numpy_unique_rows(n):
    rng = np.random.default_rng(n)
    v = rng.integers(-3, 3, (n, 3)).astype(np.float32) * np.float32(0.25)
    if n >= 2:
        v[0], v[1] = [-0.0, 0.5, 0.0], [0.0, 0.5, -0.0]  # signed zeros are the same position
    _, first, inverse = np.unique(v, axis=0, return_index=True, return_inverse=True)
    np.testing.assert_array_equal(mesh_topology.weld(v), first[inverse.reshape(-1)])
    if n >= 2:
        assert mesh_topology.weld(v)[1] == 0


def test_weld_of_no_vertices():
    assert mesh_topology.weld(np.zeros((0, 3), np.float32)).shape == (0,)


@pytest.mark.parametrize("n", [0, 1, 9, 10_000])
def test_unique_matches_numpy(n):
    x = np.random.default_rng(n + 5).integers(0, max(1, n // 3), n)
    values, index, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    got = mesh_topology.sorted_unique(x, return_index=True, return_inverse=True, return_counts=True)
    for want, have in zip((values, index, inverse.reshape(-1), counts), got):
        np.testing.assert_array_equal(have, want)
    np.testing.assert_array_equal(mesh_topology.sorted_unique(x), np.unique(x))


def test_scatter_min_matches_a_loop():
    rng = np.random.default_rng(2)
    index = rng.integers(0, 1000, 3 * mesh_topology.GIL_CHUNK + 17)  # several chunks
    values = rng.integers(0, 10**6, index.shape[0])
    target = rng.integers(0, 10**6, 1000)
    want = target.copy()
    for i, v in zip(index.tolist(), values.tolist()):
        want[i] = min(want[i], v)
    mesh_topology.scatter_min(target, index, values)
    np.testing.assert_array_equal(target, want)
