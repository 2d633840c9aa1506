"""Warp kernels: sphere-vs-mesh collision cost, swept cost and signed distance.

One thread per sphere. Every kernel writes every output element it owns, so callers may hand in
uninitialised buffers. Gradients are analytic, so no Warp adjoint code is generated.

Layout (flattened from the torch tensors of docs/design.md "Tensor layouts"):
    spheres      (N,) vec4    x, y, z, radius in the world frame; N = b * h * n
    mesh_idx     (E, M) int64 Warp mesh ids
    pose_inv     (E, M, 8)    world->mesh x, y, z, qw, qx, qy, qz, cull radius (0 = unknown): no
                              surface and no inside point farther than it from the mesh origin
                              (unknown for meshes built elsewhere: the box of their BVH root
                              bounds them, mesh_box_distance_sq)
    sign_method, slot_sign    a SignMethod for every slot, AUTO (each mesh's own, from its sign
                              data), or PER_SLOT: read slot_sign (E, M) uint8 (a SignMethod)
    mesh_enable  (E, M) uint8
    n_env_mesh   (E,) int32
    env_query    (B,) int32   environment per batch row (read only when use_env_query != 0)
    slot_bvh     (E + 1,) uint64  Warp BVH id over each environment's slot boxes (0 = visit every
                              slot), a placeholder BVH last (robot_sdf.slot_index); any other
                              length: every slot of every environment is visited
Scalars that live in tensors (weight, activation distance, max distance, dt) are read in-kernel
from 1-element arrays so that no host-device synchronisation is needed.
"""
from __future__ import annotations

import warp as wp

# Warp's banner and per-module load lines are noise in a node's log.
wp.config.log_level = wp.LOG_WARNING
wp.set_module_options({"enable_backward": False})

SIGN_NORMAL = wp.constant(0)
SIGN_DEFAULT = wp.constant(1)
SIGN_WINDING_NUMBER = wp.constant(2)
SIGN_PARITY = wp.constant(3)
# Scalar sign_method values that defer to the meshes: AUTO = each mesh's own method as recorded
# in its sign data (what `auto` chose, or the method it was built for); PER_SLOT = read the
# (E, M) uint8 slot_sign array.
SIGN_AUTO = wp.constant(4)
SIGN_PER_SLOT = wp.constant(-1)

# Search radius for the closest point of a centre known to be inside a mesh: unbounded in practice.
UNBOUNDED = wp.constant(1.0e9)
# Below this length the direction centre - closest point is meaningless; use the feature normal.
DEGENERATE_LENGTH = wp.constant(1.0e-9)
MIN_SPEED = wp.constant(1.0e-3)
# A swept sample is skipped when strictly inside the clearance of an evaluated point: search a
# little beyond the farthest sample so that free space still proves it free.
REACH_MARGIN = wp.constant(1.01)
REACH_SLACK = wp.constant(1.0e-5)
# Warp's default accuracy of the fast winding number and the inside threshold of its sign.
WINDING_ACCURACY = wp.constant(2.0)
WINDING_THRESHOLD = wp.constant(0.5)
# The inside test (winding_inside) evaluates the winding number at a coarse accuracy first and
# settles the sign there where it is clear of the threshold by its margin; the rest take Warp's
# default accuracy, so the sign is Warp's own wherever the coarse accuracy stays within its margin
# of it. Measured over 3 M points in, around and near every hard-mesh corpus mesh and the
# perception scan of bench/core_bench.py (docs/sign_methods.md; test/sign_test.py checks half the
# margin): accuracy 1.25 differed from 2.0 by at most 0.084 (sliver box; capsule 0.083, perception
# scan 0.070; margin 0.25, a factor of 3). Accuracy 1.0 is no option: it differed by up to 0.78.
# Per evaluation 1.25 costs about 60 % of 1.5 near a surface and 70 % in free space around the
# perception scan, where every free-space sphere within the winding radius pays one. A middle tier
# (1.5, margin 0.15) was dropped: it settled too few of the points that 1.25 left (on the scan 1.15
# of 3.71 per swept sphere) to pay for itself; without it MeshWorld auto on the scan is 6-7 %
# faster and no corpus mesh slower (docs/benchmarks.md, session 22).
COARSEST_WINDING_ACCURACY = wp.constant(1.25)
COARSEST_WINDING_SETTLED = wp.constant(0.25)
# Bound on |Warp's winding number at WINDING_ACCURACY - the exact one| that the swept samples'
# shortcut counts twice (docs/sign_methods.md). Measured over the test corpus and the perception
# scan: at most 0.0047 (far-field expansion) farther from the surface than 0.1 % of the mesh's
# size, where sign_test keeps it below half this; closer, float32 rounding of the nearest
# triangles' solid angles reaches 0.022 (arm_link_fine, 60 um), below the 2x this that keeps the
# shortcut's verdict the exact winding number's (sign_test: below 1.5x).
WINDING_APPROXIMATION_ERROR = wp.constant(0.02)
SIGN_DATA_MAGIC = wp.constant(7.0e5)  # robot_sdf.mesh_analysis.SIGN_DATA_MAGIC
# Direction of the ray that tells a deep point of a closed shell inside from outside (oblique so
# that it rarely runs along an axis-aligned edge of a CAD mesh).
INSIDE_RAY = wp.constant(wp.vec3(0.5773, 0.5774, 0.5775))
# Barycentric margin below which a ray hit counts as on an edge (then the exact closest-feature
# test decides).
EDGE_MARGIN = wp.constant(1.0e-4)
# On meshes with slivers, inside points and points closer than this (m) re-search the closest
# triangle in float64.
SLIVER_REACH = wp.constant(0.02)
# Closer to a surface than this [m], the Hessian of the distance (~1/distance) is reported as 0.
HESSIAN_MIN_DISTANCE = wp.constant(1.0e-6)
# 1 - cos of the angle within which a direction counts as a face's normal (float32 noise).
HESSIAN_FLAT_COSINE = wp.constant(1.0e-6)
# Largest excess distance (m) of the triangle Warp's float32 search picks on a sliver mesh over
# the closest one: farther out the float64 re-search looks near the point found only.
SLIVER_PICK_ERROR = wp.constant(1.0e-4)


@wp.func_native("""return wp::mesh_query_winding_number(mesh, p, accuracy);""")
def winding_number(mesh: wp.uint64, p: wp.vec3, accuracy: float) -> float:
    """Warp's fast generalised winding number of p (the mesh must support winding numbers);
    called directly so that an inside test far from the surface needs no closest-point search."""
    ...


@wp.func_native("""
const wp::Mesh& m = *(const wp::Mesh*)(mesh);
const int root = *m.bvh.root;
const wp::BVHPackedNodeHalf lo = m.bvh.node_lowers[root];
const wp::BVHPackedNodeHalf hi = m.bvh.node_uppers[root];
return wp::distance_to_aabb_sq(p, wp::vec3(lo.x, lo.y, lo.z), wp::vec3(hi.x, hi.y, hi.z));""")
def mesh_box_distance_sq(mesh: wp.uint64, p: wp.vec3) -> float:
    """Squared distance of mesh-frame p to the box of the mesh's BVH root (0 inside): Warp keeps
    that box enclosing every triangle across builds and refits, so it bounds any mesh, built
    anywhere, without cached host-side data that could outlive the mesh id."""
    ...


@wp.func_native("""return ((const wp::Mesh*)(mesh))->average_edge_length;""")
def mesh_average_edge_length(mesh: wp.uint64) -> float:
    """Warp's average edge length of the mesh, which scales the tie tolerance of its pseudo-normal
    sign query (1e-3 of it)."""
    ...


@wp.func
def warp_tie_margin(mesh: wp.uint64) -> float:
    """Three times the tie tolerance of Warp's pseudo-normal sign query (1e-3 of the mesh's average
    edge length): a search bound this far beyond a point's closest distance finds every face that
    Warp's query weighs for its sign (mesh_closest_points keeps the same margin)."""
    return 3.0e-3 * mesh_average_edge_length(mesh)


@wp.func
def winding_verdict(w: float, margin: float) -> int:
    """What a winding number at a tier with ``margin`` says: 1 inside, 0 outside, -1 undecided
    (within the margin of the threshold; the last tier, margin 0, always decides)."""
    if w < WINDING_THRESHOLD - margin:
        return 0
    if w > WINDING_THRESHOLD + margin:
        return 1
    if margin == 0.0:
        return 0
    return -1


@wp.func
def next_winding_tier(accuracy: float):
    """The (accuracy, margin) of the tier after the one at ``accuracy``: Warp's default, which
    always decides."""
    return WINDING_ACCURACY, 0.0


@wp.func
def winding_clearance(mesh: wp.uint64, p: wp.vec3):
    """(winding_inside(mesh, p), c): c > 0 bounds how far Warp's winding number of p at
    WINDING_ACCURACY is from WINDING_THRESHOLD (a coarse tier's value gives its own distance less
    the tier's margin)."""
    # One loop over the tiers, so that Warp's traversal is inlined once (not once per tier) into
    # the large CPU kernels; the last tier has no margin and always decides.
    accuracy = COARSEST_WINDING_ACCURACY
    margin = COARSEST_WINDING_SETTLED
    while True:
        w = winding_number(mesh, p, accuracy)
        verdict = winding_verdict(w, margin)
        if verdict >= 0:
            return verdict == 1, wp.abs(w - WINDING_THRESHOLD) - margin
        accuracy, margin = next_winding_tier(accuracy)
    return False, 0.0


@wp.func
def winding_inside(mesh: wp.uint64, p: wp.vec3) -> bool:
    """Warp's winding-number sign (inside above WINDING_THRESHOLD at WINDING_ACCURACY), from the
    coarsest evaluation that is clear of the threshold by its margin."""
    inside, clearance = winding_clearance(mesh, p)
    return inside


@wp.func
def sign_data_offset(mesh: wp.uint64) -> int:
    """Index of the bounding box entry in robot_sdf's sign data (mesh_analysis module docstring),
    or -1 for a mesh built elsewhere (then Warp's own sign queries are used)."""
    m = wp.mesh_get(mesh)
    base = m.velocities.shape[0] - 5
    normals = m.points.shape[0] + m.indices.shape[0]
    if base < normals:
        return -1
    if m.velocities[base + 2][0] != SIGN_DATA_MAGIC:
        return -1
    if base != normals + 3 * int(m.velocities[base + 4][2]):
        return -1
    return base


@wp.func
def rim_slope(mesh: wp.uint64, data: int, p: wp.vec3, reach: float) -> float:
    """A bound on |grad w| of the exact winding number everywhere within ``reach`` of mesh-frame
    p off the surface (mesh_analysis module docstring, "Rim"): (1/4 pi) sum over the rim chunks of
    length / (box distance - reach)^2; UNBOUNDED where a chunk's box comes within reach."""
    m = wp.mesh_get(mesh)
    chunks = int(m.velocities[data + 4][2])
    first = data - 3 * chunks
    total = float(0.0)
    for c in range(chunks):
        gap = wp.length(wp.max(wp.max(m.velocities[first + 3 * c] - p, p - m.velocities[first + 3 * c + 1]),
                               wp.vec3(0.0, 0.0, 0.0))) - reach
        if gap <= 0.0:
            return UNBOUNDED
        total += m.velocities[first + 3 * c + 2][0] / (gap * gap)
    # float32 rounding of the sum and the distances: far below the margin.
    return total * (1.0001 / (4.0 * wp.pi))


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
    if vc <= zero and d1 >= zero and d3 <= zero:
        return b * (d1 / (d1 - d3)), 1
    cp = p - c
    d5 = wp.dot(b, cp)
    d6 = wp.dot(c, cp)
    if d6 >= zero and d5 <= d6:
        return c, 6
    vb = d5 * d2 - d1 * d6
    if vb <= zero and d2 >= zero and d6 <= zero:
        return c * (d2 / (d2 - d6)), 3
    va = d3 * d6 - d5 * d4
    if va <= zero and (d4 - d3) >= zero and (d5 - d6) >= zero:
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
    """Angle-weighted pseudo-normal of a closest feature (mesh must carry sign data)."""
    m = wp.mesh_get(mesh)
    if feature == 0:
        return face_n
    if feature <= 3:
        return m.velocities[m.points.shape[0] + face * 3 + feature - 1]
    return m.velocities[m.indices[face * 3 + feature - 4]]


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
    m = wp.mesh_get(mesh)
    data = sign_data_offset(mesh)
    method = sign_method
    if method == SIGN_AUTO or method < 0:
        method = SIGN_NORMAL
        if data >= 0:
            method = int(m.velocities[data + 2][2])
    if method == SIGN_WINDING_NUMBER and data >= 0:
        if m.velocities[data + 2][1] == 0.0:
            # Built without winding-number support (the host refuses such calls; never read it).
            method = SIGN_NORMAL
        elif m.velocities[data + 4][1] != 0.0:
            # Classified the boundary of a solid (mesh_analysis.classify): its winding number is
            # 0 or 1, and the pseudo-normal sign equals it at any distance (and is cheaper).
            method = SIGN_NORMAL
    return data, method


