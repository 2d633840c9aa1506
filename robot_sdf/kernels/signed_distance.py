"""Signed distance of a mesh-frame point to one mesh: the search, the sign regime, deep points.

mesh_sign_method picks the sign that applies to a mesh (the call's, or the one its sign data
records); mesh_signed_distance searches the closest point with Warp's BVH query, decides inside
from outside by that method (robot_sdf's pseudo-normal, the winding number, or Warp's own signed
queries for meshes built elsewhere) and finds a centre inside the mesh however far it is from the
surface. Everything above a single mesh (slots, poses, costs) is in slot_walk and the cost modules.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.closest_point import UNBOUNDED, closest_feature, closest_feature_face, signed_result
from robot_sdf.kernels.mesh_queries import (mesh_average_edge_length, mesh_box_beyond, mesh_closest_face,
                                            mesh_supports_winding)
from robot_sdf.kernels.sign_data import (SIGN_AUTO, SIGN_DEFAULT, SIGN_NORMAL, SIGN_WINDING_NUMBER, box_lower,
                                         box_upper, has_slivers, is_closed, is_solid, recorded_method,
                                         sign_data_offset, supports_winding, winding_radius)
from robot_sdf.kernels.winding import box_gap, open_winding_outside, settled_winding_inside, winding_inside

wp.set_module_options({"enable_backward": False})

# A swept sample is skipped when strictly inside the clearance of an evaluated point: search a
# little beyond the farthest sample so that free space still proves it free.
REACH_MARGIN = wp.constant(1.01)
REACH_SLACK = wp.constant(1.0e-5)
# Direction of the ray that tells a deep point of a closed shell inside from outside (oblique so
# that it rarely runs along an axis-aligned edge of a CAD mesh).
INSIDE_RAY = wp.constant(wp.vec3(0.5773, 0.5774, 0.5775))
# Barycentric margin below which a ray hit counts as on an edge (then the exact closest-feature
# test decides).
EDGE_MARGIN = wp.constant(1.0e-4)


@wp.func
def warp_tie_margin(mesh: wp.uint64) -> float:
    """Three times the tie tolerance of Warp's pseudo-normal sign query (1e-3 of the mesh's average
    edge length): a search bound this far beyond a point's closest distance finds every face that
    Warp's query weighs for its sign (mesh_closest_points keeps the same margin)."""
    return 3.0e-3 * mesh_average_edge_length(mesh)


@wp.func
def query_closest(mesh: wp.uint64, p: wp.vec3, bound: float, sign_method: int):
    """Warp's closest point within ``bound`` with the sign of ``sign_method``: (hit, inside < 0, face, u, v)."""
    inside = float(1.0)
    face = int(0)
    u = float(0.0)
    v = float(0.0)
    hit = bool(False)
    if sign_method == SIGN_NORMAL:
        hit = wp.mesh_query_point_sign_normal(mesh, p, bound, inside, face, u, v)
    elif sign_method == SIGN_DEFAULT:
        hit = wp.mesh_query_point(mesh, p, bound, inside, face, u, v)
    elif sign_method == SIGN_WINDING_NUMBER:
        hit = wp.mesh_query_point_sign_winding_number(mesh, p, bound, inside, face, u, v)
    else:
        hit = wp.mesh_query_point_sign_parity(mesh, p, bound, inside, face, u, v)
    return hit, inside, face, u, v


@wp.func
def mesh_sign_method(mesh: wp.uint64, sign_method: int):
    """(offset of robot_sdf's sign data or -1, the sign method that applies to this mesh)."""
    data = sign_data_offset(mesh)
    method = sign_method
    if method == SIGN_AUTO or method < 0:
        method = SIGN_NORMAL
        if data >= 0:
            method = recorded_method(mesh, data)
    if method == SIGN_WINDING_NUMBER and data < 0:
        # (Nested: Warp evaluates every operand of ``and``, and this reads the mesh.)
        if not mesh_supports_winding(mesh):
            # A mesh built elsewhere without winding-number support: Warp's winding-number query
            # would read solid-angle data it lacks (on CUDA a fault that ends the context). Warp's
            # pseudo-normal sign instead (docs/sign_methods.md).
            method = SIGN_NORMAL
    if method == SIGN_WINDING_NUMBER and data >= 0:
        if not supports_winding(mesh, data):
            # Built without winding-number support (the host refuses such calls; never read it).
            method = SIGN_NORMAL
        elif is_solid(mesh, data):
            # Classified the boundary of a solid (mesh_classification.classify): its winding number is
            # 0 or 1, and the pseudo-normal sign equals it at any distance (and is cheaper).
            method = SIGN_NORMAL
    return data, method


