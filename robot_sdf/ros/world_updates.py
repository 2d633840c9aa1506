"""Applying a MeshObstacle ADD to a MeshWorld: size limits first, refit when the topology stays.

An ADD of an existing id whose triangles are identical to the ones it has (or that sends
vertices only, ``triangles`` empty) keeps the BVH topology: the world refits it
(MeshWorld.update_vertices, ~10-20x cheaper than a rebuild) and sets the new pose in the same
revision. Anything else replaces the geometry (a rebuild, or a cached geometry when the content
was seen before). An ADD keeps a DISABLEd id disabled (docs/design.md "Messages and services").
"""
from __future__ import annotations

from robot_sdf.ros import conversions as conv


class MeshTooLarge(ValueError):
    """A mesh over the node's max_vertices_per_mesh / max_triangles_per_mesh."""


def check_mesh_size(msg, max_vertices: int, max_triangles: int) -> None:
    """Refuse an oversized geometry before any conversion or copy of it."""
    if len(msg.vertices) > 0:
        nv, nt = len(msg.vertices) // 3, len(msg.triangles) // 3
    else:
        nv, nt = len(msg.mesh.vertices), len(msg.mesh.triangles)
    if nv > max_vertices:
        raise MeshTooLarge(f"mesh has {nv} vertices, more than max_vertices_per_mesh {max_vertices}")
    if nt > max_triangles:
        raise MeshTooLarge(f"mesh has {nt} triangles, more than max_triangles_per_mesh {max_triangles}")


def apply_add(world, name: str, env: int, msg, config, pose) -> str:
    """Apply an ADD message whose pose (7,), already in world_frame, is ``pose``; returns the log
    line. Raises ValueError/KeyError (nothing changed)."""
    check_mesh_size(msg, config.max_vertices_per_mesh, config.max_triangles_per_mesh)
    exists = world.has_mesh(name, env) if isinstance(name, str) and name else False
    if exists and len(msg.vertices) > 0:
        vertices = conv.as_float32(msg.vertices)
        triangles = conv.as_uint32(msg.triangles)
        if triangles.size == 0 or world.same_triangles(name, triangles, env):
            rev = world.update_vertices(name, vertices, env=env, pose=pose)
            return f"{vertices.size // 3} vertices, same topology: refit -> revision {rev}"
    vertices, triangles = conv.mesh_arrays(msg)
    enabled = world.mesh_geometry(name, env)[3] if exists else True
    rev = world.add_mesh(name, vertices, triangles, pose=pose, env=env, enabled=enabled)
    return f"{vertices.size // 3} vertices, {triangles.size // 3} triangles -> revision {rev}"
