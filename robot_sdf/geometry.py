"""Validation and pose algebra in numpy (host side, no Warp, no ROS)."""
from __future__ import annotations

import numpy as np

from robot_sdf.types import POSE_SIZE

QUATERNION_NORM_TOLERANCE = 1e-3
# Largest |x|, |y|, |z| of a mesh pose [m]. The kernels read poses in float32: 1e39 would become
# inf (the obstacle silently vanished), and at 1e6 m float32 resolution is already 6 cm.
MAX_POSE_TRANSLATION = 1e6


def validate_vertices(vertices, what: str = "vertices") -> np.ndarray:
    """Return ``vertices`` as a C-contiguous (V, 3) float32 array or raise ValueError."""
    v = np.asarray(vertices)
    if v.ndim == 1 and v.size % 3 == 0:
        v = v.reshape(-1, 3)
    if v.ndim != 2 or v.shape[1] != 3:
        raise ValueError(f"{what} must have shape (V, 3), got {tuple(np.shape(vertices))}")
    if v.shape[0] < 3:
        raise ValueError(f"{what}: a mesh needs at least 3 vertices, got {v.shape[0]}")
    if not np.issubdtype(v.dtype, np.number):
        raise ValueError(f"{what} must be numeric, got dtype {v.dtype}")
    v = np.ascontiguousarray(v, dtype=np.float32)
    if not np.isfinite(v).all():
        bad = int(np.flatnonzero(~np.isfinite(v).all(axis=1))[0])
        raise ValueError(f"{what}: vertex {bad} is not finite ({v[bad].tolist()})")
    return v


def validate_triangles(triangles, num_vertices: int) -> np.ndarray:
    """Return ``triangles`` as a C-contiguous (T, 3) int32 array or raise ValueError."""
    t = np.asarray(triangles)
    if t.ndim == 1 and t.size % 3 == 0:
        t = t.reshape(-1, 3)
    if t.ndim != 2 or t.shape[1] != 3:
        raise ValueError(f"triangles must have shape (T, 3), got {tuple(np.shape(triangles))}")
    if t.shape[0] == 0:
        raise ValueError("triangles: a mesh needs at least one triangle")
    if not np.issubdtype(t.dtype, np.integer):
        if not np.issubdtype(t.dtype, np.floating) or not np.all(np.isfinite(t)) or np.any(t != np.round(t)):
            raise ValueError(f"triangles must hold integer vertex indices, got dtype {t.dtype}")
    lo, hi = int(t.min()), int(t.max())
    if lo < 0 or hi >= num_vertices:
        bad = lo if lo < 0 else hi
        raise ValueError(f"triangles: vertex index {bad} out of range [0, {num_vertices})")
    return np.ascontiguousarray(t, dtype=np.int32)


def validate_mesh(vertices, triangles) -> tuple[np.ndarray, np.ndarray]:
    """Everything add_mesh checks of a geometry: (V,3) finite float32 vertices, (T,3) int32
    in-range triangles, at least one with non-zero area. Raises ValueError."""
    v = validate_vertices(vertices)
    t = validate_triangles(triangles, v.shape[0])
    check_area(v, t)
    return v, t


def check_area(vertices: np.ndarray, triangles: np.ndarray) -> None:
    """Reject meshes whose triangles are all degenerate (zero area)."""
    # Almost every real mesh proves itself within its first triangles; the full pass is the
    # slow path for suspicious input only (it was 40 % of add_mesh for 10k triangles).
    for tris in (triangles[:64], triangles):
        tri = vertices[tris].astype(np.float64)
        area2 = np.linalg.norm(np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0]), axis=1)
        if np.any(area2 > 0.0):
            return
    raise ValueError("mesh has no triangle with non-zero area")


def validate_pose(pose) -> np.ndarray:
    """Return a (7,) float64 pose x,y,z,qw,qx,qy,qz with a unit quaternion, or raise ValueError.

    A quaternion whose norm is within QUATERNION_NORM_TOLERANCE of 1 is renormalised (float32
    producers rarely hit 1 exactly); anything else (zero, NaN, far from unit) is rejected.
    """
    if pose is None:
        return np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
    p = np.asarray(pose, dtype=np.float64).reshape(-1)
    if p.shape != (POSE_SIZE,):
        raise ValueError(f"pose must have 7 values x,y,z,qw,qx,qy,qz, got {p.size}")
    if not np.isfinite(p).all():
        raise ValueError(f"pose is not finite: {p.tolist()}")
    if np.abs(p[:3]).max() > MAX_POSE_TRANSLATION:
        raise ValueError(f"pose translation {p[:3].tolist()} exceeds {MAX_POSE_TRANSLATION:g} m "
                         "(beyond float32 precision for the kernels)")
    norm = float(np.linalg.norm(p[3:]))
    if abs(norm - 1.0) > QUATERNION_NORM_TOLERANCE:
        raise ValueError(f"pose quaternion must be unit length, its norm is {norm:.6g}")
    p[3:] /= norm
    return p


def quat_to_matrix(q) -> np.ndarray:
    """(4,) qw,qx,qy,qz -> (3, 3) rotation matrix."""
    w, x, y, z = q
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
            [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
            [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
        ]
    )


def quat_rotate(q, v) -> np.ndarray:
    """Rotate (..., 3) vectors by the unit quaternion q = qw,qx,qy,qz."""
    return np.asarray(v) @ quat_to_matrix(q).T


def pose_inverse(pose) -> np.ndarray:
    """Mesh pose in world (7,) -> world->mesh transform (7,): p_mesh = R^T (p_world - t)."""
    p = np.asarray(pose, dtype=np.float64)
    q_inv = np.array([p[3], -p[4], -p[5], -p[6]])
    t_inv = -quat_rotate(q_inv, p[:3])
    return np.concatenate([t_inv, q_inv])


def transform_points(pose, points) -> np.ndarray:
    """Apply pose (7,) to (..., 3) points: R p + t."""
    p = np.asarray(pose, dtype=np.float64)
    return quat_rotate(p[3:], points) + p[:3]


def bounding_radius(vertices: np.ndarray) -> float:
    """Radius of the sphere about the mesh-frame origin that contains every vertex."""
    return float(np.sqrt((vertices.astype(np.float64) ** 2).sum(axis=1).max()))