@wp.func
def widened(reach: float) -> float:
    """``reach`` (m) a relative 1e-5 wider: the reach of a test made ahead of a query's own (a slot
    passed over, a mesh skipped), whose sums round differently, so that what it passes over would
    have found nothing."""
    return reach + wp.abs(reach) * 1.0e-5 + 1.0e-6


@wp.func
def out_of_reach(mesh: wp.uint64, data: int, cull_radius: float, p: wp.vec3, reach: float) -> bool:
    """Whether no surface point and no inside point of the mesh lies within ``reach`` of mesh-frame
    p: by the slot's cull radius where it is known (> 0: no surface and no inside point beyond it
    from the mesh origin), then by the mesh's own bounds (``data``: its sign_data_offset), which
    are tighter where the mesh is not centred on its origin or not round. The sign data's box
    bounds a closed surface and everything inside it, the winding radius the inside of an open
    one; without sign data, inside is only ever found in the box of the BVH's root
    (mesh_signed_distance). An inside point is within any reach: a negative one (a negative
    max_dist) counts as 0."""
    reach_0 = wp.max(reach, 0.0)
    if cull_radius > 0.0 and wp.length(p) > cull_radius + reach_0:
        return True
    if data >= 0:
        # The box is the vertices' and the search measures the triangles: rounded apart.
        if box_gap(box_lower(mesh, data), box_upper(mesh, data), p) <= widened(reach_0):
            return False
        return is_closed(mesh, data) or wp.length(p) > winding_radius(mesh, data) + reach_0
    # Warp's own test of the BVH's root box, as its search makes it.
    return mesh_box_beyond(mesh, p, reach_0)


@wp.func
def sign_is_closed(mesh: wp.uint64, data: int) -> bool:
    """Whether a mesh's sign is that of a closed surface (robot_sdf's closed flag in its sign data
    at ``data``), so that it changes only where the surface is crossed."""
    if data >= 0:
        return is_closed(mesh, data)
    return False


@wp.func
def closed_inside_bound(mesh: wp.uint64, p: wp.vec3) -> float:
    """One ray from p into the boundary of a solid (closed, consistently oriented shells without
    self-intersections, mesh_classification.classify): -1 when it proves p outside,
    else a bound on p's distance to the surface if p is inside (UNBOUNDED where the ray only
    grazes an edge: then the exact closest-feature test decides)."""
    # The first surface a ray meets is entered from outside (front face) or left from inside
    # (back face). A hit near an edge, where a ray may only graze, decides nothing.
    t_hit = float(0.0)
    bu = float(0.0)
    bv = float(0.0)
    ray_sign = float(0.0)
    ray_n = wp.vec3(0.0, 0.0, 0.0)
    ray_face = int(0)
    if not wp.mesh_query_ray(mesh, p, INSIDE_RAY, UNBOUNDED, t_hit, bu, bv, ray_sign, ray_n, ray_face):
        return -1.0
    if wp.min(wp.min(bu, bv), 1.0 - bu - bv) > EDGE_MARGIN:
        if wp.dot(INSIDE_RAY, ray_n) <= 0.0:
            return -1.0
        # Inside: the closest surface point is no farther than the hit.
        return t_hit * 1.001 + 1.0e-6
    return UNBOUNDED


