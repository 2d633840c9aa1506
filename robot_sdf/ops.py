"""torch.library custom ops over a MeshWorld: what robot_sdf.cost calls while torch.compile traces.

Dynamo cannot trace a Warp launch (nor the world's read lock), so robot_sdf.cost routes through
these ops when ``torch.compiler.is_compiling()``: each is opaque to the compiler, has a fake
(meta) implementation giving output shapes, and a registered autograd formula, so a cost
function compiles with ``fullgraph=True``. The world is passed as an integer handle (a constant
of the graph); the op reads the world's *current* snapshot when it runs, so pose and geometry
updates reach a compiled function without recompiling. On CUDA they run on torch's current
stream; under CUDA graphs (mode="reduce-overhead") outside the captured parts (see _TAGS).

Shapes: spheres (b,h,n,4) float32; env (b,) int32 or None. Outputs as robot_sdf.cost's.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch

from robot_sdf.cost_inputs import output_buffers, scalar_tensors, speed_dt_tensor
from robot_sdf.warp_primitives import (SphereCostArgs, hessian_product, launch_swept_sphere_cost, sphere_cost_vjp,
                                        swept_chain_rule)

_worlds: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()

# Not inside a captured CUDA graph (torch.compile mode="reduce-overhead" splits the graph around
# these ops and runs them eagerly between captured parts): a captured launch would keep the
# addresses of the world's tensors at capture time, while the world replaces its pose and enable
# tensors on every update (copy-on-write) and frees the old ones with their last snapshot.
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


_handles: "weakref.WeakKeyDictionary[object, int]" = weakref.WeakKeyDictionary()
_next_handle = itertools.count(1)


@torch.compiler.assume_constant_result
def world_handle(world) -> int:
    """An integer naming ``world`` for the ops while it lives (never reused: not its id())."""
    handle = _handles.get(world)
    if handle is None:
        handle = _handles[world] = next(_next_handle)
        _worlds[handle] = world
    return handle


def _world(handle: int):
    world = _worlds.get(handle)
    if world is None:
        raise RuntimeError("robot_sdf: the MeshWorld of this compiled function no longer exists")
    return world


def _args(world, snap, activation_distance: float, weight: float, max_distance: Optional[float], esdf: bool):
    w, eta, max_d = scalar_tensors(world, activation_distance, weight, max_distance)
    return SphereCostArgs(w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, max_d,
                          esdf, snap.sign_methods, snapshot=snap)


def _max(max_distance: float) -> Optional[float]:
    return None if max_distance < 0 else max_distance  # -1: the world's default


@torch.library.custom_op("robot_sdf::sphere_cost", mutates_args=(), tags=_TAGS)
def _sphere_cost(spheres: torch.Tensor, world: int, activation_distance: float, weight: float, max_distance: float,
                 env: Optional[torch.Tensor], esdf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(cost (b,h,n), gradient (b,h,n,4)) of spheres (b,h,n,4) float32."""
    w = _world(world)
    with w.reading() as snap:
        return _args(w, snap, activation_distance, weight, _max(max_distance), esdf).launch(spheres.contiguous(), env)


@_sphere_cost.register_fake
def _(spheres, world, activation_distance, weight, max_distance, env, esdf):
    b, h, n, _ = spheres.shape
    return spheres.new_empty((b, h, n)), spheres.new_empty((b, h, n, 4))


@torch.library.custom_op("robot_sdf::sphere_hessian", mutates_args=(), tags=_TAGS)
def _sphere_hessian(spheres: torch.Tensor, world: int, activation_distance: float, weight: float,
                    max_distance: float, env: Optional[torch.Tensor], esdf: bool) -> torch.Tensor:
    """Per-sphere Hessian (b,h,n,3,3) of _sphere_cost's value."""
    w = _world(world)
    with w.reading() as snap:
        return _args(w, snap, activation_distance, weight, _max(max_distance), esdf).hessian(spheres.contiguous(), env)


@_sphere_hessian.register_fake
def _(spheres, world, activation_distance, weight, max_distance, env, esdf):
    b, h, n, _ = spheres.shape
    return spheres.new_empty((b, h, n, 3, 3))


class _HessianThroughOp:
    """The part of a SphereCostArgs that the shared backward (warp_primitives.sphere_cost_vjp and
    hessian_product) uses, its ``hessian(spheres, env)``, for the op's backward: the Hessian comes
    from the sphere_hessian op, which reads the world's current snapshot when it runs and which
    the compiler keeps as one opaque call (a SphereCostArgs holds one snapshot's tensors and
    launches Warp itself)."""

    __slots__ = ("world", "activation_distance", "weight", "max_distance", "esdf")

    def __init__(self, world: int, activation_distance: float, weight: float, max_distance: float, esdf: bool):
        self.world, self.activation_distance, self.weight = world, activation_distance, weight
        self.max_distance, self.esdf = max_distance, esdf

    def hessian(self, spheres: torch.Tensor, env: Optional[torch.Tensor]) -> torch.Tensor:
        return torch.ops.robot_sdf.sphere_hessian(spheres, self.world, self.activation_distance, self.weight,
                                                  self.max_distance, env, self.esdf)


