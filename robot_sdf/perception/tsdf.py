"""A truncated signed distance field over a workspace box, fused from depth frames (Warp kernels,
CPU or CUDA), and its zero surface as a triangle mesh (Warp's marching cubes).

Grid: nodes at ``lower + voxel_size * (i, j, k)``, i < nx, ..., covering the box; per node the
fused value (distance to the surface seen along the camera's axis, in units of the truncation
distance, clamped to [-1, 1]; +1 where nothing was seen) and its weight (frames fused, capped).
Units: metres; poses (x, y, z, qw, qx, qy, qz) of the camera's optical frame (z forward, x right,
y down, as ROS's *_optical_frame) in the world; intrinsics fx, fy, cx, cy in pixels, pixel centres
at integer coordinates (sensor_msgs/CameraInfo's K).

Free space is carved as in a TSDF: every frame that sees through a node in front of a surface
pulls its value towards +1 with the weight of one frame against at most ``max_weight`` frames
of history, so an obstacle that leaves is gone after about max_weight / 2 frames that see the
space it held. Behind a surface the band [-truncation, 0] is fused as inside; beyond it nothing is
known, which the mesh takes as free (``unobserved`` "free") or as occupied ("occupied": the seen
free space is then the only free space).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import warp as wp

from robot_sdf import geometry
from robot_sdf.kernels.warp_release import WARP_MINOR

wp.set_module_options({"enable_backward": False})

# The marching-cubes class of this Warp (Warp 1.19 moved it to warp.geometry), and its sparse
# marching cubes over given cells where it has one (1.19): the surface's cells are a few percent
# of the box's, and the dense pass over every node cost 35-45 ms of a 2 cm update on a 2-core CPU
# against 15 ms for finding the cells and meshing only them (the same triangles).
if WARP_MINOR >= (1, 19):
    from warp.geometry import IsoSurfaceMarchingCubes as _MarchingCubes
    from warp.geometry import sparse_marching_cubes_from_cells as _sparse_marching_cubes
else:
    _MarchingCubes = wp.MarchingCubes
    _sparse_marching_cubes = None

# Corner c of a cell (i, j, k) is node (i, j, k) + CORNERS[c]: the order of Warp's marching-cubes
# tables, which the sparse marching cubes expects its corner values in.
CORNERS = ((0, 0, 0), (1, 0, 0), (1, 1, 0), (0, 1, 0), (0, 0, 1), (1, 0, 1), (1, 1, 1), (0, 1, 1))


@wp.kernel
def integrate_depth_kernel(
    values: wp.array3d(dtype=float),
    weights: wp.array3d(dtype=float),
    lower: wp.vec3,
    voxel_size: float,
    depth: wp.array2d(dtype=float),
    fx: float,
    fy: float,
    cx: float,
    cy: float,
    world_to_camera: wp.transform,
    truncation: float,
    max_weight: float,
    min_depth: float,
    max_depth: float,
):
    """Fuse one depth image (metres; 0, NaN or out of [min_depth, max_depth]: no return) into the
    nodes it sees."""
    i, j, k = wp.tid()
    p = lower + wp.vec3(float(i), float(j), float(k)) * voxel_size
    c = wp.transform_point(world_to_camera, p)
    if c[2] <= min_depth:
        return
    u = int(wp.round(fx * c[0] / c[2] + cx))
    v = int(wp.round(fy * c[1] / c[2] + cy))
    if u < 0 or v < 0 or u >= depth.shape[1] or v >= depth.shape[0]:
        return
    d = depth[v, u]
    if not (d >= min_depth and d <= max_depth):  # also NaN
        return
    sdf = d - c[2]
    if sdf < -truncation:
        return  # behind the band the sensor could see
    value = wp.min(sdf / truncation, 1.0)
    w = weights[i, j, k]
    values[i, j, k] = (values[i, j, k] * w + value) / (w + 1.0)
    weights[i, j, k] = wp.min(w + 1.0, max_weight)


@wp.kernel
def integrate_rays_kernel(
    points: wp.array(dtype=wp.vec3),
    origin: wp.vec3,
    lower: wp.vec3,
    voxel_size: float,
    shape: wp.vec3i,
    truncation: float,
    min_range: float,
    max_range: float,
    sums: wp.array3d(dtype=float),
    counts: wp.array3d(dtype=float),
):
    """One return of a ranging sensor (world frame) at ``origin``: every node its ray passes,
    from the box's entry to ``truncation`` behind the return, gets the truncated distance to the
    return along the ray (free space in front, the band behind), summed for this frame."""
    p = points[wp.tid()]
    if not (wp.isfinite(p[0]) and wp.isfinite(p[1]) and wp.isfinite(p[2])):
        return
    ray = p - origin
    distance = wp.length(ray)
    if distance < min_range or distance > max_range:
        return
    direction = ray / distance
    upper = lower + wp.vec3(float(shape[0] - 1), float(shape[1] - 1), float(shape[2] - 1)) * voxel_size
    # The ray's stretch inside the box (slab test), up to truncation behind the return.
    t0 = float(0.0)
    t1 = distance + truncation
    for axis in range(3):
        if wp.abs(direction[axis]) < 1.0e-12:
            if origin[axis] < lower[axis] or origin[axis] > upper[axis]:
                return
        else:
            a = (lower[axis] - origin[axis]) / direction[axis]
            b = (upper[axis] - origin[axis]) / direction[axis]
            t0 = wp.max(t0, wp.min(a, b))
            t1 = wp.min(t1, wp.max(a, b))
    step = 0.5 * voxel_size
    last = int(-1)
    t = t0
    while t <= t1:
        q = (origin + direction * t - lower) / voxel_size
        i = int(wp.round(q[0]))
        j = int(wp.round(q[1]))
        k = int(wp.round(q[2]))
        if i >= 0 and j >= 0 and k >= 0 and i < shape[0] and j < shape[1] and k < shape[2]:
            node = (i * shape[1] + j) * shape[2] + k
            if node != last:
                last = node
                node_point = lower + wp.vec3(float(i), float(j), float(k)) * voxel_size
                # Distance to the return along the ray, measured at the node itself.
                sdf = distance - wp.dot(node_point - origin, direction)
                if sdf >= -truncation:
                    wp.atomic_add(sums, i, j, k, wp.min(sdf / truncation, 1.0))
                    wp.atomic_add(counts, i, j, k, 1.0)
        t += step


@wp.kernel
def merge_rays_kernel(values: wp.array3d(dtype=float), weights: wp.array3d(dtype=float),
                      sums: wp.array3d(dtype=float), counts: wp.array3d(dtype=float), max_weight: float):
    """Fold one frame's ray sums into the field (their mean, with one frame's weight) and clear them."""
    i, j, k = wp.tid()
    n = counts[i, j, k]
    if n > 0.0:
        w = weights[i, j, k]
        values[i, j, k] = (values[i, j, k] * w + sums[i, j, k] / n) / (w + 1.0)
        weights[i, j, k] = wp.min(w + 1.0, max_weight)
        sums[i, j, k] = 0.0
        counts[i, j, k] = 0.0


@wp.kernel
def mask_spheres_kernel(
    depth: wp.array2d(dtype=float),
    fx: float,
    fy: float,
    cx: float,
    cy: float,
    camera_to_world: wp.transform,
    spheres: wp.array(dtype=wp.vec4),
    padding: float,
    out: wp.array2d(dtype=float),
):
    """``depth`` with every pixel whose return lies inside a sphere (x, y, z, r world frame, r + padding)
    set to 0 (no return): the robot's own body, removed before fusion."""
    v, u = wp.tid()
    d = depth[v, u]
    out[v, u] = d
    if not (d > 0.0):
        return
    p = wp.transform_point(camera_to_world, wp.vec3((float(u) - cx) / fx * d, (float(v) - cy) / fy * d, d))
    for i in range(spheres.shape[0]):
        s = spheres[i]
        reach = s[3] + padding
        if s[3] >= 0.0 and wp.length_sq(p - wp.vec3(s[0], s[1], s[2])) < reach * reach:
            out[v, u] = 0.0
            return