@wp.func
def ray_winding_inside(mesh: wp.uint64, data: int, p: wp.vec3) -> int:
    """The winding-number verdict of mesh-frame p (1 inside, 0 outside) from the first triangle a
    ray from p meets, where its face row settles it (settled_winding_inside: nothing lies between
    p and the hit, whose side the ray's direction tells; on an open surface only as far as the
    rim allows over the hit's distance); -1 where it does not. A ray that meets nothing leaves a
    closed surface's winding number 0 (an open one's to Warp's winding number)."""
    t_hit = float(0.0)
    bu = float(0.0)
    bv = float(0.0)
    ray_sign = float(0.0)
    ray_n = wp.vec3(0.0, 0.0, 0.0)
    ray_face = int(0)
    if not wp.mesh_query_ray(mesh, p, INSIDE_RAY, UNBOUNDED, t_hit, bu, bv, ray_sign, ray_n, ray_face):
        if is_closed(mesh, data):
            return 0
        return -1
    facing = wp.dot(INSIDE_RAY, ray_n)
    if wp.abs(facing) < 1.0e-3 or wp.min(wp.min(bu, bv), 1.0 - bu - bv) <= EDGE_MARGIN:
        return -1  # grazing, or on an edge where either face may be reported: the side is not clear
    # The hit's distance, rounded up (INSIDE_RAY is a unit vector to float32 rounding).
    return settled_winding_inside(mesh, data, ray_face, facing > 0.0, True, p, t_hit * 1.001 + 1.0e-6)


@wp.func
def deep_winding_inside(mesh: wp.uint64, data: int, p: wp.vec3) -> bool:
    """Winding-number inside test of a point with no surface near: from the first face a ray meets
    where its face row settles it (ray_winding_inside), else Warp's winding number."""
    verdict = ray_winding_inside(mesh, data, p)
    if verdict < 0:
        return winding_inside(mesh, p)
    return verdict == 1


@wp.func
def winding_feature(mesh: wp.uint64, data: int, p: wp.vec3, face: int):
    """closest_feature of a point of a winding-regime mesh (with robot_sdf's sign data at
    ``data``) from its closest triangle, signed by the winding number: from the face row of that
    triangle where it settles it (robot_sdf.face_winding), else Warp's winding number."""
    delta, dist, side, outward, closest, feature = closest_feature_face(mesh, p, face, 1.0, True)
    verdict = settled_winding_inside(mesh, data, closest, side < 0.0, feature == 0, p, dist)
    if verdict < 0:
        verdict = wp.where(winding_inside(mesh, p), 1, 0)
    return delta, dist, wp.where(verdict == 1, -1.0, 1.0), outward


@wp.func
def closest_face_within(mesh: wp.uint64, p: wp.vec3, bound: float, exact: bool):
    """(hit, face) of the closest triangle of mesh-frame p nearer than ``bound``: Warp's float32
    search, or with ``exact`` (a mesh with slivers) native.mesh_closest_face, which measures thin
    triangles in float64."""
    face = int(0)
    if exact:
        face = mesh_closest_face(mesh, p, bound)
        return face >= 0, face
    u = float(0.0)
    v = float(0.0)
    hit = wp.mesh_query_point_no_sign(mesh, p, bound, face, u, v)
    return hit, face