@wp.func
def sign_is_closed(mesh: wp.uint64, data: int) -> bool:
    """Whether a mesh's sign is that of a closed surface (robot_sdf's closed flag in its sign data
    at ``data``), so that it changes only where the surface is crossed."""
    if data >= 0:
        return wp.mesh_get(mesh).velocities[data + 3][1] != 0.0
    return False


@wp.func
def closest_feature(mesh: wp.uint64, p: wp.vec3, face: int, inside: float, data: int, pseudo: bool):
    """Exact closest point of p on the mesh given the triangle Warp's float32 search found:
    (p - closest point, its length, inside < 0 (recomputed from the pseudo-normal when
    ``pseudo``), outward direction for a point on the surface)."""
    m = wp.mesh_get(mesh)
    delta, dist, feature, face_n = refine_closest(mesh, p, face)
    outward = face_n
    if pseudo:
        outward = feature_normal(mesh, face, feature, face_n)
        inside = wp.where(wp.dot(delta, outward) < 0.0, -1.0, 1.0)
    if data >= 0:
        if m.velocities[data + 3][2] != 0.0:
            # Slivers: Warp's float32 search may have picked a triangle farther than the closest
            # one; every triangle nearer than the one found overlaps this box. Outside and
            # farther than SLIVER_REACH that box would hold too many triangles for a free-space
            # query (inside points pay anyway): there the box is centred on the point found, as
            # wide as the surface can be from it while at most SLIVER_PICK_ERROR nearer to p
            # (sqrt(2 dist e) + e on a plane; the closest point of a point that is not near a
            # tie of distant features lies there).
            box_centre = p
            half = dist + 1.0e-6
            if dist >= SLIVER_REACH and inside >= 0.0:
                box_centre = p - delta
                half = wp.sqrt(2.0 * dist * SLIVER_PICK_ERROR) + SLIVER_PICK_ERROR
            reach = wp.vec3(half, half, half)
            query = wp.mesh_query_aabb(mesh, box_centre - reach, box_centre + reach)
            other = int(0)
            improved = bool(False)
            while wp.mesh_query_aabb_next(query, other):
                if other != face:
                    d2, l2, f2, n2 = refine_closest(mesh, p, other)
                    if l2 < dist:
                        delta = d2
                        dist = l2
                        feature = f2
                        face_n = n2
                        face = other
                        improved = True
            if improved:
                outward = face_n
                if pseudo:
                    outward = feature_normal(mesh, face, feature, face_n)
                    inside = wp.where(wp.dot(delta, outward) < 0.0, -1.0, 1.0)
    return delta, dist, inside, outward


@wp.func
def signed_result(delta: wp.vec3, dist: float, inside: float, outward: wp.vec3):
    """(sd, d sd / d p) of a closest point: sd < 0 inside; on the surface the outward direction."""
    sign = wp.where(inside < 0.0, -1.0, 1.0)
    grad = outward
    if dist > DEGENERATE_LENGTH:
        grad = delta * (sign / dist)
    return sign * dist, grad


@wp.func
def closed_inside_bound(mesh: wp.uint64, p: wp.vec3) -> float:
    """One ray from p into the boundary of a solid (closed, consistently oriented shells without
    self-intersections, mesh_analysis.classify): -1 when it proves p outside,
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
def open_winding_outside(mesh: wp.uint64, data: int, p: wp.vec3, searched: float) -> bool:
    """Whether mesh-frame p, with no surface of the mesh within ``searched``, is outside by the
    bounds of the exact winding number of a surface that is not closed (its winding number may
    pass 0.5 outside its box): beyond the winding radius, or |w| <= A / (4 pi d^2) < 1/2 with d
    the distance to the surface, at least ``searched`` and at least the distance to the box."""
    m = wp.mesh_get(mesh)
    if wp.length(p) > m.velocities[data + 3][0]:
        return True
    gap = wp.length(wp.max(wp.max(m.velocities[data] - p, p - m.velocities[data + 1]), wp.vec3(0.0, 0.0, 0.0)))
    far = wp.max(searched, gap)
    return m.velocities[data + 4][0] < 2.0 * wp.pi * far * far


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
    to its first corner. With robot_sdf's sign data, ``normal`` is the angle-weighted pseudo-normal
    of the closest feature (Baerentzen & Aanaes), exact wherever faces tie.

    ``need`` (<= bound: the caller needs no outside result with sd >= need; >= bound: every
    result) lets a mesh with robot_sdf's sign data and no slivers whose inside test does not come
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
    centre_dist = wp.length(p)
    if bounding_radius > 0.0 and centre_dist > bounding_radius + bound:
        return found, sd, grad
    m = wp.mesh_get(mesh)
    data, method = mesh_sign_method(mesh, sign_method)
    pseudo = method == SIGN_NORMAL and data >= 0
    # The winding-number method of robot_sdf's sign data (the mesh supports winding numbers:
    # checked by mesh_sign_method).
    winding = method == SIGN_WINDING_NUMBER and data >= 0

    # Search within need first (see above): a closed shell's pseudo-normal sign is exact, the
    # winding number does not depend on the search, and without slivers the float64 distance
    # of what the float32 search found stays within the margin of it.
    first = bound
    if data >= 0 and (winding or (pseudo and m.velocities[data + 4][1] != 0.0)) and m.velocities[data + 3][2] == 0.0:
        first = wp.min(bound, need * REACH_MARGIN + REACH_SLACK)

    inside = float(1.0)
    face = int(0)
    u = float(0.0)
    v = float(0.0)
    hit = bool(False)
    # Warp's unsigned query serves `normal` and `winding_number`; the winding number itself is
    # evaluated at one call site below for hits and deep centres alike (each inlined copy of
    # Warp's traversal costs instruction cache in this one large CPU kernel).
    if pseudo or winding:
        hit = wp.mesh_query_point_no_sign(mesh, p, first, face, u, v)
    else:
        hit, inside, face, u, v = query_closest(mesh, p, first, method)
    deep = bool(False)
    if not hit:
        # Nothing within bound: outside, unless the point is deep inside. Only a point in the
        # mesh's bounding box can be; the method's own test decides, without a bound.
        if data >= 0:
            lo = m.velocities[data]
            hi = m.velocities[data + 1]
            winding_info = m.velocities[data + 3]
            if winding and winding_info[1] == 0.0:
                if open_winding_outside(mesh, data, p, first):
                    return found, sd, grad
            elif p[0] < lo[0] or p[1] < lo[1] or p[2] < lo[2] or p[0] > hi[0] or p[1] > hi[1] or p[2] > hi[2]:
                return found, sd, grad
        elif (bounding_radius > 0.0 and centre_dist > bounding_radius) or mesh_box_distance_sq(mesh, p) > 0.0:
            # A mesh without robot_sdf's sign data (built by a caller, e.g. cuRobo's world
            # tensors, whose bounding radius is often 0): its BVH's root box bounds it instead.
            return found, sd, grad
        deep = True
    if winding:
        if winding_inside(mesh, p):
            inside = -1.0
        elif deep:
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
            hit = wp.mesh_query_point_no_sign(mesh, p, search, face, u, v)
        else:
            hit, inside, face, u, v = query_closest(mesh, p, search, method)
        if not hit:
            return found, sd, grad

    delta, dist, inside, outward = closest_feature(mesh, p, face, inside, data, pseudo)
    if deep and inside >= 0.0:
        return found, sd, grad
    found = 1
    sd, grad = signed_result(delta, dist, inside, outward)
    return found, sd, grad


@wp.func
def slot_pose(pose_inv: wp.array3d(dtype=wp.float32), env: int, slot: int):
    t = wp.vec3(pose_inv[env, slot, 0], pose_inv[env, slot, 1], pose_inv[env, slot, 2])
    # wp.quat stores x, y, z, w; the tensor layout is w, x, y, z.
    q = wp.quat(pose_inv[env, slot, 4], pose_inv[env, slot, 5], pose_inv[env, slot, 6], pose_inv[env, slot, 3])
    return t, q


@wp.func
def env_slot_bvh(slot_bvh: wp.array(dtype=wp.uint64), env: int, n_envs: int):
    """(BVH id, 1) of env's slot BVH (robot_sdf.slot_index), or (the never-matching placeholder
    BVH, 0) where the env has none: then its slots are visited one by one.

    slot_bvh is (n_envs + 1,): one id per environment (0 = none) and the placeholder last; any
    other length (the one-element placeholder of calls without a MeshWorld) means no env has one.
    """
    n = slot_bvh.shape[0]
    if n == n_envs + 1:
        bvh = slot_bvh[env]
        if bvh != wp.uint64(0):
            return bvh, 1
    return slot_bvh[n - 1], 0


# Slots a query visits, collected by slot_bvh_hits. Warp's own wp.bvh_query_aabb keeps its
# traversal stack in CUDA shared memory (32 ints per thread of the block: 32 KB at 256 threads);
# beside the mesh queries' stack that passed the 48 KB static limit and ptxas refused both query
# kernels (test/cuda_build_test.py). This traversal keeps its stack in registers/local memory.
SLOT_HITS = wp.constant(32)
slot_hits_t = wp.types.vector(length=33, dtype=wp.int32)


@wp.func_native("""
wp::vec_t<33, int> out;
const wp::BVH bvh = wp::bvh_get(id);
int stack[BVH_QUERY_STACK_SIZE];
stack[0] = *bvh.root;
int count = 1;
int n = 0;
while (count) {
    const int node = stack[--count];
    const wp::BVHPackedNodeHalf nl = bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf nu = bvh.node_uppers[node];
    if (nl.x > upper[0] || nl.y > upper[1] || nl.z > upper[2] || nu.x < lower[0] || nu.y < lower[1] || nu.z < lower[2])
        continue;
    if (nl.b) {
        for (int prim = (int)nl.i; prim < (int)nu.i; ++prim) {
            const int item = bvh.primitive_indices[prim];
            const wp::vec3 il = bvh.item_lowers[item];
            const wp::vec3 iu = bvh.item_uppers[item];
            if (il[0] > upper[0] || il[1] > upper[1] || il[2] > upper[2] || iu[0] < lower[0] || iu[1] < lower[1] || iu[2] < lower[2])
                continue;
            if (n < 32)
                out[n] = item;
            ++n;
        }
    } else if (count + 2 > BVH_QUERY_STACK_SIZE) {
        n = 33;  // deeper than the stack: the caller visits every slot instead
        break;
    } else {
        stack[count++] = (int)nl.i;
        stack[count++] = (int)nu.i;
    }
}
out[32] = n;
return out;""")
def slot_bvh_hits(id: wp.uint64, lower: wp.vec3, upper: wp.vec3) -> slot_hits_t:
    """Items of BVH ``id`` whose boxes overlap [lower, upper]: entries 0..min(n, 32)-1, n in
    entry 32 (n > 32: more than fit, or a tree deeper than the stack)."""
    ...


@wp.func
def slot_candidates(slot_bvh: wp.array(dtype=wp.uint64), env: int, n_envs: int, count: int, p: wp.vec3,
                    reach: float):
    """(hits, number of iterations, 1 if hits lists the slots) for a slot loop of env around p:
    the slots whose boxes come within ``reach`` of p when env has a slot BVH and at most
    SLOT_HITS of them do, else every slot 0..count-1 (then the loop's index is the slot)."""
    bvh, use_bvh = env_slot_bvh(slot_bvh, env, n_envs)
    hits = slot_hits_t()
    if use_bvh != 0:
        box = wp.vec3(reach, reach, reach)
        hits = slot_bvh_hits(bvh, p - box, p + box)
        if hits[32] <= SLOT_HITS:
            return hits, hits[32], 1
    return hits, count, 0


@wp.func
def candidate_slot(hits: slot_hits_t, i: int, listed: int, count: int, env: int,
                   mesh_idx: wp.array2d(dtype=wp.int64), mesh_enable: wp.array2d(dtype=wp.uint8)) -> int:
    """The slot of a slot loop's iteration i (see slot_candidates), or -1 where there is nothing to
    evaluate: beyond the env's count, disabled, or empty."""
    slot = i
    if listed != 0:
        slot = hits[i]
    if slot >= count:
        return -1
    if mesh_enable[env, slot] == wp.uint8(0) or mesh_idx[env, slot] == wp.int64(0):
        return -1
    return slot


@wp.kernel
def slot_boxes_kernel(
    pose_inv: wp.array3d(dtype=wp.float32),
    envs: wp.array(dtype=wp.int32),
    lowers: wp.array2d(dtype=wp.vec3),
    uppers: wp.array2d(dtype=wp.vec3),
):
    """World-space box of slot j of environment envs[i] (one launch for every changed env): the
    cube around the mesh origin's world position with half-size the slot's cull radius
    (pose_inv[..., 7]; no surface and no inside point lies beyond it), so a rotation never changes
    its size and a pose change needs a refit only."""
    i, j = wp.tid()
    env = envs[i]
    t, q = slot_pose(pose_inv, env, j)
    # p_mesh = q p + t = 0 at the mesh origin.
    centre = -wp.quat_rotate_inv(q, t)
    r = pose_inv[env, j, 7]
    half = wp.vec3(r, r, r)
    lowers[env, j] = centre - half
    uppers[env, j] = centre + half


@wp.func
def slot_sign_method(sign_method: int, slot_sign: wp.array2d(dtype=wp.uint8), env: int, slot: int) -> int:
    """The call's sign method, or the slot's own when the call defers to the world (PER_SLOT)."""
    if sign_method == SIGN_PER_SLOT:
        return int(slot_sign[env, slot])
    return sign_method


@wp.func
def sphere_world_cost(
    p: wp.vec3,
    radius: float,
    eta: float,
    max_dist: float,
    env: int,
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
):
    """Unweighted cost of one sphere summed over the meshes of ``env`` and its world-frame gradient.
    Only surfaces nearer than r + eta (and inside centres) cost: each mesh is searched within that
    first where its sign allows (mesh_signed_distance's ``need``), within max_dist + r + eta
    otherwise."""
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    bound = max_dist + radius + eta
    count = wp.min(n_env_mesh[env], mesh_idx.shape[1])
    # The slots that may hold a surface or inside point within the search (slot BVH), or all.
    hits, n_iter, listed = slot_candidates(slot_bvh, env, n_env_mesh.shape[0], count, p, bound)
    for i in range(n_iter):
        slot = candidate_slot(hits, i, listed, count, env, mesh_idx, mesh_enable)
        if slot < 0:
            continue
        t, q = slot_pose(pose_inv, env, slot)
        p_mesh = wp.quat_rotate(q, p) + t
        found, sd, grad_sd = mesh_signed_distance(
            wp.uint64(mesh_idx[env, slot]), p_mesh, bound, pose_inv[env, slot, 7],
            slot_sign_method(sign_method, slot_sign, env, slot), radius + eta,
        )
        if found == 0:
            continue
        d = radius + eta - sd
        if d > 0.0:
            dcost = float(1.0)
            if d <= eta:
                cost += d * d / (2.0 * eta)
                dcost = d / eta
            else:
                cost += d - 0.5 * eta
            # d d / d p = -grad_sd; back to the world frame with the inverse rotation.
            grad += wp.quat_rotate_inv(q, grad_sd * (-dcost))
    return cost, grad


@wp.func
def point_world_esdf(
    p: wp.vec3,
    max_dist: float,
    env: int,
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
):
    """max_i(-sd_i) over the meshes of ``env`` (-max_dist when none is in range) and its gradient."""
    best = -max_dist
    grad = wp.vec3(0.0, 0.0, 0.0)
    count = wp.min(n_env_mesh[env], mesh_idx.shape[1])
    # The slots that may hold a surface or inside point within the search (slot BVH), or all.
    hits, n_iter, listed = slot_candidates(slot_bvh, env, n_env_mesh.shape[0], count, p, max_dist)
    for i in range(n_iter):
        slot = candidate_slot(hits, i, listed, count, env, mesh_idx, mesh_enable)
        if slot < 0:
            continue
        t, q = slot_pose(pose_inv, env, slot)
        p_mesh = wp.quat_rotate(q, p) + t
        found, sd, grad_sd = mesh_signed_distance(
            wp.uint64(mesh_idx[env, slot]), p_mesh, max_dist, pose_inv[env, slot, 7],
            slot_sign_method(sign_method, slot_sign, env, slot), max_dist,
        )
        if found != 0 and -sd > best:
            best = -sd
            grad = wp.quat_rotate_inv(q, -grad_sd)
    return best, grad


@wp.func
def query_env(
    tid: int, spheres_per_batch: int, use_env_query: int, env_query: wp.array(dtype=wp.int32), n_envs: int
) -> int:
    env = int(0)
    if use_env_query != 0:
        env = env_query[tid / spheres_per_batch]
    if env < 0 or env >= n_envs:
        return -1
    return env


# CUDA only: both query kernels sit at the 255-register cap and spill (docs/benchmarks.md, issue
# 18). launch_bounds: Warp's default block size, which every launch of these kernels uses.
# Shared-memory spilling (enable_cuda_smem_spilling) is off: its spill area beside Warp's shared
# traversal stacks passed the 48 KB static limit and ptxas refused the kernels
# (test/cuda_build_test.py caught it); the slot BVH walk keeps its stack in local memory.
@wp.kernel(launch_bounds=256)
def sphere_cost_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    env_query: wp.array(dtype=wp.int32),
    use_env_query: int,
    spheres_per_batch: int,
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
    compute_esdf: int,
    compute_grad: int,
    start: int,
    total: int,
    out_cost: wp.array(dtype=wp.float32),
    out_grad: wp.array(dtype=wp.vec4),
    out_sparsity: wp.array(dtype=wp.uint8),
):
    tid = wp.tid() + start
    if tid >= total:
        return
    s = spheres[tid]
    p = wp.vec3(s[0], s[1], s[2])
    w = weight[0]
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    env = query_env(tid, spheres_per_batch, use_env_query, env_query, n_env_mesh.shape[0])
    if compute_esdf != 0:
        cost = -max_distance[0]
        if env >= 0:
            cost, grad = point_world_esdf(p, max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method, slot_sign, slot_bvh)
    elif s[3] >= 0.0 and env >= 0:
        cost, grad = sphere_world_cost(
            p, s[3], activation_distance[0], max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method, slot_sign, slot_bvh
        )
    cost = w * cost
    out_cost[tid] = cost
    out_sparsity[tid] = wp.where(cost > 0.0, wp.uint8(1), wp.uint8(0))
    if compute_grad != 0:
        grad = grad * w
        out_grad[tid] = wp.vec4(grad[0], grad[1], grad[2], 0.0)
    else:
        out_grad[tid] = wp.vec4(0.0, 0.0, 0.0, 0.0)