@wp.kernel
def surface_field_kernel(values: wp.array3d(dtype=float), weights: wp.array3d(dtype=float), unobserved: float,
                         field: wp.array3d(dtype=float)):
    """The field marching cubes meshes: fused values where seen, ``unobserved`` elsewhere, and
    ``unobserved`` on the box's faces, so that the surface closes inside the box."""
    i, j, k = wp.tid()
    on_face = i == 0 or j == 0 or k == 0 or i == values.shape[0] - 1 or j == values.shape[1] - 1 \
        or k == values.shape[2] - 1
    if weights[i, j, k] > 0.0 and not on_face:
        field[i, j, k] = values[i, j, k]
    else:
        field[i, j, k] = unobserved


@wp.kernel
def surface_cells_kernel(field: wp.array3d(dtype=float), count: wp.array(dtype=wp.int32),
                         cells: wp.array(dtype=wp.vec3i), corner_values: wp.array2d(dtype=float)):
    """The cells (i, j, k: min corner) whose corners lie on both sides of the zero level (value
    >= 0 on one, < 0 on another, as marching cubes splits them), appended at ``count`` with
    their 8 corner values in CORNERS order."""
    i, j, k = wp.tid()
    outside = int(0)
    for c in range(8):
        if field[i + wp.static(CORNERS[c][0]), j + wp.static(CORNERS[c][1]), k + wp.static(CORNERS[c][2])] >= 0.0:
            outside += 1
    if outside == 0 or outside == 8:
        return
    slot = wp.atomic_add(count, 0, 1)
    cells[slot] = wp.vec3i(i, j, k)
    for c in range(8):
        corner_values[slot, c] = field[i + wp.static(CORNERS[c][0]), j + wp.static(CORNERS[c][1]),
                                       k + wp.static(CORNERS[c][2])]


