"""Warp kernels: sphere-vs-mesh collision cost, swept cost and signed distance.

One thread per sphere. Every kernel writes every output element it owns, so callers may hand in
uninitialised buffers. Gradients are analytic, so no Warp adjoint code is generated.

Layout (flattened from the torch tensors of design.md section 3):
    spheres      (N,) vec4    x, y, z, radius in the world frame; N = b * h * n
    mesh_idx     (E, M) int64 Warp mesh ids
    pose_inv     (E, M, 8)    world->mesh x, y, z, qw, qx, qy, qz, cull radius (0 = unknown): no
                              surface and no inside point farther than it from the mesh origin
    sign_method, slot_sign    a SignMethod for every slot, AUTO (each mesh's own, from its sign
                              data), or PER_SLOT: read slot_sign (E, M) uint8
    mesh_enable  (E, M) uint8
    n_env_mesh   (E,) int32
    env_query    (B,) int32   environment per batch row (read only when use_env_query != 0)
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
# The inside test (winding_inside) evaluates the winding number in tiers of rising accuracy and
# settles the sign at the first tier that is clear of the threshold by its margin; the last tier
# is WINDING_ACCURACY, so the sign is Warp's own wherever each coarse accuracy stays within its
# margin of it. Measured over 3 M points in, around and near every hard-mesh corpus mesh and the
# perception scan of bench/core_bench.py (docs/sign_methods.md; test/sign_test.py checks half
# the margin): accuracy 1.5 differed from 2.0 by at most 0.043 (capsule; margin 0.15, a safety
# factor of 3.5), accuracy 1.25 by at most 0.084 (sliver box; capsule 0.083, perception scan
# 0.070; margin 0.25, a factor of 3). Accuracy 1.0 is no option: it differed by up to 0.78.
# Per evaluation 1.25 costs about 60 % of 1.5 near a surface and 70 % in free space around the
# perception scan, where every free-space sphere within the winding radius pays one.
COARSEST_WINDING_ACCURACY = wp.constant(1.25)
COARSEST_WINDING_SETTLED = wp.constant(0.25)
COARSE_WINDING_ACCURACY = wp.constant(1.5)
WINDING_SETTLED = wp.constant(0.15)
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
# Largest excess distance (m) of the triangle Warp's float32 search picks on a sliver mesh over
# the closest one: farther out the float64 re-search looks near the point found only.
SLIVER_PICK_ERROR = wp.constant(1.0e-4)


@wp.func_native("""return wp::mesh_query_winding_number(mesh, p, accuracy);""")
def winding_number(mesh: wp.uint64, p: wp.vec3, accuracy: float) -> float:
    """Warp's fast generalised winding number of p (the mesh must support winding numbers);
    called directly so that an inside test far from the surface needs no closest-point search."""
    ...


@wp.func
def winding_inside(mesh: wp.uint64, p: wp.vec3) -> bool:
    """Warp's winding-number sign (inside above WINDING_THRESHOLD at WINDING_ACCURACY), from the
    coarsest evaluation that is clear of the threshold by its margin."""
    # One loop over the tiers, so that Warp's traversal is inlined once (not three times) into
    # the large CPU kernels; the last tier has no margin and always decides.
    accuracy = COARSEST_WINDING_ACCURACY
    margin = COARSEST_WINDING_SETTLED
    while True:
        w = winding_number(mesh, p, accuracy)
        if w < WINDING_THRESHOLD - margin:
            return False
        if w > WINDING_THRESHOLD + margin:
            return True
        if margin == 0.0:
            return False
        if accuracy == COARSEST_WINDING_ACCURACY:
            accuracy = COARSE_WINDING_ACCURACY
            margin = WINDING_SETTLED
        else:
            accuracy = WINDING_ACCURACY
            margin = 0.0
    return False


@wp.func
def sign_data_offset(mesh: wp.uint64) -> int:
    """Index of the bounding box entry in robot_sdf's sign data (mesh_analysis module docstring),
    or -1 for a mesh built elsewhere (then Warp's own sign queries are used)."""
    m = wp.mesh_get(mesh)
    base = m.points.shape[0] + m.indices.shape[0]
    if m.velocities.shape[0] != base + 5:
        return -1
    if m.velocities[base + 2][0] != SIGN_DATA_MAGIC:
        return -1
    return base


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
def mesh_signed_distance(mesh: wp.uint64, p: wp.vec3, bound: float, bounding_radius: float, sign_method: int):
    """Signed distance of mesh-frame point p to one mesh, searched up to ``bound`` outside.

    Returns (found, sd, grad_sd): found = 0 when the point is outside and no surface is within
    ``bound``; otherwise sd < 0 inside and grad_sd = d sd / d p (unit, mesh frame). A point inside
    the mesh is always found, however far it is from the surface: where nothing is within
    ``bound`` and the point lies in the mesh's bounding box, the method's own inside test runs
    without a bound (the fast winding number directly for winding_number).

    The distance and its direction are re-evaluated in float64 on the triangle found, relative
    to its first corner. With robot_sdf's sign data, ``normal`` is the angle-weighted pseudo-normal
    of the closest feature (Baerentzen & Aanaes), exact wherever faces tie.
    """
    found = int(0)
    sd = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    centre_dist = wp.length(p)
    if bounding_radius > 0.0 and centre_dist > bounding_radius + bound:
        return found, sd, grad
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
    pseudo = method == SIGN_NORMAL and data >= 0
    # The winding-number method of robot_sdf's sign data (the mesh supports winding numbers:
    # checked above).
    winding = method == SIGN_WINDING_NUMBER and data >= 0

    inside = float(1.0)
    face = int(0)
    u = float(0.0)
    v = float(0.0)
    hit = bool(False)
    # Warp's unsigned query serves `normal` and `winding_number`; the winding number itself is
    # evaluated at one call site below for hits and deep centres alike (each inlined copy of
    # Warp's traversal costs instruction cache in this one large CPU kernel).
    if pseudo or winding:
        hit = wp.mesh_query_point_no_sign(mesh, p, bound, face, u, v)
    else:
        hit, inside, face, u, v = query_closest(mesh, p, bound, method)
    deep = bool(False)
    if not hit:
        # Nothing within bound: outside, unless the point is deep inside. Only a point in the
        # mesh's bounding box can be; the method's own test decides, without a bound.
        if data >= 0:
            lo = m.velocities[data]
            hi = m.velocities[data + 1]
            winding_info = m.velocities[data + 3]
            if winding and winding_info[1] == 0.0:
                # Not a closed surface: its winding number may pass 0.5 outside the box, but
                # |w| <= A / (4 pi d^2) with d the distance to the surface, which is at least
                # the search bound and at least the distance to the box.
                if centre_dist > winding_info[0]:
                    return found, sd, grad
                box_gap = wp.length(wp.max(wp.max(lo - p, p - hi), wp.vec3(0.0, 0.0, 0.0)))
                far = wp.max(bound, box_gap)
                if m.velocities[data + 4][0] < 2.0 * wp.pi * far * far:
                    return found, sd, grad
            elif p[0] < lo[0] or p[1] < lo[1] or p[2] < lo[2] or p[0] > hi[0] or p[1] > hi[1] or p[2] > hi[2]:
                return found, sd, grad
        elif bounding_radius > 0.0 and centre_dist > bounding_radius:
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
            # Closed shell: the first surface a ray meets is entered from outside (front face)
            # or left from inside (back face). A hit near an edge, where a ray may only graze,
            # leaves it to the exact closest-feature test below.
            t_hit = float(0.0)
            bu = float(0.0)
            bv = float(0.0)
            ray_sign = float(0.0)
            ray_n = wp.vec3(0.0, 0.0, 0.0)
            ray_face = int(0)
            if not wp.mesh_query_ray(mesh, p, INSIDE_RAY, UNBOUNDED, t_hit, bu, bv, ray_sign, ray_n, ray_face):
                return found, sd, grad
            if wp.min(wp.min(bu, bv), 1.0 - bu - bv) > EDGE_MARGIN:
                if wp.dot(INSIDE_RAY, ray_n) <= 0.0:
                    return found, sd, grad
                # Inside: the closest surface point is no farther than the hit.
                search = t_hit * 1.001 + 1.0e-6
        if pseudo or winding:
            hit = wp.mesh_query_point_no_sign(mesh, p, search, face, u, v)
        else:
            hit, inside, face, u, v = query_closest(mesh, p, UNBOUNDED, method)
        if not hit:
            return found, sd, grad

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
    if deep and inside >= 0.0:
        return found, sd, grad
    sign = wp.where(inside < 0.0, -1.0, 1.0)
    found = 1
    sd = sign * dist
    if dist > DEGENERATE_LENGTH:
        grad = delta * (sign / dist)
    else:
        grad = outward
    return found, sd, grad


@wp.func
def slot_pose(pose_inv: wp.array3d(dtype=wp.float32), env: int, slot: int):
    t = wp.vec3(pose_inv[env, slot, 0], pose_inv[env, slot, 1], pose_inv[env, slot, 2])
    # wp.quat stores x, y, z, w; the tensor layout is w, x, y, z.
    q = wp.quat(pose_inv[env, slot, 4], pose_inv[env, slot, 5], pose_inv[env, slot, 6], pose_inv[env, slot, 3])
    return t, q


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
):
    """Unweighted cost of one sphere summed over the meshes of ``env``, its world-frame gradient,
    and the clearance max(min_i sd_i - r - eta, 0) (= max_dist when no surface is in range)."""
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    bound = max_dist + radius + eta
    min_sd = bound
    for slot in range(wp.min(n_env_mesh[env], mesh_idx.shape[1])):
        if mesh_enable[env, slot] == wp.uint8(0) or mesh_idx[env, slot] == wp.int64(0):
            continue
        t, q = slot_pose(pose_inv, env, slot)
        p_mesh = wp.quat_rotate(q, p) + t
        found, sd, grad_sd = mesh_signed_distance(
            wp.uint64(mesh_idx[env, slot]), p_mesh, bound, pose_inv[env, slot, 7],
            slot_sign_method(sign_method, slot_sign, env, slot),
        )
        if found == 0:
            continue
        min_sd = wp.min(min_sd, sd)
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
    clearance = wp.max(min_sd - radius - eta, 0.0)
    return cost, grad, clearance


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
):
    """max_i(-sd_i) over the meshes of ``env`` (-max_dist when none is in range) and its gradient."""
    best = -max_dist
    grad = wp.vec3(0.0, 0.0, 0.0)
    for slot in range(wp.min(n_env_mesh[env], mesh_idx.shape[1])):
        if mesh_enable[env, slot] == wp.uint8(0) or mesh_idx[env, slot] == wp.int64(0):
            continue
        t, q = slot_pose(pose_inv, env, slot)
        p_mesh = wp.quat_rotate(q, p) + t
        found, sd, grad_sd = mesh_signed_distance(
            wp.uint64(mesh_idx[env, slot]), p_mesh, max_dist, pose_inv[env, slot, 7],
            slot_sign_method(sign_method, slot_sign, env, slot),
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


@wp.kernel
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
            cost, grad = point_world_esdf(p, max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method, slot_sign)
    elif s[3] >= 0.0 and env >= 0:
        clearance = float(0.0)
        cost, grad, clearance = sphere_world_cost(
            p, s[3], activation_distance[0], max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method, slot_sign
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


@wp.kernel
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
    """Swept cost of step t of each sphere's trajectory (design.md section 4) and its partials.

    cost_t = weight * time-average of the sphere's cost over its slot [mid(t-1, t), p[t],
    mid(t, t+1)], sampled at p[t] and at s_k = k / (2K) of each existing side's segment
    (K = sweep_steps), with the fixed weights of swept_sample_weight. A side exists when the
    neighbour step exists and its sphere is on (radius >= 0). A sample is skipped (cost 0) only
    when it lies strictly within the clearance of a point already evaluated on the same side:
    the signed distance is 1-Lipschitz, so its penetration is <= 0 there.

    Outputs per sphere (world frame, all scaled by weight; written only when compute_grad):
    out_own = d cost_t / d p[t], out_to_prev = d cost_t / d p[t-1], out_to_next =
    d cost_t / d p[t+1]; a sample at fraction s with weight w and cost gradient g adds
    w (1 - s) g to p[t] and w s g to the neighbour. With the speed metric applied to a step,
    its whole (CHOMP) gradient goes to out_own and both neighbour partials are 0.
    out_evaluations (when count_evaluations): sphere_world_cost calls made for the sphere.
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
        clearance0 = float(0.0)
        c0, g0, clearance0 = sphere_world_cost(
            p, radius, eta, bound0, env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method, slot_sign
        )
        evaluations = int(1)
        cost = c0
        own = g0
        if n_sides > 0:
            inv_2k = 1.0 / (2.0 * float(sweep_steps))
            own = g0 * inv_2k
            # cost = c0 + sum_i w_i (c_i - c0): equal to sum_i w_i c_i (weights sum to 1), and
            # exactly c0 when every sample sits on p[t] (a stationary trajectory).
            delta = float(0.0)
            for side in range(2):
                if (side == 0 and has_prev == 0) or (side == 1 and has_next == 0):
                    continue
                sn = spheres[tid + (2 * side - 1) * spheres_per_step]
                segment = wp.vec3(sn[0], sn[1], sn[2]) - p
                seg_len = wp.length(segment)
                # Farthest fraction-times-length proven free so far: an evaluated point at
                # s_e with clearance c_e frees every later sample with s L < s_e L + c_e.
                free_reach = clearance0
                to_neighbour = wp.vec3(0.0, 0.0, 0.0)
                for k in range(1, sweep_steps + 1):
                    sk = float(k) * inv_2k
                    wk = swept_sample_weight(k, sweep_steps, n_sides)
                    if sk * seg_len < free_reach:
                        delta -= wk * c0
                        continue
                    q = p + segment * sk
                    ck = float(0.0)
                    gk = wp.vec3(0.0, 0.0, 0.0)
                    clearance_k = float(0.0)
                    ck, gk, clearance_k = sphere_world_cost(
                        q, radius, eta, wp.min(max_dist, (0.5 - sk) * seg_len * REACH_MARGIN + REACH_SLACK), env, mesh_idx, pose_inv, mesh_enable,
                        n_env_mesh, sign_method, slot_sign
                    )
                    evaluations += 1
                    free_reach = wp.max(free_reach, sk * seg_len + clearance_k)
                    delta += wk * (ck - c0)
                    own += gk * (wk * (1.0 - sk))
                    to_neighbour += gk * (wk * sk)
                if side == 0:
                    to_prev = to_neighbour
                else:
                    to_next = to_neighbour
            cost = wp.max(c0 + delta, 0.0)
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
