"""The swept cost (docs/design.md "Swept cost") per sphere and step of a trajectory.

Each step pays the time-average of the sphere's cost over its slot of the trajectory, mesh after
mesh of its environment (swept_slot: swept_slot_cost, or open_swept_slot_cost for moving steps on
meshes whose sign is not a closed surface's), plus the optional CHOMP speed metric. The kernel
writes every output element it owns; gradients are analytic.

Layout (flattened from the torch tensors of docs/design.md "Tensor layouts"; the world, its
tensors and the call's sign selection, in one slot_walk.World struct as slot_walk's docstring
describes it):
    spheres      (N,) vec4    x, y, z, radius in the world frame (m); N = b * h * n, step-major
                              within a batch row: sphere j of step t at (row * h + t) * n + j
    env_query    (B,) int32   environment per batch row (read only when use_env_query != 0)
Scalars that live in tensors (weight, activation distance, max distance, dt) are read in-kernel
from 1-element arrays so that no host-device synchronisation is needed.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.signed_distance import (REACH_MARGIN, REACH_SLACK, mesh_sign_method, out_of_reach,
                                               sign_is_closed, widened)
from robot_sdf.kernels.slot_walk import World, env_slots, query_env, slot_at, slot_sign_method, thread_spheres
from robot_sdf.kernels.swept_slot import SweptSlotResult, open_swept_sign, open_swept_slot_cost, swept_slot_cost

wp.set_module_options({"enable_backward": False})

# Below this speed (m/s) the speed metric leaves a step's cost and gradient as they are.
MIN_SPEED = wp.constant(1.0e-3)


@wp.func
def mask_count(mask: int) -> int:
    """Number of samples in a side's evaluation mask (bits 0..30 set)."""
    count = int(0)
    for bit in range(31):
        if ((mask >> bit) & 1) != 0:
            count += 1
    return count


@wp.func
def sphere_at(spheres: wp.array(dtype=wp.vec4), i: int) -> wp.vec3:
    """Centre of sphere i."""
    s = spheres[i]
    return wp.vec3(s[0], s[1], s[2])


@wp.func
def step_neighbours(spheres: wp.array(dtype=wp.vec4), tid: int, step: int, horizon: int, spheres_per_step: int,
                    sweep_steps: int):
    """(has_prev, has_next, prev, nxt) of sphere tid at step ``step`` of its trajectory: whether each
    side of its slot exists (the neighbouring step exists, its sphere is on and sweep_steps > 0) and
    the neighbours' centres (0 where the side does not exist)."""
    has_prev = int(0)
    has_next = int(0)
    if sweep_steps > 0:
        if step > 0 and spheres[tid - spheres_per_step][3] >= 0.0:
            has_prev = 1
        if step < horizon - 1 and spheres[tid + spheres_per_step][3] >= 0.0:
            has_next = 1
    prev = wp.vec3(0.0, 0.0, 0.0)
    nxt = wp.vec3(0.0, 0.0, 0.0)
    if has_prev == 1:
        prev = sphere_at(spheres, tid - spheres_per_step)
    if has_next == 1:
        nxt = sphere_at(spheres, tid + spheres_per_step)
    return has_prev, has_next, prev, nxt


@wp.func
def closed_search_bound(half_len: float, max_dist: float) -> float:
    """swept_slot_cost's bound0: how far (besides r + eta) p is searched on a mesh whose sign is a
    closed surface's, for a step whose farthest sample is ``half_len`` (m) from p. The cost only
    needs surfaces within r + eta; a larger bound only buys clearance, and clearance beyond the
    farthest sample frees nothing, so the search reaches max_dist only where a neighbour is that
    far, which makes queries near surfaces much cheaper. A stationary or isolated step keeps the
    plain bound (max_dist), so it reproduces the plain cost bit for bit."""
    if half_len > 0.0:
        return wp.min(max_dist, half_len * REACH_MARGIN + REACH_SLACK)
    return max_dist


