"""Depth frames into a MeshWorld: the fused surface of a TsdfVolume becomes one of the world's
meshes, so every query (the Functions, MeshWorld's costs and signed distances, the node's
services) sees perceived geometry beside the meshes given to it, with no query path of its own.

    fusion = DepthFusion(world, lower=(-1, -1, 0), upper=(1, 1, 1.2), voxel_size=0.02)
    fusion.add_depth(depth, (fx, fy, cx, cy), camera_pose)   # (H, W) m; pose of the optical frame
    world.sphere_cost(spheres)                               # perceived obstacles included

The surface is closed inside the workspace box (tsdf.surface_field_kernel), wound outward and free
of self-intersections by construction, so it joins the world as an oriented mesh (MeshWorld.add_mesh
oriented=True): the exact pseudo-normal sign (``normal``), without the winding repair and the
classification that meshes from elsewhere need. A centre behind a seen surface, within the band the
sensor saw, is inside, its cost growing with depth.
"""
from __future__ import annotations

from robot_sdf.perception.tsdf import TsdfVolume
from robot_sdf.types import IDENTITY_POSE

# The world mesh the fused surface is, unless DepthFusion is given another name.
PERCEIVED_MESH = "perceived"


class DepthFusion:
    """A TsdfVolume (its keyword arguments: voxel_size, truncation, max_weight, unobserved,
    min_depth, max_depth) whose surface is the mesh ``name`` of ``world``'s environment ``env``,
    on the world's device."""

    def __init__(self, world, lower, upper, name: str = PERCEIVED_MESH, env: int = 0, **volume) -> None:
        world.check_env(env)
        self.world, self.name, self.env = world, name, int(env)
        self.volume = TsdfVolume(lower, upper, device=str(world.device), **volume)
        self.triangles = 0

    def integrate(self, depth, intrinsics, pose, exclude_spheres=None, exclude_padding: float = 0.0) -> None:
        """Fuse one frame (TsdfVolume.integrate: the robot's spheres may be excluded) without
        changing the world yet."""
        self.volume.integrate(depth, intrinsics, pose, exclude_spheres, exclude_padding)

    def add_points(self, points, origin) -> int:
        """A lidar scan in (TsdfVolume.integrate_points: world-frame returns, the sensor's
        position), then update_world. Returns the revision."""
        self.volume.integrate_points(points, origin)
        return self.update_world()

    def update_world(self) -> int:
        """Put the fused surface into the world (replacing the last one; removed when empty).
        Returns the world's revision."""
        vertices, triangles = self.volume.surface()
        self.triangles = len(triangles)
        if len(triangles) == 0:
            if self.world.has_mesh(self.name, self.env):
                return self.world.remove_mesh(self.name, self.env)
            return self.world.revision
        return self.world.add_mesh(self.name, vertices, triangles, IDENTITY_POSE, self.env, oriented=True)

    def add_depth(self, depth, intrinsics, pose, exclude_spheres=None, exclude_padding: float = 0.0) -> int:
        """integrate, then update_world: a frame in, the world answering with it. Returns the revision."""
        self.integrate(depth, intrinsics, pose, exclude_spheres, exclude_padding)
        return self.update_world()