@wp.func
def swept_sample_weight(k: int, sweep_steps: int, n_sides: int) -> float:
    """Quadrature weight of sample k (1..K) of one side of a slot with ``n_sides`` sides.

    Trapezoid rule in time over each half segment [p[t], midpoint], nodes at s_k = k / (2K):
    p[t] weighs 1 / (2K) (set by the caller), inner samples 1 / (K n_sides), the half-way point
    1 / (2K n_sides); the weights of one slot sum to 1. The half-way point is shared with the
    neighbouring step's slot, so along a whole trajectory every node carries the same weight.
    """
    w = 1.0 / (float(sweep_steps) * float(n_sides))
    if k == sweep_steps:
        w = 0.5 * w
    return w


# Samples searched with the centre in one BVH traversal by mesh_closest_points: both sides of
# sweep_steps up to 7 at once; beyond that, 15 at a time per side.
SWEPT_BATCH = wp.constant(15)
SWEPT_SIDE_BATCH = wp.constant(7)
vec16 = wp.types.vector(length=16, dtype=wp.float32)


@wp.func_native("""
const wp::Mesh m = wp::mesh_get(mesh);
const int n1c = n1 < 15 ? (n1 > 0 ? n1 : 0) : 15;
const int n2c = n2 < 15 - n1c ? (n2 > 0 ? n2 : 0) : 15 - n1c;
const int count_pts = 1 + n1c + n2c;
// Per point, in 16 lanes as a structure of arrays (unused lanes: best 0, never in reach), so
// that the tests of all points against a leaf or a triangle are branch-free loops over fixed
// lanes (vectorised on the CPU); only the points that pass get a closest-point test. A GPU
// thread does not vectorise: there the loops run over the points in use only.
#if defined(__CUDA_ARCH__)
#define SWEPT_LANES count_pts
#else
#define SWEPT_LANES 16
#endif
float px[16];
float py[16];
float pz[16];
float best[16];
float off[16];
float fs1[16];
float fs2[16];
int best_face[16];
// Warp's sign rule (warp_sign, mesh_query_point_sign_normal): per point the distance of its
// closest face so far (its bound while none) and the faces within Warp's tie tolerance of it;
// best is then the squared pruning radius (closest + tie).
const float tie = warp_sign ? m.average_edge_length * 1.0e-3f : 0.0f;
float closest[16];
float acc_x[16];
float acc_y[16];
float acc_z[16];
// The weights (Warp's u, v) of each point's closest point on its closest face, as the test that
// took the face computed them: the sign needs that point again.
float best_u[16];
float best_v[16];
// The ties of each point since its last strictly closer face, kept as face indices and weighed
// when the traversal is done (most faces a point takes are passed by a closer one later); the
// ties beyond WARP_TIES are weighed at once.
#if defined(__CUDA_ARCH__)
#define WARP_TIES 2
#else
#define WARP_TIES 6
#endif
int ties[16][WARP_TIES];
int n_ties[16];
// Warp's weighted normal of a face for a point: the angle of the feature nearest to the point's
// closest point on it (a corner's angle, pi on an edge, 2 pi inside) times its unit normal.
// Out of line on the CPU: rarely needed, and inlined (its acosf calls in the traversal's
// innermost loop) it slowed the whole traversal by 8 % (table scan, raw swept, 100k spheres).
#if defined(__CUDA_ARCH__)
#define RARELY_CALLED
#else
#define RARELY_CALLED __attribute__((noinline))
#endif
auto warp_weighted_normal = [&](int tri, const wp::vec3& pt) RARELY_CALLED {
    const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
    const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
    const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
    const wp::vec3 e0 = q - p;
    const wp::vec3 e1 = r - p;
    const wp::vec3 e2 = r - q;
    const wp::vec2 bary = wp::closest_point_to_triangle(p, q, r, pt);
    const float tie_sq = tie * tie;
    const float u = bary[0];
    const float v = bary[1];
    const float w = 1.0f - u - v;
    const wp::vec3 c = u * p + v * q + w * r;
    const wp::vec3 cp = c - p;
    const wp::vec3 cq = c - q;
    const wp::vec3 cr = c - r;
    const float cp_sq = wp::length_sq(cp);
    const float cq_sq = wp::length_sq(cq);
    const float cr_sq = wp::length_sq(cr);
    float weight;
    if (cp_sq < tie_sq) {
        weight = acosf(wp::dot(wp::normalize(e0), wp::normalize(e1)));
    } else if (cq_sq < tie_sq) {
        weight = acosf(wp::dot(wp::normalize(e2), wp::normalize(-e0)));
    } else if (cr_sq < tie_sq) {
        weight = acosf(wp::dot(wp::normalize(-e1), wp::normalize(-e2)));
    } else {
        const float e0_sq = wp::dot(e0, e0);
        const float e1_sq = wp::dot(e1, e1);
        const float e2_sq = wp::dot(e2, e2);
        const float e0cp = wp::dot(e0, cp);
        const float e2cq = wp::dot(e2, cq);
        const float e1cp = wp::dot(e1, cp);
        const bool on_edge = cp_sq * e0_sq - e0cp * e0cp < tie_sq * e0_sq
            || cq_sq * e2_sq - e2cq * e2cq < tie_sq * e2_sq || cp_sq * e1_sq - e1cp * e1cp < tie_sq * e1_sq;
        weight = on_edge ? 3.14159265359f : 2.0f * 3.14159265359f;
    }
    return weight * wp::normalize(wp::cross(e0, e1));
};
// A face within the pruning radius of point j: it joins the ties within the tolerance of the
// closest face, or, closer by more than the tolerance, starts them anew.
auto take_warp_candidate = [&](int j, int tri, float dist, const wp::vec2& bary) {
    if (dist > closest[j] - tie) {
        if (n_ties[j] < WARP_TIES) {
            ties[j][n_ties[j]++] = tri;
        } else {
            const wp::vec3 n = warp_weighted_normal(tri, wp::vec3(px[j], py[j], pz[j]));
            acc_x[j] += n[0];
            acc_y[j] += n[1];
            acc_z[j] += n[2];
        }
        if (dist < closest[j]) {
            closest[j] = dist;
            best_face[j] = tri;
            best_u[j] = bary[0];
            best_v[j] = bary[1];
        }
    } else {
        closest[j] = dist;
        best_face[j] = tri;
        best_u[j] = bary[0];
        best_v[j] = bary[1];
        ties[j][0] = tri;
        n_ties[j] = 1;
        acc_x[j] = 0.0f;
        acc_y[j] = 0.0f;
        acc_z[j] = 0.0f;
    }
    best[j] = (closest[j] + tie) * (closest[j] + tie);
};
for (int j = 0; j < 16; ++j) {
    px[j] = a[0];
    py[j] = a[1];
    pz[j] = a[2];
    best[j] = 0.0f;
    off[j] = 0.0f;
    fs1[j] = 0.0f;
    fs2[j] = 0.0f;
    best_face[j] = -1;
    best_u[j] = 0.0f;
    best_v[j] = 0.0f;
    closest[j] = 0.0f;
    n_ties[j] = 0;
    acc_x[j] = 0.0f;
    acc_y[j] = 0.0f;
    acc_z[j] = 0.0f;
}
closest[0] = bound_a;
best[0] = bound_a > 0.0f ? (bound_a + tie) * (bound_a + tie) : 0.0f;
wp::vec3 lo = a;
wp::vec3 hi = a;
float worst = best[0];
for (int j = 1; j < count_pts; ++j) {
    const bool first_side = j <= n1c;
    const float s = first_side ? s1 + ds * (float)(j - 1) : s2 + ds * (float)(j - 1 - n1c);
    // The fraction along each side's direction (0 on the other side): the tangent bound below.
    fs1[j] = first_side ? s : 0.0f;
    fs2[j] = first_side ? 0.0f : s;
    const wp::vec3 offset = (first_side ? d1 : d2) * s;
    const wp::vec3 pt = a + offset;
    px[j] = pt[0];
    py[j] = pt[1];
    pz[j] = pt[2];
    off[j] = wp::length(offset);
    // 1-Lipschitz: the closest surface point of a is within base of a (under Warp's sign rule
    // with room for the faces that tie with the closest one).
    float b = reach;
    if (base >= 0.0f) {
        const float lip = (base + off[j]) * 1.0001f + 1.0e-6f + 3.0f * tie;
        b = base_inside ? lip : wp::min(reach, lip);
    }
    closest[j] = b;
    best[j] = (b + tie) * (b + tie);
    lo = wp::min(lo, pt);
    hi = wp::max(hi, pt);
    worst = wp::max(worst, best[j]);
}
int stack[BVH_QUERY_STACK_SIZE];
stack[0] = *m.bvh.root;
int count = worst > 0.0f ? 1 : 0;
while (count) {
    const int node = stack[--count];
    const wp::BVHPackedNodeHalf nl = m.bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf nu = m.bvh.node_uppers[node];
    const wp::vec3 node_lo(nl.x, nl.y, nl.z);
    const wp::vec3 node_hi(nu.x, nu.y, nu.z);
    const wp::vec3 gap = wp::max(wp::max(node_lo - hi, lo - node_hi), wp::vec3(0.0f));
    if (wp::length_sq(gap) >= worst)
        continue;
    if (nl.b) {
        // Points whose best so far is farther than the leaf's box (bit j for point j).
        unsigned int in_reach = 0u;
        for (int j = 0; j < SWEPT_LANES; ++j) {
            const float gx = wp::max(wp::max(nl.x - px[j], px[j] - nu.x), 0.0f);
            const float gy = wp::max(wp::max(nl.y - py[j], py[j] - nu.y), 0.0f);
            const float gz = wp::max(wp::max(nl.z - pz[j], pz[j] - nu.z), 0.0f);
            in_reach |= (gx * gx + gy * gy + gz * gz < best[j] ? 1u : 0u) << j;
        }
        for (int prim = (int)nl.i; in_reach != 0u && prim < (int)nu.i; ++prim) {
            const int tri = m.bvh.primitive_indices[prim];
            const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
            const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
            const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
            const wp::vec3 e0 = q - p;
            const wp::vec3 e1 = r - p;
            const wp::vec3 e2 = r - q;
            // Warp's own closest-point queries skip these slivers: the same candidates here.
            if (wp::length(wp::cross(e0, e1)) / (wp::dot(e0, e0) + wp::dot(e1, e1) + wp::dot(e2, e2)) < 1.e-6f)
                continue;
            // The distance to a triangle (a convex set) is convex along each segment a + d s, so
            // it lies above its tangent at a: dist(s) >= dist(a) + s (a - c) / |a - c| . d.
            // Measured at a once, that rules the triangle out for nearly every other point.
            const wp::vec2 bary_a = wp::closest_point_to_triangle(p, q, r, a);
            const wp::vec3 from_c = a - (bary_a[0] * p + bary_a[1] * q + (1.0f - bary_a[0] - bary_a[1]) * r);
            const float a_sq = wp::length_sq(from_c);
            const float a_dist = wp::sqrt(a_sq);
            if ((in_reach & 1u) && a_sq < best[0]) {
                if (warp_sign)
                    take_warp_candidate(0, tri, a_dist, bary_a);
                else {
                    best[0] = a_sq;
                    best_face[0] = tri;
                }
                if (base_inside && !warp_sign) {
                    // Each point's closest surface point is within a's best so far plus its
                    // offset (1-Lipschitz): a loose base tightens as a's search goes.
                    for (int j = 1; j < count_pts; ++j) {
                        const float b = (a_dist + off[j]) * 1.0001f + 1.0e-6f;
                        best[j] = wp::min(best[j], b * b);
                    }
                }
            }
            float slope1 = 0.0f;
            float slope2 = 0.0f;
            float slack = 1.0e30f;
            if (a_dist > 1.0e-6f) {
                slope1 = wp::dot(from_c, d1) / a_dist;
                slope2 = wp::dot(from_c, d2) / a_dist;
                // Float32 rounding of the distances stays far below this margin [m].
                slack = 2.0e-6f + 1.0e-5f * a_dist;
            }
            // Points in reach that the tangent bound does not rule out (never a itself).
            unsigned int test = 0u;
            for (int j = 1; j < SWEPT_LANES; ++j) {
                const float sure = a_dist + fs1[j] * slope1 + fs2[j] * slope2 - slack;
                test |= (sure > 0.0f && sure * sure >= best[j] ? 0u : 1u) << j;
            }
            test &= in_reach;
            while (test != 0u) {
#if defined(__CUDA_ARCH__)
                const int j = __ffs(test) - 1;
#else
                const int j = __builtin_ctz(test);
#endif
                test &= test - 1u;
                const wp::vec3 pt(px[j], py[j], pz[j]);
                const wp::vec2 bary = wp::closest_point_to_triangle(p, q, r, pt);
                const wp::vec3 c = bary[0] * p + bary[1] * q + (1.0f - bary[0] - bary[1]) * r;
                const float dist_sq = wp::length_sq(c - pt);
                if (dist_sq < best[j]) {
                    if (warp_sign)
                        take_warp_candidate(j, tri, wp::sqrt(dist_sq), bary);
                    else {
                        best[j] = dist_sq;
                        best_face[j] = tri;
                    }
                }
            }
        }
        worst = 0.0f;
        for (int j = 0; j < SWEPT_LANES; ++j)
            worst = wp::max(worst, best[j]);
    } else {
        const int children[2] = {(int)nl.i, (int)nu.i};
        float child_gap[2];
        for (int c = 0; c < 2; ++c) {
            const wp::BVHPackedNodeHalf cl = m.bvh.node_lowers[children[c]];
            const wp::BVHPackedNodeHalf cu = m.bvh.node_uppers[children[c]];
            const wp::vec3 g = wp::max(wp::max(wp::vec3(cl.x, cl.y, cl.z) - hi, lo - wp::vec3(cu.x, cu.y, cu.z)),
                                       wp::vec3(0.0f));
            child_gap[c] = wp::length_sq(g);
            if (child_gap[c] < worst) {
                // Some point's best so far farther than the child's box?
                bool any = false;
                for (int j = 0; j < SWEPT_LANES; ++j) {
                    const float gx = wp::max(wp::max(cl.x - px[j], px[j] - cu.x), 0.0f);
                    const float gy = wp::max(wp::max(cl.y - py[j], py[j] - cu.y), 0.0f);
                    const float gz = wp::max(wp::max(cl.z - pz[j], pz[j] - cu.z), 0.0f);
                    any |= gx * gx + gy * gy + gz * gz < best[j];
                }
                if (!any)
                    child_gap[c] = worst;
            }
        }
        // The nearer child last, so that it is searched first.
        const int first = child_gap[0] < child_gap[1] ? 1 : 0;
        if (child_gap[first] < worst)
            stack[count++] = children[first];
        if (child_gap[1 - first] < worst)
            stack[count++] = children[1 - first];
    }
}
#undef SWEPT_LANES
#undef WARP_TIES
#undef RARELY_CALLED
wp::vec_t<16, float> out;
for (int j = 0; j < 16; ++j) {
    union { int i; float f; } bits;
    bits.i = j < count_pts ? best_face[j] : -1;
    if (warp_sign && bits.i >= 0) {
        // Warp's sign: inside where the accumulated normal faces away from the point.
        const int tri = bits.i;
        const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
        const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
        const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
        const wp::vec3 pt(px[j], py[j], pz[j]);
        // Warp's closest point, weights rounded as it rounds them.
        const float v = best_v[j];
        const float w = 1.0f - best_u[j] - best_v[j];
        const wp::vec3 to_point = pt - (p * (1.0f - v - w) + q * v + r * w);
        // Where every tie's normal faces the same way, so does their weighted sum (the weights
        // are positive); only ties that disagree are weighed.
        bool outside = true;
        bool agree = acc_x[j] == 0.0f && acc_y[j] == 0.0f && acc_z[j] == 0.0f;
        for (int t = 0; t < n_ties[j] && agree; ++t) {
            const int f = ties[j][t];
            const wp::vec3 fp = m.points[m.indices[f * 3 + 0]];
            const float side = wp::dot(wp::cross(m.points[m.indices[f * 3 + 1]] - fp,
                                                 m.points[m.indices[f * 3 + 2]] - fp), to_point);
            if (t == 0)
                outside = side > 0.0f;
            agree = side != 0.0f && (side > 0.0f) == outside;
        }
        if (!agree) {
            wp::vec3 acc(acc_x[j], acc_y[j], acc_z[j]);
            for (int t = 0; t < n_ties[j]; ++t)
                acc += warp_weighted_normal(ties[j][t], pt);
            outside = wp::dot(acc, to_point) > 0.0f;
        }
        if (!outside)
            bits.i |= 1 << 30;
    }
    out[j] = bits.f;
}
return out;""")
def mesh_closest_points(mesh: wp.uint64, a: wp.vec3, bound_a: float, d1: wp.vec3, s1: float, n1: int, d2: wp.vec3,
                        s2: float, n2: int, ds: float, reach: float, base: float, base_inside: bool,
                        warp_sign: bool) -> vec16:
    """Closest triangles of up to 16 points in one traversal of the mesh's BVH: entry 0 for a
    within ``bound_a`` (not searched when bound_a <= 0), entries 1..n1 for a + d1 (s1 + i ds),
    the next n2 for a + d2 (s2 + i ds), i = 0, 1, ... (n1 + n2 <= SWEPT_BATCH). Each of those is
    searched within ``reach``, or, where a's unsigned distance ``base`` (>= 0) is known, within
    base + its distance to a (1-Lipschitz; always when a is inside: a deep point is found without
    a ray), whichever is smaller. The points lie on two short segments from a, so their searches
    visit nearly the same nodes; a child node is entered only where its box is nearer than some
    point's best, and a leaf's triangles are tested against a point only where the leaf's box is
    nearer than the point's best (a per-triangle box test cost more than it saved). The per-point
    tests against a box or a triangle's tangent bound run over 16 fixed lanes without branches
    (the CPU compiler vectorises them); only the points that pass get a closest-point test.
    Entries hold the triangle's index as float bits (face_of reads them), -1 for none. Candidates are those of Warp's mesh_query_point_no_sign (slivers
    skipped alike).

    With ``warp_sign`` each point found is signed as Warp's mesh_query_point_sign_normal signs
    it (warp_inside reads it): by the angle-weighted normals of the faces within its tie
    tolerance (1e-3 of the mesh's average edge length) of the closest one, weighed only where
    their normals disagree. The traversal differs from Warp's, so where faces tie in a chain
    wider than the tolerance the sign may differ from Warp's own (Warp's depends on its visit
    order there). Where a is inside and ``base_inside``, the others' bounds tighten as a's
    search narrows (the distance is 1-Lipschitz); elsewhere that cost more than it saved."""
    ...