def _sphere_cost_setup(ctx, inputs, output):
    spheres, world, activation_distance, weight, max_distance, env, esdf = inputs
    # An output nothing depends on gets None, not zeros: no Hessian launch for an unused gradient.
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(spheres, output[1])
    ctx.env = env
    ctx.args = _HessianThroughOp(world, activation_distance, weight, max_distance, esdf)


def _sphere_cost_backward(ctx, grad_cost, grad_gradient):
    """The plain cost's backward shared with SdfMeshWarpPy and robot_sdf.cost (sphere_cost_vjp:
    with create_graph a second backward gets the Hessian), plus the gradient output's own
    derivative, the Hessian-vector product (hessian_product)."""
    spheres, gradient = ctx.saved_tensors
    result = torch.zeros_like(spheres)
    if grad_cost is not None:
        result = result + sphere_cost_vjp(grad_cost, spheres, gradient, ctx.env, ctx.args)
    if grad_gradient is not None:
        result = result + hessian_product(spheres, grad_gradient, ctx.env, ctx.args)
    return result, None, None, None, None, None, None


_sphere_cost.register_autograd(_sphere_cost_backward, setup_context=_sphere_cost_setup)


@torch.library.custom_op("robot_sdf::swept_sphere_cost", mutates_args=(), tags=_TAGS)
def _swept_sphere_cost(spheres: torch.Tensor, world: int, activation_distance: float, weight: float,
                       max_distance: float, sweep_steps: int, speed_dt: float, speed_metric: bool,
                       env: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(cost (b,h,n), partials (3,b,h,n,4): warp_primitives.SweptPartials) of trajectories (b,h,n,4)."""
    w = _world(world)
    s = spheres.contiguous()
    weight_t, eta, max_d = scalar_tensors(w, activation_distance, weight, _max(max_distance))
    dt = speed_dt_tensor(w, speed_dt, speed_metric)
    cost, grad, sparsity = output_buffers(s)
    with w.reading() as snap:
        partials = launch_swept_sphere_cost(s, cost, grad, sparsity, weight_t, eta, dt, snap.mesh_idx,
                                            snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, max_d,
                                            sweep_steps, speed_metric, env, compute_grad=True,
                                            sign_method=snap.sign_methods, snapshot=snap)
    return cost, partials.buffer


@_swept_sphere_cost.register_fake
def _(spheres, world, activation_distance, weight, max_distance, sweep_steps, speed_dt, speed_metric, env):
    b, h, n, _ = spheres.shape
    return spheres.new_empty((b, h, n)), spheres.new_empty((3, b, h, n, 4))


def _swept_setup(ctx, inputs, output):
    ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(output[1])


def _swept_backward(ctx, grad_cost, _):
    (partials,) = ctx.saved_tensors
    return swept_chain_rule(partials, grad_cost), None, None, None, None, None, None, None, None


_swept_sphere_cost.register_autograd(_swept_backward, setup_context=_swept_setup)


def _number(x) -> float:
    return float(x)


def sphere_cost(world, spheres, activation_distance, weight, env, max_distance, esdf: bool) -> torch.Tensor:
    """The cost (b,h,n) through the op (robot_sdf.cost.sphere_cost while compiling)."""
    return torch.ops.robot_sdf.sphere_cost(spheres, world_handle(world), _number(activation_distance),
                                           _number(weight), -1.0 if max_distance is None else _number(max_distance),
                                           env, esdf)[0]


def signed_distance(world, spheres, env: int, max_distance):
    """(distance (1,1,n), gradient (1,1,n,4)) of points as zero-radius spheres (1,1,n,4)."""
    env_index = torch.full((1,), int(env), dtype=torch.int32, device=spheres.device)
    return torch.ops.robot_sdf.sphere_cost(spheres, world_handle(world), 0.0, -1.0,
                                           -1.0 if max_distance is None else _number(max_distance), env_index, True)


def swept_sphere_cost(world, spheres, activation_distance, weight, sweep_steps, speed_dt, enable_speed_metric, env,
                      max_distance) -> torch.Tensor:
    return torch.ops.robot_sdf.swept_sphere_cost(spheres, world_handle(world), _number(activation_distance),
                                                 _number(weight),
                                                 -1.0 if max_distance is None else _number(max_distance),
                                                 int(sweep_steps), _number(speed_dt), bool(enable_speed_metric),
                                                 env)[0]
