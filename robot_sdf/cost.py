"""Differentiable collision costs and signed distances over a MeshWorld, for in-process use.

All inputs are torch tensors on any device (moved to the world's device); outputs live on the
world's device. Lengths are metres.

dtype: the kernels compute in float32. float64 (or other floating) spheres/points are accepted:
the outputs come back in the input's dtype (values computed in float32, then converted) and
gradients flow back in that dtype.

Autograd: sphere_cost, swept_sphere_cost and signed_distance work with ordinary backward,
torch.func (grad, vmap: the vmapped dimension folds into the batch, one launch; jacrev, jacfwd,
jvp), forward-mode AD (torch.autograd.forward_ad) and torch.compile(fullgraph=True) (while Dynamo
traces, the evaluation goes through robot_sdf.ops' custom ops, which read the world's current
snapshot at run time). sphere_cost and signed_distance have exact second derivatives (double
backward, forward-over-reverse: warp_primitives.launch_sphere_hessian); swept_sphere_cost refuses
double backward (once_differentiable).

Dependency direction: world.py imports this module (MeshWorld's evaluation methods delegate
here); this module never imports world.py and uses only MeshWorld's public API (``device``,
``num_envs``, ``max_distance``, ``check_env``, ``reading``), so any object offering that API
can be evaluated.
"""
from __future__ import annotations

import torch

from robot_sdf import _internals, ops
from robot_sdf.cost_inputs import (env_rows, output_buffers, prepare_env_index, prepare_spheres,
                                   scalar_tensors, speed_dt_tensor)
from robot_sdf.warp_primitives import (
    _INTRA_OP_GRAIN,
    SphereCostArgs,
    fold_spheres_env,
    hessian_product,
    launch_sphere_cost_fresh,
    launch_swept_sphere_cost,
    sphere_cost_jvp,
    sphere_cost_vjp,
    swept_cost_of_snapshot,
    unfold_batch,
)


# Under a torch.func transform the evaluation goes through _SphereCost, whose gradient output is
# differentiable (functorch builds a graph of every backward: the Hessian comes from that node's
# own backward); elsewhere through _EagerSphereCost.
_transforms_active = _internals.transforms_active


class _SphereCost(torch.autograd.Function):
    """_SphereCost.apply(spheres (b,h,n,4) float32, env (b,) int32 or None, args: SphereCostArgs)
    -> (cost (b,h,n), gradient (b,h,n,4)): the in-process cost (or ESDF value) with its gradient
    from the same launch (computing it costs nothing extra there), for torch.func.

    The gradient is a differentiable output whose own derivative is the Hessian: backward forms
    the cost's vector-Jacobian product from it, so a second derivative reaches this node again
    with that output's cotangent, and torch.func's first-order path (it always builds a graph of
    the backward) runs no further Function. The other arguments travel as one opaque object:
    torch.func walks every argument of apply on every level."""

    @staticmethod
    def forward(spheres, env, args):
        return args.launch(spheres, env)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)
        ctx.args = inputs[2]
        ctx.env = inputs[1]  # integer, never differentiated (save_for_forward wants floating tensors)
        ctx.save_for_backward(inputs[0], output[1])
        ctx.save_for_forward(inputs[0], output[1])

    @staticmethod
    def backward(ctx, grad_cost, grad_gradient):
        spheres, gradient = ctx.saved_tensors
        result = None
        if grad_cost is not None:
            # gradient is this node's own output: under a graph of the backward the product links back here.
            result = grad_cost.unsqueeze(-1) * gradient
        if grad_gradient is not None:
            hv = hessian_product(spheres, grad_gradient, ctx.env, ctx.args)
            result = hv if result is None else result + hv
        return result, None, None

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        spheres, gradient = ctx.saved_tensors
        # The gradient output's tangent, H t (one more launch): forward-over-reverse uses it.
        return (sphere_cost_jvp(spheres_tangent, gradient),
                hessian_product(spheres, spheres_tangent, ctx.env, ctx.args))

    @staticmethod
    def vmap(info, in_dims, spheres, env, args):
        folded, fenv = fold_spheres_env(info, spheres, in_dims[0], env, in_dims[1])
        cost, gradient = _SphereCost.apply(folded, fenv, args)
        return (unfold_batch(cost, info.batch_size), unfold_batch(gradient, info.batch_size)), (0, 0)