@wp.func_native("""
const wp::Mesh m = wp::mesh_get(mesh);
const int n1c = n1 < 15 ? (n1 > 0 ? n1 : 0) : 15;
const int n2c = n2 < 15 - n1c ? (n2 > 0 ? n2 : 0) : 15 - n1c;
const int count_pts = 1 + n1c + n2c;
wp::vec3 pts[16];
for (int j = 0; j < count_pts; ++j) {
    const bool first_side = j >= 1 && j <= n1c;
    const float s = j == 0 ? 0.0f : (first_side ? s1 + ds * (float)(j - 1) : s2 + ds * (float)(j - 1 - n1c));
    pts[j] = a + (first_side ? d1 : d2) * s;
}
wp::vec_t<16, float> out;
for (int j = 0; j < 16; ++j)
    out[j] = 0.0f;
unsigned int todo = lanes & ((1u << count_pts) - 1u);
#if defined(__CUDA_ARCH__)
// A GPU thread gains nothing from sharing (no vector lanes) and would pay the partial sums in
// local memory: point after point.
for (int j = 0; j < count_pts; ++j)
    if (todo & (1u << j))
        out[j] = wp::mesh_query_winding_number(mesh, pts[j], accuracy);
#else
// Warp's solid_angle_iterative for every point at once: a depth-first walk in Warp's order, each
// point descending where Warp's would (its own far-field test) and keeping its own partial sum
// per level, added to its parent's in Warp's order, so that each value is Warp's to the bit. The
// nodes and triangles are read once for all points.
const float accuracy_sq = accuracy * accuracy;
int stack[BVH_QUERY_STACK_SIZE];
int at_child[BVH_QUERY_STACK_SIZE];
unsigned int reach_mask[BVH_QUERY_STACK_SIZE];
unsigned int down_mask[BVH_QUERY_STACK_SIZE];
float angle[BVH_QUERY_STACK_SIZE][16];
stack[0] = *m.bvh.root;
at_child[0] = 0;
reach_mask[0] = todo;
for (int j = 0; j < 16; ++j)
    angle[0][j] = 0.0f;
int count = todo ? 1 : 0;
while (count) {
    const int level = count - 1;
    const int node = stack[level];
    const wp::BVHPackedNodeHalf lower = m.bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf upper = m.bvh.node_uppers[node];
    if (lower.b) {
        const unsigned int here = reach_mask[level];
        for (int j = 0; j < count_pts; ++j)
            angle[level][j] = 0.0f;
        for (int prim = (int)lower.i; prim < (int)upper.i; ++prim) {
            const int tri = m.bvh.primitive_indices[prim];
            const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
            const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
            const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
            for (unsigned int left = here; left != 0u; left &= left - 1u) {
                const int j = __builtin_ctz(left);
                angle[level][j] += wp::robust_solid_angle(p, q, r, pts[j]);
            }
        }
        count--;
    } else if (at_child[level] == 0) {
        unsigned int down = 0u;
        for (unsigned int left = reach_mask[level]; left != 0u; left &= left - 1u) {
            const int j = __builtin_ctz(left);
            if (wp::evaluate_node_solid_angle(pts[j], &m.solid_angle_props[node], angle[level][j], accuracy_sq))
                down |= 1u << j;
        }
        if (down) {
            down_mask[level] = down;
            at_child[level] = 1;
            stack[count] = (int)lower.i;
            reach_mask[count] = down;
            at_child[count] = 0;
            count++;
        } else {
            count--;
        }
    } else {
        for (unsigned int left = down_mask[level]; left != 0u; left &= left - 1u) {
            const int j = __builtin_ctz(left);
            angle[level][j] += angle[level + 1][j];
        }
        if (at_child[level] == 1) {
            at_child[level] = 2;
            stack[count] = (int)upper.i;
            reach_mask[count] = down_mask[level];
            at_child[count] = 0;
            count++;
        } else {
            count--;
        }
    }
}
for (int j = 0; j < count_pts; ++j)
    if (todo & (1u << j))
        out[j] = (float)((double)angle[0][j] * 0.07957747154);
#endif
return out;""")
def mesh_winding_numbers(mesh: wp.uint64, a: wp.vec3, d1: wp.vec3, s1: float, n1: int, d2: wp.vec3, s2: float,
                         n2: int, ds: float, accuracy: float, lanes: int) -> vec16:
    """Warp's fast winding numbers (mesh_query_winding_number at ``accuracy``) of the points that
    mesh_closest_points would search with the same arguments (a, then a + d1 (s1 + i ds), then
    a + d2 (s2 + i ds)), for the points whose bit is set in ``lanes`` (0 for the others), in one
    traversal on the CPU."""
    ...