@wp.func
def swept_step_cost(p: wp.vec3, prev: wp.vec3, nxt: wp.vec3, has_prev: int, has_next: int, radius: float,
                    eta: float, max_dist: float, sweep_steps: int, env: int, world: World) -> SweptSlotResult:
    """Unweighted swept cost of one step over the meshes of ``env``, summed mesh by mesh (the slot
    loop of sphere_world_cost), each mesh with all the samples of the step: a sample is skipped
    per mesh, and the samples of a side share traversals (swept_slot_cost, or
    open_swept_slot_cost for a moving step on a mesh whose sign is not a closed surface's).

    Returns the meshes' SweptSlotResults summed, in the world frame (the masks or-ed). The slots
    visited are those within reach of any sample of the step (p, the samples up to half way to
    each neighbour, each searched within max_dist + r + eta at most): through the environment's
    slot BVH where it has one (swept_slot_cost's own early-out then sees the same slots as the
    plain loop would let through), else slot after slot."""
    n_sides = has_prev + has_next
    # Every sample lies within half the longer segment of p.
    half_len = 0.5 * wp.max(float(has_prev) * wp.length(prev - p), float(has_next) * wp.length(nxt - p))
    bound0 = closed_search_bound(half_len, max_dist)
    total = SweptSlotResult()
    # As swept_slot_cost's batched test: a stationary step keeps the plain query of p.
    moving = n_sides > 0 and half_len > 0.0
    slot_reach = max_dist + radius + eta + half_len
    slots = env_slots(env, p, slot_reach, world)
    for i in range(slots.iterations):
        slot, q, p_mesh = slot_at(slots, i, env, p, world)
        if slot < 0:
            continue
        mesh = wp.uint64(world.mesh_idx[env, slot])
        slot_method = slot_sign_method(world, env, slot)
        cull_radius = world.pose_inv[env, slot, 7]
        # The test the slot costs start with (on a closed surface swept_slot_cost searches p within
        # bound0 + r + eta, open surfaces within max_dist + r + eta), made before the segments are
        # rotated into the mesh frame and the results back.
        data, method = mesh_sign_method(mesh, slot_method)
        reach = wp.where(sign_is_closed(mesh, data), bound0 + radius + eta + half_len, slot_reach)
        if out_of_reach(mesh, data, cull_radius, p_mesh, widened(reach)):
            continue
        seg_prev = wp.quat_rotate(q, prev - p)
        seg_next = wp.quat_rotate(q, nxt - p)
        share = SweptSlotResult()
        if moving and open_swept_sign(mesh, slot_method):
            share = open_swept_slot_cost(
                mesh, cull_radius, slot_method, p_mesh, seg_prev, seg_next, has_prev,
                has_next, radius, eta, max_dist, sweep_steps, n_sides,
            )
        else:
            share = swept_slot_cost(
                mesh, cull_radius, slot_method, p_mesh, seg_prev, seg_next, has_prev,
                has_next, radius, eta, max_dist, bound0, sweep_steps, n_sides,
            )
        # The share's vectors are in the mesh frame: rotated back to the world's.
        total.centre_cost += share.centre_cost
        total.centre_grad += wp.quat_rotate_inv(q, share.centre_grad)
        total.sample_delta += share.sample_delta
        total.own += wp.quat_rotate_inv(q, share.own)
        total.to_prev += wp.quat_rotate_inv(q, share.to_prev)
        total.to_next += wp.quat_rotate_inv(q, share.to_next)
        total.mask_prev = total.mask_prev | share.mask_prev
        total.mask_next = total.mask_next | share.mask_next
    return total


@wp.func
def speed_metric(p: wp.vec3, prev: wp.vec3, nxt: wp.vec3, dt: float, cost: float, own: wp.vec3, to_prev: wp.vec3,
                 to_next: wp.vec3):
    """(cost, own, to_prev, to_next) of an inner step with the CHOMP speed metric applied
    (docs/design.md "Swept cost"): unchanged below MIN_SPEED, else the cost times the speed and
    its functional gradient (of the step's gradient for a common translation of its slot,
    projected) on p[t] alone, the neighbour partials 0."""
    vel = (nxt - prev) / (2.0 * dt)
    speed = wp.length(vel)
    if speed > MIN_SPEED:
        grad = own + to_prev + to_next
        acc = (prev + nxt - 2.0 * p) / (dt * dt)
        v_hat = vel / speed
        kappa = acc / (speed * speed)
        proj_grad = grad - v_hat * wp.dot(v_hat, grad)
        proj_kappa = kappa - v_hat * wp.dot(v_hat, kappa)
        return cost * speed, (proj_grad - proj_kappa * cost) * speed, wp.vec3(0.0, 0.0, 0.0), wp.vec3(0.0, 0.0, 0.0)
    return cost, own, to_prev, to_next


