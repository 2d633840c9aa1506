"""MeshWorld memory and precision bounds: the geometry cache is bounded in bytes, pose
translations beyond float32 sense are refused, a refit carries its pose in the same revision."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.world_geometry import geometry_bytes

V, T = ref.icosphere(0.2, 3)  # 1280 triangles


def _variant(i):
    return V * (1.0 + 0.01 * i), T


def test_cache_is_bounded_in_bytes():
    probe = MeshWorld(device="cpu")
    probe.add_mesh("x", V, T)
    one = geometry_bytes(probe._geometries[next(iter(probe._geometries))])
    assert one > V.astype(np.float32).nbytes + T.astype(np.int32).nbytes
    w = MeshWorld(device="cpu", geometry_cache_size=1000, geometry_cache_bytes=int(3.5 * one))
    for i in range(10):
        w.add_mesh(f"m{i}", *_variant(i))
    for i in range(10):
        w.remove_mesh(f"m{i}")
    count, nbytes = w.cache_info()
    assert count == 3 and nbytes == 3 * one  # the three most recently released
    # a cached geometry comes back without a build: the same Warp mesh id
    cached_ids = {g.mesh.id for g in w._unused.values()}
    w.add_mesh("again", *_variant(9))
    assert int(np.uint64(w.snapshot().mesh_idx[0, 0].item() & (2**64 - 1))) in cached_ids
    assert w.cache_info() == (2, 2 * one)
    none = MeshWorld(device="cpu", geometry_cache_bytes=0)
    none.add_mesh("a", V, T)
    none.remove_mesh("a")
    assert none.cache_info() == (0, 0)


def test_pose_translation_beyond_float32_sense_is_refused():
    w = MeshWorld(device="cpu")
    w.add_mesh("a", V, T)
    rev = w.revision
    for x in (1e39, 2e6, -1e7):
        with pytest.raises(ValueError, match="exceeds 1e\\+06 m"):
            w.set_pose("a", [x, 0, 0, 1, 0, 0, 0])
        with pytest.raises(ValueError, match="exceeds 1e\\+06 m"):
            w.add_mesh("b", V, T, [0, 0, x, 1, 0, 0, 0])
    assert w.revision == rev and w.mesh_names() == ["a"]


def test_refit_with_pose_is_one_revision_and_matches_reference():
    w = MeshWorld(device="cpu", max_distance=1.0)
    w.add_mesh("a", V, T)
    rev = w.revision
    pose = np.array([0.3, -0.2, 0.1, 0.9238795, 0.3826834, 0.0, 0.0])
    w.update_vertices("a", V * 1.5, pose=pose)
    assert w.revision == rev + 1
    pts = np.random.default_rng(3).uniform(-0.8, 0.8, (300, 3)).astype(np.float32)
    d, _ = w.signed_distance(torch.from_numpy(pts))
    sd, _ = ref.RefMesh(V * 1.5, T, pose).signed_distance_world(pts.astype(np.float64))
    np.testing.assert_allclose(d.numpy(), np.minimum(sd, 1.0), atol=1e-4)
