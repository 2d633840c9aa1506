"""Differentiable collision costs and signed distances over a MeshWorld, for in-process use.

All inputs are torch tensors on any device (moved to the world's device); outputs live on the
world's device. Lengths are metres.

Dependency direction: world.py imports this module (MeshWorld's evaluation methods delegate
here); this module never imports world.py and uses only MeshWorld's public API (``device``,
``num_envs``, ``max_distance``, ``check_env``, ``reading``), so any object offering that API
can be evaluated.
"""
from __future__ import annotations

import torch

from robot_sdf.warp_primitives import (
    SdfMeshWarpPy,
    SweptSdfMeshWarpPy,
    launch_sphere_cost,
    launch_sphere_cost_fresh,
    launch_swept_sphere_cost,
)


def _prepare_spheres(world, spheres: torch.Tensor) -> torch.Tensor:
    if spheres.dim() != 4 or spheres.shape[-1] != 4:
        raise ValueError(f"spheres must be (b, h, n, 4), got {tuple(spheres.shape)}")
    if spheres.dtype == torch.float32 and spheres.device == world.device:
        return spheres
    return spheres.to(device=world.device, dtype=torch.float32)


def _prepare_env_index(world, env_index, batch: int):
    if env_index is None:
        return None
    env = torch.as_tensor(env_index).reshape(-1)
    if env.shape[0] != batch:
        raise ValueError(f"env_index must have one entry per batch row ({batch}), got {env.shape[0]}")
    # Checked where it is free (host memory); on a GPU the kernel gives rows of an unknown
    # environment cost 0 rather than paying a device sync here on every call.
    if env.device.type == "cpu" and env.numel() and (int(env.min()) < 0 or int(env.max()) >= world.num_envs):
        raise ValueError(f"env_index values must be in [0, {world.num_envs}), got [{int(env.min())}, {int(env.max())}]")
    return env.to(device=world.device, dtype=torch.int32)


def _scalars(world, activation_distance, weight, max_distance):
    key = (world.device, activation_distance, weight, world.max_distance if max_distance is None else max_distance)
    try:
        cached = _scalar_sets.get(key)
    except TypeError:  # unhashable (e.g. a tensor): validate below, uncached
        cached = key = None
    if cached is not None:
        return cached
    result = _checked_scalars(world, activation_distance, weight, max_distance)
    if key is not None and type(key[1]) in (int, float) and type(key[2]) in (int, float) \
            and type(key[3]) in (int, float):
        if len(_scalar_sets) >= _MAX_CONSTANTS:
            _scalar_sets.clear()
        _scalar_sets[key] = result
    return result


# (device, activation, weight, max_distance) as given (plain numbers only) -> the three validated
# constant tensors: one lookup per call instead of three conversions and checks.
_scalar_sets: dict[tuple, tuple] = {}


def _checked_scalars(world, activation_distance, weight, max_distance):
    max_d = world.max_distance if max_distance is None else float(max_distance)
    for name, value, lower in (("activation_distance", activation_distance, 0.0), ("weight", weight, None),
                               ("max_distance", max_d, 0.0)):
        v = float(value)
        if v != v or (lower is not None and v < lower):
            raise ValueError(f"{name} must be a number >= {lower}, got {value}")
    dev = world.device
    return _constant(dev, weight), _constant(dev, activation_distance), _constant(dev, max_d)


_constants: dict[tuple[torch.device, float], torch.Tensor] = {}
_MAX_CONSTANTS = 256


def _constant(device: torch.device, value) -> torch.Tensor:
    """A (1,) float32 tensor holding ``value`` on ``device``, cached: on CUDA a fresh one would
    cost a host-to-device copy (and a stream sync) on every call. Callers never write to it."""
    key = (device, float(value))
    t = _constants.get(key)
    if t is None:
        if len(_constants) >= _MAX_CONSTANTS:
            _constants.clear()
        t = _constants.setdefault(key, torch.tensor([float(value)], dtype=torch.float32, device=device))
    return t


def _buffers(spheres: torch.Tensor):
    """Fresh cost (b,h,n) float32, gradient (b,h,n,4) float32 and sparsity (b,h,n) uint8 buffers,
    contiguous, for float32 spheres (b,h,n,4). Sizes go in as separate ints and the rest as
    *_like: torch parses a torch.Size or tuple argument several times slower (per-call cost)."""
    b, h, n, _ = spheres.shape
    cost = torch.empty(b, h, n, dtype=torch.float32, device=spheres.device)
    return (cost, torch.empty_like(spheres, memory_format=torch.contiguous_format),
            torch.empty_like(cost, dtype=torch.uint8))


class _SphereCost(torch.autograd.Function):
    """SdfMeshWarpPy's cost and backward for buffers this module owns, with the non-differentiable
    arguments passed as one tuple: autograd inspects every argument of apply, so the fifteen of
    SdfMeshWarpPy cost measurable time on a call of a few spheres."""

    @staticmethod
    def forward(ctx, spheres, call):
        cost, grad, sparsity, rest, sign_methods = call
        launch_sphere_cost_fresh(spheres, cost, grad, sparsity, *rest, compute_esdf=False,
                                 compute_grad=bool(ctx.needs_input_grad[0]), sign_method=sign_methods)
        ctx.out_grad = grad  # an internal buffer, not an output: no reference cycle
        return cost

    @staticmethod
    def backward(ctx, grad_output):
        # out_grad[..., 3] is zero, so the radius gets no gradient (as SdfMeshWarpPy.backward).
        return grad_output.unsqueeze(-1) * ctx.out_grad, None


