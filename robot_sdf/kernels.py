"""Warp kernels: sphere-vs-mesh collision cost, swept cost and signed distance.

One thread per sphere. Every kernel writes every output element it owns, so callers may hand in
uninitialised buffers. Gradients are analytic, so no Warp adjoint code is generated.

Layout (flattened from the torch tensors of design.md section 3):
    spheres      (N,) vec4    x, y, z, radius in the world frame; N = b * h * n
    mesh_idx     (E, M) int64 Warp mesh ids
    pose_inv     (E, M, 8)    world->mesh x, y, z, qw, qx, qy, qz, bounding radius (0 = unknown)
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

# Search radius for the closest point of a centre known to be inside a mesh: unbounded in practice.
UNBOUNDED = wp.constant(1.0e9)
# Below this length the direction centre - closest point is meaningless; use the face normal.
DEGENERATE_LENGTH = wp.constant(1.0e-9)
# Oblique direction so that a parity ray rarely grazes an axis-aligned edge of a CAD mesh.
PARITY_RAY = wp.constant(wp.vec3(0.5773, 0.5774, 0.5775))
MIN_SPEED = wp.constant(1.0e-3)


@wp.func
def face_normal(mesh: wp.uint64, face: int) -> wp.vec3:
    m = wp.mesh_get(mesh)
    a = m.points[m.indices[face * 3 + 0]]
    b = m.points[m.indices[face * 3 + 1]]
    c = m.points[m.indices[face * 3 + 2]]
    return wp.normalize(wp.cross(b - a, c - a))


@wp.func
def query_closest(mesh: wp.uint64, p: wp.vec3, bound: float, sign_method: int):
    """Closest point within ``bound`` with the sign of ``sign_method``: (hit, inside < 0, face, u, v)."""
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
    the mesh is always found, however far it is from the surface.
    """
    found = int(0)
    sd = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    centre_dist = wp.length(p)
    if bounding_radius > 0.0 and centre_dist > bounding_radius + bound:
        return found, sd, grad

    hit, inside, face, u, v = query_closest(mesh, p, bound, sign_method)
    if not hit:
        # Nothing within bound: outside, unless the centre lies deep inside the mesh. That case
        # must still pay its full cost, so look for it cheaply (crossing parity of two opposite
        # rays; either odd = maybe inside, robust to one ray grazing a shared edge) and confirm
        # with the world's own sign method searched without a bound, so that an open mesh is
        # not called "inside" by parity alone.
        if bounding_radius > 0.0 and centre_dist > bounding_radius:
            return found, sd, grad
        if sign_method != SIGN_WINDING_NUMBER:
            forward = wp.mesh_query_ray_count_intersections(mesh, p, PARITY_RAY)
            backward = wp.mesh_query_ray_count_intersections(mesh, p, -PARITY_RAY)
            if forward % 2 == 0 and backward % 2 == 0:
                return found, sd, grad
        hit, inside, face, u, v = query_closest(mesh, p, UNBOUNDED, sign_method)
        if not hit or inside >= 0.0:
            return found, sd, grad

    closest = wp.mesh_eval_position(mesh, face, u, v)
    delta = p - closest
    dist = wp.length(delta)
    sign = wp.where(inside < 0.0, -1.0, 1.0)
    found = 1
    sd = sign * dist
    if dist > DEGENERATE_LENGTH:
        grad = delta * (sign / dist)
    else:
        grad = face_normal(mesh, face)
    return found, sd, grad


@wp.func
def slot_pose(pose_inv: wp.array3d(dtype=wp.float32), env: int, slot: int):
    t = wp.vec3(pose_inv[env, slot, 0], pose_inv[env, slot, 1], pose_inv[env, slot, 2])
    # wp.quat stores x, y, z, w; the tensor layout is w, x, y, z.
    q = wp.quat(pose_inv[env, slot, 4], pose_inv[env, slot, 5], pose_inv[env, slot, 6], pose_inv[env, slot, 3])
    return t, q


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
            wp.uint64(mesh_idx[env, slot]), p_mesh, bound, pose_inv[env, slot, 7], sign_method
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
            wp.uint64(mesh_idx[env, slot]), p_mesh, max_dist, pose_inv[env, slot, 7], sign_method
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
            cost, grad = point_world_esdf(p, max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method)
    elif s[3] >= 0.0 and env >= 0:
        clearance = float(0.0)
        cost, grad, clearance = sphere_world_cost(
            p, s[3], activation_distance[0], max_distance[0], env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method
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
        c0 = float(0.0)
        g0 = wp.vec3(0.0, 0.0, 0.0)
        clearance0 = float(0.0)
        c0, g0, clearance0 = sphere_world_cost(
            p, radius, eta, max_dist, env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method
        )
        evaluations = int(1)
        has_prev = int(0)
        has_next = int(0)
        if sweep_steps > 0:
            if step > 0 and spheres[tid - spheres_per_step][3] >= 0.0:
                has_prev = 1
            if step < horizon - 1 and spheres[tid + spheres_per_step][3] >= 0.0:
                has_next = 1
        n_sides = has_prev + has_next
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
                        q, radius, eta, max_dist, env, mesh_idx, pose_inv, mesh_enable, n_env_mesh, sign_method
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
