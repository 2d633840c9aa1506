"""torch.library custom ops over a MeshWorld: what robot_sdf.cost calls while torch.compile traces.

Dynamo cannot trace a Warp launch (nor the world's read lock), so robot_sdf.cost routes through
these ops when ``torch.compiler.is_compiling()``: each is opaque to the compiler, has a fake
implementation giving output shapes, and the derivatives of warp_primitives' SphereCost and
SweptCost as its autograd formula, so a cost function compiles with ``fullgraph=True``. The world
travels as an integer handle (a constant of the graph); an op reads the world's *current*
snapshot when it runs, so pose and geometry updates reach a compiled function without
recompiling. On CUDA they run on torch's current stream, outside captured CUDA graphs (_TAGS).

Shapes: spheres (b,h,n,4) float32; env (b,) int32 or None. Outputs as robot_sdf.cost's.
"""
from __future__ import annotations

import itertools
import weakref
from typing import Optional

import torch

from robot_sdf.cost_inputs import world_query
from robot_sdf.warp_primitives import sphere_cost_backward, swept_chain_rule

_worlds: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()
_handles: "weakref.WeakKeyDictionary[object, int]" = weakref.WeakKeyDictionary()
_next_handle = itertools.count(1)

# Not inside a captured CUDA graph (mode="reduce-overhead" runs these ops eagerly between captured
# parts): a captured launch would keep the addresses of the world's tensors at capture time, while
# the world replaces its pose and enable tensors on every update and frees the old ones.
_TAGS = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()


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


def _max(max_distance: float) -> Optional[float]:
    return None if max_distance < 0 else max_distance  # -1: the world's default


@torch.library.custom_op("robot_sdf::sphere_cost", mutates_args=(), tags=_TAGS)
def _sphere_cost(spheres: torch.Tensor, world: int, activation_distance: float, weight: float, max_distance: float,
                 env: Optional[torch.Tensor], esdf: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(cost (b,h,n), gradient (b,h,n,4)) of spheres (b,h,n,4) float32."""
    w = _world(world)
    with w.reading() as snap:
        return world_query(w, snap, activation_distance, weight, _max(max_distance), esdf=esdf).cost(
            spheres.contiguous(), env)


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
        return world_query(w, snap, activation_distance, weight, _max(max_distance), esdf=esdf).hessian(
            spheres.contiguous(), env)


@_sphere_hessian.register_fake
def _(spheres, world, activation_distance, weight, max_distance, env, esdf):
    b, h, n, _ = spheres.shape
    return spheres.new_empty((b, h, n, 3, 3))


class _HessianThroughOp:
    """The Hessian source of the op's backward (warp_primitives.sphere_cost_backward): the
    sphere_hessian op, which reads the world's current snapshot when it runs and which the
    compiler keeps as one opaque call."""

    __slots__ = ("arguments",)

    def __init__(self, world: int, activation_distance: float, weight: float, max_distance: float, esdf: bool):
        self.arguments = (world, activation_distance, weight, max_distance, esdf)

    def hessian(self, spheres: torch.Tensor, env: Optional[torch.Tensor]) -> torch.Tensor:
        world, activation_distance, weight, max_distance, esdf = self.arguments
        return torch.ops.robot_sdf.sphere_hessian(spheres, world, activation_distance, weight, max_distance, env, esdf)


def _sphere_cost_setup(ctx, inputs, output):
    spheres, world, activation_distance, weight, max_distance, env, esdf = inputs
    ctx.set_materialize_grads(False)  # None, not zeros, for an unused output: no Hessian launch
    ctx.save_for_backward(spheres, output[1])
    ctx.env = env
    ctx.hessian_source = _HessianThroughOp(world, activation_distance, weight, max_distance, esdf)


def _sphere_cost_backward(ctx, grad_cost, grad_gradient):
    spheres, gradient = ctx.saved_tensors
    result = sphere_cost_backward(grad_cost, grad_gradient, spheres, gradient, ctx.env, ctx.hessian_source)
    return (torch.zeros_like(spheres) if result is None else result), None, None, None, None, None, None


_sphere_cost.register_autograd(_sphere_cost_backward, setup_context=_sphere_cost_setup)


@torch.library.custom_op("robot_sdf::swept_sphere_cost", mutates_args=(), tags=_TAGS)
def _swept_sphere_cost(spheres: torch.Tensor, world: int, activation_distance: float, weight: float,
                       max_distance: float, sweep_steps: int, speed_dt: float, speed_metric: bool,
                       env: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(cost (b,h,n), partials (3,b,h,n,4): warp_primitives.Query.swept) of trajectories (b,h,n,4)."""
    w = _world(world)
    with w.reading() as snap:
        return world_query(w, snap, activation_distance, weight, _max(max_distance),
                           sweep=(sweep_steps, speed_dt, speed_metric)).swept(spheres.contiguous(), env)


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


def _maximum(max_distance) -> float:
    return -1.0 if max_distance is None else float(max_distance)


def sphere_cost(world, spheres, activation_distance, weight, env, max_distance, esdf: bool) -> torch.Tensor:
    """The cost (b,h,n) through the op (robot_sdf.cost.sphere_cost while compiling)."""
    return torch.ops.robot_sdf.sphere_cost(spheres, world_handle(world), float(activation_distance), float(weight),
                                           _maximum(max_distance), env, esdf)[0]


def signed_distance(world, spheres, env: int, max_distance):
    """(distance (1,1,n), gradient (1,1,n,4)) of points as zero-radius spheres (1,1,n,4)."""
    env_index = torch.full((1,), int(env), dtype=torch.int32, device=spheres.device)
    return torch.ops.robot_sdf.sphere_cost(spheres, world_handle(world), 0.0, -1.0, _maximum(max_distance),
                                           env_index, True)


def swept_sphere_cost(world, spheres, activation_distance, weight, sweep_steps, speed_dt, enable_speed_metric, env,
                      max_distance) -> torch.Tensor:
    """The swept cost (b,h,n) through the op (robot_sdf.cost.swept_sphere_cost while compiling)."""
    return torch.ops.robot_sdf.swept_sphere_cost(spheres, world_handle(world), float(activation_distance),
                                                 float(weight), _maximum(max_distance), int(sweep_steps),
                                                 float(speed_dt), bool(enable_speed_metric), env)[0]
