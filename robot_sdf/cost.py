"""Differentiable collision costs and signed distances over a MeshWorld, for in-process use.

Inputs are torch tensors on any device (moved to the world's device); outputs live on the world's
device; lengths in metres. The kernels compute in float32: float64 (or other floating) spheres or
points give outputs in their own dtype (computed in float32, then converted), and gradients flow
back in that dtype.

Autograd: through warp_primitives' SphereCost and SweptCost, so sphere_cost, swept_sphere_cost
and signed_distance work with ordinary backward, torch.func (grad, vmap: the vmapped dimension
folds into the batch, one launch; jacrev, jacfwd, jvp), forward-mode AD and
torch.compile(fullgraph=True) (while Dynamo traces, the evaluation goes through robot_sdf.ops'
custom ops, which read the world's current snapshot at run time). sphere_cost and signed_distance
have exact second derivatives; swept_sphere_cost refuses double backward (once_differentiable).

``world`` is anything offering MeshWorld's public ``device``, ``num_envs``, ``max_distance``,
``check_env`` and ``reading``: world.py imports this module, never the reverse.
"""
from __future__ import annotations

import torch

from robot_sdf import _internals, ops
from robot_sdf.cost_inputs import env_rows, prepare_env_index, prepare_spheres, world_query
from robot_sdf.warp_primitives import sphere_cost_apply, swept_cost_apply


def _as_input_dtype(out: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return out if like.dtype == torch.float32 or not like.is_floating_point() else out.to(like.dtype)


def sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None):
    """Cost (b,h,n) of spheres (b,h,n,4) [x,y,z,r]; differentiable w.r.t. the sphere centres."""
    s = prepare_spheres(world, spheres)
    env = prepare_env_index(world, env_index, s.shape[0])
    if torch.compiler.is_compiling():
        return _as_input_dtype(ops.sphere_cost(world, s, activation_distance, weight, env, max_distance, False),
                               spheres)
    with world.reading() as snap:
        query = world_query(world, snap, activation_distance, weight, max_distance, reading=world.reading)
        cost = sphere_cost_apply(s, env, query)[0]
    return _as_input_dtype(cost, spheres)


def swept_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4, speed_dt=0.1,
                      enable_speed_metric=False, env_index=None, max_distance=None):
    """Swept cost (b,h,n) of trajectories of spheres (b,h,n,4) along h; differentiable w.r.t. the
    centres. Step t's cost depends on the centres of steps t-1, t and t+1 (docs/design.md "Swept
    cost"); backward gives the exact gradient for any upstream gradient."""
    s = prepare_spheres(world, spheres)
    env = prepare_env_index(world, env_index, s.shape[0])
    if torch.compiler.is_compiling():
        return _as_input_dtype(ops.swept_sphere_cost(world, s, activation_distance, weight, sweep_steps, speed_dt,
                                                     enable_speed_metric, env, max_distance), spheres)
    with world.reading() as snap:
        # Partials only when a gradient may be asked for (a no-grad rollout skips them).
        query = world_query(world, snap, activation_distance, weight, max_distance, sweep=(sweep_steps, speed_dt,
                            enable_speed_metric), compute_grad=_internals.may_need_gradient(s))
        cost = swept_cost_apply(s, env, query)[0]
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
    with world.reading() as snap:
        # weight -1 turns the ESDF value max_i(-sd_i) into min_i sd_i, the signed distance to the union.
        query = world_query(world, snap, 0.0, -1.0, max_distance, esdf=True, reading=world.reading)
        dist, grad = sphere_cost_apply(spheres, env_rows(world.device, int(env)), query)
        revision = snap.revision
    result = (_as_input_dtype(dist.reshape(-1), pts), grad.detach().reshape(-1, 4)[:, :3])
    return result + (revision,) if return_revision else result


def evaluate_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None,
                         compute_gradient=True, return_revision=False):
    """Cost (b,h,n) and gradient (b,h,n,3) (None unless compute_gradient), without an autograd graph.
    With return_revision, a third element is the world revision the result was computed against."""
    s = prepare_spheres(world, spheres).detach()
    env = prepare_env_index(world, env_index, s.shape[0])
    with world.reading() as snap:
        query = world_query(world, snap, activation_distance, weight, max_distance, compute_grad=compute_gradient)
        cost, grad = query.cost(s, env)
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
    cost, grad = torch.empty_like(s[..., 0]), torch.empty_like(s)
    with world.reading() as snap:
        query = world_query(world, snap, activation_distance, weight, max_distance, compute_grad=compute_gradient,
                            sweep=(sweep_steps, speed_dt, enable_speed_metric),
                            outputs=(cost, grad, torch.empty_like(cost, dtype=torch.uint8)))
        query.swept(s, env)
        revision = snap.revision
    result = (cost, grad[..., :3] if compute_gradient else None)
    return result + (revision,) if return_revision else result
