"""Shared pytest fixtures for the robot_sdf core tests.

- keeps DDS discovery on loopback for every test process (set before anything imports ROS);
- initialises Warp quietly once;
- `device`: "cpu" always, "cuda:0" only when both torch and Warp see a CUDA device;
- `build_warp_env`: Warp meshes and the fixed kernel tensors of docs/design.md "Tensor layouts" built directly
  with Warp from reference meshes, so SdfMeshWarpPy is tested without MeshWorld.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import warp as wp  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference as ref  # noqa: E402

wp.config.log_level = wp.LOG_WARNING
wp.init()


def _cuda_usable() -> bool:
    try:
        return bool(torch.cuda.is_available()) and wp.get_cuda_device_count() > 0
    except Exception:  # a broken driver counts as no CUDA
        return False


CUDA_USABLE = _cuda_usable()
DEVICES = [
    "cpu",
    pytest.param(
        "cuda:0",
        marks=pytest.mark.skipif(not CUDA_USABLE, reason="no CUDA device visible to both torch and Warp"),
    ),
]


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Torch/Warp device string the test runs on."""
    return request.param


@dataclass
class WarpEnv:
    """Warp meshes of reference environments and the kernel tensors that describe them.

    mesh_idx (n_env, m) int64, mesh_pose_inverse (n_env, m, 8) float32, mesh_enable (n_env, m)
    uint8, n_env_mesh (n_env,) int32, all on `device`. `meshes` keeps the wp.Mesh objects alive.
    `sign_methods`: None for meshes passed as they are; for adopted ones (build_warp_env's
    ``adopt``) the (n_env, m) uint8 per-slot signs of robot_sdf.adopt_meshes, whose ids are then
    in mesh_idx (`adopted` keeps the twins alive).
    """

    mesh_idx: torch.Tensor
    mesh_pose_inverse: torch.Tensor
    mesh_enable: torch.Tensor
    n_env_mesh: torch.Tensor
    meshes: list[Any] = field(default_factory=list)
    sign_methods: torch.Tensor | None = None
    adopted: Any = None


_MESH_CACHE: dict[tuple, Any] = {}


def warp_mesh(vertices: np.ndarray, triangles: np.ndarray, device: str):
    """A wp.Mesh (with winding-number support) for the geometry, cached per (geometry, device)."""
    v = np.ascontiguousarray(vertices, dtype=np.float32)
    t = np.ascontiguousarray(triangles, dtype=np.int32)
    key = (v.tobytes(), t.tobytes(), device)
    mesh = _MESH_CACHE.get(key)
    if mesh is None:
        mesh = wp.Mesh(
            points=wp.array(v, dtype=wp.vec3, device=device),
            indices=wp.array(t.reshape(-1), dtype=wp.int32, device=device),
            support_winding_number=True,
        )
        _MESH_CACHE[key] = mesh
    return mesh


def build_warp_env(envs: list[list[ref.RefMesh]], device: str, capacity: int | None = None,
                   extra_slots: list[list[ref.RefMesh]] | None = None, adopt: bool = False) -> WarpEnv:
    """Kernel tensors for `envs` (meshes per environment, slot order = list order).

    capacity: slots per environment (default: the largest environment, at least 1).
    extra_slots: per environment, meshes written into the slots *after* n_env_mesh (enabled,
    colliding decoys): a correct kernel never reads them.
    adopt: pass the meshes through robot_sdf.adopt_meshes (robot_sdf's sign regimes for them).
    """
    n_env = len(envs)
    used = [len(e) for e in envs]
    extra = extra_slots or [[] for _ in envs]
    m = capacity or max([1] + [u + len(x) for u, x in zip(used, extra)])
    mesh_idx = np.zeros((n_env, m), dtype=np.int64)
    pose_inv = np.zeros((n_env, m, 8), dtype=np.float32)
    pose_inv[..., 3] = 1.0
    enable = np.zeros((n_env, m), dtype=np.uint8)
    keep = []
    for e, (meshes, decoys) in enumerate(zip(envs, extra)):
        for s, rm in enumerate(list(meshes) + list(decoys)):
            wm = warp_mesh(rm.vertices, rm.triangles, device)
            keep.append(wm)
            mesh_idx[e, s] = wm.id
            pose_inv[e, s, :7] = ref.pose_inverse(rm.pose)
            enable[e, s] = 1 if (rm.enabled or s >= len(meshes)) else 0
    env = WarpEnv(
        mesh_idx=torch.from_numpy(mesh_idx).to(device),
        mesh_pose_inverse=torch.from_numpy(pose_inv).to(device),
        mesh_enable=torch.from_numpy(enable).to(device),
        n_env_mesh=torch.tensor(used, dtype=torch.int32, device=device),
        meshes=keep,
    )
    if adopt:
        from robot_sdf import adopt_meshes

        env.adopted = adopt_meshes(env.mesh_idx)
        env.mesh_idx, env.sign_methods = env.adopted.mesh_idx, env.adopted.sign_methods
    return env


def assert_kernels_agree(actual, expected, device: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """Two kernels (or two launches) that compute the same values by different code: equal to the
    bit on the CPU, where Warp compiles without multiply-add contraction and both walk the same
    BVH; within float32 rounding on CUDA, where NVRTC fuses multiply-adds differently in
    differently shaped code and a GPU-built BVH visits tied triangles in another order. The
    default bounds: about 10 float32 ulps of the values relative, 1e-6 absolute (a distance's
    rounding at a metre, times the cost's slope). numpy arrays or torch tensors."""
    a = actual.detach().cpu().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    b = expected.detach().cpu().numpy() if isinstance(expected, torch.Tensor) else np.asarray(expected)
    if str(device).startswith("cuda"):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    else:
        np.testing.assert_array_equal(a, b)


_supports_winding_kernel = None


def supports_winding(mesh: wp.Mesh) -> bool:
    """Whether ``mesh`` was built with support_winding_number, read by native.mesh_supports_winding
    (Warp before 1.16 keeps no such attribute on its Python Mesh). The kernel is made on first use:
    importing native refuses a Warp it was not checked against, where the other tests still run."""
    global _supports_winding_kernel
    if _supports_winding_kernel is None:
        from robot_sdf.kernels import native

        @wp.kernel
        def kernel(mesh: wp.uint64, out: wp.array(dtype=wp.int32)):
            out[0] = wp.where(native.mesh_supports_winding(mesh), 1, 0)

        _supports_winding_kernel = kernel
    out = wp.zeros(1, dtype=wp.int32, device=mesh.device)
    wp.launch(_supports_winding_kernel, 1, [mesh.id, out], device=mesh.device)
    return bool(out.numpy()[0])


def scalar(x: float, device: str) -> torch.Tensor:
    """A (1,) float32 tensor, as the primitives take their scalars."""
    return torch.tensor([float(x)], dtype=torch.float32, device=device)


@pytest.fixture(autouse=True)
def _seed_torch():
    torch.manual_seed(0)
