"""A simulated depth camera: ray-casts triangle meshes (Warp) into depth images with a RealSense-
like error (sigma = 1 mm + 2 mm z^2, z in m) and dropped pixels, for tests, benchmarks and demos.
Images are (H, W) float32 metres of z along the optical axis, 0 where nothing returns; poses are
of the optical frame (z forward, x right, y down) in the world, (x, y, z, qw, qx, qy, qz).
"""
from __future__ import annotations

import numpy as np
import warp as wp
from scipy.spatial.transform import Rotation

wp.set_module_options({"enable_backward": False})


@wp.kernel
def raycast_depth_kernel(mesh: wp.uint64, camera_to_world: wp.transform, fx: float, fy: float, cx: float,
                         cy: float, max_range: float, depth: wp.array2d(dtype=float)):
    v, u = wp.tid()
    ray = wp.vec3((float(u) - cx) / fx, (float(v) - cy) / fy, 1.0)
    length = wp.length(ray)
    origin = wp.transform_point(camera_to_world, wp.vec3(0.0, 0.0, 0.0))
    direction = wp.transform_vector(camera_to_world, ray / length)
    hit = wp.mesh_query_ray(mesh, origin, direction, max_range)
    depth[v, u] = wp.where(hit.result, hit.t / length, 0.0)


def merge_meshes(parts) -> tuple[np.ndarray, np.ndarray]:
    """One mesh (vertices (V, 3), triangles (T, 3)) of several [(vertices, triangles)]: a scene to render."""
    offsets = np.cumsum([0] + [len(v) for v, _ in parts])[:-1]
    return np.concatenate([v for v, _ in parts]), np.concatenate([t + o for (_, t), o in zip(parts, offsets)])


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """Pose (7,) of an optical frame at ``eye`` looking at ``target``, image 'up' towards ``up``."""
    eye, target, up = (np.asarray(a, np.float64) for a in (eye, target, up))
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    if np.linalg.norm(x) < 1e-9:
        x = np.cross(z, [1.0, 0.0, 0.0])
    x /= np.linalg.norm(x)
    y = np.cross(z, x)
    qx, qy, qz, qw = Rotation.from_matrix(np.stack([x, y, z], axis=1)).as_quat()
    return np.array([*eye, qw, qx, qy, qz])


class SimulatedDepthCamera:
    """width x height pixels, intrinsics fx, fy, cx, cy (pixels), returns up to ``max_range`` m."""

    def __init__(self, width: int = 320, height: int = 240, fx: float = 300.0, fy: float = 300.0,
                 cx: float | None = None, cy: float | None = None, max_range: float = 6.0, device: str = "cpu"):
        self.width, self.height = int(width), int(height)
        self.intrinsics = (float(fx), float(fy), float((width - 1) / 2 if cx is None else cx),
                           float((height - 1) / 2 if cy is None else cy))
        self.max_range = float(max_range)
        self.device = device

    def points(self, depth: np.ndarray, pose) -> np.ndarray:
        """The returns of a depth image (0: none) as points (N, 3) in the frame ``pose`` places
        the camera in (the identity pose: the camera's own optical frame)."""
        fx, fy, cx, cy = self.intrinsics
        v, u = np.nonzero(depth > 0)
        z = depth[v, u].astype(np.float64)
        local = np.stack([(u - cx) / fx * z, (v - cy) / fy * z, z], 1)
        pose = np.asarray(pose, np.float64)
        return local @ Rotation.from_quat([pose[4], pose[5], pose[6], pose[3]]).as_matrix().T + pose[:3]

    def render(self, vertices: np.ndarray, triangles: np.ndarray, pose, rng: np.random.Generator | None = None,
               drop_fraction: float = 0.01) -> np.ndarray:
        """Depth image of the world-frame mesh (vertices (V, 3), triangles (T, 3)) seen from
        ``pose``; with ``rng``, the sensor's error and ``drop_fraction`` of pixels returning 0."""
        mesh = wp.Mesh(points=wp.array(np.asarray(vertices, np.float32), dtype=wp.vec3, device=self.device),
                       indices=wp.array(np.asarray(triangles, np.int32).ravel(), dtype=wp.int32, device=self.device))
        pose = np.asarray(pose, np.float64)
        transform = wp.transform(wp.vec3(*map(float, pose[:3])),
                                 wp.quat(float(pose[4]), float(pose[5]), float(pose[6]), float(pose[3])))
        depth = wp.zeros((self.height, self.width), dtype=float, device=self.device)
        wp.launch(raycast_depth_kernel, dim=(self.height, self.width),
                  inputs=[mesh.id, transform, *self.intrinsics, self.max_range, depth], device=self.device)
        image = depth.numpy()
        return image if rng is None else add_sensor_error(image, rng, drop_fraction)


def add_sensor_error(image: np.ndarray, rng: np.random.Generator, drop_fraction: float = 0.01) -> np.ndarray:
    """An exact depth image (0: no return) as the sensor reports it: the RealSense-like error
    (sigma = 1 mm + 2 mm z^2) on every return and ``drop_fraction`` of the pixels returning 0.
    Separate from render so that layers rendered apart (a static scene once, a moving object per
    frame) can be combined before the error is drawn."""
    hit = image > 0
    noisy = np.where(hit, image + rng.normal(size=image.shape) * (1e-3 + 2e-3 * image ** 2), 0.0)
    noisy[rng.random(image.shape) < drop_fraction] = 0.0
    return noisy.astype(np.float32)


def nearest_return(*images: np.ndarray) -> np.ndarray:
    """Per pixel the nearest return of depth images of the same view (0: no return): the image of
    the union of the scenes they show."""
    stacked = np.stack(images)
    nearest = np.where(stacked > 0, stacked, np.inf).min(axis=0)
    return np.where(np.isfinite(nearest), nearest, 0.0).astype(np.float32)
