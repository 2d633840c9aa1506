"""Service requests as plain arrays: validation, shapes and the call into a MeshWorld.

The ROS node (robot_sdf.ros.sdf_server) only turns messages into the numpy arrays and scalars
taken here and the arrays returned back into message fields; everything in between lives in
this module, which imports no ROS package, so the node's compute path runs (and is tested)
anywhere the core runs, a GPU machine without ROS included.

Every value is checked in the precision the kernels use (float32): a coordinate, radius or
distance that is finite in float64 but overflows float32, or is absurd for a robot (a radius of
3e38 m), is refused with a message instead of answering ``inf`` with success; a result that is
not finite (a huge weight times a large cost) is refused too. Refusals raise RequestError (a
ValueError) and compute nothing; MeshWorld's own refusals (env out of range, ...) are
ValueErrors as well.

Request conventions (robot_sdf_interfaces/srv/*.srv):
- spheres are rows x, y, z, r [m] in the world frame; a negative radius switches a sphere off:
  it gets cost 0 and gradient 0 wherever it is (inside a mesh too);
- activation_distance, weight and max_distance <= 0 mean "node default".
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

FLOAT32_MAX = float(np.finfo(np.float32).max)


class RequestError(ValueError):
    """A request that cannot be served; its text goes into response.message."""


@dataclass(frozen=True)
class RequestSettings:
    """Defaults and limits of the requests one server answers.

    activation_distance, weight, max_distance: defaults used when a request sends <= 0 [m, -, m];
    max_spheres_per_request, max_points_per_request, max_sweep_steps: size limits;
    max_coordinate: largest |x|, |y|, |z| of a sphere or point [m] (float32 keeps ~6 mm
        resolution at 1e5 m; beyond that a query is meaningless);
    max_length: largest sphere radius, activation_distance and max_distance a request may send [m].
    """

    activation_distance: float = 0.05
    weight: float = 1.0
    max_distance: float = 0.5
    max_spheres_per_request: int = 2_000_000
    max_points_per_request: int = 1_000_000
    max_sweep_steps: int = 32
    max_coordinate: float = 1e5
    max_length: float = 1e3

    def __post_init__(self) -> None:
        for name in ("activation_distance", "weight", "max_distance", "max_coordinate", "max_length"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0 < value <= FLOAT32_MAX):
                raise ValueError(f"RequestSettings.{name} must be a finite float32 > 0, got {value}")
        for name in ("max_spheres_per_request", "max_points_per_request"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"RequestSettings.{name} must be >= 1")
        if int(self.max_sweep_steps) < 0:
            raise ValueError("RequestSettings.max_sweep_steps must be >= 0")


@dataclass
class CostResult:
    """Flat response arrays of a cost request.

    cost (b*h*n,) float32; gradient (b*h*n*3,) float32, empty when not requested;
    world_revision: revision of the world state the answer was computed on;
    spheres (b,h,n,4) float32: the validated request spheres (a view of the request buffer).
    """

    cost: np.ndarray
    gradient: np.ndarray
    world_revision: int
    spheres: np.ndarray


@dataclass
class DistanceResult:
    """Flat response arrays of a signed-distance request: distance (n,), gradient (n*3,) float32."""

    distance: np.ndarray
    gradient: np.ndarray
    world_revision: int


def _flat_float32(values, what: str) -> np.ndarray:
    """Any buffer / sequence of numbers -> 1-D float32 array (a view when already float32)."""
    a = np.asarray(values)
    if a.dtype != np.float32:
        if a.size and not np.issubdtype(a.dtype, np.number):
            raise RequestError(f"{what} must be numbers, got dtype {a.dtype}")
        with np.errstate(over="ignore", invalid="ignore"):
            a = a.astype(np.float32)  # float64 beyond float32 range becomes inf: refused below
    return a.reshape(-1)


def _request_scalar(value, default: float, name: str, upper: float | None) -> float:
    """The contract: <= 0 means the node default; otherwise a finite float32 up to ``upper``."""
    v = float(value)
    if not math.isfinite(v) or abs(v) > FLOAT32_MAX:
        raise RequestError(f"{name} must be finite (in float32), got {value}")
    if v <= 0:
        return float(default)
    if upper is not None and v > upper:
        raise RequestError(f"{name} {v:g} exceeds the limit of {upper:g}")
    return v


def _check_rows(rows: np.ndarray, settings: RequestSettings, shape: tuple[int, ...], what: str,
                has_radius: bool) -> None:
    """Finite, bounded coordinates (and radii) of (k, 3|4) float32 rows; one pass of reductions
    over the request (no temporary copies), the slow search only to name a bad row."""
    xyz = rows[:, :3]
    lim = settings.max_coordinate
    lo, hi = float(xyz.min()), float(xyz.max())
    r_lo, r_hi = (float(rows[:, 3].min()), float(rows[:, 3].max())) if has_radius else (0.0, 0.0)
    # NaN fails every comparison, so it lands in the error branch too.
    if lo >= -lim and hi <= lim and r_hi <= settings.max_length and r_lo >= -FLOAT32_MAX:
        return
    bad_xyz = ~np.isfinite(xyz).all(axis=1)
    if bad_xyz.any():
        i = int(np.flatnonzero(bad_xyz)[0])
        raise RequestError(f"{what} {_index(i, shape)} is not finite")
    if has_radius and not np.isfinite(rows[:, 3]).all():
        i = int(np.flatnonzero(~np.isfinite(rows[:, 3]))[0])
        raise RequestError(f"{what} {_index(i, shape)} radius is not finite")
    far = np.flatnonzero((np.abs(xyz) > lim).any(axis=1))
    if far.size:
        i = int(far[0])
        raise RequestError(f"{what} {_index(i, shape)} has a coordinate beyond max_coordinate "
                           f"{lim:g} m ({rows[i, :3].tolist()})")
    i = int(np.flatnonzero(rows[:, 3] > settings.max_length)[0])
    raise RequestError(f"{what} {_index(i, shape)} radius {float(rows[i, 3]):g} m exceeds the "
                       f"limit of {settings.max_length:g} m (a negative radius switches a sphere off)")


def _index(flat_row: int, shape: tuple[int, ...]) -> str:
    if len(shape) == 3:
        b, h, n = np.unravel_index(flat_row, shape)
        return f"(batch {b}, step {h}, sphere {n})"
    return str(flat_row)


def _env_index(env_index, batch: int) -> torch.Tensor | None:
    env = np.asarray(env_index if env_index is not None else (), dtype=np.int64).reshape(-1)
    return torch.from_numpy(env) if env.size else None


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().to("cpu").numpy().reshape(-1)


def _check_result(name: str, *arrays: np.ndarray) -> None:
    for a in arrays:
        if a.size and not (np.isfinite(a.min()) and np.isfinite(a.max())):
            raise RequestError(f"the {name} is not finite in float32 (weight or lengths too large "
                               f"for this scene); nothing returned")


class RequestTranslator:
    """Answers flat-array requests against ``world`` (a robot_sdf.MeshWorld) with ``settings``."""

    def __init__(self, world, settings: RequestSettings | None = None) -> None:
        self.world = world
        self.settings = settings or RequestSettings(max_distance=world.max_distance)

    # -------------------------------------------------------------- pieces shared by the services
    def spheres(self, batch: int, horizon: int, spheres_per_step: int, spheres) -> np.ndarray:
        """Validated (b,h,n,4) float32 spheres (a view of ``spheres`` when it is float32)."""
        b, h, n = int(batch), int(horizon), int(spheres_per_step)
        count = b * h * n  # Python ints: no overflow whatever the uint32 fields hold
        if b <= 0 or h <= 0 or n <= 0:
            raise RequestError(f"batch, horizon and spheres_per_step must be > 0, got {b}, {h}, {n}")
        limit = self.settings.max_spheres_per_request
        if count > limit:
            raise RequestError(f"batch*horizon*spheres_per_step = {count} exceeds "
                               f"max_spheres_per_request {limit}")
        flat = _flat_float32(spheres, "spheres")
        if flat.size != 4 * count:
            raise RequestError(f"spheres has {flat.size} floats, expected "
                               f"batch*horizon*spheres_per_step*4 = {4 * count}")
        rows = flat.reshape(count, 4)
        _check_rows(rows, self.settings, (b, h, n), "sphere", has_radius=True)
        return flat.reshape(b, h, n, 4)

    def cost_scalars(self, activation_distance, weight) -> tuple[float, float]:
        s = self.settings
        return (_request_scalar(activation_distance, s.activation_distance, "activation_distance", s.max_length),
                _request_scalar(weight, s.weight, "weight", None))

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        if not array.flags.writeable:  # torch wants writable memory; it never writes here
            array = array.copy()
        return torch.from_numpy(array).to(self.world.device)

    # -------------------------------------------------------------- services
    def sphere_cost(self, batch, horizon, spheres_per_step, spheres, env_index=(), activation_distance=0.0,
                    weight=0.0, compute_gradient=True) -> CostResult:
        """EvaluateSphereCost: spheres batch*horizon*spheres_per_step*4 floats, env_index (batch,)
        or empty -> CostResult."""
        s = self.spheres(batch, horizon, spheres_per_step, spheres)
        eta, w = self.cost_scalars(activation_distance, weight)
        cost, grad, rev = self.world.evaluate_sphere_cost(
            self._tensor(s), activation_distance=eta, weight=w, env_index=_env_index(env_index, s.shape[0]),
            compute_gradient=bool(compute_gradient), return_revision=True)
        return self._cost_result(cost, grad if compute_gradient else None, rev, s)

    def swept_sphere_cost(self, batch, horizon, spheres_per_step, spheres, env_index=(), activation_distance=0.0,
                          weight=0.0, compute_gradient=True, sweep_steps=0, speed_dt=0.0,
                          enable_speed_metric=False) -> CostResult:
        """EvaluateSweptSphereCost: as sphere_cost plus sweep_steps, speed_dt [s], enable_speed_metric."""
        s = self.spheres(batch, horizon, spheres_per_step, spheres)
        eta, w = self.cost_scalars(activation_distance, weight)
        steps = int(sweep_steps)
        if steps < 0:
            raise RequestError(f"sweep_steps must be >= 0, got {steps}")
        if steps > self.settings.max_sweep_steps:
            raise RequestError(f"sweep_steps {steps} exceeds max_sweep_steps {self.settings.max_sweep_steps}")
        dt = float(speed_dt)
        if not math.isfinite(dt) or abs(dt) > FLOAT32_MAX:
            raise RequestError(f"speed_dt must be finite (in float32), got {speed_dt}")
        if enable_speed_metric and dt > 0 and dt < 1e-6:
            raise RequestError(f"speed_dt {dt:g} s is too small for the speed metric (>= 1e-6 s)")
        cost, grad, rev = self.world.evaluate_swept_sphere_cost(
            self._tensor(s), activation_distance=eta, weight=w, sweep_steps=steps, speed_dt=dt,
            enable_speed_metric=bool(enable_speed_metric), env_index=_env_index(env_index, s.shape[0]),
            compute_gradient=bool(compute_gradient), return_revision=True)
        return self._cost_result(cost, grad if compute_gradient else None, rev, s)

    def signed_distance(self, points, env=0, max_distance=0.0) -> DistanceResult:
        """QuerySignedDistance: points n*3 floats, env, max_distance (<= 0: default) -> DistanceResult."""
        flat = _flat_float32(points, "points")
        if flat.size == 0:
            raise RequestError("points is empty")
        if flat.size % 3:
            raise RequestError(f"points has {flat.size} floats, not a multiple of 3")
        n = flat.size // 3
        if n > self.settings.max_points_per_request:
            raise RequestError(f"{n} points exceed max_points_per_request {self.settings.max_points_per_request}")
        rows = flat.reshape(n, 3)
        _check_rows(rows, self.settings, (n,), "point", has_radius=False)
        max_d = _request_scalar(max_distance, self.settings.max_distance, "max_distance", self.settings.max_length)
        dist, grad, rev = self.world.signed_distance(self._tensor(rows), env=int(env), max_distance=max_d,
                                                     return_revision=True)
        d, g = _to_numpy(dist), _to_numpy(grad)
        _check_result("distance", d, g)
        return DistanceResult(d, g, int(rev))

    def _cost_result(self, cost, grad, rev, spheres) -> CostResult:
        c = _to_numpy(cost)
        g = _to_numpy(grad) if grad is not None else np.zeros(0, np.float32)
        _check_result("cost", c, g)
        return CostResult(c, g, int(rev), spheres)
