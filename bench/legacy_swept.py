"""The swept-cost rule robot_sdf used before the time-average rule, kept ONLY for side-by-side benchmarks.

Old rule (do not use): step t paid the SUM of p[t]'s cost and of up to ``sweep_steps`` samples per
side placed by sphere tracing (advance by max(clearance, L / sweep_steps) towards the half-way
point), and its gradient was the sum of the samples' gradients, all credited to p[t]. The sum put
the cost out of scale (up to 2 * sweep_steps + 1 times the plain cost) and made it jump when a
neighbour moved off p[t]; the gradient was not the derivative of that cost. The current rule is
robot_sdf.kernels.swept_sphere_cost_kernel (docs/design.md "Swept cost").

The plain cost no longer returns the clearance the old rule advanced by; here it comes from one
more ESDF query per point (legacy_clearance), so this kernel's times bound the old rule's from
above.
"""
from __future__ import annotations

import warp as wp

from robot_sdf import kernels

wp.set_module_options({"enable_backward": False})


@wp.func
def legacy_clearance(p: wp.vec3, radius: float, max_dist: float, world: kernels.World) -> float:
    """Distance from the sphere to the nearest surface of environment 0 (0 inside, at most max_dist)."""
    deepest, unused = kernels.point_world_esdf(p, max_dist, 0, world)
    return wp.max(-deepest - radius, 0.0)


@wp.kernel
def legacy_swept_sphere_cost_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    world: kernels.World,
    horizon: int,
    spheres_per_step: int,
    sweep_steps: int,
    start: int,
    total: int,
    out_cost: wp.array(dtype=wp.float32),
    out_grad: wp.array(dtype=wp.vec4),
    out_evaluations: wp.array(dtype=wp.int32),
):
    """Environment 0 only, no speed metric; out_evaluations counts sphere_world_cost calls."""
    tid = wp.tid() + start
    if tid >= total:
        return
    s = spheres[tid]
    p = wp.vec3(s[0], s[1], s[2])
    radius = s[3]
    eta = activation_distance[0]
    max_dist = max_distance[0]
    step = (tid / spheres_per_step) % horizon
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    evaluations = int(0)
    if radius >= 0.0:
        cost, grad = kernels.sphere_world_cost(p, radius, eta, max_dist, 0, world)
        clearance0 = legacy_clearance(p, radius, max_dist, world)
        evaluations = int(1)
        for side in range(2):
            neighbour_step = step - 1 + 2 * side
            if sweep_steps <= 0 or neighbour_step < 0 or neighbour_step >= horizon:
                continue
            sn = spheres[tid + (neighbour_step - step) * spheres_per_step]
            if sn[3] < 0.0:
                continue
            half = (wp.vec3(sn[0], sn[1], sn[2]) - p) * 0.5
            length = wp.length(half)
            if length < 1.0e-6:
                continue
            direction = half / length
            min_advance = length / float(sweep_steps)
            tau = float(0.0)
            clearance = clearance0
            for _k in range(sweep_steps):
                tau = wp.min(tau + wp.max(clearance, min_advance), length)
                q = p + direction * tau
                cq, gq = kernels.sphere_world_cost(q, radius, eta, max_dist, 0, world)
                clearance = legacy_clearance(q, radius, max_dist, world)
                evaluations += 1
                cost += cq
                grad += gq
                if tau >= length:
                    break
    w = weight[0]
    out_cost[tid] = cost * w
    grad = grad * w
    out_grad[tid] = wp.vec4(grad[0], grad[1], grad[2], 0.0)
    out_evaluations[tid] = evaluations
