"""Validated inputs of robot_sdf's costs over a MeshWorld: spheres and environment rows on the
world's device, the scalar constants as cached (1,) float32 tensors, fresh output buffers.

Shared by robot_sdf.cost (the in-process API) and robot_sdf.ops (its torch.compile custom ops),
which both import this module and not each other's internals. ``world`` is anything offering
MeshWorld's public ``device``, ``num_envs`` and ``max_distance``.
"""
from __future__ import annotations

import torch

from robot_sdf import _internals
from robot_sdf.types import SignMethod
from robot_sdf.warp_primitives import Query


def prepare_spheres(world, spheres: torch.Tensor) -> torch.Tensor:
    if spheres.dim() != 4 or spheres.shape[-1] != 4:
        raise ValueError(f"spheres must be (b, h, n, 4), got {tuple(spheres.shape)}")
    if spheres.dtype == torch.float32 and spheres.device == world.device:
        return spheres
    return spheres.to(device=world.device, dtype=torch.float32)


def prepare_env_index(world, env_index, batch: int):
    if env_index is None:
        return None
    env = torch.as_tensor(env_index).reshape(-1)
    if env.shape[0] != batch:
        raise ValueError(f"env_index must have one entry per batch row ({batch}), got {env.shape[0]}")
    # Checked where it is free (host memory); on a GPU the kernel gives rows of an unknown
    # environment cost 0 rather than paying a device sync here on every call.
    if env.device.type == "cpu" and env.numel() and not torch.compiler.is_compiling():
        try:
            low, high = int(env.min()), int(env.max())
        except RuntimeError:  # a torch.func wrapper (vmap over environments): values unreadable here
            low, high = 0, 0
        if low < 0 or high >= world.num_envs:
            raise ValueError(f"env_index values must be in [0, {world.num_envs}), got [{low}, {high}]")
    return env.to(device=world.device, dtype=torch.int32)


def scalar_tensors(world, activation_distance, weight, max_distance):
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
    return constant(dev, weight), constant(dev, activation_distance), constant(dev, max_d)


_constants: dict[tuple[torch.device, float], torch.Tensor] = {}
_MAX_CONSTANTS = 256


def constant(device: torch.device, value) -> torch.Tensor:
    """A (1,) float32 tensor holding ``value`` on ``device``, cached: on CUDA a fresh one would
    cost a host-to-device copy (and a stream sync) on every call. Callers never write to it."""
    key = (device, float(value))
    t = _constants.get(key)
    if t is None:
        if len(_constants) >= _MAX_CONSTANTS:
            _constants.clear()
        with _internals.plain_tensors():
            t = _constants.setdefault(key, torch.tensor([float(value)], dtype=torch.float32, device=device))
    return t


def output_buffers(spheres: torch.Tensor):
    """Fresh cost (b,h,n) float32, gradient (b,h,n,4) float32 and sparsity (b,h,n) uint8 buffers,
    contiguous, for float32 spheres (b,h,n,4). Sizes go in as separate ints and the rest as
    *_like: torch parses a torch.Size or tuple argument several times slower (per-call cost)."""
    b, h, n, _ = spheres.shape
    cost = torch.empty(b, h, n, dtype=torch.float32, device=spheres.device)
    return (cost, torch.empty_like(spheres, memory_format=torch.contiguous_format),
            torch.empty_like(cost, dtype=torch.uint8))


def env_rows(device: torch.device, env: int) -> torch.Tensor:
    """A (1,) int32 tensor holding ``env`` on ``device``, cached (callers never write to it)."""
    key = (device, env)
    t = _env_row_tensors.get(key)
    if t is None:
        if len(_env_row_tensors) >= _MAX_CONSTANTS:
            _env_row_tensors.clear()
        with _internals.plain_tensors():
            t = _env_row_tensors.setdefault(key, torch.full((1,), env, dtype=torch.int32, device=device))
    return t


_env_row_tensors: dict = {}


def speed_dt_tensor(world, speed_dt, enable_speed_metric):
    dt = float(speed_dt)
    if enable_speed_metric and not (dt > 0.0):
        raise ValueError(f"speed_dt must be > 0 with the speed metric, got {speed_dt}")
    return constant(world.device, dt if dt > 0 else 1.0)


def world_query(world, snap, activation_distance, weight, max_distance, *, sweep: tuple | None = None,
                **options) -> Query:
    """The warp_primitives.Query of an evaluation over ``snap``, a snapshot of ``world`` read
    inside world.reading(): its tensors, per-slot sign methods and slot BVHs, the validated
    scalars; ``sweep`` (sweep_steps, speed_dt, enable_speed_metric) for a swept one; ``options``
    Query's keywords (esdf, compute_grad, outputs, reading)."""
    w, eta, max_d = scalar_tensors(world, activation_distance, weight, max_distance)
    if sweep is not None:
        steps, speed_dt, metric = sweep
        options.update(speed_dt=speed_dt_tensor(world, speed_dt, metric), sweep_steps=int(steps),
                       speed_metric=bool(metric))
    return Query(w, eta, max_d, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh,
                 SignMethod.AUTO, snap, **options)