# Gradient elements below which sphere_cost_vjp's special cases never apply.
_SMALL = _INTRA_OP_GRAIN


class _EagerSphereCost(torch.autograd.Function):
    """sphere_cost outside torch.func (ordinary autograd, forward-mode AD, no_grad):
    _EagerSphereCost.apply(spheres, env, args) -> cost (b,h,n), with _SphereCost's derivatives, in
    torch's older forward-with-ctx form, which the public torch.autograd.Function.apply enters
    directly (a Function with a setup_context pays a binding of its arguments by inspect on every
    call, about as much again as the whole evaluation of a few spheres), and one output. The
    gradient stays on ctx; a create_graph backward goes through SphereGradient for the Hessian."""

    @staticmethod
    def forward(ctx, spheres, env, args):
        cost, ctx.gradient = args.launch(spheres, env)
        # Plain attributes, not saved tensors: an internal buffer and two inputs (no reference
        # cycle), read back only by this node; saving costs a microsecond per call.
        ctx.spheres, ctx.env, ctx.args = spheres, env, args
        return cost

    @staticmethod
    def backward(ctx, grad_cost):
        gradient = ctx.gradient
        if gradient.numel() < _SMALL and not torch.is_grad_enabled():
            return grad_cost.unsqueeze(-1) * gradient, None, None
        return sphere_cost_vjp(grad_cost, ctx.spheres, gradient, ctx.env, ctx.args), None, None

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        return sphere_cost_jvp(spheres_tangent, ctx.gradient)


# _SphereCost.apply without torch's Python wrapper where that is safe (robot_sdf._internals): the
# wrapper's binding by inspect would double the cost of a signed_distance call of a few points.
_sphere_cost_apply = _internals.direct_apply(_SphereCost)


def _as_input_dtype(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return out if like.dtype == torch.float32 or not like.is_floating_point() else out.to(like.dtype)


def sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None):
    """Cost (b,h,n) of spheres (b,h,n,4) [x,y,z,r]; differentiable w.r.t. the sphere centres."""
    s = prepare_spheres(world, spheres)
    env = None if env_index is None else prepare_env_index(world, env_index, s.shape[0])
    if torch.compiler.is_compiling():
        return _as_input_dtype(ops.sphere_cost(world, s, activation_distance, weight, env, max_distance, False),
                               spheres)
    w, eta, max_d = scalar_tensors(world, activation_distance, weight, max_distance)
    with world.reading() as snap:
        args = SphereCostArgs(w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, max_d,
                              False, snap.sign_methods, _transforms_active(), snapshot=snap, reading=world.reading)
        cost = _SphereCost.apply(s, env, args)[0] if args.second_order else _EagerSphereCost.apply(s, env, args)
    return cost if spheres.dtype is torch.float32 else _as_input_dtype(cost, spheres)


def swept_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4, speed_dt=0.1,
                      enable_speed_metric=False, env_index=None, max_distance=None):
    """Swept cost (b,h,n) of trajectories of spheres (b,h,n,4) along h; differentiable w.r.t. the
    centres. Step t's cost depends on the centres of steps t-1, t and t+1 (docs/design.md "Swept cost");
    backward gives the exact gradient for any upstream gradient."""
    s = prepare_spheres(world, spheres)
    env = prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = scalar_tensors(world, activation_distance, weight, max_distance)
    dt = speed_dt_tensor(world, speed_dt, enable_speed_metric)
    if torch.compiler.is_compiling():
        return _as_input_dtype(ops.swept_sphere_cost(world, s, activation_distance, weight, sweep_steps, speed_dt,
                                                     enable_speed_metric, env, max_distance), spheres)
    cost, grad, sparsity = output_buffers(s)
    # Partials only when a gradient may be asked for (a no-grad rollout skips them).
    want = _internals.may_need_gradient(s)
    with world.reading() as snap:
        cost = swept_cost_of_snapshot(s, cost, grad, sparsity, w, eta, dt, snap, max_d, sweep_steps,
                                      enable_speed_metric, env, want)
    return _as_input_dtype(cost, spheres)


