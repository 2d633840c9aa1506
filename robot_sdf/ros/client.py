"""Client of the ``sdf_server`` services for MPC code: torch tensors in, torch tensors out.

    from robot_sdf.ros.client import SdfClient, remote_sphere_cost
    client = SdfClient()                      # own rclpy node, spun in a background thread
    client.wait_for_services(10.0)
    res = client.sphere_cost(spheres)         # spheres (b,h,n,4) x,y,z,r [m], world frame
    res.cost, res.gradient, res.world_revision, res.latency_s
    cost = remote_sphere_cost(client, spheres.requires_grad_())   # autograd through the service
    cost.sum().backward()

With ``node=...`` the client uses that node instead; it must then be spun by an executor in
another thread (the synchronous calls wait for the response). Whole-buffer conversions only:
tensors become ``array.array`` via one ``tobytes`` copy, responses become tensors via
``np.frombuffer``.
"""
from __future__ import annotations

import array
import concurrent.futures
import itertools
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

import rclpy
from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node

from robot_sdf import _internals
from robot_sdf.warp_primitives import refuse_second_order
from robot_sdf.ros.conversions import float32_array, uint32_array
from robot_sdf_interfaces.srv import EvaluateSphereCost, EvaluateSweptSphereCost, QuerySignedDistance

_counter = itertools.count()
# How often pending requests are checked for their deadline [s].
_WATCHDOG_PERIOD_S = 0.05


class SdfServiceError(RuntimeError):
    """The service answered success=false, or did not answer within the timeout."""


@dataclass
class CostResult:
    """Result of a cost request.

    cost: (b,h,n) float32; gradient: (b,h,n,3) float32 d cost / d x,y,z, or None when not
    requested; both on the device of the request's spheres. world_revision: revision of the
    world state the server used. latency_s: request to response, seconds.
    """

    cost: torch.Tensor
    gradient: torch.Tensor | None
    world_revision: int
    latency_s: float


class DistanceResult(NamedTuple):
    """Result of query_signed_distance (unpacks as ``distance, gradient, world_revision``).

    distance: (n,) float32 [m], negative inside; gradient: (n,3) unit direction of increasing
    distance; both on the device of the query points. world_revision: world state used.
    """

    distance: torch.Tensor
    gradient: torch.Tensor
    world_revision: int


def _float_field(t: torch.Tensor) -> array.array:
    return float32_array(t.detach().to("cpu", torch.float32).numpy())


