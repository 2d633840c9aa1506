"""cuRobo's mesh-collision algorithm, written here from its description, ONLY as a timing reference.

cuRobo v0.7.8 cannot be installed on the benchmark machines (the package registry holds no
release of it), so "side by side against cuRobo's kernels" is measured against this
module instead: the same work per sphere that cuRobo's Warp kernels do, on the same tensors
(mesh ids, inverse poses [x y z qw qx qy qz pad], enable flags; one environment):

- plain: for each enabled mesh, Warp's ``mesh_query_point`` (closest point within
  max(max_dist, max_dist + r + eta when r + eta exceeds max_dist), sign by Warp's three-ray vote),
  then the activation cost of the penetration r + eta - sd (quadratic below eta, linear above)
  and its direction, summed over meshes and scaled by the weight;
- swept: the plain cost of p[t] plus, per side whose half step is longer than p[t]'s clearance,
  up to ``sweep_steps`` samples between p[t] and the half-way point, placed by advancing a jump
  distance by each sample's clearance (cuRobo's schedule: the penetration on the previous side,
  max(penetration - r - eta, r + eta) on the next one, max(d - 2 (r + eta), r + eta) when free,
  the search bound when nothing is found); every colliding sample's cost is added to p[t]'s;
- backward: the gradient written by the forward, returned as it is (cuRobo's autograd Functions).

It is not robot_sdf's cost (docs/design.md §4: robot_sdf's swept cost is a weighted mean with an
exact gradient) and not cuRobo's code; only the number and kind of Warp queries per sphere are
meant to match. The speed metric and ESDF modes are left out (the benchmarks use neither).
"""
from __future__ import annotations

import torch
import warp as wp

from robot_sdf import kernels
from robot_sdf.launch import descriptor as _as_warp, launch_kernel as _launch

wp.set_module_options({"enable_backward": False})


@wp.func
def _sample_cost(mesh: wp.uint64, p: wp.vec3, bound: float, r_eta: float, eta: float):
    """Cost, mesh-frame gradient direction (scaled as the cost's slope), penetration r_eta - sd
    (r_eta = r + eta) and whether a surface was found within bound, for mesh-frame point p."""
    zero = wp.vec3(0.0, 0.0, 0.0)
    query = wp.mesh_query_point(mesh, p, bound)
    if not query.result:
        return 0.0, zero, 0.0, False
    delta = wp.mesh_eval_position(mesh, query.face, query.u, query.v) - p
    dist = wp.length(delta)
    penetration = r_eta - dist * query.sign
    if penetration <= 0.0:
        return 0.0, zero, penetration, True
    direction = query.sign * delta / wp.max(dist, 1.0e-12)
    if penetration > eta:
        return penetration - 0.5 * eta, direction, penetration, True
    return 0.5 * penetration * penetration / eta, direction * (penetration / eta), penetration, True


@wp.func
def _side_cost(mesh: wp.uint64, p: wp.vec3, neighbour: wp.vec3, half: float, mid: float, bound: float,
               r_eta: float, eta: float, sweep_steps: int, previous_side: bool):
    """Summed cost and mesh-frame gradient of the samples between p and the half-way point to
    ``neighbour`` (mesh frame), placed by cuRobo's jump schedule starting at p's clearance mid."""
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    jump = mid
    step = int(0)
    while step < sweep_steps and jump < half:
        k = 1.0 - 0.5 * jump / half
        c, g, penetration, found = _sample_cost(mesh, k * p + (1.0 - k) * neighbour, bound, r_eta, eta)
        cost += c
        grad += g
        if not found:
            jump += bound
        elif penetration > 0.0:
            jump += wp.where(previous_side, penetration, wp.max(penetration - r_eta, r_eta))
        else:
            jump += wp.max(-penetration - r_eta, r_eta)
        step += 1
    return cost, grad