@wp.func_native("""union { float f; int i; } bits; bits.f = x; return bits.i < 0 ? -1 : bits.i & ~(1 << 30);""")
def face_of(x: float) -> int:
    """The triangle whose index mesh_closest_points stored in a float entry, -1 for none."""
    ...


@wp.func_native("""union { float f; int i; } bits; bits.f = x; return bits.i >= 0 && (bits.i & (1 << 30)) ? -1.f : 1.f;""")
def warp_inside(x: float) -> float:
    """Warp's sign of an entry that mesh_closest_points found with warp_sign: -1 inside (else 1)."""
    ...


@wp.func
def penetration_cost(sd: float, radius: float, eta: float):
    """cost_i of docs/design.md "Cost definition" for signed distance sd and d cost_i / d (-sd)."""
    d = radius + eta - sd
    cost = float(0.0)
    dcost = float(0.0)
    if d > 0.0:
        dcost = 1.0
        if d <= eta:
            cost = d * d / (2.0 * eta)
            dcost = d / eta
        else:
            cost = d - 0.5 * eta
    return cost, dcost


@wp.func
def side_bit(k: int) -> int:
    """Bit of sample k in a side's evaluation mask (samples beyond 30 share the last bit)."""
    return 1 << wp.min(k, 30)


@wp.func
def batched_feature(mesh: wp.uint64, q: wp.vec3, face: int, data: int, winding: bool):
    """closest_feature of a point whose closest triangle a shared traversal found, signed by the
    pseudo-normal, or on a winding-number mesh by its winding number at q."""
    inside = float(1.0)
    if winding:
        if winding_inside(mesh, q):
            inside = -1.0
    return closest_feature(mesh, q, face, inside, data, not winding)


