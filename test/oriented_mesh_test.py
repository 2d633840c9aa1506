"""MeshWorld.add_mesh(oriented=True): the caller vouches that the mesh bounds solids (closed,
wound outward, not self-intersecting), so the world signs it by pseudo-normals without the
winding repair or the classification.

Expected distances come from the brute-force numpy reference (closest points, winding numbers),
never from the world.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reference as ref
from robot_sdf import MeshWorld

SPH_V, SPH_T = ref.icosphere(0.15, 2)
BOX_V, BOX_T = ref.box((0.3, 0.2, 0.1))


def probe_points(seed: int = 0, n: int = 400) -> np.ndarray:
    """(n, 3) points around and inside meshes of about 0.3 m at the origin."""
    return np.random.default_rng(seed).uniform(-0.25, 0.25, size=(n, 3))


def world_sd(world: MeshWorld, points: np.ndarray) -> np.ndarray:
    sd, _ = world.signed_distance(torch.tensor(points, dtype=torch.float32), 0, 1.0)
    return sd.cpu().numpy()


@pytest.mark.parametrize("mesh", [(SPH_V, SPH_T), (BOX_V, BOX_T)], ids=["icosphere", "box"])
def test_oriented_mesh_matches_reference(mesh):
    v, t = mesh
    world = MeshWorld(device="cpu", max_distance=1.0, sign_method="winding_number")  # default overridden
    world.add_mesh("m", v, t, oriented=True)
    points = probe_points()
    expected, _, _ = ref.signed_distance(points, v, t)
    np.testing.assert_allclose(world_sd(world, points), expected, atol=1e-5)
    info = world.mesh_info("m")
    assert info["oriented"] is True and info["orientation"] is None
    assert info["sign_method"] == "normal" and info["closed_shell"] is True


def test_oriented_skips_the_repair():
    """The promise is trusted: an inside-out mesh added as oriented reads inside out, while the
    same mesh added plainly is repaired. So oriented=True must only be given where it holds."""
    inside_out = SPH_T[:, ::-1]
    points = probe_points(1)
    expected, _, _ = ref.signed_distance(points, SPH_V, SPH_T)  # true signs of the solid
    world = MeshWorld(device="cpu", max_distance=1.0)
    world.add_mesh("plain", SPH_V, inside_out, sign_method="normal")
    np.testing.assert_allclose(world_sd(world, points), expected, atol=1e-5)
    world.remove_mesh("plain")
    world.add_mesh("trusted", SPH_V, inside_out, oriented=True)
    sd = world_sd(world, points)
    clear = np.abs(expected) > 1e-3
    assert np.all(np.sign(sd[clear]) == -np.sign(expected[clear]))
    np.testing.assert_allclose(np.abs(sd), np.abs(expected), atol=1e-5)


def test_oriented_and_plain_are_different_geometries():
    """Same vertices and triangles with and without the promise: two geometries (the content
    key tells them apart), each reporting its own way in."""
    world = MeshWorld(device="cpu", max_distance=1.0)
    world.add_mesh("plain", SPH_V, SPH_T, sign_method="normal")
    world.add_mesh("trusted", SPH_V, SPH_T, oriented=True)
    assert world.mesh_info("plain")["oriented"] is False
    assert world.mesh_info("plain")["orientation"]["faces_reversed"] == 0
    assert world.mesh_info("trusted")["oriented"] is True


def test_oriented_refit_keeps_the_promise():
    """update_vertices on an oriented mesh (same topology, moved vertices): still oriented, and
    distances follow the moved surface."""
    world = MeshWorld(device="cpu", max_distance=1.0)
    world.add_mesh("m", SPH_V, SPH_T, oriented=True)
    moved = SPH_V * np.array([1.3, 1.0, 0.8]) + np.array([0.02, 0.0, -0.01])
    world.update_vertices("m", moved)
    points = probe_points(2)
    expected, _, _ = ref.signed_distance(points, moved, SPH_T)
    np.testing.assert_allclose(world_sd(world, points), expected, atol=1e-5)
    assert world.mesh_info("m")["oriented"] is True


def test_oriented_refuses_other_sign_methods():
    world = MeshWorld(device="cpu")
    with pytest.raises(ValueError, match="oriented"):
        world.add_mesh("m", SPH_V, SPH_T, sign_method="winding_number", oriented=True)
    assert world.mesh_count() == 0
    world.add_mesh("m", SPH_V, SPH_T, sign_method="normal", oriented=True)
    assert world.mesh_info("m")["sign_method"] == "normal"