@wp.kernel
def curobo_style_cost_kernel(
    spheres: wp.array(dtype=wp.vec4),
    weight: wp.array(dtype=wp.float32),
    activation_distance: wp.array(dtype=wp.float32),
    max_distance: wp.array(dtype=wp.float32),
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    mesh_enable: wp.array2d(dtype=wp.uint8),
    n_env_mesh: wp.array(dtype=wp.int32),
    horizon: int,
    spheres_per_step: int,
    sweep_steps: int,
    start: int,
    total: int,
    out_cost: wp.array(dtype=wp.float32),
    out_grad: wp.array(dtype=wp.vec4),
):
    """Plain (sweep_steps 0) or swept cost of sphere tid of (b, horizon, spheres_per_step)."""
    tid = wp.tid() + start
    if tid >= total:
        return
    s = spheres[tid]
    eta = activation_distance[0]
    r_eta = s[3] + eta
    bound = max_distance[0]
    if r_eta > bound:
        bound += r_eta
    p = wp.vec3(s[0], s[1], s[2])
    h = (tid // spheres_per_step) % horizon
    has_prev = sweep_steps > 0 and h > 0
    has_next = sweep_steps > 0 and h < horizon - 1
    prev = p
    next_ = p
    if has_prev:
        sp = spheres[tid - spheres_per_step]
        prev = wp.vec3(sp[0], sp[1], sp[2])
    if has_next:
        sn = spheres[tid + spheres_per_step]
        next_ = wp.vec3(sn[0], sn[1], sn[2])
    half_prev = 0.5 * wp.length(prev - p)
    half_next = 0.5 * wp.length(next_ - p)
    cost = float(0.0)
    grad = wp.vec3(0.0, 0.0, 0.0)
    for i in range(n_env_mesh[0]):
        if mesh_enable[0, i] == wp.uint8(0):
            continue
        t, q = kernels.slot_pose(pose_inv, 0, i)
        mesh = wp.uint64(mesh_idx[0, i])
        local = wp.quat_rotate(q, p) + t
        c, g, penetration, found = _sample_cost(mesh, local, bound, r_eta, eta)
        mid = wp.where(found, wp.abs(penetration), bound)
        if has_prev and mid < half_prev:
            cs, gs = _side_cost(mesh, local, wp.quat_rotate(q, prev) + t, half_prev, mid, bound, r_eta, eta,
                                sweep_steps, True)
            c += cs
            g += gs
        if has_next and mid < half_next:
            cs, gs = _side_cost(mesh, local, wp.quat_rotate(q, next_) + t, half_next, mid, bound, r_eta, eta,
                                sweep_steps, False)
            c += cs
            g += gs
        cost += c
        # Mesh-frame direction back to the world frame.
        grad += wp.quat_rotate_inv(q, g)
    w = weight[0]
    out_cost[tid] = w * cost
    out_grad[tid] = wp.vec4(w * grad[0], w * grad[1], w * grad[2], 0.0)


class _CuroboStyleFunction(torch.autograd.Function):
    """Forward writes cost and gradient; backward returns the written gradient (cuRobo's shape)."""

    @staticmethod
    def forward(ctx, spheres, runner, sweep_steps):
        runner.launch(sweep_steps)
        ctx.save_for_backward(runner.grad)
        return runner.cost

    @staticmethod
    def backward(ctx, grad_output):
        (grad,) = ctx.saved_tensors
        return grad * grad_output.unsqueeze(-1), None, None


class CuroboStyleRunner:
    """The reference kernels on a bench CostRunner's tensors (spheres (b,h,n,4), env 0's meshes),
    outputs preallocated as a cuRobo caller holds them."""

    def __init__(self, runner) -> None:
        self.runner = runner
        self.cost = torch.empty_like(runner.cost)
        self.grad = torch.empty_like(runner.grad)
        self.spheres_grad = runner.spheres.clone().requires_grad_(True)

    def launch(self, sweep_steps: int) -> None:
        r, s = self.runner, self.runner.snap
        b, h, n, _ = r.spheres.shape
        inputs = [_as_warp(r.spheres.view(-1, 4), dtype=wp.vec4), _as_warp(r.weight), _as_warp(r.eta),
                  _as_warp(r.max_dist), _as_warp(s.mesh_idx), _as_warp(s.mesh_pose_inverse),
                  _as_warp(s.mesh_enable), _as_warp(s.n_env_mesh), h, n, sweep_steps]
        outputs = [_as_warp(self.cost.view(-1)), _as_warp(self.grad.view(-1, 4), dtype=wp.vec4)]
        _launch(curobo_style_cost_kernel, b * h * n, inputs, outputs, r.world.device)

    def forward_backward(self, sweep_steps: int = 0) -> torch.Tensor:
        """Plain (sweep_steps 0) or swept cost and its gradient, as an MPC's step calls them."""
        self.spheres_grad.grad = None
        _CuroboStyleFunction.apply(self.spheres_grad, self, sweep_steps).sum().backward()
        return self.spheres_grad.grad
