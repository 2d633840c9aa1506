"""Exact closest point on a mesh, once a BVH search has found the closest triangle.

The distance and its direction are recomputed in float64 on that triangle, relative to its first
corner (refine_closest), so that slivers keep their accuracy (the searches of a mesh with slivers
measure thin triangles in float64 too, so that the triangle is the closest: native.mesh_closest_face
and mesh_closest_points). The feature holding
the closest point (face, edge or corner) gives the angle-weighted pseudo-normal of the ``normal``
sign (feature_normal, from the sign data). Points are in the mesh (kernel) frame, lengths in m.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.sign_data import edge_normal, vertex_normal

wp.set_module_options({"enable_backward": False})

# Search radius for the closest point of a centre known to be inside a mesh: unbounded in practice.
UNBOUNDED = wp.constant(1.0e9)
# Below this length the direction centre - closest point is meaningless; use the feature normal.
DEGENERATE_LENGTH = wp.constant(1.0e-9)


@wp.func
def closest_on_segment(p: wp.vec3d, a: wp.vec3d, b: wp.vec3d) -> wp.vec3d:
    ab = b - a
    len2 = wp.dot(ab, ab)
    t = wp.float64(0.0)
    if len2 > wp.float64(0.0):
        t = wp.clamp(wp.dot(p - a, ab) / len2, wp.float64(0.0), wp.float64(1.0))
    return a + ab * t


@wp.func
def closest_on_triangle(p: wp.vec3d, b: wp.vec3d, c: wp.vec3d):
    """Closest point of p on the triangle (0, b, c) (coordinates relative to its first corner)
    and the feature holding it: 0 face, 1 edge 0-b, 2 edge b-c, 3 edge c-0, 4/5/6 corner 0/b/c.
    Ericson's region test, in float64 so that slivers keep their accuracy."""
    zero = wp.float64(0.0)
    d1 = wp.dot(b, p)
    d2 = wp.dot(c, p)
    if d1 <= zero and d2 <= zero:
        return wp.vec3d(zero, zero, zero), 4
    bp = p - b
    d3 = wp.dot(b, bp)
    d4 = wp.dot(c, bp)
    if d3 >= zero and d4 <= d3:
        return b, 5
    vc = d1 * d4 - d3 * d2
    # (Each edge region also asks for a nonzero denominator: it is zero only where the edge's
    # corners coincide, and the edge is then a point that the corner regions or the zero-area
    # search below give.)
    if vc <= zero and d1 >= zero and d3 <= zero and d1 - d3 > zero:
        return b * (d1 / (d1 - d3)), 1
    cp = p - c
    d5 = wp.dot(b, cp)
    d6 = wp.dot(c, cp)
    if d6 >= zero and d5 <= d6:
        return c, 6
    vb = d5 * d2 - d1 * d6
    if vb <= zero and d2 >= zero and d6 <= zero and d2 - d6 > zero:
        return c * (d2 / (d2 - d6)), 3
    va = d3 * d6 - d5 * d4
    if va <= zero and (d4 - d3) >= zero and (d5 - d6) >= zero and (d4 - d3) + (d5 - d6) > zero:
        return b + (c - b) * ((d4 - d3) / ((d4 - d3) + (d5 - d6))), 2
    denom = va + vb + vc
    if denom <= zero:
        # Zero-area triangle: its closest point lies on one of its edges.
        best = closest_on_segment(p, wp.vec3d(zero, zero, zero), b)
        feature = int(1)
        e2 = closest_on_segment(p, b, c)
        if wp.length_sq(p - e2) < wp.length_sq(p - best):
            best = e2
            feature = 2
        e3 = closest_on_segment(p, c, wp.vec3d(zero, zero, zero))
        if wp.length_sq(p - e3) < wp.length_sq(p - best):
            best = e3
            feature = 3
        return best, feature
    return b * (vb / denom) + c * (vc / denom), 0


@wp.func
def refine_closest(mesh: wp.uint64, p: wp.vec3, face: int):
    """p - closest point on triangle ``face`` (float32 vector of a float64 difference), its length,
    the feature holding the closest point and the face's unit normal."""
    m = wp.mesh_get(mesh)
    a = wp.vec3d(m.points[m.indices[face * 3 + 0]])
    b = wp.vec3d(m.points[m.indices[face * 3 + 1]]) - a
    c = wp.vec3d(m.points[m.indices[face * 3 + 2]]) - a
    q = wp.vec3d(p) - a
    closest, feature = closest_on_triangle(q, b, c)
    delta = q - closest
    normal = wp.cross(b, c)
    area2 = wp.length(normal)
    face_n = wp.vec3(0.0, 0.0, 0.0)
    if area2 > wp.float64(0.0):
        face_n = wp.vec3(normal / area2)
    return wp.vec3(delta), float(wp.length(delta)), feature, face_n


@wp.func
def feature_normal(mesh: wp.uint64, face: int, feature: int, face_n: wp.vec3) -> wp.vec3:
    """Angle-weighted pseudo-normal of a closest feature (refine_closest's feature; the mesh must
    carry sign data); ``face_n`` is the face's unit normal."""
    if feature == 0:
        return face_n
    if feature <= 3:
        return edge_normal(mesh, face, feature - 1)
    return vertex_normal(mesh, wp.mesh_get(mesh).indices[face * 3 + feature - 4])


@wp.func
def closest_feature(mesh: wp.uint64, p: wp.vec3, face: int, inside: float, pseudo: bool):
    """closest_feature_face without the face."""
    delta, dist, inside_out, outward, closest, feature = closest_feature_face(mesh, p, face, inside, pseudo)
    return delta, dist, inside_out, outward


@wp.func
def closest_feature_face(mesh: wp.uint64, p: wp.vec3, face: int, inside: float, pseudo: bool):
    """Exact closest point of p on the mesh given its closest triangle ``face`` (from a search that
    measures thin triangles in float64 where the mesh has slivers: native.mesh_closest_face,
    mesh_closest_points with exact_thin): (p - closest point, its length, inside < 0 (recomputed
    from the pseudo-normal of the closest feature when ``pseudo``: the mesh must carry sign
    data), outward direction for a point on the surface, ``face``, the feature holding the closest
    point (refine_closest's: 0 the face's interior, 1-3 an edge, 4-6 a corner))."""
    delta, dist, feature, face_n = refine_closest(mesh, p, face)
    outward = face_n
    if pseudo:
        outward = feature_normal(mesh, face, feature, face_n)
        inside = wp.where(wp.dot(delta, outward) < 0.0, -1.0, 1.0)
    return delta, dist, inside, outward, face, feature


@wp.func
def signed_result(delta: wp.vec3, dist: float, inside: float, outward: wp.vec3):
    """(sd, d sd / d p) of a closest point: sd < 0 inside; on the surface the outward direction."""
    sign = wp.where(inside < 0.0, -1.0, 1.0)
    grad = outward
    if dist > DEGENERATE_LENGTH:
        grad = delta * (sign / dist)
    return sign * dist, grad