@wp.kernel(launch_bounds=256, module="robot_sdf.kernels")  # the package's one Warp module (see there)
def swept_sphere_cost_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    speed_dt: wp.array(dtype=wp.float32),
    world: World,
    env_query: wp.array(dtype=wp.int32),
    use_env_query: int,
    horizon: int,
    spheres_per_step: int,
    sweep_steps: int,
    enable_speed_metric: int,
    compute_grad: int,
    count_evaluations: int,
    start: int,
    total: int,
    out_cost: wp.array(dtype=wp.float32),
    out_sparsity: wp.array(dtype=wp.uint8),
    out_partials: wp.array(dtype=wp.vec4),
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

    Partials (world frame, scaled by weight; written only when compute_grad): a sample at
    fraction s with weight w and cost gradient g adds w (1 - s) g to d cost_t / d p[t] and w s g
    to the partial towards its neighbour step. out_partials (3 * total) holds them by the step they
    are taken at (robot_sdf.warp_primitives.Query.swept: row k of sphere i, at k * total + i,
    is d cost of step(i) - 1 + k / d p of sphere i, radius component 0): each sphere's step writes
    its own row 1, row 2 of its previous step and row 0 of its next one, and at the trajectory's ends the
    row that no neighbour writes (0). With the speed metric applied to a step, its whole (CHOMP)
    gradient goes to d cost_t / d p[t] and both neighbour partials are 0.
    out_evaluations (when count_evaluations): points of the sphere's slot searched for at least
    one mesh (p[t] and the samples not skipped for every mesh).
    """
    first, end = thread_spheres(wp.tid(), start, total)
    for tid in range(first, end):
        s = spheres[tid]
        p = wp.vec3(s[0], s[1], s[2])
        radius = s[3]
        step = (tid / spheres_per_step) % horizon
        env = query_env(tid, spheres_per_step * horizon, use_env_query, env_query, world.n_env_mesh.shape[0])
        cost = float(0.0)
        own = wp.vec3(0.0, 0.0, 0.0)
        to_prev = wp.vec3(0.0, 0.0, 0.0)
        to_next = wp.vec3(0.0, 0.0, 0.0)
        evaluations = int(0)
        if radius >= 0.0 and env >= 0:
            has_prev, has_next, prev, nxt = step_neighbours(spheres, tid, step, horizon, spheres_per_step, sweep_steps)
            step_cost = swept_step_cost(p, prev, nxt, has_prev, has_next, radius, activation_distance[0],
                                        max_distance[0], sweep_steps, env, world)
            if count_evaluations != 0:
                evaluations = 1 + mask_count(step_cost.mask_prev) + mask_count(step_cost.mask_next)
            c0 = step_cost.centre_cost
            g0 = step_cost.centre_grad
            own = step_cost.own
            to_prev = step_cost.to_prev
            to_next = step_cost.to_next
            cost = c0
            if has_prev + has_next > 0:
                # own holds the samples' partials; p[t] itself weighs 1 / (2K). cost = c0 + sum_k
                # w_k (c_k - c0): equal to sum_k w_k c_k (weights sum to 1), and exactly c0 when
                # every sample sits on p[t] (a stationary trajectory).
                own += g0 * (1.0 / (2.0 * float(sweep_steps)))
                cost = wp.max(c0 + step_cost.sample_delta, 0.0)
            else:
                own = g0
            w = weight[0]
            cost = cost * w
            own = own * w
            to_prev = to_prev * w
            to_next = to_next * w
            if enable_speed_metric != 0 and cost > 0.0 and step > 0 and step < horizon - 1:
                cost, own, to_prev, to_next = speed_metric(p, sphere_at(spheres, tid - spheres_per_step),
                                                           sphere_at(spheres, tid + spheres_per_step), speed_dt[0],
                                                           cost, own, to_prev, to_next)
        out_cost[tid] = cost
        out_sparsity[tid] = wp.where(cost > 0.0, wp.uint8(1), wp.uint8(0))
        if compute_grad != 0:
            out_partials[total + tid] = wp.vec4(own[0], own[1], own[2], 0.0)
            if step > 0:
                out_partials[2 * total + tid - spheres_per_step] = wp.vec4(to_prev[0], to_prev[1], to_prev[2], 0.0)
            else:
                out_partials[tid] = wp.vec4(0.0, 0.0, 0.0, 0.0)
            if step < horizon - 1:
                out_partials[tid + spheres_per_step] = wp.vec4(to_next[0], to_next[1], to_next[2], 0.0)
            else:
                out_partials[2 * total + tid] = wp.vec4(0.0, 0.0, 0.0, 0.0)
        if count_evaluations != 0:
            out_evaluations[tid] = evaluations