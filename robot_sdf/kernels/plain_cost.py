"""The plain cost and the ESDF per sphere, summed (or maxed) over its environment's slots.

sphere_cost_kernel writes every output element it owns, so callers may hand in uninitialised
buffers. Gradients are analytic, so no Warp adjoint code is generated.

Layout (flattened from the torch tensors of docs/design.md "Tensor layouts"; the world, its
tensors and the call's sign selection, in one slot_walk.World struct as slot_walk's docstring
describes it):
    spheres      (N,) vec4    x, y, z, radius in the world frame (m); N = b * h * n
    env_query    (B,) int32   environment per batch row (read only when use_env_query != 0)
Scalars that live in tensors (weight, activation distance, max distance) are read in-kernel
from 1-element arrays so that no host-device synchronisation is needed.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.signed_distance import mesh_signed_distance
from robot_sdf.kernels.slot_walk import World, env_slots, query_env, slot_at, slot_sign_method, thread_spheres

wp.set_module_options({"enable_backward": False})


@wp.func
def penetration_cost(sd: float, radius: float, eta: float):
    """The cost of docs/design.md "Cost definition" for one mesh, the one place it is written:
    (cost_i, d cost_i / d d, d^2 cost_i / d d^2) of a sphere of ``radius`` whose centre has
    signed distance ``sd`` (m), penetration d = radius + eta - sd. (0, 0, 0) where d <= 0."""
    d = radius + eta - sd
    cost = float(0.0)
    dcost = float(0.0)
    ddcost = float(0.0)
    if d > 0.0:
        dcost = 1.0
        if d <= eta:
            cost = d * d / (2.0 * eta)
            dcost = d / eta
            ddcost = 1.0 / eta
        else:
            cost = d - 0.5 * eta
    return cost, dcost, ddcost


@wp.func
def sphere_world_cost(
    p: wp.vec3,
    radius: float,
    eta: float,
    max_dist: float,
    env: int,
    world: World,
):
    """Unweighted cost of one sphere summed over the meshes of ``env`` and its world-frame gradient.
    Only surfaces nearer than r + eta (and inside centres) cost: each mesh is searched within that
    first where its sign allows (mesh_signed_distance's ``need``), within max_dist + r + eta
    otherwise."""
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    bound = max_dist + radius + eta
    # The slots that may hold a surface or inside point within the search (slot BVH), or all.
    slots = env_slots(env, p, bound, world)
    for i in range(slots.iterations):
        slot, q, p_mesh = slot_at(slots, i, env, p, world)
        if slot < 0:
            continue
        found, sd, grad_sd = mesh_signed_distance(
            wp.uint64(world.mesh_idx[env, slot]), p_mesh, bound, world.pose_inv[env, slot, 7],
            slot_sign_method(world, env, slot), radius + eta,
        )
        if found == 0:
            continue
        c, dcost, _ = penetration_cost(sd, radius, eta)
        if dcost > 0.0:
            cost += c
            # d d / d p = -grad_sd; back to the world frame with the inverse rotation.
            grad += wp.quat_rotate_inv(q, grad_sd * (-dcost))
    return cost, grad


@wp.func
def point_world_esdf(
    p: wp.vec3,
    max_dist: float,
    env: int,
    world: World,
):
    """max_i(-sd_i) over the meshes of ``env`` (-max_dist when none is in range) and its gradient."""
    best = -max_dist
    grad = wp.vec3(0.0, 0.0, 0.0)
    # The slots that may hold a surface or inside point within the search (slot BVH), or all.
    slots = env_slots(env, p, max_dist, world)
    for i in range(slots.iterations):
        slot, q, p_mesh = slot_at(slots, i, env, p, world)
        if slot < 0:
            continue
        found, sd, grad_sd = mesh_signed_distance(
            wp.uint64(world.mesh_idx[env, slot]), p_mesh, max_dist, world.pose_inv[env, slot, 7],
            slot_sign_method(world, env, slot), max_dist,
        )
        if found != 0 and -sd > best:
            best = -sd
            grad = wp.quat_rotate_inv(q, -grad_sd)
    return best, grad


# CUDA only: both query kernels sit at the 255-register cap and spill (docs/history/benchmarks.md).
# launch_bounds: Warp's default block size, which every launch of these kernels uses.
# Shared-memory spilling (enable_cuda_smem_spilling) is off: its spill area beside Warp's shared
# traversal stacks passed the 48 KB static limit and ptxas refused the kernels
# (test/cuda_build_test.py caught it); the slot BVH walk keeps its stack in local memory.
@wp.kernel(launch_bounds=256, module="robot_sdf.kernels")  # the package's one Warp module (see there)
def sphere_cost_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    world: World,
    env_query: wp.array(dtype=wp.int32),
    use_env_query: int,
    spheres_per_batch: int,
    compute_esdf: int,
    compute_grad: int,
    start: int,
    total: int,
    out_cost: wp.array(dtype=wp.float32),
    out_grad: wp.array(dtype=wp.vec4),
    out_sparsity: wp.array(dtype=wp.uint8),
):
    """The plain cost (or the ESDF) of spheres start .. total - 1 (module docstring), a run of
    them per thread (thread_spheres)."""
    first, end = thread_spheres(wp.tid(), start, total)
    for tid in range(first, end):
        s = spheres[tid]
        p = wp.vec3(s[0], s[1], s[2])
        w = weight[0]
        cost = float(0.0)
        grad = wp.vec3(0.0, 0.0, 0.0)
        env = query_env(tid, spheres_per_batch, use_env_query, env_query, world.n_env_mesh.shape[0])
        if compute_esdf != 0:
            cost = -max_distance[0]
            if env >= 0:
                cost, grad = point_world_esdf(p, max_distance[0], env, world)
        elif s[3] >= 0.0 and env >= 0:
            cost, grad = sphere_world_cost(p, s[3], activation_distance[0], max_distance[0], env, world)
        cost = w * cost
        out_cost[tid] = cost
        out_sparsity[tid] = wp.where(cost > 0.0, wp.uint8(1), wp.uint8(0))
        if compute_grad != 0:
            grad = grad * w
            out_grad[tid] = wp.vec4(grad[0], grad[1], grad[2], 0.0)
        else:
            out_grad[tid] = wp.vec4(0.0, 0.0, 0.0, 0.0)