def signed_distance(world, points, env=0, max_distance=None, return_revision=False):
    """Signed distance (n,) of points (n,3) to the union of env's meshes, and its gradient (n,3).

    Negative inside, positive outside, +max_distance where no surface is within max_distance.
    The distance is differentiable w.r.t. the points; the gradient is returned detached.
    With return_revision, a third element is the world revision used.
    """
    pts = torch.as_tensor(points)
    if pts.dim() != 2 or pts.shape[-1] != 3:
        raise ValueError(f"points must be (n, 3), got {tuple(pts.shape)}")
    world.check_env(env)
    pts32 = pts.to(device=world.device, dtype=torch.float32)
    spheres = torch.cat([pts32, torch.zeros_like(pts32[:, :1])], dim=1).reshape(1, 1, -1, 4)
    if torch.compiler.is_compiling():
        dist, grad = ops.signed_distance(world, spheres, env, max_distance)
        return (_as_input_dtype(dist.reshape(-1), pts), grad.detach().reshape(-1, 4)[:, :3])
    # weight -1 turns the ESDF value max_i(-sd_i) into min_i sd_i, the signed distance to the union.
    w, eta, max_d = scalar_tensors(world, 0.0, -1.0, max_distance)
    env_index = env_rows(world.device, int(env))
    with world.reading() as snap:
        args = SphereCostArgs(w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, max_d,
                              True, snap.sign_methods, _transforms_active(), snapshot=snap, reading=world.reading)
        dist, grad = _sphere_cost_apply(spheres, env_index, args)
        revision = snap.revision
    result = (_as_input_dtype(dist.reshape(-1), pts), grad.detach().reshape(-1, 4)[:, :3])
    return result + (revision,) if return_revision else result


def evaluate_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None,
                         compute_gradient=True, return_revision=False):
    """Cost (b,h,n) and gradient (b,h,n,3) (None unless compute_gradient), without an autograd graph.

    With return_revision, a third element is the world revision the result was computed against."""
    s = prepare_spheres(world, spheres).detach()
    env = prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = scalar_tensors(world, activation_distance, weight, max_distance)
    cost, grad, sparsity = output_buffers(s)
    with world.reading() as snap:
        launch_sphere_cost_fresh(s, cost, grad, sparsity, w, eta, snap.mesh_idx, snap.mesh_pose_inverse,
                                 snap.mesh_enable, snap.n_env_mesh, max_d, env, compute_grad=compute_gradient,
                                 sign_method=snap.sign_methods, snapshot=snap)
        revision = snap.revision
    result = (cost, grad[..., :3] if compute_gradient else None)
    return result + (revision,) if return_revision else result


def evaluate_swept_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4, speed_dt=0.1,
                               enable_speed_metric=False, env_index=None, max_distance=None, compute_gradient=True,
                               return_revision=False):
    """Swept cost (b,h,n) and gradient (b,h,n,3) or None; the revision used with return_revision.

    The gradient of sphere t is that of the summed cost sum_t' cost_t' (each step's cost depends
    on its neighbouring steps too), what an MPC that adds up the steps needs."""
    s = prepare_spheres(world, spheres).detach()
    env = prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = scalar_tensors(world, activation_distance, weight, max_distance)
    dt = speed_dt_tensor(world, speed_dt, enable_speed_metric)
    cost, grad, sparsity = output_buffers(s)
    with world.reading() as snap:
        launch_swept_sphere_cost(s, cost, grad, sparsity, w, eta, dt, snap.mesh_idx, snap.mesh_pose_inverse,
                                 snap.mesh_enable, snap.n_env_mesh, max_d, int(sweep_steps), bool(enable_speed_metric),
                                 env, compute_grad=compute_gradient, sign_method=snap.sign_methods, snapshot=snap)
        revision = snap.revision
    result = (cost, grad[..., :3] if compute_gradient else None)
    return result + (revision,) if return_revision else result