def _tensor(field: array.array, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    a = np.frombuffer(field, dtype=np.float32) if len(field) else np.zeros(0, np.float32)
    expected = int(np.prod(shape))
    if a.size != expected:
        raise SdfServiceError(f"response holds {a.size} values, expected {expected}")
    return torch.from_numpy(a.reshape(shape)).to(like.device)


class SdfClient:
    """Synchronous and asynchronous access to the three sdf_server services.

    node: an rclpy Node to create the service clients on (spun by its owner), or None to create
    and spin a private node (rclpy is initialised when needed). server: the server node's fully
    qualified name. timeout_s: default time to wait for a response.
    """

    def __init__(self, node: Node | None = None, server: str = "/sdf_server",
                 timeout_s: float = 5.0) -> None:
        self.timeout_s = float(timeout_s)
        self._own = node is None
        self._executor: SingleThreadedExecutor | None = None
        self._thread: threading.Thread | None = None
        if node is None:
            if not rclpy.ok():
                rclpy.init()
            node = rclpy.create_node(f"sdf_client_{os.getpid()}_{next(_counter)}")
        self.node = node
        base = server.rstrip("/")
        self._clients = {
            EvaluateSphereCost: node.create_client(EvaluateSphereCost, f"{base}/evaluate_sphere_cost"),
            EvaluateSweptSphereCost: node.create_client(
                EvaluateSweptSphereCost, f"{base}/evaluate_swept_sphere_cost"),
            QuerySignedDistance: node.create_client(QuerySignedDistance, f"{base}/query_signed_distance"),
        }
        self._lock = threading.Lock()
        self._closed = False
        # pending request future -> (rclpy future, client, deadline); failed by the watchdog
        self._pending: dict[concurrent.futures.Future, tuple[Any, Any, float]] = {}
        self._watchdog = node.create_timer(_WATCHDOG_PERIOD_S, self._expire)
        if self._own:
            self._executor = SingleThreadedExecutor(context=node.context)
            self._executor.add_node(node)
            self._thread = threading.Thread(target=self._spin, name="sdf_client_spin", daemon=True)
            self._thread.start()

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:  # noqa: BLE001 - context shut down underneath us: nothing to serve
            pass

    # ------------------------------------------------------------------ lifecycle

    def wait_for_services(self, timeout_s: float | None = None) -> bool:
        """Wait until all three services are available; False after ``timeout_s`` seconds."""
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        for client in self._clients.values():
            left = deadline - time.monotonic()
            if left <= 0 or not client.wait_for_service(timeout_sec=left):
                return False
        return True

    def close(self) -> None:
        """Fail pending requests, destroy the service clients (and the private node)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            pending, self._pending = self._pending, {}
        for fut, (rfut, client, _) in pending.items():
            client.remove_pending_request(rfut)
            if not fut.done():
                fut.set_exception(SdfServiceError("client closed"))
        self.node.destroy_timer(self._watchdog)
        for client in self._clients.values():
            self.node.destroy_client(client)
        if self._own:
            self._executor.shutdown(timeout_sec=1.0)
            self.node.destroy_node()
            if self._thread is not None:
                self._thread.join(timeout=2.0)

    def __enter__(self) -> "SdfClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _call_async(self, srv_type, request, convert: Callable[[Any, float], Any],
                    timeout_s: float | None) -> concurrent.futures.Future:
        if self._closed:
            raise SdfServiceError("the client is closed")
        client = self._clients[srv_type]
        fut: concurrent.futures.Future = concurrent.futures.Future()
        t0 = time.perf_counter()
        deadline = time.monotonic() + (self.timeout_s if timeout_s is None else timeout_s)
        rfut = client.call_async(request)

        def done(rf) -> None:
            # Whoever removes `fut` from _pending (this callback, the timeout watchdog or close())
            # is the only one that resolves it.
            with self._lock:
                owned = self._pending.pop(fut, None) is not None
            if not owned:
                return
            try:
                response = rf.result()
                if response is None:
                    raise SdfServiceError(f"{client.service_name}: no response")
                if not response.success:
                    raise SdfServiceError(f"{client.service_name}: {response.message}")
                fut.set_result(convert(response, time.perf_counter() - t0))
            except Exception as exc:  # noqa: BLE001 - delivered to the caller through the future
                fut.set_exception(exc if isinstance(exc, SdfServiceError)
                                  else SdfServiceError(f"{client.service_name}: {exc}"))

        with self._lock:
            self._pending[fut] = (rfut, client, deadline)
        rfut.add_done_callback(done)
        return fut

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            late = [(f, v) for f, v in self._pending.items() if v[2] <= now]
            for f, _ in late:
                del self._pending[f]
        for fut, (rfut, client, _) in late:
            client.remove_pending_request(rfut)
            if not fut.done():
                fut.set_exception(SdfServiceError(f"{client.service_name}: no response within the timeout"))

    def _wait(self, fut: concurrent.futures.Future, timeout_s: float | None):
        limit = (self.timeout_s if timeout_s is None else timeout_s) + 1.0
        try:
            return fut.result(timeout=limit)
        except concurrent.futures.TimeoutError:
            # The watchdog did not run (node not spun): fail here instead of hanging.
            raise SdfServiceError("no response within the timeout (is the client node spun?)") from None

    # ------------------------------------------------------------------ cost requests

    @staticmethod
    def _fill_cost_request(req, spheres: torch.Tensor, activation_distance: float, weight: float,
                           env_index, compute_gradient: bool) -> None:
        if spheres.dim() != 4 or spheres.shape[-1] != 4:
            raise ValueError(f"spheres must have shape (b,h,n,4), got {tuple(spheres.shape)}")
        b, h, n, _ = spheres.shape
        req.batch, req.horizon, req.spheres_per_step = int(b), int(h), int(n)
        req.spheres = _float_field(spheres)
        if env_index is not None:
            req.env_index = uint32_array(torch.as_tensor(env_index).detach().cpu().reshape(-1).numpy())
        req.activation_distance = float(activation_distance)
        req.weight = float(weight)
        req.compute_gradient = bool(compute_gradient)

    @staticmethod
    def _cost_converter(spheres: torch.Tensor, compute_gradient: bool):
        b, h, n, _ = spheres.shape

        def convert(resp, latency: float) -> CostResult:
            cost = _tensor(resp.cost, (b, h, n), spheres)
            grad = _tensor(resp.gradient, (b, h, n, 3), spheres) if compute_gradient else None
            return CostResult(cost, grad, int(resp.world_revision), latency)

        return convert

    def sphere_cost_async(self, spheres: torch.Tensor, activation_distance: float = 0.0,
                          weight: float = 0.0, env_index=None, compute_gradient: bool = True,
                          timeout_s: float | None = None) -> concurrent.futures.Future:
        """Start an evaluate_sphere_cost request; the future resolves to a CostResult or raises
        SdfServiceError. spheres (b,h,n,4); activation_distance [m] and weight <= 0 = server
        default; env_index (b,) ints or None (env 0)."""
        req = EvaluateSphereCost.Request()
        self._fill_cost_request(req, spheres, activation_distance, weight, env_index, compute_gradient)
        return self._call_async(EvaluateSphereCost, req,
                                self._cost_converter(spheres, compute_gradient), timeout_s)

    def sphere_cost(self, spheres: torch.Tensor, activation_distance: float = 0.0,
                    weight: float = 0.0, env_index=None, compute_gradient: bool = True,
                    timeout_s: float | None = None) -> CostResult:
        """Blocking evaluate_sphere_cost (see sphere_cost_async)."""
        return self._wait(self.sphere_cost_async(spheres, activation_distance, weight, env_index,
                                                 compute_gradient, timeout_s), timeout_s)

    def swept_sphere_cost_async(self, spheres: torch.Tensor, sweep_steps: int = 4,
                                speed_dt: float = 0.1, enable_speed_metric: bool = False,
                                activation_distance: float = 0.0, weight: float = 0.0,
                                env_index=None, compute_gradient: bool = True,
                                timeout_s: float | None = None) -> concurrent.futures.Future:
        """Start an evaluate_swept_sphere_cost request (spheres (b,h,n,4) trajectories along h;
        speed_dt [s] between horizon steps); the future resolves to a CostResult."""
        req = EvaluateSweptSphereCost.Request()
        self._fill_cost_request(req, spheres, activation_distance, weight, env_index, compute_gradient)
        req.sweep_steps = int(sweep_steps)
        req.speed_dt = float(speed_dt)
        req.enable_speed_metric = bool(enable_speed_metric)
        return self._call_async(EvaluateSweptSphereCost, req,
                                self._cost_converter(spheres, compute_gradient), timeout_s)

    def swept_sphere_cost(self, spheres: torch.Tensor, sweep_steps: int = 4, speed_dt: float = 0.1,
                          enable_speed_metric: bool = False, activation_distance: float = 0.0,
                          weight: float = 0.0, env_index=None, compute_gradient: bool = True,
                          timeout_s: float | None = None) -> CostResult:
        """Blocking evaluate_swept_sphere_cost (see swept_sphere_cost_async)."""
        return self._wait(self.swept_sphere_cost_async(
            spheres, sweep_steps, speed_dt, enable_speed_metric, activation_distance, weight,
            env_index, compute_gradient, timeout_s), timeout_s)

    # ------------------------------------------------------------------ distance queries

    def signed_distance_async(self, points: torch.Tensor, env: int = 0, max_distance: float = 0.0,
                              timeout_s: float | None = None) -> concurrent.futures.Future:
        """Start a query_signed_distance request for points (n,3) [m]; resolves to a
        DistanceResult (distance (n,), gradient (n,3), world_revision)."""
        points = torch.as_tensor(points)
        if points.dim() != 2 or points.shape[1] != 3:
            raise ValueError(f"points must have shape (n,3), got {tuple(points.shape)}")
        if env < 0:
            raise ValueError("env must be >= 0")
        req = QuerySignedDistance.Request()
        req.points = _float_field(points)
        req.env = int(env)
        req.max_distance = float(max_distance)
        n = int(points.shape[0])

        def convert(resp, latency: float) -> DistanceResult:
            return DistanceResult(_tensor(resp.distance, (n,), points),
                                  _tensor(resp.gradient, (n, 3), points), int(resp.world_revision))

        return self._call_async(QuerySignedDistance, req, convert, timeout_s)

    def signed_distance(self, points: torch.Tensor, env: int = 0, max_distance: float = 0.0,
                        timeout_s: float | None = None) -> DistanceResult:
        """Blocking query_signed_distance; unpacks as ``distance, gradient, revision``."""
        return self._wait(self.signed_distance_async(points, env, max_distance, timeout_s), timeout_s)


# ---------------------------------------------------------------------- autograd


def _pad_grad(grad_output: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """grad_output (b,h,n) * gradient (b,h,n,3) -> (b,h,n,4) with 0 for the radius."""
    g = grad_output[..., None] * gradient.to(grad_output.dtype)
    return torch.cat([g, torch.zeros_like(g[..., :1])], dim=-1)


def _tangent(tangent: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """Forward-mode tangent (b,h,n): the server gradient (b,h,n,3) dotted with the spheres' tangent
    (b,h,n,4) (the radius does not count)."""
    return (gradient.to(tangent.dtype) * tangent[..., :3]).sum(-1)


def _fold_env(info, env_index, env_dim, batch: int):
    """env_index for spheres folded from (B, b, ...) to (B*b, ...): None, a batched (B, b) tensor,
    or a shared (b,) one repeated."""
    if env_index is None:
        return None
    env = torch.as_tensor(env_index)
    if env_dim is None:
        return env.reshape(1, -1).expand(info.batch_size, batch).reshape(-1)
    return env.movedim(env_dim, 0).reshape(-1)


def _fold_spheres(info, spheres, dim):
    s = spheres.movedim(dim, 0) if dim is not None else spheres.unsqueeze(0).expand(info.batch_size, *spheres.shape)
    return s.reshape(s.shape[0] * s.shape[1], *s.shape[2:]), s.shape[1]


class _RemoteFunction(torch.autograd.Function):
    """What the remote Functions share: forward returns (cost, server gradient (b,h,n,3), not
    differentiable) so that torch.func sees the gradient at every level; the public classes'
    ``apply`` returns the cost. compute_gradient None: ask the server for it where a derivative
    may be wanted (robot_sdf._internals.may_need_gradient)."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1], inputs[0])
        ctx.save_for_forward(output[1])

    @staticmethod
    def _gradient(ctx):
        gradient = ctx.saved_tensors[0]
        if gradient.dim() == 1:
            raise RuntimeError("robot_sdf remote cost: derivatives asked for a call made with compute_gradient=False")
        return gradient

    @staticmethod
    def jvp(ctx, tangent, *_):
        return _tangent(tangent, _RemoteFunction._gradient(ctx)), None

    @staticmethod
    def _result(res, spheres):
        gradient = res.gradient if res.gradient is not None else res.cost.new_empty(0)
        return res.cost.to(spheres.dtype), gradient

    @classmethod
    def _vmap(cls, info, spheres_dim, spheres, env_dim, env_position: int, args: tuple):
        """Fold the vmapped dimension into b and make one request."""
        folded, b = _fold_spheres(info, spheres, spheres_dim)
        args = list(args)
        args[env_position] = _fold_env(info, args[env_position], env_dim, b)
        cost, gradient = cls.apply(folded, *args)
        cost = cost.reshape(info.batch_size, b, *cost.shape[1:])
        if gradient.dim() == 1:
            return (cost, gradient), (0, None)
        return (cost, gradient.reshape(info.batch_size, b, *gradient.shape[1:])), (0, 0)


class _RemoteSphereCost(_RemoteFunction):
    """``RemoteSphereCost.apply(spheres, client, activation_distance, weight, env_index,
    compute_gradient=None)`` -> cost (b,h,n); backward: grad_output[..., None] * server gradient,
    radius gradient 0; jvp: server gradient . tangent. torch.func transforms work (vmap folds the
    vmapped dimension into b: one request); double backward is refused with torch's once_differentiable
    error (the service returns no second derivatives)."""

    @staticmethod
    def forward(spheres, client: SdfClient, activation_distance: float = 0.0, weight: float = 0.0, env_index=None,
                compute_gradient=None):
        res = client.sphere_cost(spheres, activation_distance, weight, env_index,
                                 compute_gradient=bool(compute_gradient))
        return _RemoteFunction._result(res, spheres)

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad = refuse_second_order(_pad_grad(grad_output, _RemoteFunction._gradient(ctx)), ctx.saved_tensors[1])
        return grad, None, None, None, None, None

    @staticmethod
    def vmap(info, in_dims, spheres, client, activation_distance, weight, env_index, compute_gradient):
        return _RemoteSphereCost._vmap(info, in_dims[0], spheres, in_dims[4], 3,
                                      (client, activation_distance, weight, env_index, compute_gradient))


class _RemoteSweptSphereCost(_RemoteFunction):
    """``RemoteSweptSphereCost.apply(spheres, client, sweep_steps, speed_dt, enable_speed_metric,
    activation_distance, weight, env_index, compute_gradient=None)`` -> cost (b,h,n),
    differentiable w.r.t. spheres.

    A swept step's cost depends on its neighbouring steps too, and the service returns only the
    gradient of the summed cost per sphere; backward returns grad_output[..., None] * that
    gradient, which is exact when grad_output is the same for every step of a trajectory (e.g.
    ``cost.sum()``) and an approximation otherwise; likewise jvp's tangent summed over a
    trajectory's steps is exact, its split over the steps an approximation (use the in-process
    ``world.swept_sphere_cost`` for exact per-step derivatives). torch.func transforms work as
    for RemoteSphereCost; double backward is refused (torch's once_differentiable error)."""

    @staticmethod
    def forward(spheres, client: SdfClient, sweep_steps: int = 4, speed_dt: float = 0.1,
                enable_speed_metric: bool = False, activation_distance: float = 0.0,
                weight: float = 0.0, env_index=None, compute_gradient=None):
        res = client.swept_sphere_cost(spheres, sweep_steps, speed_dt, enable_speed_metric, activation_distance,
                                       weight, env_index, compute_gradient=bool(compute_gradient))
        return _RemoteFunction._result(res, spheres)

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad = refuse_second_order(_pad_grad(grad_output, _RemoteFunction._gradient(ctx)), ctx.saved_tensors[1])
        return (grad,) + (None,) * 8

    @staticmethod
    def vmap(info, in_dims, spheres, client, sweep_steps, speed_dt, enable_speed_metric, activation_distance,
             weight, env_index, compute_gradient):
        return _RemoteSweptSphereCost._vmap(
            info, in_dims[0], spheres, in_dims[7], 6,
            (client, sweep_steps, speed_dt, enable_speed_metric, activation_distance, weight, env_index,
             compute_gradient))


def _public_apply(function):
    """``apply`` of a public remote Function: all arguments bound, the cost of the 2-output one."""

    def apply(cls, *args, **kwargs):
        full = _internals.bind_arguments(function, args, kwargs)
        if full[-1] is None:
            full[-1] = _internals.may_need_gradient(full[0])
        return function.apply(*full)[0]

    return classmethod(apply)


class RemoteSphereCost(_RemoteSphereCost):
    __doc__ = _RemoteSphereCost.__doc__
    apply = _public_apply(_RemoteSphereCost)


class RemoteSweptSphereCost(_RemoteSweptSphereCost):
    __doc__ = _RemoteSweptSphereCost.__doc__
    apply = _public_apply(_RemoteSweptSphereCost)


def remote_sphere_cost(client: SdfClient, spheres: torch.Tensor, activation_distance: float = 0.0,
                       weight: float = 0.0, env_index=None) -> torch.Tensor:
    """Differentiable remote sphere cost (b,h,n) of spheres (b,h,n,4) (torch.func and forward-mode
    AD too); the server computes the gradient only where a derivative may be asked for."""
    return RemoteSphereCost.apply(spheres, client, activation_distance, weight, env_index)


def remote_swept_sphere_cost(client: SdfClient, spheres: torch.Tensor, sweep_steps: int = 4,
                             speed_dt: float = 0.1, enable_speed_metric: bool = False,
                             activation_distance: float = 0.0, weight: float = 0.0,
                             env_index=None) -> torch.Tensor:
    """Differentiable remote swept sphere cost (b,h,n) of trajectories spheres (b,h,n,4)."""
    return RemoteSweptSphereCost.apply(spheres, client, sweep_steps, speed_dt, enable_speed_metric,
                                       activation_distance, weight, env_index)
