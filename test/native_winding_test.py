"""robot_sdf.kernels.native_winding: the swept kernel's shared winding-number traversal
(mesh_winding_numbers) against Warp's own mesh_query_winding_number at each point, to the bit."""
from __future__ import annotations

import numpy as np
import pytest
import warp as wp

from conftest import assert_kernels_agree
from mesh_corpus import open_bowl
from native_test import folded_open_surfaces
from robot_sdf.kernels import native, native_winding


@wp.kernel
def _winding_numbers_kernel(
    mesh: wp.uint64,
    start: wp.array(dtype=wp.vec3),
    direction: wp.array(dtype=wp.vec3),
    accuracy: float,
    lanes: wp.array(dtype=wp.int32),
    shared: wp.array2d(dtype=wp.float32),
    warp_own: wp.array2d(dtype=wp.float32),
):
    i = wp.tid()
    a = start[i]
    d = direction[i]
    # p, 4 samples towards one neighbour, 4 towards the other (the swept kernel's first traversal).
    w = native_winding.mesh_winding_numbers(mesh, a, d, 0.125, 4, -d, 0.125, 4, 0.125, accuracy, lanes[i])
    for j in range(9):
        shared[i, j] = w[j]
        s = float(0.0)
        if j > 4:
            s = -0.125 * float(j - 4)
        elif j > 0:
            s = 0.125 * float(j)
        warp_own[i, j] = native.winding_number(mesh, a + d * s, accuracy)  # Warp's own, called directly


@pytest.mark.parametrize("accuracy", [1.25, 1.5, 2.0])
def test_shared_winding_numbers_are_warps_to_the_bit(device, accuracy):
    """mesh_winding_numbers (the open-surface swept kernel's winding numbers of a step's points in
    one traversal) against Warp's own mesh_query_winding_number at each point (native.winding_number
    calls it as it is): equal to the bit on the CPU (within float32
    rounding on CUDA: conftest.assert_kernels_agree) for the points asked for (every tier accuracy; points near, inside and far from an open bowl
    and a folded sheet), 0 for the others."""
    bv, bt = open_bowl()
    fv, ft = folded_open_surfaces()
    v = np.concatenate([bv, fv + [0.5, 0.0, 0.0]])
    t = np.concatenate([bt, ft + len(bv)])
    mesh = wp.Mesh(points=wp.array(v, dtype=wp.vec3, device=device),
                   indices=wp.array(t.ravel(), dtype=wp.int32, device=device), support_winding_number=True)
    rng = np.random.default_rng(11)
    n = 2000
    start = np.concatenate([rng.uniform(v.min(0) - 0.2, v.max(0) + 0.2, size=(n - 200, 3)),
                            v[rng.integers(0, len(v), size=200)] + rng.normal(scale=0.01, size=(200, 3))])
    direction = rng.normal(scale=0.05, size=(n, 3))
    lanes = rng.integers(0, 1 << 9, size=n).astype(np.int32)
    outs = [wp.zeros((n, 9), dtype=wp.float32, device=device) for _ in range(2)]
    wp.launch(_winding_numbers_kernel, dim=n, inputs=[mesh.id, wp.array(start, dtype=wp.vec3, device=device),
              wp.array(direction, dtype=wp.vec3, device=device), accuracy,
              wp.array(lanes, dtype=wp.int32, device=device)], outputs=outs, device=device)
    shared, own = (o.numpy() for o in outs)
    asked = (lanes[:, None] >> np.arange(9)[None, :]) & 1 == 1
    assert np.abs(own[asked]).max() > 0.5  # inside the bowl and under the sheet as well
    # Winding numbers are sums of a few hundred solid angles of magnitude <= 1: 1e-5 covers a
    # CUDA build's other multiply-add fusion in the two differently shaped traversals.
    assert_kernels_agree(shared[asked], own[asked], device, atol=1e-5)
    assert np.all(shared[~asked] == 0.0)