def _direct_apply(function):
    """(torch's C entry point of ``function.apply``, its functorch checks), or None where this
    torch does not offer them.

    torch.autograd.Function.apply is a Python wrapper around that entry point: it binds default
    arguments for Functions with a setup_context (_SphereCost has none) and, unless a functorch
    transform is active, unwraps dead functorch wrappers and calls the entry point. sphere_cost
    does the same with two C calls, a few microseconds less on every evaluation; under an active
    transform it goes through apply."""
    try:
        return (super(torch.autograd.Function, function).apply, torch._C._are_functorch_transforms_active,
                torch._C._functorch.unwrap_if_dead)
    except AttributeError:  # pragma: no cover - other torch versions
        return None


_sphere_cost_apply = _direct_apply(_SphereCost)


def sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None):
    """Cost (b,h,n) of spheres (b,h,n,4) [x,y,z,r]; differentiable w.r.t. the sphere centres."""
    s = _prepare_spheres(world, spheres)
    env = None if env_index is None else _prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = _scalars(world, activation_distance, weight, max_distance)
    cost, grad, sparsity = _buffers(s)
    with world.reading() as snap:
        call = (cost, grad, sparsity, (w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                                       snap.n_env_mesh, max_d, env), snap.sign_methods)
        direct = _sphere_cost_apply
        if direct is not None and not direct[1]():
            return direct[0](direct[2](s), call)
        return _SphereCost.apply(s, call)


def swept_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4, speed_dt=0.1,
                      enable_speed_metric=False, env_index=None, max_distance=None):
    """Swept cost (b,h,n) of trajectories of spheres (b,h,n,4) along h; differentiable w.r.t. the
    centres. Step t's cost depends on the centres of steps t-1, t and t+1 (docs/design.md "Swept cost");
    backward gives the exact gradient for any upstream gradient."""
    s = _prepare_spheres(world, spheres)
    env = _prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = _scalars(world, activation_distance, weight, max_distance)
    dt = _speed_dt(world, speed_dt, enable_speed_metric)
    cost, grad, sparsity = _buffers(s)
    with world.reading() as snap:
        return SweptSdfMeshWarpPy.apply(s, cost, grad, sparsity, w, eta, dt, snap.mesh_idx,
                                        snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh, max_d,
                                        int(sweep_steps), bool(enable_speed_metric), env, False, snap.sign_methods)


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
    pts = pts.to(device=world.device, dtype=torch.float32)
    spheres = torch.cat([pts, torch.zeros_like(pts[:, :1])], dim=1).reshape(1, 1, -1, 4)
    # weight -1 turns the ESDF value max_i(-sd_i) into min_i sd_i, the signed distance to the union.
    w, eta, max_d = _scalars(world, 0.0, -1.0, max_distance)
    cost, grad, sparsity = _buffers(spheres)
    env_index = torch.full((1,), int(env), dtype=torch.int32, device=world.device)
    with world.reading() as snap:
        args = (spheres, cost, grad, sparsity, w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                snap.n_env_mesh, max_d, env_index)
        if spheres.requires_grad:
            dist = SdfMeshWarpPy.apply(*args, False, True, snap.sign_methods)
        else:
            launch_sphere_cost(*args, compute_esdf=True, compute_grad=True, sign_method=snap.sign_methods)
            dist = cost
        revision = snap.revision
    result = (dist.reshape(-1), grad.detach().reshape(-1, 4)[:, :3])
    return result + (revision,) if return_revision else result


def _speed_dt(world, speed_dt, enable_speed_metric):
    dt = float(speed_dt)
    if enable_speed_metric and not (dt > 0.0):
        raise ValueError(f"speed_dt must be > 0 with the speed metric, got {speed_dt}")
    return _constant(world.device, dt if dt > 0 else 1.0)


def evaluate_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None,
                         compute_gradient=True, return_revision=False):
    """Cost (b,h,n) and gradient (b,h,n,3) (None unless compute_gradient), without an autograd graph.

    With return_revision, a third element is the world revision the result was computed against."""
    s = _prepare_spheres(world, spheres).detach()
    env = _prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = _scalars(world, activation_distance, weight, max_distance)
    cost, grad, sparsity = _buffers(s)
    with world.reading() as snap:
        launch_sphere_cost_fresh(s, cost, grad, sparsity, w, eta, snap.mesh_idx, snap.mesh_pose_inverse,
                                 snap.mesh_enable, snap.n_env_mesh, max_d, env, compute_grad=compute_gradient,
                                 sign_method=snap.sign_methods)
        revision = snap.revision
    result = (cost, grad[..., :3] if compute_gradient else None)
    return result + (revision,) if return_revision else result


def evaluate_swept_sphere_cost(world, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4, speed_dt=0.1,
                               enable_speed_metric=False, env_index=None, max_distance=None, compute_gradient=True,
                               return_revision=False):
    """Swept cost (b,h,n) and gradient (b,h,n,3) or None; the revision used with return_revision.

    The gradient of sphere t is that of the summed cost sum_t' cost_t' (each step's cost depends
    on its neighbouring steps too), what an MPC that adds up the steps needs."""
    s = _prepare_spheres(world, spheres).detach()
    env = _prepare_env_index(world, env_index, s.shape[0])
    w, eta, max_d = _scalars(world, activation_distance, weight, max_distance)
    dt = _speed_dt(world, speed_dt, enable_speed_metric)
    cost, grad, sparsity = _buffers(s)
    with world.reading() as snap:
        launch_swept_sphere_cost(s, cost, grad, sparsity, w, eta, dt, snap.mesh_idx, snap.mesh_pose_inverse,
                                 snap.mesh_enable, snap.n_env_mesh, max_d, int(sweep_steps), bool(enable_speed_metric),
                                 env, compute_grad=compute_gradient, sign_method=snap.sign_methods)
        revision = snap.revision
    result = (cost, grad[..., :3] if compute_gradient else None)
    return result + (revision,) if return_revision else result