@wp.func
def swept_slot_cost(
    mesh: wp.uint64,
    cull_radius: float,
    sign_method: int,
    p: wp.vec3,
    seg_prev: wp.vec3,
    seg_next: wp.vec3,
    has_prev: int,
    has_next: int,
    radius: float,
    eta: float,
    max_dist: float,
    bound0: float,
    sweep_steps: int,
    n_sides: int,
):
    """One mesh's share of a step's swept cost, in the mesh frame (p, segments to the neighbours).

    Returns (c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next): the cost at p and its
    gradient, sum_k w_k (c_k - c0) over the samples of both sides, the samples' gradient partials
    w (1 - s) g towards p and w s g towards each neighbour, and per side the samples whose cost
    took a closest point or a full test.

    Skipping is per mesh: a sample is skipped for this mesh when it lies strictly within this
    mesh's clearance of an evaluated point of its side (its share of the cost is provably 0; the
    distance to one mesh is 1-Lipschitz). With robot_sdf's pseudo-normal sign, and with the
    winding number of a closed surface with robot_sdf's sign data (each point found is then
    signed by its winding number; p's inside test in the box is the winding number, not a ray),
    p and the samples of both sides are searched in one BVH traversal (mesh_closest_points; p
    within its bound, the samples within r + eta: their cost needs nothing farther). A sample
    with no surface within r + eta is outside when the last point of its side evaluated is
    outside and too far from the surface for a crossing in between (|sd| + r + eta > their
    distance; closed meshes only); otherwise the full test decides (deep centres are costed).
    Other sign methods search sample after sample, each bound as far as its clearance could
    still free a later sample.
    """
    c0 = float(0.0)
    g0 = wp.vec3(0.0, 0.0, 0.0)
    delta = float(0.0)
    own = wp.vec3(0.0, 0.0, 0.0)
    to_prev = wp.vec3(0.0, 0.0, 0.0)
    to_next = wp.vec3(0.0, 0.0, 0.0)
    mask_prev = int(0)
    mask_next = int(0)
    reach_b = radius + eta
    data, method = mesh_sign_method(mesh, sign_method)
    # Only the sign of a closed surface changes where the surface is crossed: elsewhere (open
    # surfaces; the winding number of an open surface, which passes 0.5 off the surface) a point
    # free of the surface may still be inside, so the clearance of a point frees no sample, and
    # p and every sample take the plain query (max_dist + r + eta), which makes the step's cost
    # the mean of the plain costs at its samples, as defined. (The kernel hands moving steps on
    # such meshes to open_swept_slot_cost where the sign lets their points share traversals.)
    sign_closed = sign_is_closed(mesh, data)
    if not sign_closed:
        bound0 = max_dist
    bound_p = bound0 + radius + eta
    half_len = wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next)) * 0.5
    if cull_radius > 0.0:
        # Beyond the cull sphere by more than any search of the slot reaches: nothing to find,
        # and no point of the slot can be inside (the mesh itself is not touched).
        if wp.length(p) > cull_radius + bound_p + half_len:
            return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
    # A closed winding-number surface (several, overlapping or nested shells: the box bounds its
    # inside) shares the traversal too; the winding number at each point found gives the sign.
    winding = method == SIGN_WINDING_NUMBER and data >= 0 and sign_closed
    # A stationary step keeps the plain query of p, so that it reproduces the plain cost bit for bit.
    batched = sign_closed and (winding or (method == SIGN_NORMAL and data >= 0)) and n_sides > 0 and (
        (has_prev == 1 and wp.length_sq(seg_prev) > 0.0) or (has_next == 1 and wp.length_sq(seg_next) > 0.0))
    inv_2k = float(0.0)
    n_first = int(0)
    batch = vec16()
    found = int(0)
    sd = float(0.0)
    grad_sd = wp.vec3(0.0, 0.0, 0.0)
    # Samples of both sides searched in one more traversal when p is inside deeper than r + eta
    # (deep_batch: side 0's samples deep_lo0 .. deep_hi0 - 1, then side 1's deep_lo1 .. deep_hi1 - 1).
    deep_batch = vec16()
    deep_done = bool(False)
    deep_lo0 = int(0)
    deep_hi0 = int(0)
    deep_lo1 = int(0)
    deep_hi1 = int(0)
    if batched:
        # p (within its bound) and the samples of both sides (within r + eta: their cost needs
        # nothing farther) in one traversal.
        inv_2k = 1.0 / (2.0 * float(sweep_steps))
        n_first = wp.min(sweep_steps, SWEPT_SIDE_BATCH)
        batch = mesh_closest_points(mesh, p, bound_p, seg_prev, inv_2k, has_prev * n_first, seg_next, inv_2k,
                                    has_next * n_first, inv_2k, reach_b, -1.0, False, False)
        face = face_of(batch[0])
        if face >= 0:
            d_vec, dist, inside, outward = batched_feature(mesh, p, face, data, winding)
            sd, grad_sd = signed_result(d_vec, dist, inside, outward)
            found = 1
        else:
            # Nothing within bound_p: outside unless p is deep inside, which only a point in the
            # mesh's box can be (mesh_signed_distance's inside test). One ray decides; where p
            # may be inside, p and the samples of both sides are searched in one traversal, the
            # samples within the Lipschitz bound from p (found for sure, tightened as p's
            # search narrows).
            m = wp.mesh_get(mesh)
            lo = m.velocities[data]
            hi = m.velocities[data + 1]
            search = float(-1.0)
            if p[0] >= lo[0] and p[1] >= lo[1] and p[2] >= lo[2] and p[0] <= hi[0] and p[1] <= hi[1] and p[2] <= hi[2]:
                if winding:
                    if winding_inside(mesh, p):
                        search = UNBOUNDED
                else:
                    search = closed_inside_bound(mesh, p)
            if search > 0.0:
                deep_batch = mesh_closest_points(mesh, p, search, seg_prev, inv_2k, has_prev * n_first, seg_next,
                                                 inv_2k, has_next * n_first, inv_2k, reach_b, search, True, False)
                face = face_of(deep_batch[0])
                if face >= 0:
                    # inside: the winding number said so (pseudo False keeps it), or the pseudo-normal says
                    d_vec, dist, inside, outward = closest_feature(mesh, p, face, wp.where(winding, -1.0, 1.0), data,
                                                                   not winding)
                    if inside < 0.0:
                        sd, grad_sd = signed_result(d_vec, dist, inside, outward)
                        found = 1
                        deep_done = True
                        deep_lo0 = 1
                        deep_hi0 = 1 + has_prev * n_first
                        deep_lo1 = 1
                        deep_hi1 = 1 + has_next * n_first
    else:
        # p's result is needed within r + eta (its cost) and, as a clearance, out to the farthest
        # sample (half_len): where mesh_signed_distance may search within need first, nothing
        # found there still frees every sample (the clearance below exceeds half_len).
        need_p = wp.min(bound_p, reach_b + half_len * REACH_MARGIN + REACH_SLACK)
        if not sign_closed:
            need_p = reach_b
        found, sd, grad_sd = mesh_signed_distance(mesh, p, bound_p, cull_radius, sign_method, need_p)
        bound_p = need_p
    clearance = bound_p - reach_b
    chain_abs = bound_p
    chain_inside = bool(False)
    if found != 0:
        dc = float(0.0)
        c0, dc = penetration_cost(sd, radius, eta)
        g0 = grad_sd * (-dc)
        clearance = sd - reach_b
        chain_abs = wp.abs(sd)
        chain_inside = sd < 0.0
    if n_sides == 0:
        return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
    inv_2k = 1.0 / (2.0 * float(sweep_steps))
    for side in range(2):
        if (side == 0 and has_prev == 0) or (side == 1 and has_next == 0):
            continue
        segment = seg_prev
        first_entry = 0
        if side == 1:
            segment = seg_next
            first_entry = has_prev * n_first
        seg_len = wp.length(segment)
        free_reach = wp.max(clearance, 0.0)
        last_s = float(0.0)
        last_abs = chain_abs
        last_inside = chain_inside
        # last_abs is the exact distance of the last point evaluated (it was found).
        last_exact = found != 0
        to_neighbour = wp.vec3(0.0, 0.0, 0.0)
        mask = int(0)
        side_batch = vec16()
        batch_start = int(0)
        batch_end = int(0)
        for k in range(1, sweep_steps + 1):
            sk = float(k) * inv_2k
            wk = swept_sample_weight(k, sweep_steps, n_sides)
            # Where the sign is not a closed surface's, no clearance frees a sample (see above).
            if sign_closed and sk * seg_len < free_reach:
                delta -= wk * c0
                continue
            ck = float(0.0)
            gk = wp.vec3(0.0, 0.0, 0.0)
            if seg_len == 0.0:
                # Every sample sits on p: its cost is c0, bit for bit.
                ck = c0
                gk = g0
                mask = mask | side_bit(k)
            else:
                q = p + segment * sk
                search = wp.min(max_dist, (0.5 - sk) * seg_len * REACH_MARGIN + REACH_SLACK) + reach_b
                known = search
                full = bool(True)
                found_k = int(0)
                sd_k = float(0.0)
                grad_k = wp.vec3(0.0, 0.0, 0.0)
                if batched:
                    # Searched within r + eta already: a full test only asks whether it is inside.
                    search = 0.0
                    known = reach_b
                    face = int(-1)
                    covered = k >= batch_start and k < batch_end
                    in_deep = (side == 0 and k >= deep_lo0 and k < deep_hi0) or (
                        side == 1 and k >= deep_lo1 and k < deep_hi1)
                    if covered:
                        face = face_of(side_batch[1 + k - batch_start])
                    elif in_deep:
                        face = face_of(deep_batch[wp.where(side == 0, 1 + k - deep_lo0,
                                                           1 + deep_hi0 - deep_lo0 + k - deep_lo1)])
                    elif k <= n_first:
                        face = face_of(batch[first_entry + k])
                    if face < 0 and not covered and not in_deep and k <= n_first and chain_inside and last_inside \
                            and not deep_done:
                        # p is inside deeper than r + eta: this side's samples from here on and, when
                        # the other side's first sample found nothing within r + eta either, that
                        # side's samples, in one traversal (each within the Lipschitz bound from p:
                        # found for sure, no ray).
                        deep_done = True
                        if side == 0:
                            deep_lo0 = k
                            deep_hi0 = n_first + 1
                            if has_next == 1:
                                if face_of(batch[first_entry + n_first + 1]) < 0:
                                    deep_lo1 = 1
                                    deep_hi1 = n_first + 1
                        else:
                            deep_lo1 = k
                            deep_hi1 = n_first + 1
                        deep_batch = mesh_closest_points(mesh, p, 0.0, seg_prev, float(deep_lo0) * inv_2k,
                                                         deep_hi0 - deep_lo0, seg_next, float(deep_lo1) * inv_2k,
                                                         deep_hi1 - deep_lo1, inv_2k, reach_b, chain_abs, True, False)
                        face = face_of(deep_batch[1])
                        in_deep = True
                    if face < 0 and not covered and not in_deep and (k > n_first or (chain_inside and last_inside)):
                        # The samples from here on, in one more traversal: beyond the first batch,
                        # or p is inside deeper than r + eta (each sample is then searched within
                        # the Lipschitz bound from p: found for sure, no ray).
                        batch_start = k
                        batch_end = wp.min(sweep_steps + 1, k + SWEPT_BATCH)
                        side_batch = mesh_closest_points(mesh, p, 0.0, segment, sk, batch_end - k, segment, 0.0, 0,
                                                         inv_2k, reach_b, wp.where(found != 0, chain_abs, -1.0),
                                                         chain_inside, False)
                        face = face_of(side_batch[1])
                    if face >= 0:
                        d_vec, dist, inside, outward = batched_feature(mesh, q, face, data, winding)
                        sd_k, grad_k = signed_result(d_vec, dist, inside, outward)
                        found_k = 1
                        full = False
                    elif not last_inside and last_abs + reach_b > (sk - last_s) * seg_len:
                        full = False
                if not sign_closed:
                    # The plain query of q (see above), bounded by the last exact distance plus the
                    # distance moved where that is nearer: the closest point lies within it, and a
                    # bound beyond it by Warp's tie tolerance finds the same one (same sign).
                    search = max_dist + reach_b
                    if last_exact:
                        search = wp.min(search, (last_abs + (sk - last_s) * seg_len) * REACH_MARGIN + REACH_SLACK
                                        + warp_tie_margin(mesh))
                if full:
                    found_k, sd_k, grad_k = mesh_signed_distance(mesh, q, search, cull_radius, sign_method,
                                                                 wp.where(sign_closed, search, reach_b))
                if full or found_k != 0:
                    mask = mask | side_bit(k)
                clearance_k = known - reach_b
                last_abs = known
                last_inside = False
                if found_k != 0:
                    dck = float(0.0)
                    ck, dck = penetration_cost(sd_k, radius, eta)
                    gk = grad_k * (-dck)
                    clearance_k = sd_k - reach_b
                    last_abs = wp.abs(sd_k)
                    last_inside = sd_k < 0.0
                last_exact = found_k != 0
                last_s = sk
                free_reach = wp.max(free_reach, sk * seg_len + clearance_k)
            delta += wk * (ck - c0)
            own += gk * (wk * (1.0 - sk))
            to_neighbour += gk * (wk * sk)
        if side == 0:
            to_prev = to_neighbour
            mask_prev = mask
        else:
            to_next = to_neighbour
            mask_next = mask
    return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next


@wp.func
def rim_settled_lanes(n_prev: int, n_next: int, len_prev: float, len_next: float, inv_2k: float, apart: float,
                      slope_prev: float, slope_next: float, clearance: float) -> int:
    """Lanes of mesh_closest_points' first traversal of a step (p, n_prev samples at distances
    k inv_2k len_prev, k = 1.., then n_next at k inv_2k len_next) whose inside test Warp's winding
    number decides as it decides p's (docs/sign_methods.md, "Swept samples on open surfaces"): the
    segment from p meets no surface (shorter than ``apart``), and along it the exact winding number
    moves less than p's ``clearance`` (rim_slope of each side's half length, times the distance)
    less twice WINDING_APPROXIMATION_ERROR."""
    lanes = int(0)
    for j in range(1, 16):
        if j <= n_prev + n_next:
            on_prev = j <= n_prev
            reach = float(wp.where(on_prev, j, j - n_prev)) * inv_2k * wp.where(on_prev, len_prev, len_next)
            if reach < apart and reach * wp.where(on_prev, slope_prev, slope_next) \
                    + 2.0 * WINDING_APPROXIMATION_ERROR < clearance:
                lanes = lanes | (1 << j)
    return lanes


@wp.func
def batched_winding_inside(mesh: wp.uint64, p: wp.vec3, seg_prev: wp.vec3, seg_next: wp.vec3, ds: float,
                           n_prev: int, n_next: int, lanes: int) -> int:
    """winding_inside of the points of mesh_closest_points' first traversal of a step (p, then
    n_prev samples towards the previous step, n_next towards the next, s = ds, 2 ds, ...) whose
    bit is set in ``lanes``: bit j set where point j is inside. The same tiers as winding_inside,
    each tier one traversal for the points it has not settled."""
    inside = int(0)
    pending = lanes
    accuracy = COARSEST_WINDING_ACCURACY
    margin = COARSEST_WINDING_SETTLED
    while pending != 0:
        w = mesh_winding_numbers(mesh, p, seg_prev, ds, n_prev, seg_next, ds, n_next, ds, accuracy, pending)
        for j in range(16):
            bit = 1 << j
            if (pending & bit) != 0:
                verdict = winding_verdict(w[j], margin)
                if verdict >= 0:
                    pending = pending ^ bit
                    if verdict == 1:
                        inside = inside | bit
        accuracy, margin = next_winding_tier(accuracy)
    return inside


