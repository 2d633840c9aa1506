"""Exact closest point on a mesh, once Warp's float32 BVH search has found a triangle.

The distance and its direction are recomputed in float64 on that triangle, relative to its first
corner (refine_closest), so that slivers keep their accuracy; on a mesh whose sign data flags
slivers the triangles that could be nearer are re-searched (closest_feature). The feature holding
the closest point (face, edge or corner) gives the angle-weighted pseudo-normal of the ``normal``
sign (feature_normal, from the sign data). Points are in the mesh (kernel) frame, lengths in m.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.native import SLOT_HITS, mesh_faces_near
from robot_sdf.kernels.sign_data import edge_normal, has_slivers, vertex_normal

wp.set_module_options({"enable_backward": False})

# Search radius for the closest point of a centre known to be inside a mesh: unbounded in practice.
UNBOUNDED = wp.constant(1.0e9)
# Below this length the direction centre - closest point is meaningless; use the feature normal.
DEGENERATE_LENGTH = wp.constant(1.0e-9)
# On meshes with slivers, inside points and points closer than this (m) re-search the closest
# triangle in float64.
SLIVER_REACH = wp.constant(0.02)
# Largest excess distance (m) of the triangle Warp's float32 search picks on a sliver mesh over
# the closest one: farther out the float64 re-search looks near the point found only.
SLIVER_PICK_ERROR = wp.constant(1.0e-4)


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
def triangle_box_distance(mesh: wp.uint64, face: int, p: wp.vec3) -> float:
    """A lower bound on the distance from p to triangle ``face``: the distance to its bounding box
    (float32, shrunk by a relative 1e-5 for rounding)."""
    m = wp.mesh_get(mesh)
    a = m.points[m.indices[3 * face]]
    b = m.points[m.indices[3 * face + 1]]
    c = m.points[m.indices[3 * face + 2]]
    gap = wp.max(wp.max(wp.min(wp.min(a, b), c) - p, p - wp.max(wp.max(a, b), c)), wp.vec3(0.0, 0.0, 0.0))
    return wp.length(gap) * (1.0 - 1.0e-5)


@wp.func
def closer_face(mesh: wp.uint64, p: wp.vec3, other: int, delta: wp.vec3, dist: float, feature: int,
                face_n: wp.vec3, face: int, improved: bool):
    """refine_closest's (delta, dist, feature, face_n) of triangle ``other`` and ``other`` itself
    where it is strictly closer to p than ``dist`` (its box ruling most triangles out first), else
    the closest so far; ``improved`` set when it is taken."""
    if other != face and triangle_box_distance(mesh, other, p) < dist:
        d2, l2, f2, n2 = refine_closest(mesh, p, other)
        if l2 < dist:
            return d2, l2, f2, n2, other, True
    return delta, dist, feature, face_n, face, improved


@wp.func
def closest_feature(mesh: wp.uint64, p: wp.vec3, face: int, inside: float, data: int, pseudo: bool,
                    need: float = UNBOUNDED):
    """closest_feature_face without the face."""
    delta, dist, inside_out, outward, closest = closest_feature_face(mesh, p, face, inside, data, pseudo, need)
    return delta, dist, inside_out, outward


@wp.func
def closest_feature_face(mesh: wp.uint64, p: wp.vec3, face: int, inside: float, data: int, pseudo: bool,
                         need: float = UNBOUNDED):
    """Exact closest point of p on the mesh given the triangle Warp's float32 search found:
    (p - closest point, its length, inside < 0 (recomputed from the pseudo-normal when
    ``pseudo``), outward direction for a point on the surface, the triangle holding the closest
    point). ``data``: the mesh's
    sign_data_offset (-1 without sign data: no re-search). ``need`` (m): an outside result at
    least this far needs no exact distance (its cost is 0): on a mesh with slivers it is not
    searched again once the triangle found is SLIVER_PICK_ERROR beyond it (the closest one is
    then beyond ``need`` as well)."""
    delta, dist, feature, face_n = refine_closest(mesh, p, face)
    outward = face_n
    if pseudo:
        outward = feature_normal(mesh, face, feature, face_n)
        inside = wp.where(wp.dot(delta, outward) < 0.0, -1.0, 1.0)
    if data >= 0 and (inside < 0.0 or dist < need + SLIVER_PICK_ERROR):
        if has_slivers(mesh, data):
            # Slivers: Warp's float32 search may have picked a triangle farther than the closest
            # one; every triangle nearer than the one found overlaps this box. Outside and
            # farther than SLIVER_REACH that box would hold too many triangles for a free-space
            # query (inside points pay anyway): there the box is centred on the point found, as
            # wide as the surface can be from it while at most SLIVER_PICK_ERROR nearer to p
            # (sqrt(2 dist e) + e on a plane; the closest point of a point that is not near a
            # tie of distant features lies there). The candidates are listed by a traversal pruned
            # by distance to p as well (mesh_faces_near): for a deep point the cube holds most of
            # the mesh, the ball of radius dist only the triangles near its closest points.
            box_centre = p
            half = dist + 1.0e-6
            if dist >= SLIVER_REACH and inside >= 0.0:
                box_centre = p - delta
                half = wp.sqrt(2.0 * dist * SLIVER_PICK_ERROR) + SLIVER_PICK_ERROR
            reach = wp.vec3(half, half, half)
            # Warp's float32 distance of a well-shaped triangle is right (the premise of searching
            # meshes without slivers once): where it picked one, only a thin triangle can be
            # nearer than the pick by more than rounding, and only those are listed (the pick
            # passed as such). Listed SLOT_HITS at a time, with the first pick and radius
            # throughout (the same traversal every time); each candidate is tested against the
            # closest so far.
            picked = face
            radius = dist
            improved = bool(False)
            skip = int(0)
            listed = int(0)
            while listed >= 0:
                near = mesh_faces_near(mesh, p, radius, box_centre - reach, box_centre + reach, picked, skip)
                listed = near[32]
                for k in range(wp.min(listed - skip, SLOT_HITS)):
                    delta, dist, feature, face_n, face, improved = closer_face(
                        mesh, p, near[k], delta, dist, feature, face_n, face, improved)
                if listed <= skip + SLOT_HITS:
                    break
                skip += SLOT_HITS
            if listed < 0:
                # A tree deeper than the traversal's stack: every triangle whose box overlaps the cube.
                query = wp.mesh_query_aabb(mesh, box_centre - reach, box_centre + reach)
                other = int(0)
                while wp.mesh_query_aabb_next(query, other):
                    delta, dist, feature, face_n, face, improved = closer_face(
                        mesh, p, other, delta, dist, feature, face_n, face, improved)
            if improved:
                outward = face_n
                if pseudo:
                    outward = feature_normal(mesh, face, feature, face_n)
                    inside = wp.where(wp.dot(delta, outward) < 0.0, -1.0, 1.0)
    return delta, dist, inside, outward, face


@wp.func
def signed_result(delta: wp.vec3, dist: float, inside: float, outward: wp.vec3):
    """(sd, d sd / d p) of a closest point: sd < 0 inside; on the surface the outward direction."""
    sign = wp.where(inside < 0.0, -1.0, 1.0)
    grad = outward
    if dist > DEGENERATE_LENGTH:
        grad = delta * (sign / dist)
    return sign * dist, grad
