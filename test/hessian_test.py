"""robot_sdf.kernels.hessian: sphere_hessian_kernel (through warp_primitives.Query.hessian)
against central differences of test/reference.py's gradient (float64), for the plain cost (both
parts: c'' n n^T - c' H_sd) and the ESDF (-H_sd of the mesh attaining the maximum), on posed meshes
whose closest features are faces, edges and corners, in a world with a slot BVH."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import mesh_corpus as corpus
import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.warp_primitives import Query

ETA, MAX_DIST, WEIGHT = 0.04, 0.08, 1.3
H = 1e-5  # central-difference step (m)


@pytest.fixture(scope="module")
def scene():
    """(world, reference meshes): nine posed boxes, icospheres and capsules (a slot BVH)."""
    rng = np.random.default_rng(29)
    shapes = [lambda: ref.box((0.2, 0.12, 0.16)), lambda: ref.icosphere(0.1, 1), corpus.capsule]
    world = MeshWorld(device="cpu", mesh_capacity=9, max_distance=MAX_DIST)
    meshes = []
    for j in range(9):
        v, t = shapes[j % 3]()
        pose = np.concatenate([rng.uniform(-0.6, 0.6, 3), ref.random_quaternion(rng)])
        world.add_mesh(f"m{j}", v, t, pose=pose)
        meshes.append(ref.RefMesh(np.asarray(v, np.float64), np.asarray(t), pose))
    return world, meshes


def _spheres(rng: np.random.Generator, meshes, n: int) -> np.ndarray:
    """(1, 1, n, 4): centres near the meshes' corners, edges and faces, radii 0..3 cm."""
    out = []
    for _ in range(n):
        m = meshes[rng.integers(len(meshes))]
        tri = m.vertices[m.triangles[rng.integers(len(m.triangles))]]
        w = rng.dirichlet([0.3, 0.3, 0.3])  # often near an edge or a corner
        out.append(ref.transform_points(m.pose, (w @ tri)[None])[0] + rng.normal(scale=0.03, size=3))
    return np.concatenate([np.array(out), rng.uniform(0.0, 0.03, size=(n, 1))], 1)[None, None].astype(np.float32)


def _reference_hessian(spheres: np.ndarray, meshes, esdf: bool, h: float) -> np.ndarray:
    """(n, 3, 3) central differences (step h) of the reference gradient, float64."""
    s = spheres.astype(np.float64)
    cols = []
    for k in range(3):
        e = np.zeros(4)
        e[k] = h
        plus = ref.sphere_cost(s + e, [meshes], ETA, WEIGHT, MAX_DIST, compute_esdf=esdf)[1]
        minus = ref.sphere_cost(s - e, [meshes], ETA, WEIGHT, MAX_DIST, compute_esdf=esdf)[1]
        cols.append((plus - minus)[0, 0] / (2 * h))
    return np.stack(cols, axis=-1)


@pytest.mark.parametrize("esdf", [False, True], ids=["cost", "esdf"])
def test_hessians_are_the_references_differences(scene, esdf):
    world, meshes = scene
    spheres = _spheres(np.random.default_rng(6 + esdf), meshes, 800)
    with world.reading() as snap:
        hess = Query(torch.tensor([WEIGHT]), torch.tensor([ETA]), torch.tensor([MAX_DIST]), snap.mesh_idx,
                     snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, snap.sign_methods, snap,
                     esdf=esdf).hessian(torch.from_numpy(spheres))[0, 0].numpy()
    fd = _reference_hessian(spheres, meshes, esdf, H)
    # Where a stencil crosses a region boundary or a medial axis, or a surface is nearer than it,
    # differences with two steps disagree: those points are left out. The larger step also leaves
    # out points within the kernel's float32 tolerance of a region boundary (a direction within
    # HESSIAN_FLAT_COSINE of a face's normal counts as that face's: ~30 um at 2 cm).
    smooth = np.abs(fd - _reference_hessian(spheres, meshes, esdf, 10 * H)).max(axis=(1, 2)) < 1e-3 * np.maximum(
        1.0, np.abs(fd).max(axis=(1, 2)))
    p = spheres[0, 0, :, :3].astype(np.float64)
    sd = np.stack([m.signed_distance_world(p)[0] for m in meshes])
    smooth &= np.all(np.abs(sd) > 1e-3, axis=0)
    assert smooth.mean() > 0.8
    scale = np.maximum(1.0, np.abs(fd[smooth]).max(axis=(1, 2)))[:, None, None]
    assert np.all(np.abs(hess[smooth] - fd[smooth]) <= 2e-3 * scale)
    np.testing.assert_allclose(hess, np.swapaxes(hess, 1, 2), atol=1e-4 * np.abs(hess).max())
    # Both cases occur: zero (no contact; a face's region for the ESDF) and, at many points, the
    # curvature of an edge or a corner (H_sd of rank 2 or more).
    second = np.linalg.svd(hess[smooth], compute_uv=False)[:, 1]
    assert (second > 1.0).sum() > 10 and (np.abs(hess[smooth]).max(axis=(1, 2)) == 0).sum() > 20