# Out of line: inlined, its traversal arrays and long-lived state would join the swept kernel's
# stack frame and spills on the GPU for every mesh (ptxas: kernel spills 748 / 632 B -> 2,636 /
# 2,044 B, sm_90); called, they are paid only on the meshes it serves. On the CPU no slower.
@wp.func(inline=False)
def open_swept_slot_cost(
    mesh: wp.uint64,
    cull_radius: float,
    sign_method: int,
    p: wp.vec3,
    seg_prev: wp.vec3,
    seg_next: wp.vec3,
    has_prev: int,
    has_next: int,
    radius: float,
    eta: float,
    max_dist: float,
    sweep_steps: int,
    n_sides: int,
):
    """swept_slot_cost on a mesh whose sign is not a closed surface's (open_swept_sign) and a
    moving step: the same results (every sample takes the plain query; nothing is skipped), with
    p and the samples searched in shared traversals (mesh_closest_points: on a mesh without sign
    data signed as Warp's normal sign signs them, else by robot_sdf's pseudo-normal or the winding
    number at each point found), each point within its plain query's first bound (the winding
    number's r + eta, else max_dist + r + eta). A point found nothing for takes the plain query,
    bounded by its side's last exact distance plus the distance moved (plus Warp's tie tolerance).
    """
    c0 = float(0.0)
    g0 = wp.vec3(0.0, 0.0, 0.0)
    delta = float(0.0)
    own = wp.vec3(0.0, 0.0, 0.0)
    to_prev = wp.vec3(0.0, 0.0, 0.0)
    to_next = wp.vec3(0.0, 0.0, 0.0)
    mask_prev = int(0)
    mask_next = int(0)
    reach_b = radius + eta
    bound = max_dist + reach_b
    half_len = wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next)) * 0.5
    if cull_radius > 0.0:
        if wp.length(p) > cull_radius + bound + half_len:
            return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
    data, method = mesh_sign_method(mesh, sign_method)
    winding = method == SIGN_WINDING_NUMBER and data >= 0
    reach = wp.where(winding, reach_b * REACH_MARGIN + REACH_SLACK, bound)
    inv_2k = 1.0 / (2.0 * float(sweep_steps))
    n_first = wp.min(sweep_steps, SWEPT_SIDE_BATCH)
    batch = vec16()
    tie_margin = warp_tie_margin(mesh)
    side_batch = vec16()
    batch_start = int(0)
    batch_end = int(0)
    inside_lanes = int(0)
    p_abs = float(-1.0)
    last_abs = float(-1.0)
    last_s = float(0.0)
    to_neighbour = wp.vec3(0.0, 0.0, 0.0)
    mask = int(0)
    # The rim shortcut of the winding number (rim_settled_lanes): p's verdict, once known, and what
    # it settles.
    p_known = bool(False)
    p_inside = bool(False)
    p_clearance = float(0.0)
    p_apart = float(0.0)
    slope_prev = float(0.0)
    slope_next = float(0.0)
    settled = int(0)
    p_delta = wp.vec3(0.0, 0.0, 0.0)
    p_dist = float(0.0)
    p_outward = wp.vec3(0.0, 0.0, 0.0)
    # Point 0 is p, then side 0's samples k = 1..K, then side 1's: one evaluation site for all.
    for i in range(2 * sweep_steps + 1):
        side = wp.where(i > sweep_steps, 1, 0)
        k = i - side * sweep_steps
        if i > 0 and ((side == 0 and has_prev == 0) or (side == 1 and has_next == 0)):
            continue
        segment = wp.where(side == 0, seg_prev, seg_next)
        if k == 1:
            # A side starts: its chain of exact distances starts at p.
            batch_start = 0
            batch_end = 0
            last_abs = p_abs
            last_s = 0.0
            to_neighbour = wp.vec3(0.0, 0.0, 0.0)
            mask = 0
        sk = float(k) * inv_2k
        q = p + segment * sk
        # The traversals, at one call site: first p and up to n_first samples a side, then, where
        # a side has more, SWEPT_BATCH more at a time (within the Lipschitz bound from p).
        first = i == 0
        if first or (k > n_first and k >= batch_end):
            n_more = wp.min(sweep_steps + 1, k + SWEPT_BATCH) - k
            fresh = mesh_closest_points(mesh, p, wp.where(first, reach, 0.0), wp.where(first, seg_prev, segment),
                                        wp.where(first, inv_2k, sk), wp.where(first, has_prev * n_first, n_more),
                                        seg_next, inv_2k, wp.where(first, has_next * n_first, 0), inv_2k, reach,
                                        wp.where(first, -1.0, p_abs), False, data < 0)
            if first:
                batch = fresh
                if winding:
                    # The winding numbers of the points found, in shared traversals too, except
                    # where the rim shortcut gives a sample p's verdict.
                    found_lanes = int(0)
                    for j in range(16):
                        if face_of(batch[j]) >= 0:
                            found_lanes = found_lanes | (1 << j)
                    p_face = face_of(batch[0])
                    # No surface within p_apart of p: a sample nearer p reaches it without crossing.
                    p_apart = reach_b
                    if p_face >= 0:
                        p_delta, p_dist, unused_inside, p_outward = closest_feature(mesh, p, p_face, 1.0, data, False)
                        p_apart = p_dist * 0.9999
                    if has_prev != 0:
                        slope_prev = rim_slope(mesh, data, p, 0.5 * wp.length(seg_prev))
                    if has_next != 0:
                        slope_next = rim_slope(mesh, data, p, 0.5 * wp.length(seg_next))
                    wanted = found_lanes
                    if p_face >= 0 or not open_winding_outside(mesh, data, p, reach_b):
                        wanted = -1
                    # p's winding number is evaluated on its own only where it may settle a
                    # sample (a clearance above 1/2 needs nested surfaces).
                    if rim_settled_lanes(has_prev * n_first, has_next * n_first, wp.length(seg_prev),
                                         wp.length(seg_next), inv_2k, p_apart, slope_prev, slope_next,
                                         0.5) & wanted & ~1 != 0:
                        p_inside, p_clearance = winding_clearance(mesh, p)
                        p_known = True
                        settled = rim_settled_lanes(has_prev * n_first, has_next * n_first, wp.length(seg_prev),
                                                    wp.length(seg_next), inv_2k, p_apart, slope_prev, slope_next,
                                                    p_clearance) | 1
                        found_lanes = found_lanes & ~settled
                    inside_lanes = batched_winding_inside(mesh, p, seg_prev, seg_next, inv_2k, has_prev * n_first,
                                                          has_next * n_first, found_lanes)
                    if p_inside:
                        inside_lanes = inside_lanes | settled
            else:
                side_batch = fresh
                batch_start = k
                batch_end = k + n_more
        entry = batch[0]
        lane = int(0)
        in_side_batch = i > 0 and k >= batch_start and k < batch_end
        if in_side_batch:
            entry = side_batch[1 + k - batch_start]
        elif i > 0:
            lane = side * has_prev * n_first + k
            entry = batch[lane]
        face = face_of(entry)
        found = int(0)
        sd = float(0.0)
        grad_sd = wp.vec3(0.0, 0.0, 0.0)
        # p's verdict holds here (the rim shortcut), for a sample of a later batch too.
        as_p = bool(False)
        if p_known:
            if in_side_batch:
                reach_q = sk * wp.length(segment)
                as_p = reach_q < p_apart and reach_q * wp.where(side == 0, slope_prev, slope_next) \
                    + 2.0 * WINDING_APPROXIMATION_ERROR < p_clearance
            else:
                as_p = ((settled >> lane) & 1) != 0
        if face >= 0:
            inside_q = warp_inside(entry)
            if winding:
                if in_side_batch and not as_p:
                    inside_q = wp.where(winding_inside(mesh, q), -1.0, 1.0)
                elif in_side_batch:
                    inside_q = wp.where(p_inside, -1.0, 1.0)
                else:
                    inside_q = wp.where(((inside_lanes >> lane) & 1) != 0, -1.0, 1.0)
            if i == 0 and winding:
                sd, grad_sd = signed_result(p_delta, p_dist, inside_q, p_outward)
            else:
                d_vec, dist, inside, outward = closest_feature(mesh, q, face, inside_q, data,
                                                               data >= 0 and not winding)
                sd, grad_sd = signed_result(d_vec, dist, inside, outward)
            found = 1
        elif as_p and not p_inside:
            # Outside and nothing within r + eta: no cost, as mesh_signed_distance would find.
            found = 0
        else:
            search = bound
            if last_abs >= 0.0:
                # The closest point lies within the last exact distance plus the distance moved,
                # and a bound beyond it by Warp's tie tolerance finds the same one (same sign).
                search = wp.min(search, (last_abs + (sk - last_s) * wp.length(segment)) * REACH_MARGIN
                                + REACH_SLACK + tie_margin)
            found, sd, grad_sd = mesh_signed_distance(mesh, q, search, cull_radius, sign_method, reach_b)
        c = float(0.0)
        g = wp.vec3(0.0, 0.0, 0.0)
        last_abs = -1.0
        if found != 0:
            dc = float(0.0)
            c, dc = penetration_cost(sd, radius, eta)
            g = grad_sd * (-dc)
            last_abs = wp.abs(sd)
        last_s = sk
        if i == 0:
            c0 = c
            g0 = g
            p_abs = last_abs
            continue
        wk = swept_sample_weight(k, sweep_steps, n_sides)
        delta += wk * (c - c0)
        own += g * (wk * (1.0 - sk))
        to_neighbour += g * (wk * sk)
        mask = mask | side_bit(k)
        if k == sweep_steps:
            if side == 0:
                to_prev = to_neighbour
                mask_prev = mask
            else:
                to_next = to_neighbour
                mask_next = mask
    return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next


@wp.func
def open_swept_sign(mesh: wp.uint64, sign_method: int) -> bool:
    """Whether open_swept_slot_cost serves a mesh: its sign is not a closed surface's (swept_slot_cost
    then evaluates every sample) and comes from the closest triangle or the winding number."""
    data, method = mesh_sign_method(mesh, sign_method)
    return (not sign_is_closed(mesh, data)) and (method == SIGN_NORMAL or (method == SIGN_WINDING_NUMBER and data >= 0))


@wp.func
def mask_count(mask: int) -> int:
    count = int(0)
    for bit in range(31):
        if ((mask >> bit) & 1) != 0:
            count += 1
    return count