@wp.func
def mesh_signed_distance(mesh: wp.uint64, p: wp.vec3, bound: float, bounding_radius: float, sign_method: int,
                         need: float):
    """Signed distance of mesh-frame point p to one mesh, searched up to ``bound`` outside.

    Returns (found, sd, grad_sd): found = 0 when the point is outside and no surface is within
    ``bound``; otherwise sd < 0 inside and grad_sd = d sd / d p (unit, mesh frame). A point inside
    the mesh is always found, however far it is from the surface: where nothing is within
    ``bound`` and the point lies in the mesh's bounding box, the method's own inside test runs
    without a bound (the fast winding number directly for winding_number).

    The distance and its direction are re-evaluated in float64 on the triangle found, relative
    to its first corner; on a mesh whose sign data flags slivers the search measures thin
    triangles in float64 (native.mesh_closest_face), so that the triangle found is the closest.
    With robot_sdf's sign data, ``normal`` is the angle-weighted pseudo-normal of the closest
    feature (Baerentzen & Aanaes), exact wherever faces tie.

    ``need`` (<= bound: the caller needs no outside result with sd >= need; >= bound: every
    result) lets a mesh with robot_sdf's sign data whose inside test does not come
    from the closest feature (winding_number), or comes from it exactly (normal on a mesh that
    MeshWorld classified as the boundary of a solid: closed, consistently oriented shells without
    self-intersections), be searched within need first: where nothing is that near, a point is found only if it is
    inside. A result with sd < need is the one the full search gives (the same triangle: a search
    within a smaller bound visits the same nodes in the same order up to its bound); an outside
    one beyond need may then be left out (found = 0).
    """
    found = int(0)
    sd = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    data, method = mesh_sign_method(mesh, sign_method)
    pseudo = method == SIGN_NORMAL and data >= 0
    # The winding-number method of robot_sdf's sign data (the mesh supports winding numbers:
    # checked by mesh_sign_method).
    winding = method == SIGN_WINDING_NUMBER and data >= 0

    # Search within need first (see above): a closed shell's pseudo-normal sign is exact, the
    # winding number does not depend on the search, and the float64 distance of what the search
    # found stays within the margin of it (on a mesh with slivers the search measures thin
    # triangles in float64: closest_face_within).
    first = bound
    if data >= 0 and (winding or (pseudo and is_solid(mesh, data))):
        first = wp.min(bound, need * REACH_MARGIN + REACH_SLACK)
    # Out of reach at first: nothing is within first of p and p is not inside, which is what the
    # search below would conclude.
    if out_of_reach(mesh, data, bounding_radius, p, first):
        return found, sd, grad
    slivers = has_slivers(mesh, data)

    inside = float(1.0)
    face = int(0)
    u = float(0.0)
    v = float(0.0)
    hit = bool(False)
    # Warp's unsigned query serves `normal` and `winding_number`; the winding number itself is
    # evaluated at one call site below for hits and deep centres alike (each inlined copy of
    # Warp's traversal costs instruction cache in this one large CPU kernel).
    if pseudo or winding:
        hit, face = closest_face_within(mesh, p, first, slivers)
    else:
        hit, inside, face, u, v = query_closest(mesh, p, first, method)
    deep = bool(False)
    if not hit:
        # Nothing within bound: outside, unless the point is deep inside. Only a point in the
        # mesh's bounding box can be; the method's own test decides, without a bound.
        if data >= 0:
            lo = box_lower(mesh, data)
            hi = box_upper(mesh, data)
            if winding and not is_closed(mesh, data):
                if open_winding_outside(mesh, data, p, first, 0.0):
                    return found, sd, grad
            elif p[0] < lo[0] or p[1] < lo[1] or p[2] < lo[2] or p[0] > hi[0] or p[1] > hi[1] or p[2] > hi[2]:
                return found, sd, grad
        elif (bounding_radius > 0.0 and wp.length(p) > bounding_radius) or mesh_box_beyond(mesh, p, 0.0):
            # A mesh without robot_sdf's sign data (built by a caller, e.g. cuRobo's world
            # tensors, whose bounding radius is often 0): its BVH's root box bounds it instead.
            return found, sd, grad
        deep = True
    if winding and deep:
        if deep_winding_inside(mesh, data, p):
            inside = -1.0
        else:
            return found, sd, grad
    if deep:
        search = UNBOUNDED
        if pseudo:
            # A closed shell.
            search = closed_inside_bound(mesh, p)
            if search < 0.0:
                return found, sd, grad
            if first < bound:
                # Searched within need only: a point inside is found as the full search finds
                # it, however near the ray's hit (no surface within bound changes it).
                search = wp.max(search, bound)
        if pseudo or winding:
            hit, face = closest_face_within(mesh, p, search, slivers)
        else:
            hit, inside, face, u, v = query_closest(mesh, p, search, method)
        if not hit:
            return found, sd, grad

    if slivers and not (pseudo or winding):
        # Warp's signed query gave the sign; its float32 pick may be farther than the closest
        # triangle by more than rounding where the mesh has slivers: the distance comes from the
        # closest one.
        closest = mesh_closest_face(mesh, p, UNBOUNDED)
        if closest >= 0:
            face = closest
    delta = wp.vec3(0.0, 0.0, 0.0)
    dist = float(0.0)
    outward = wp.vec3(0.0, 0.0, 0.0)
    if winding and not deep:
        delta, dist, inside, outward = winding_feature(mesh, data, p, face)
    else:
        delta, dist, inside, outward = closest_feature(mesh, p, face, inside, pseudo)
    if deep and inside >= 0.0:
        return found, sd, grad
    found = 1
    sd, grad = signed_result(delta, dist, inside, outward)
    return found, sd, grad