def _transform(pose) -> wp.transform:
    """A pose (7,) x, y, z, qw, qx, qy, qz as Warp's transform."""
    return wp.transform(wp.vec3(*map(float, pose[:3])), wp.quat(float(pose[4]), float(pose[5]), float(pose[6]),
                                                                float(pose[3])))


class TsdfVolume:
    """The fused field of a workspace box (module docstring).

    lower, upper (3,): the box's corners in the world (m); voxel_size (m); truncation (m, default
    4 voxels); max_weight: frames of history a node keeps (the carving rate); unobserved: "free"
    or "occupied"; device: torch/Warp device string.
    """

    def __init__(self, lower, upper, voxel_size: float = 0.02, truncation: float | None = None,
                 max_weight: float = 20.0, unobserved: str = "free", device: str = "cpu",
                 min_depth: float = 0.1, max_depth: float = 10.0) -> None:
        lower, upper = np.asarray(lower, np.float64), np.asarray(upper, np.float64)
        if lower.shape != (3,) or upper.shape != (3,) or not np.all(np.isfinite(lower)) or not np.all(upper > lower):
            raise ValueError(f"workspace box must be two finite corners lower < upper, got {lower}, {upper}")
        if not voxel_size > 0:
            raise ValueError(f"voxel_size must be > 0, got {voxel_size}")
        if unobserved not in ("free", "occupied"):
            raise ValueError(f"unobserved must be 'free' or 'occupied', got {unobserved!r}")
        self.voxel_size = float(voxel_size)
        self.truncation = float(truncation if truncation is not None else 4.0 * voxel_size)
        self.max_weight = float(max_weight)
        self.unobserved = unobserved
        self.min_depth, self.max_depth = float(min_depth), float(max_depth)
        self.shape = tuple(int(n) for n in np.ceil((upper - lower) / self.voxel_size).astype(int) + 1)
        cells = int(np.prod(self.shape))
        if cells > 400_000_000:
            raise ValueError(f"workspace box of {self.shape} nodes at {voxel_size} m is too large")
        self.lower = lower.astype(np.float32)
        self.upper = (lower + self.voxel_size * (np.array(self.shape) - 1)).astype(np.float32)
        self.device = device
        self.values = wp.full(self.shape, 1.0, dtype=float, device=device)
        self.weights = wp.zeros(self.shape, dtype=float, device=device)
        self._field = wp.empty(self.shape, dtype=float, device=device)
        if _sparse_marching_cubes is None:
            self._mc = _MarchingCubes(*self.shape, domain_bounds_lower_corner=tuple(map(float, self.lower)),
                                      domain_bounds_upper_corner=tuple(map(float, self.upper)))
        else:
            # Room for every cell: the surface's are appended here each update (surface_cells_kernel).
            self._cell_count = wp.zeros(1, dtype=wp.int32, device=device)
            self._cells = wp.empty(cells, dtype=wp.vec3i, device=device)
            self._corner_values = wp.empty((cells, 8), dtype=float, device=device)
        self.frames = 0
        self._sums = self._counts = None  # one scan's ray sums (integrate_points), made on first use

    def integrate(self, depth, intrinsics, pose, exclude_spheres=None, exclude_padding: float = 0.0) -> None:
        """Fuse one depth image: ``depth`` (H, W) metres (numpy, torch or a Warp array; 0 or NaN:
        no return), ``intrinsics`` (fx, fy, cx, cy), ``pose`` (7,) of the camera's optical frame
        in the world. ``exclude_spheres`` (n, 4) x, y, z, r in the world (radius < 0: off): returns
        within r + ``exclude_padding`` of a centre are dropped first (the robot's own body, e.g.
        robot_sdf.robot.RobotModel.spheres). Bad input raises ValueError and changes nothing."""
        fx, fy, cx, cy = (float(x) for x in intrinsics)
        if not all(np.isfinite([fx, fy, cx, cy])) or fx <= 0 or fy <= 0:
            raise ValueError(f"intrinsics must be finite with fx, fy > 0, got {intrinsics}")
        pose = geometry.validate_pose(pose)
        image = self._depth_array(depth)
        if exclude_spheres is not None:
            image = self._masked(image, (fx, fy, cx, cy), pose, exclude_spheres, float(exclude_padding))
        transform = _transform(geometry.pose_inverse(pose))  # world -> camera
        wp.launch(integrate_depth_kernel, dim=self.shape,
                  inputs=[self.values, self.weights, wp.vec3(*map(float, self.lower)), self.voxel_size, image,
                          fx, fy, cx, cy, transform, self.truncation, self.max_weight, self.min_depth,
                          self.max_depth], device=self.device)
        self.frames += 1

    def integrate_points(self, points, origin) -> None:
        """Fuse one scan of a ranging sensor (a lidar): ``points`` (N, 3) its returns in the world
        (NaN rows: no return), ``origin`` (3,) the sensor's position in the world. Each return's
        ray carves the free space in front of it and marks the band behind it. Bad input raises
        ValueError and changes nothing."""
        origin = np.asarray(origin, np.float64).reshape(-1)
        if origin.shape != (3,) or not np.isfinite(origin).all():
            raise ValueError(f"origin must be 3 finite numbers, got {origin}")
        points = np.asarray(points.detach().cpu() if isinstance(points, torch.Tensor) else points, np.float32)
        if points.ndim != 2 or points.shape[1] != 3:
            raise ValueError(f"points must be (N, 3), got shape {points.shape}")
        if self._sums is None:
            self._sums = wp.zeros(self.shape, dtype=float, device=self.device)
            self._counts = wp.zeros(self.shape, dtype=float, device=self.device)
        if len(points):
            wp.launch(integrate_rays_kernel, dim=len(points),
                      inputs=[wp.array(np.ascontiguousarray(points), dtype=wp.vec3, device=self.device),
                              wp.vec3(*map(float, origin)), wp.vec3(*map(float, self.lower)), self.voxel_size,
                              wp.vec3i(*self.shape), self.truncation, self.min_depth, self.max_depth,
                              self._sums, self._counts], device=self.device)
            wp.launch(merge_rays_kernel, dim=self.shape,
                      inputs=[self.values, self.weights, self._sums, self._counts, self.max_weight], device=self.device)
        self.frames += 1

    def filled_field(self) -> np.ndarray:
        """The field marching cubes meshes with ``unobserved`` "free" (surface's docstring), on
        the host: seen values; +1 on the box's faces and in never-seen space connected to seen
        free space or to the faces (6-connected, scipy.ndimage.label); -1 in never-seen space
        enclosed by seen inside."""
        from scipy import ndimage

        values, weights = self.values.numpy(), self.weights.numpy()
        seen = weights > 0.0
        seen_free = seen & (values > 0.0)
        labels, count = ndimage.label(~seen | seen_free)
        # Per label: free if it holds seen free space or touches a face (a table, not np.isin,
        # which sorts every node's label).
        free = np.zeros(count + 1, bool)
        free[labels[seen_free]] = True
        for face in (labels[0], labels[-1], labels[:, 0], labels[:, -1], labels[:, :, 0], labels[:, :, -1]):
            free[face] = True
        free[0] = False  # label 0: seen inside
        field = np.where(seen, values, np.where(free[labels], np.float32(1.0), np.float32(-1.0)))
        field[0], field[-1], field[:, 0], field[:, -1], field[:, :, 0], field[:, :, -1] = (1.0,) * 6
        return field

    def _masked(self, image: wp.array, intrinsics, pose, spheres, padding: float) -> wp.array:
        spheres = np.asarray(spheres.detach().cpu() if isinstance(spheres, torch.Tensor) else spheres, np.float32)
        if spheres.ndim != 2 or spheres.shape[1] != 4 or not np.isfinite(spheres).all():
            raise ValueError(f"exclude_spheres must be finite (n, 4) x, y, z, r, got shape {spheres.shape}")
        if not (math.isfinite(padding) and padding >= 0.0):
            raise ValueError(f"exclude_padding must be a finite number >= 0, got {padding}")
        out = wp.empty_like(image)
        wp.launch(mask_spheres_kernel, dim=image.shape,
                  inputs=[image, *intrinsics, _transform(pose), wp.array(spheres, dtype=wp.vec4, device=self.device),
                          padding, out], device=self.device)
        return out

    def _depth_array(self, depth) -> wp.array:
        if isinstance(depth, wp.array):
            if depth.ndim != 2 or depth.dtype != wp.float32:
                raise ValueError(f"depth must be a 2-D float32 image, got {depth.ndim}-D {depth.dtype}")
            return depth
        if isinstance(depth, torch.Tensor):
            depth = depth.detach().to(torch.float32).contiguous()
            if depth.dim() != 2:
                raise ValueError(f"depth must be a 2-D image, got shape {tuple(depth.shape)}")
            return wp.from_torch(depth.to(self.device), dtype=float)
        depth = np.asarray(depth, dtype=np.float32)
        if depth.ndim != 2 or depth.size == 0:
            raise ValueError(f"depth must be a non-empty 2-D image, got shape {depth.shape}")
        return wp.array(np.ascontiguousarray(depth), dtype=float, device=self.device)

    def surface(self) -> tuple[np.ndarray, np.ndarray]:
        """The fused field's zero surface: vertices (V, 3) float32 world frame and triangles (T, 3)
        int32, counter-clockwise seen from the free side. Empty arrays when nothing was seen.

        With ``unobserved`` "free", space never seen is free only where it connects to space
        seen free or to the box's faces: the core of an object that the views surround, beyond the
        band seen behind each of its faces, is enclosed by seen inside and counts as inside."""
        if self.unobserved == "occupied":
            wp.launch(surface_field_kernel, dim=self.shape, inputs=[self.values, self.weights, -1.0, self._field],
                      device=self.device)
        else:
            self._field.assign(self.filled_field())
        if _sparse_marching_cubes is None:
            self._mc.surface(self._field, 0.0)
            vertices, indices = self._mc.verts, self._mc.indices
        else:
            self._cell_count.zero_()
            wp.launch(surface_cells_kernel, dim=tuple(n - 1 for n in self.shape),
                      inputs=[self._field, self._cell_count, self._cells, self._corner_values], device=self.device)
            count = int(self._cell_count.numpy()[0])
            if count == 0:
                vertices = indices = None
            else:
                vertices, indices = _sparse_marching_cubes(self._cells[:count], self._corner_values[:count],
                                                           origin=tuple(map(float, self.lower)),
                                                           cell_width=self.voxel_size, device=self.device)
        if vertices is None or indices is None or indices.shape[0] == 0:
            return np.zeros((0, 3), np.float32), np.zeros((0, 3), np.int32)
        return vertices.numpy().astype(np.float32), indices.numpy().reshape(-1, 3).astype(np.int32)