@wp.kernel(launch_bounds=256)
def swept_sphere_cost_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    speed_dt: wp.array(dtype=wp.float32),
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    env_query: wp.array(dtype=wp.int32),
    use_env_query: int,
    horizon: int,
    spheres_per_step: int,
    sweep_steps: int,
    enable_speed_metric: int,
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
    compute_grad: int,
    count_evaluations: int,
    start: int,
    total: int,
    out_cost: wp.array(dtype=wp.float32),
    out_sparsity: wp.array(dtype=wp.uint8),
    out_own: wp.array(dtype=wp.vec3),
    out_to_prev: wp.array(dtype=wp.vec3),
    out_to_next: wp.array(dtype=wp.vec3),
    out_evaluations: wp.array(dtype=wp.int32),
):
    """Swept cost of step t of each sphere's trajectory (docs/design.md "Swept cost") and its partials.

    cost_t = weight * time-average of the sphere's cost over its slot [mid(t-1, t), p[t],
    mid(t, t+1)], sampled at p[t] and at s_k = k / (2K) of each existing side's segment
    (K = sweep_steps), with the fixed weights of swept_sample_weight. A side exists when the
    neighbour step exists and its sphere is on (radius >= 0). A sample is skipped (cost 0) only
    when its cost is provably 0, mesh by mesh (swept_slot_cost): the signed distance to a mesh is
    1-Lipschitz, so a sample within a mesh's clearance of an evaluated point of the same side
    is not penetrated by that mesh.

    Outputs per sphere (world frame, all scaled by weight; written only when compute_grad):
    out_own = d cost_t / d p[t], out_to_prev = d cost_t / d p[t-1], out_to_next =
    d cost_t / d p[t+1]; a sample at fraction s with weight w and cost gradient g adds
    w (1 - s) g to p[t] and w s g to the neighbour. With the speed metric applied to a step,
    its whole (CHOMP) gradient goes to out_own and both neighbour partials are 0.
    out_evaluations (when count_evaluations): points of the sphere's slot searched for at least
    one mesh (p[t] and the samples not skipped for every mesh).
    """
    tid = wp.tid() + start
    if tid >= total:
        return
    s = spheres[tid]
    p = wp.vec3(s[0], s[1], s[2])
    radius = s[3]
    eta = activation_distance[0]
    max_dist = max_distance[0]
    step = (tid / spheres_per_step) % horizon
    env = query_env(tid, spheres_per_step * horizon, use_env_query, env_query, n_env_mesh.shape[0])
    cost = float(0.0)
    own = wp.vec3(0.0, 0.0, 0.0)
    to_prev = wp.vec3(0.0, 0.0, 0.0)
    to_next = wp.vec3(0.0, 0.0, 0.0)
    evaluations = int(0)
    if radius >= 0.0 and env >= 0:
        has_prev = int(0)
        has_next = int(0)
        if sweep_steps > 0:
            if step > 0 and spheres[tid - spheres_per_step][3] >= 0.0:
                has_prev = 1
            if step < horizon - 1 and spheres[tid + spheres_per_step][3] >= 0.0:
                has_next = 1
        n_sides = has_prev + has_next
        # The cost only needs surfaces within r + eta; a larger search bound only buys clearance,
        # and clearance beyond the farthest sample (half way to a neighbour) frees nothing. So
        # the search reaches max_dist only where a neighbour is that far, which makes queries
        # near surfaces much cheaper. A stationary or isolated step keeps the plain bound, so
        # it reproduces the plain cost bit for bit.
        reach0 = float(0.0)
        for side in range(2):
            if (side == 0 and has_prev == 1) or (side == 1 and has_next == 1):
                sn = spheres[tid + (2 * side - 1) * spheres_per_step]
                reach0 = wp.max(reach0, 0.5 * wp.length(wp.vec3(sn[0], sn[1], sn[2]) - p))
        bound0 = max_dist
        if reach0 > 0.0:
            bound0 = wp.min(max_dist, reach0 * REACH_MARGIN + REACH_SLACK)
        c0 = float(0.0)
        g0 = wp.vec3(0.0, 0.0, 0.0)
        delta = float(0.0)
        mask_prev = int(0)
        mask_next = int(0)
        prev = wp.vec3(0.0, 0.0, 0.0)
        nxt = wp.vec3(0.0, 0.0, 0.0)
        if has_prev == 1:
            sp = spheres[tid - spheres_per_step]
            prev = wp.vec3(sp[0], sp[1], sp[2])
        if has_next == 1:
            sq = spheres[tid + spheres_per_step]
            nxt = wp.vec3(sq[0], sq[1], sq[2])
        # Mesh after mesh (the slot loop of sphere_world_cost), each mesh with all the samples
        # of the step: a sample is skipped per mesh, and the samples of a side share traversals.
        # Slots within reach of any sample of the step (p, the samples up to half way to each
        # neighbour, each searched within max_dist + r + eta at most): through the environment's
        # slot BVH where it has one (swept_slot_cost's own early-out then sees the same slots as
        # the plain loop would let through), else slot after slot. Meshes whose sign is not that
        # of a closed surface search every point to max_dist + r + eta (swept_slot_cost).
        half_len = 0.5 * wp.max(float(has_prev) * wp.length(prev - p), float(has_next) * wp.length(nxt - p))
        # As swept_slot_cost's batched test: a stationary step keeps the plain query of p.
        moving = n_sides > 0 and half_len > 0.0
        slot_reach = max_dist + radius + eta + half_len
        count = wp.min(n_env_mesh[env], mesh_idx.shape[1])
        hits, n_iter, listed = slot_candidates(slot_bvh, env, n_env_mesh.shape[0], count, p, slot_reach)
        for i in range(n_iter):
            slot = candidate_slot(hits, i, listed, count, env, mesh_idx, mesh_enable)
            if slot < 0:
                continue
            t, q = slot_pose(pose_inv, env, slot)
            mesh = wp.uint64(mesh_idx[env, slot])
            slot_method = slot_sign_method(sign_method, slot_sign, env, slot)
            seg_prev = wp.quat_rotate(q, prev - p)
            seg_next = wp.quat_rotate(q, nxt - p)
            c_i = float(0.0)
            g_i = wp.vec3(0.0, 0.0, 0.0)
            delta_i = float(0.0)
            own_i = wp.vec3(0.0, 0.0, 0.0)
            prev_i = wp.vec3(0.0, 0.0, 0.0)
            next_i = wp.vec3(0.0, 0.0, 0.0)
            m_prev = int(0)
            m_next = int(0)
            if moving and open_swept_sign(mesh, slot_method):
                c_i, g_i, delta_i, own_i, prev_i, next_i, m_prev, m_next = open_swept_slot_cost(
                    mesh, pose_inv[env, slot, 7], slot_method, wp.quat_rotate(q, p) + t, seg_prev, seg_next, has_prev,
                    has_next, radius, eta, max_dist, sweep_steps, n_sides,
                )
            else:
                c_i, g_i, delta_i, own_i, prev_i, next_i, m_prev, m_next = swept_slot_cost(
                    mesh, pose_inv[env, slot, 7], slot_method, wp.quat_rotate(q, p) + t, seg_prev, seg_next, has_prev,
                    has_next, radius, eta, max_dist, bound0, sweep_steps, n_sides,
                )
            c0 += c_i
            g0 += wp.quat_rotate_inv(q, g_i)
            delta += delta_i
            own += wp.quat_rotate_inv(q, own_i)
            to_prev += wp.quat_rotate_inv(q, prev_i)
            to_next += wp.quat_rotate_inv(q, next_i)
            mask_prev = mask_prev | m_prev
            mask_next = mask_next | m_next
        if count_evaluations != 0:
            evaluations = 1 + mask_count(mask_prev) + mask_count(mask_next)
        cost = c0
        if n_sides > 0:
            # own holds the samples' partials; p[t] itself weighs 1 / (2K). cost = c0 + sum_k
            # w_k (c_k - c0): equal to sum_k w_k c_k (weights sum to 1), and exactly c0 when
            # every sample sits on p[t] (a stationary trajectory).
            own += g0 * (1.0 / (2.0 * float(sweep_steps)))
            cost = wp.max(c0 + delta, 0.0)
        else:
            own = g0
        w = weight[0]
        cost = cost * w
        own = own * w
        to_prev = to_prev * w
        to_next = to_next * w
        if enable_speed_metric != 0 and cost > 0.0 and step > 0 and step < horizon - 1:
            sp = spheres[tid - spheres_per_step]
            sq = spheres[tid + spheres_per_step]
            prev = wp.vec3(sp[0], sp[1], sp[2])
            nxt = wp.vec3(sq[0], sq[1], sq[2])
            dt = speed_dt[0]
            vel = (nxt - prev) / (2.0 * dt)
            speed = wp.length(vel)
            if speed > MIN_SPEED:
                # CHOMP's functional gradient of the step's cost: its gradient for a common
                # translation of the slot (own + both partials), projected, applied to p[t] only.
                grad = own + to_prev + to_next
                acc = (prev + nxt - 2.0 * p) / (dt * dt)
                v_hat = vel / speed
                kappa = acc / (speed * speed)
                proj_grad = grad - v_hat * wp.dot(v_hat, grad)
                proj_kappa = kappa - v_hat * wp.dot(v_hat, kappa)
                own = (proj_grad - proj_kappa * cost) * speed
                to_prev = wp.vec3(0.0, 0.0, 0.0)
                to_next = wp.vec3(0.0, 0.0, 0.0)
                cost = cost * speed
    out_cost[tid] = cost
    out_sparsity[tid] = wp.where(cost > 0.0, wp.uint8(1), wp.uint8(0))
    if compute_grad != 0:
        out_own[tid] = own
        out_to_prev[tid] = to_prev
        out_to_next[tid] = to_next
    if count_evaluations != 0:
        out_evaluations[tid] = evaluations


# ---------------------------------------------------------------------------------------------
# Second derivatives (double backward, forward-over-reverse): the Hessian of the cost per sphere.


@wp.func
def mesh_sd_hessian(mesh: wp.uint64, p: wp.vec3, sd: float, grad_sd: wp.vec3) -> wp.mat33:
    """Hessian (mesh frame) of one mesh's signed distance at p, from mesh_signed_distance's sd and
    grad_sd: 0 where the closest point lies inside a face, (I - n n^T) / sd at a vertex and
    (I - n n^T - e e^T) / sd on an edge of unit direction e (n = grad_sd). 0 on the surface, where
    it is unbounded. The closest feature is found again from the closest point p - sd n: any face
    holding that point sees the same feature (a shared edge or corner) from p."""
    zero = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    if wp.abs(sd) <= HESSIAN_MIN_DISTANCE:
        return zero
    c = p - grad_sd * sd
    face = int(0)
    u = float(0.0)
    v = float(0.0)
    if not wp.mesh_query_point_no_sign(mesh, c, HESSIAN_MIN_DISTANCE + 1.0e-3 * wp.abs(sd), face, u, v):
        return zero
    delta, dist, feature, face_n = refine_closest(mesh, p, face)
    if feature == 0 or wp.abs(wp.dot(grad_sd, face_n)) >= 1.0 - HESSIAN_FLAT_COSINE:
        # In a face's region, or on its border: there the distance is that to the face's plane
        # on one side at least, and on both above an edge or corner where the faces are flat
        # (the triangles of a planar patch), whose curvature is 0. The float32 tolerance makes
        # this hold within about 1.4 mrad of a face's normal: the wedge of a fold flatter than
        # about 2.8 mrad (tessellation noise) counts as flat.
        return zero
    h = wp.identity(n=3, dtype=float) - wp.outer(grad_sd, grad_sd)
    if feature <= 3:
        # Edges 1, 2, 3 run from corner feature-1 to corner feature % 3 of the face.
        m = wp.mesh_get(mesh)
        e = wp.normalize(m.points[m.indices[face * 3 + feature % 3]] - m.points[m.indices[face * 3 + feature - 1]])
        h = h - wp.outer(e, e)
    return h * (1.0 / sd)


@wp.func
def to_world_hessian(q: wp.quat, h: wp.mat33) -> wp.mat33:
    """R^T h R for p_mesh = R p + t: the world-frame Hessian of a mesh-frame one."""
    r = wp.quat_to_matrix(q)
    return wp.transpose(r) * h * r


@wp.func
def sphere_world_hessian(
    p: wp.vec3,
    radius: float,
    eta: float,
    max_dist: float,
    env: int,
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
) -> wp.mat33:
    """World-frame Hessian of sphere_world_cost's (unweighted) cost: per mesh with d = r + eta - sd > 0,
    c''(d) n n^T - c'(d) H_sd (d d / d p = -n; c' = d / eta, c'' = 1 / eta below eta, else 1, 0).
    Visits the slots sphere_world_cost visits (slot BVH where the world has one)."""
    hess = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    bound = max_dist + radius + eta
    count = wp.min(n_env_mesh[env], mesh_idx.shape[1])
    hits, n_iter, listed = slot_candidates(slot_bvh, env, n_env_mesh.shape[0], count, p, bound)
    for i in range(n_iter):
        slot = candidate_slot(hits, i, listed, count, env, mesh_idx, mesh_enable)
        if slot < 0:
            continue
        t, q = slot_pose(pose_inv, env, slot)
        p_mesh = wp.quat_rotate(q, p) + t
        mesh = wp.uint64(mesh_idx[env, slot])
        found, sd, grad_sd = mesh_signed_distance(
            mesh, p_mesh, bound, pose_inv[env, slot, 7], slot_sign_method(sign_method, slot_sign, env, slot),
            radius + eta)
        d = radius + eta - sd
        if found == 0 or d <= 0.0:
            continue
        dcost = float(1.0)
        ddcost = float(0.0)
        if d <= eta:
            dcost = d / eta
            ddcost = 1.0 / eta
        h = wp.outer(grad_sd, grad_sd) * ddcost - mesh_sd_hessian(mesh, p_mesh, sd, grad_sd) * dcost
        hess += to_world_hessian(q, h)
    return hess


@wp.func
def point_world_esdf_hessian(
    p: wp.vec3,
    max_dist: float,
    env: int,
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
) -> wp.mat33:
    """World-frame Hessian of point_world_esdf's max_i(-sd_i): -H_sd of the mesh attaining it
    (the slots point_world_esdf visits)."""
    best = -max_dist
    hess = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    count = wp.min(n_env_mesh[env], mesh_idx.shape[1])
    hits, n_iter, listed = slot_candidates(slot_bvh, env, n_env_mesh.shape[0], count, p, max_dist)
    for i in range(n_iter):
        slot = candidate_slot(hits, i, listed, count, env, mesh_idx, mesh_enable)
        if slot < 0:
            continue
        t, q = slot_pose(pose_inv, env, slot)
        p_mesh = wp.quat_rotate(q, p) + t
        mesh = wp.uint64(mesh_idx[env, slot])
        found, sd, grad_sd = mesh_signed_distance(
            mesh, p_mesh, max_dist, pose_inv[env, slot, 7], slot_sign_method(sign_method, slot_sign, env, slot),
            max_dist)
        if found != 0 and -sd > best:
            best = -sd
            hess = to_world_hessian(q, -mesh_sd_hessian(mesh, p_mesh, sd, grad_sd))
    return hess


@wp.kernel
def sphere_hessian_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    env_query: wp.array(dtype=wp.int32),
    use_env_query: int,
    spheres_per_batch: int,
    sign_method: int,
    slot_sign: wp.array2d(dtype=wp.uint8),
    slot_bvh: wp.array(dtype=wp.uint64),
    compute_esdf: int,
    start: int,
    total: int,
    out_hessian: wp.array(dtype=wp.mat33),
):
    """d^2 out_cost / d p^2 (world frame, weighted) of sphere_cost_kernel's value, per sphere."""
    tid = wp.tid() + start
    if tid >= total:
        return
    s = spheres[tid]
    p = wp.vec3(s[0], s[1], s[2])
    hess = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    env = query_env(tid, spheres_per_batch, use_env_query, env_query, n_env_mesh.shape[0])
    if compute_esdf != 0:
        if env >= 0:
            hess = point_world_esdf_hessian(p, max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh,
                                            sign_method, slot_sign, slot_bvh)
    elif s[3] >= 0.0 and env >= 0:
        hess = sphere_world_hessian(p, s[3], activation_distance[0], max_distance[0], env, mesh_idx, pose_inv,
                                    mesh_enable, n_env_mesh, sign_method, slot_sign, slot_bvh)
    out_hessian[tid] = hess * weight[0]
