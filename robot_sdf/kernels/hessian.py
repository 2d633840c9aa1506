"""Second derivatives of the plain cost and the ESDF (double backward, forward-over-reverse).

sphere_hessian_kernel gives, per sphere, the world-frame Hessian of sphere_cost_kernel's value:
per mesh, from the signed distance's own Hessian at the closest feature (0 in a face's region,
(I - n n^T) / sd at a corner, (I - n n^T - e e^T) / sd on an edge) and the cost's second
derivative. It visits the slots the plain cost visits (slot_walk), with the same search.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.closest_point import refine_closest
from robot_sdf.kernels.plain_cost import penetration_cost
from robot_sdf.kernels.signed_distance import mesh_signed_distance
from robot_sdf.kernels.slot_walk import World, env_slots, query_env, slot_at, slot_sign_method, thread_spheres

wp.set_module_options({"enable_backward": False})

# Closer to a surface than this [m], the Hessian of the distance (~1/distance) is reported as 0.
HESSIAN_MIN_DISTANCE = wp.constant(1.0e-6)
# 1 - cos of the angle within which a direction counts as a face's normal (float32 noise).
HESSIAN_FLAT_COSINE = wp.constant(1.0e-6)


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
    world: World,
) -> wp.mat33:
    """World-frame Hessian of sphere_world_cost's (unweighted) cost: per mesh with d = r + eta - sd > 0,
    c''(d) n n^T - c'(d) H_sd (d d / d p = -n; c' = d / eta, c'' = 1 / eta below eta, else 1, 0).
    Visits the slots sphere_world_cost visits (slot BVH where the world has one)."""
    hess = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    bound = max_dist + radius + eta
    slots = env_slots(env, p, bound, world)
    for i in range(slots.iterations):
        slot, q, p_mesh = slot_at(slots, i, env, p, world)
        if slot < 0:
            continue
        mesh = wp.uint64(world.mesh_idx[env, slot])
        found, sd, grad_sd = mesh_signed_distance(
            mesh, p_mesh, bound, world.pose_inv[env, slot, 7], slot_sign_method(world, env, slot), radius + eta)
        _, dcost, ddcost = penetration_cost(sd, radius, eta)
        if found == 0 or dcost <= 0.0:
            continue
        h = wp.outer(grad_sd, grad_sd) * ddcost - mesh_sd_hessian(mesh, p_mesh, sd, grad_sd) * dcost
        hess += to_world_hessian(q, h)
    return hess


@wp.func
def point_world_esdf_hessian(
    p: wp.vec3,
    max_dist: float,
    env: int,
    world: World,
) -> wp.mat33:
    """World-frame Hessian of point_world_esdf's max_i(-sd_i): -H_sd of the mesh attaining it
    (the slots point_world_esdf visits)."""
    best = -max_dist
    hess = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    slots = env_slots(env, p, max_dist, world)
    for i in range(slots.iterations):
        slot, q, p_mesh = slot_at(slots, i, env, p, world)
        if slot < 0:
            continue
        mesh = wp.uint64(world.mesh_idx[env, slot])
        found, sd, grad_sd = mesh_signed_distance(
            mesh, p_mesh, max_dist, world.pose_inv[env, slot, 7], slot_sign_method(world, env, slot), max_dist)
        if found != 0 and -sd > best:
            best = -sd
            hess = to_world_hessian(q, -mesh_sd_hessian(mesh, p_mesh, sd, grad_sd))
    return hess


@wp.kernel(module="robot_sdf.kernels")  # the package's one Warp module (see there)
def sphere_hessian_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    world: World,
    env_query: wp.array(dtype=wp.int32),
    use_env_query: int,
    spheres_per_batch: int,
    compute_esdf: int,
    start: int,
    total: int,
    out_hessian: wp.array(dtype=wp.mat33),
):
    """d^2 out_cost / d p^2 (world frame, weighted) of sphere_cost_kernel's value, per sphere (a run
    of them per thread: thread_spheres)."""
    first, end = thread_spheres(wp.tid(), start, total)
    for tid in range(first, end):
        s = spheres[tid]
        p = wp.vec3(s[0], s[1], s[2])
        hess = wp.mat33(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        env = query_env(tid, spheres_per_batch, use_env_query, env_query, world.n_env_mesh.shape[0])
        if compute_esdf != 0:
            if env >= 0:
                hess = point_world_esdf_hessian(p, max_distance[0], env, world)
        elif s[3] >= 0.0 and env >= 0:
            hess = sphere_world_hessian(p, s[3], activation_distance[0], max_distance[0], env, world)
        out_hessian[tid] = hess * weight[0]
