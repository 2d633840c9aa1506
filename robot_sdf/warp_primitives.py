"""The torch front end of the query kernels: one plain and one swept autograd Function, and
cuRobo's two Functions (their forward signatures) on top of them.

Shapes (docs/design.md "Tensor layouts"): query_spheres (b,h,n,4) float32; out_cost (b,h,n);
out_grad (b,h,n,4); sparsity_idx (b,h,n) uint8; scalars as (1,) float32 tensors; mesh_idx (E,M)
int64; mesh_pose_inverse (E,M,8) float32; mesh_enable (E,M) uint8; n_env_mesh (E,) int32;
env_query_idx (b,) int32 or None. Lengths in metres. The tensors may live on the CPU or on CUDA
(the mesh tensors on the spheres' device); Warp runs there, on torch's current stream.

cuRobo's Functions take three arguments beyond cuRobo's at the end:

- ``sign_method``: a SignMethod or its name for every slot, or an (n_env, m) uint8 tensor with one
  per slot (robot_sdf.adopt_meshes' ``sign_methods``, a snapshot's ``sign_methods``). ``auto``
  (the default) uses each mesh's own method as MeshWorld or adopt_meshes recorded it, and Warp's
  sign for a mesh built elsewhere and not adopted: such meshes are passed as they are, searched out
  to max_dist + r + eta as cuRobo does, with robot_sdf's two corrections (deep centres costed,
  outputs fully rewritten). ``winding_number`` on a mesh built without its support is refused.
- ``compute_grad``: whether out_grad (or the swept partials) is filled; None decides by
  robot_sdf._internals.may_need_gradient, which also sees torch.func and forward-mode tangents.
- ``snapshot``: the MeshWorld snapshot the world tensors come from (inside ``world.reading()``):
  its per-slot sign methods (unless sign_method says otherwise) and its slot BVHs, so that a
  sphere visits only the slots near it (robot_sdf.slot_index).

Outputs are fully rewritten on every call. The whole autograd.Function contract holds (ordinary
backward, torch.func's grad, vmap (the vmapped dimension folds into b: one launch), jacrev,
jacfwd, jvp, forward-mode AD): the plain cost has exact second derivatives (its gradient output's
derivative is the Hessian, Query.hessian); the swept cost refuses double backward with
torch's once_differentiable error. float64 spheres are refused: the buffers are float32.
"""
from __future__ import annotations

import numpy as np
import torch

from robot_sdf import _internals, kernels
from robot_sdf.launch import launch_kernel
from robot_sdf.types import SignMethod, WorldSnapshot
from robot_sdf.world_args import constant_arguments, env_tensor, unused_tensor

# Elements below which torch runs an elementwise product on the calling thread (its grain size).
_INTRA_OP_GRAIN = 32768


class Query:
    """An evaluation's arguments besides the spheres and the env rows, handed to the Functions as
    one opaque argument (torch.func walks every argument of apply, on every level): the (1,)
    float32 scalars, the four world tensors, the sign selection, the snapshot they come from (or
    None), the kind of evaluation, and the caller's output buffers (cost, grad, sparsity) or None
    for fresh ones. ``reading``: the world's MeshWorld.reading, under which a Hessian launched
    later by a backward holds off in-place refits as the forward's launch did."""

    __slots__ = ("scalars", "world", "sign_method", "snapshot", "esdf", "sweep_steps", "speed_metric",
                 "compute_grad", "outputs", "reading")

    def __init__(self, weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                 sign_method=SignMethod.AUTO, snapshot=None, *, esdf=False, speed_dt=None, sweep_steps=0,
                 speed_metric=False, compute_grad=True, outputs=None, reading=None):
        if type(sign_method) is WorldSnapshot:
            raise TypeError("robot_sdf: pass a MeshWorld snapshot as snapshot=, not as sign_method")
        if snapshot is not None and not isinstance(sign_method, torch.Tensor) \
                and (sign_method is SignMethod.AUTO or sign_method == "auto"):
            sign_method = snapshot.sign_methods if snapshot.sign_methods is not None else snapshot.sign_method
        self.scalars = (weight, activation_distance, max_dist) + (() if speed_dt is None else (speed_dt,))
        self.world = (mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh)
        self.sign_method, self.snapshot, self.esdf = sign_method, snapshot, int(bool(esdf))
        self.sweep_steps, self.speed_metric = int(sweep_steps), int(bool(speed_metric))
        self.compute_grad, self.outputs, self.reading = int(bool(compute_grad)), outputs, reading

    def with_fresh_outputs(self) -> "Query":
        other = Query.__new__(Query)
        for name in Query.__slots__:
            setattr(other, name, getattr(self, name))
        other.outputs = None
        return other

    def _prepare(self, spheres: torch.Tensor, env, with_grad: bool) -> tuple:
        """(contiguous spheres, env tensor, whether env is used, the kept constants, the cost, grad
        (None unless ``with_grad``) and sparsity buffers to launch into, and the (caller's buffer,
        stand-in) pairs to copy back after the launch)."""
        if spheres.dim() != 4 or spheres.shape[-1] != 4:
            raise ValueError(f"query_spheres must be (b, h, n, 4), got {tuple(spheres.shape)}")
        if spheres.dtype != torch.float32:
            raise ValueError(f"query_spheres must be float32, got {spheres.dtype}")
        b, h, n, _ = spheres.shape
        device = spheres.device
        data = spheres.detach().contiguous()
        env_t, use_env = env_tensor(env, b, device)
        constants = constant_arguments(self.scalars, *self.world, self.sign_method, device, self.snapshot)
        if self.outputs is not None:
            buffers, copy_back = _launch_buffers(self.outputs, (b, h, n), device)
            return data, env_t, use_env, constants, buffers, copy_back
        # Sizes as separate ints and the rest *_like: torch parses a size argument several times slower.
        cost = torch.empty(b, h, n, dtype=torch.float32, device=device)
        grad = torch.empty_like(data) if with_grad else None
        return data, env_t, use_env, constants, (cost, grad, torch.empty_like(cost, dtype=torch.uint8)), ()

    def cost(self, spheres: torch.Tensor, env=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(cost (b,h,n), gradient (b,h,n,4)) of float32 spheres (b,h,n,4): the plain cost (or the
        ESDF value), its gradient zero-filled unless compute_grad."""
        data, env_t, use_env, constants, (cost, grad, sparsity), copy_back = self._prepare(spheres, env, True)
        b, h, n, _ = data.shape
        launch_kernel(kernels.sphere_cost_kernel, b * h * n,
                      [data, *constants, env_t, use_env, h * n, self.esdf, self.compute_grad],
                      [cost, grad, sparsity], data.device, self.snapshot)
        if self.outputs is None:
            return cost, grad
        for target, written in copy_back:
            target.copy_(written)
        return self.outputs[0], self.outputs[1]

    def swept(self, spheres: torch.Tensor, env=None, out_evaluations: torch.Tensor | None = None) -> tuple:
        """(cost (b,h,n), partials (3,b,h,n,4) or None unless compute_grad) of trajectories (b,h,n,4)
        along h (docs/design.md "Swept cost"). Row k of sphere (b,t,n) is d cost_{t-1+k} / d p[t]
        (0 where that step does not exist or its sphere is off); so the caller's out_grad, when
        given, receives their sum, the gradient of the summed cost. out_evaluations: an optional
        contiguous (b,h,n) int32 tensor receiving the cost evaluations made per sphere."""
        if self.sweep_steps < 0:
            raise ValueError(f"sweep_steps must be >= 0, got {self.sweep_steps}")
        data, env_t, use_env, constants, (cost, grad, sparsity), copy_back = self._prepare(spheres, env, False)
        b, h, n, _ = data.shape
        device = data.device
        partials = torch.empty((3, b, h, n, 4), dtype=torch.float32, device=device) if self.compute_grad \
            else unused_tensor("partials", device, (3, 1, 1, 1, 4), torch.float32)
        if out_evaluations is not None and (tuple(out_evaluations.shape) != (b, h, n) or out_evaluations.device != device
                                            or out_evaluations.dtype != torch.int32
                                            or not out_evaluations.is_contiguous()):
            raise ValueError(f"out_evaluations must be a contiguous ({b}, {h}, {n}) int32 tensor on {device}")
        evaluations = unused_tensor("int", device, (1,), torch.int32) if out_evaluations is None else out_evaluations
        launch_kernel(kernels.swept_sphere_cost_kernel, b * h * n,
                      [data, *constants, env_t, use_env, h, n, self.sweep_steps, self.speed_metric,
                       self.compute_grad, int(out_evaluations is not None)],
                      [cost, sparsity, partials, evaluations], device, self.snapshot)
        if self.outputs is not None:
            if self.compute_grad:  # two adds: torch.sum over the leading dimension took 1.5x longer
                torch.add(partials[0], partials[1], out=grad).add_(partials[2])
            else:
                grad.zero_()
            for target, written in copy_back:
                target.copy_(written)
            cost = self.outputs[0]
        return cost, (partials if self.compute_grad else None)

    def hessian(self, spheres: torch.Tensor, env=None) -> torch.Tensor:
        """d^2 cost / d p^2 (b,h,n,3,3) float32 of the plain cost's (or the ESDF's) value, per
        sphere, world frame: per mesh with penetration d > 0, c''(d) n n^T - c'(d) H_sd, H_sd the
        signed distance's Hessian (0 on a face, (I - n n^T)/sd at a vertex, (I - n n^T - e e^T)/sd
        on an edge). Undefined, as the gradient's jump, on medial axes; 0 within 1e-6 m of a surface."""
        if self.reading is not None:
            with self.reading():
                return self._hessian(spheres, env)
        return self._hessian(spheres, env)

    def _hessian(self, spheres: torch.Tensor, env) -> torch.Tensor:
        b, h, n, _ = spheres.shape
        data = spheres.detach().contiguous()
        env_t, use_env = env_tensor(env, b, data.device)
        constants = constant_arguments(self.scalars, *self.world, self.sign_method, data.device, self.snapshot)
        hessian = torch.empty(b, h, n, 3, 3, dtype=torch.float32, device=data.device)
        launch_kernel(kernels.sphere_hessian_kernel, b * h * n, [data, *constants, env_t, use_env, h * n, self.esdf],
                      [hessian], data.device, self.snapshot)
        return hessian


def _launch_buffers(outputs: tuple, shape: tuple, device: torch.device) -> tuple:
    """The caller's (out_cost, out_grad, sparsity_idx) after checks, as contiguous buffers of the
    kernels' dtypes (stand-ins where the caller's are not), and the (target, stand-in) pairs."""
    out_cost, out_grad, sparsity_idx = outputs
    for name, t, want in (("out_cost", out_cost, shape), ("out_grad", out_grad, shape + (4,)),
                          ("sparsity_idx", sparsity_idx, shape)):
        if t.shape != want:
            raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
        if t.device != device:
            raise ValueError(f"{name} must be on the spheres' device {device}, got {t.device}")
    if out_cost.dtype != torch.float32 or out_grad.dtype != torch.float32:
        raise ValueError("out_cost and out_grad must be float32")
    buffers, copy_back = [], []
    for t, dtype in ((out_cost, torch.float32), (out_grad, torch.float32), (sparsity_idx, torch.uint8)):
        if t.dtype == dtype and t.is_contiguous():
            buffers.append(t)
        else:
            buffers.append(torch.empty(t.shape, dtype=dtype, device=device))
            copy_back.append((t, buffers[-1]))
    return tuple(buffers), tuple(copy_back)


# --- derivatives shared by the Functions and robot_sdf.ops' custom ops

def sphere_cost_backward(grad_cost, grad_gradient, spheres, gradient, env, hessian_source):
    """d/d spheres (b,h,n,4) of sum(grad_cost * cost) + sum(grad_gradient * gradient) (either
    may be None: zero), from the forward's gradient (b,h,n,4) and, for the second term, the
    Hessian that ``hessian_source.hessian(spheres, env)`` gives. With create_graph ``gradient``
    is the forward node's own output, so a second backward reaches the Hessian through it."""
    result = None
    if grad_cost is not None:
        result = _scaled_gradient(grad_cost, gradient)
    if grad_gradient is not None:
        hv = hessian_product(spheres, grad_gradient, env, hessian_source)
        result = hv if result is None else result + hv
    return result


def _scaled_gradient(grad_cost: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """grad_cost[..., None] * gradient (the radius component of gradient is 0)."""
    if not torch.is_grad_enabled() and gradient.numel() >= _INTRA_OP_GRAIN and gradient.device.type == "cpu" \
            and grad_cost.dtype == torch.float32 and type(grad_cost) is torch.Tensor \
            and grad_cost.layout == torch.strided:
        # The same products on the calling thread: torch splits one this large over its intra-op
        # threads, and on a loaded CPU that barrier waits for a busy core (5-8 ms per call on 2
        # shared cores, against 0.2-0.4 ms for the product itself).
        try:
            return torch.from_numpy(np.multiply(grad_cost.resolve_neg().numpy()[..., None], gradient.numpy()))
        except (RuntimeError, TypeError):  # a tensor numpy cannot view: torch's path
            pass
    return grad_cost.unsqueeze(-1) * gradient


def sphere_cost_jvp(tangent: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """Forward-mode tangent (b,h,n) of the cost: the gradient dotted with the spheres' tangent."""
    return (gradient.to(tangent.dtype) * tangent).sum(-1)


def hessian_product(spheres: torch.Tensor, vector: torch.Tensor, env, hessian_source) -> torch.Tensor:
    """H v (b,h,n,4), H the per-sphere Hessian, v (b,h,n,4) (its radius ignored, the result's 0)."""
    hess = SphereHessian.apply(spheres, env, hessian_source)
    hv = torch.matmul(hess.to(vector.dtype), vector[..., :3].unsqueeze(-1)).squeeze(-1)
    return torch.cat([hv, torch.zeros_like(hv[..., :1])], dim=-1)


def swept_chain_rule(partials: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """d (sum_t grad_output[t] cost_t) / d spheres (b,h,n,4) from the partials (3,b,h,n,4,
    Query.swept): sphere (b,t,n) gets sum_k g[t-1+k] row k, g 0 beyond the trajectory's ends."""
    g = grad_output.to(partials.dtype)
    # g over the 4 components, padded by a step at each end: products over contiguous rows (a
    # broadcast over the last dimension ran 2x slower).
    g4 = torch.nn.functional.pad(g.unsqueeze(-1).expand(*g.shape, 4), (0, 0, 0, 0, 1, 1))
    grad = partials[1] * g4[:, 1:-1]
    grad.addcmul_(partials[0], g4[:, :-2])
    return grad.addcmul_(partials[2], g4[:, 2:])


def swept_jvp(tangent: torch.Tensor, partials: torch.Tensor) -> torch.Tensor:
    """Forward-mode tangent (b,h,n) of the swept costs: cost_t moves by row 2 of step t-1, row 1
    of step t and row 0 of step t+1, each dotted with that step's tangent."""
    moved = (partials.to(tangent.dtype) * tangent).sum(-1)
    out = moved[1].clone()  # a tensor of its own: torch refuses a view as a view output's tangent
    out[:, 1:] = out[:, 1:] + moved[2, :, :-1]
    out[:, :-1] = out[:, :-1] + moved[0, :, 1:]
    return out


# --- torch.func's vmap: the vmapped dimension folds into the batch dimension b.

def fold_spheres_env(info, spheres, spheres_dim, env, env_dim):
    """spheres (B,b,h,n,4) folded to (B*b,h,n,4) and env ((B,b), (b,) or None) to match."""
    spheres = spheres.movedim(spheres_dim, 0)
    if env is not None:
        env = env.movedim(env_dim, 0) if env_dim is not None else env.unsqueeze(0).expand(info.batch_size, *env.shape)
        env = env.reshape(-1)
    return spheres.reshape(-1, *spheres.shape[2:]), env


def unfold_batch(t: torch.Tensor, batch_size: int) -> torch.Tensor:
    return t.reshape(batch_size, t.shape[0] // batch_size, *t.shape[1:])


class SphereCost(torch.autograd.Function):
    """SphereCost.apply(spheres (b,h,n,4) float32, env (b,) int32 or None, query: Query) ->
    (cost (b,h,n), gradient (b,h,n,4)): the plain cost (or ESDF value) and its gradient from one
    launch. The gradient is a differentiable output whose own derivative is the Hessian, so a
    second derivative reaches this node again with that output's cotangent."""

    @staticmethod
    def forward(spheres, env, query):
        cost, grad = query.cost(spheres, env)
        if query.outputs is not None:  # the caller's buffers: autograd history goes on views of them
            return cost.view_as(cost), grad.view_as(grad)
        return cost, grad

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.set_materialize_grads(False)  # None, not zeros, for an unused output: no Hessian launch
        ctx.env, ctx.query = inputs[1], inputs[2]  # env: integer, never differentiated
        ctx.save_for_backward(inputs[0], output[1])
        ctx.save_for_forward(inputs[0], output[1])

    @staticmethod
    def backward(ctx, grad_cost, grad_gradient):
        spheres, gradient = ctx.saved_tensors
        result = sphere_cost_backward(grad_cost, grad_gradient, spheres, gradient, ctx.env, ctx.query)
        return (torch.zeros_like(spheres) if result is None else result), None, None

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        spheres, gradient = ctx.saved_tensors
        if spheres_tangent is None:  # a tangent on another input only: nothing moves
            return gradient.new_zeros(gradient.shape[:-1]), None
        return (sphere_cost_jvp(spheres_tangent, gradient),
                hessian_product(spheres, spheres_tangent, ctx.env, ctx.query))

    @staticmethod
    def vmap(info, in_dims, spheres, env, query):
        folded, fenv = fold_spheres_env(info, spheres, in_dims[0], env, in_dims[1])
        cost, gradient = SphereCost.apply(folded, fenv, query.with_fresh_outputs())
        return (unfold_batch(cost, info.batch_size), unfold_batch(gradient, info.batch_size)), (0, 0)


class SweptCost(torch.autograd.Function):
    """SweptCost.apply(spheres (b,h,n,4) float32, env (b,) int32 or None, query: Query) -> (cost
    (b,h,n), partials (3,b,h,n,4), a non-differentiable output; (3, 0) without compute_grad):
    cost_t depends on p[t-1], p[t] and p[t+1]; backward applies the chain rule for any
    grad_output (swept_chain_rule), jvp the forward-mode one (swept_jvp)."""

    @staticmethod
    def forward(spheres, env, query):
        cost, partials = query.swept(spheres, env)
        if partials is None:
            partials = cost.new_empty((3, 0))
        return (cost.view_as(cost) if query.outputs is not None else cost), partials

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.set_materialize_grads(False)  # no zero-filled cotangent of the partials per backward
        ctx.save_for_backward(output[1], inputs[0])
        ctx.save_for_forward(output[1])
        ctx.cost_shape = output[0].shape

    @staticmethod
    def _checked(partials: torch.Tensor) -> torch.Tensor:
        if partials.dim() == 2:
            raise RuntimeError("SweptSdfMeshWarpPy: derivatives asked for a call made with compute_grad=False")
        return partials

    @staticmethod
    def backward(ctx, grad_output, _):
        partials, spheres = ctx.saved_tensors
        if grad_output is None:
            return torch.zeros_like(spheres), None, None
        return refuse_second_order(swept_chain_rule(SweptCost._checked(partials), grad_output), spheres), None, None

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        partials = ctx.saved_tensors[0]
        if spheres_tangent is None:
            return partials.new_zeros(ctx.cost_shape), None
        return swept_jvp(spheres_tangent, SweptCost._checked(partials)), None

    @staticmethod
    def vmap(info, in_dims, spheres, env, query):
        folded, fenv = fold_spheres_env(info, spheres, in_dims[0], env, in_dims[1])
        cost, partials = SweptCost.apply(folded, fenv, query.with_fresh_outputs())
        if partials.dim() == 2:
            return (unfold_batch(cost, info.batch_size), partials), (0, None)
        _, b, h, n, _ = partials.shape  # (3, B*b, h, n, 4) -> (3, B, b, h, n, 4): vmapped dimension 1
        return (unfold_batch(cost, info.batch_size), partials.reshape(3, info.batch_size, -1, h, n, 4)), (0, 1)


class SphereHessian(torch.autograd.Function):
    """SphereHessian.apply(spheres (b,h,n,4), env, hessian_source) -> (b,h,n,3,3): the per-sphere
    Hessian (hessian_source.hessian), for second derivatives; third derivatives are refused."""

    @staticmethod
    def forward(spheres, env, hessian_source):
        return hessian_source.hessian(spheres, env)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad_output):
        raise RuntimeError("robot_sdf: derivatives of the collision cost beyond the second are not implemented")

    @staticmethod
    def vmap(info, in_dims, spheres, env, hessian_source):
        folded, fenv = fold_spheres_env(info, spheres, in_dims[0], env, in_dims[1])
        return unfold_batch(SphereHessian.apply(folded, fenv, hessian_source), info.batch_size), 0


class _SecondOrderRefused(torch.autograd.Function):
    """Identity on a first derivative whose own derivative robot_sdf does not have."""

    generate_vmap_rule = True

    @staticmethod
    def forward(gradient, spheres):
        return gradient.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad_output):
        # torch's own once_differentiable message, which users and tools recognise.
        raise RuntimeError("trying to differentiate twice a function that was marked with @once_differentiable "
                           "(robot_sdf: this cost has no second derivatives; the in-process sphere_cost and "
                           "signed_distance have exact ones)")


def refuse_second_order(gradient: torch.Tensor, spheres: torch.Tensor) -> torch.Tensor:
    """A backward's result for ``spheres``: as is, unless a graph of the backward is being built
    (create_graph) - then through a node that refuses to be differentiated, with torch's
    once_differentiable error (torch's decorator gives a result whose second backward fails with
    a message that names nothing)."""
    if torch.is_grad_enabled() and spheres.requires_grad:
        return _SecondOrderRefused.apply(gradient, spheres)
    return gradient


# SphereCost.apply and SweptCost.apply without torch's Python wrapper where that is safe
# (robot_sdf._internals.direct_apply: the wrapper's binding by inspect costs as much as a whole
# evaluation of a few spheres).
sphere_cost_apply = _internals.direct_apply(SphereCost)
swept_cost_apply = _internals.direct_apply(SweptCost)
_QUERY_TENSORS = ("weight", "activation_distance", "max_dist", "speed_dt")


def _unwrapped(query: Query) -> Query:
    """The query of a call under torch.func, its tensors unwrapped to the memory the kernels read
    and write (derivatives are taken w.r.t. the spheres only; the Functions' own tensor arguments
    torch.func unwraps level by level), after refusing one a vmap batches: the world is shared by
    every sample."""
    named = list(zip(_QUERY_TENSORS, query.scalars)) \
        + list(zip(("mesh_idx", "mesh_pose_inverse", "mesh_enable", "n_env_mesh"), query.world)) \
        + [("sign_method", query.sign_method)]
    for name, t in named:
        if _internals.is_batched(t):
            raise ValueError(f"robot_sdf: vmap over {name} is not supported (vmap over spheres and "
                             "env_query_idx; world tensors are shared by every sample)")
    unwrap = lambda t: _internals.unwrapped(t) if isinstance(t, torch.Tensor) else t  # noqa: E731
    query.scalars, query.world = tuple(map(unwrap, query.scalars)), tuple(map(unwrap, query.world))
    query.sign_method = unwrap(query.sign_method)
    if query.outputs is not None:
        query.outputs = tuple(map(unwrap, query.outputs))
    return query


class SdfMeshWarpPy(torch.autograd.Function):
    """Collision cost of spheres against the meshes of a world, cuRobo's signature (docs/design.md
    "Tensor layouts", "Cost definition"), through SphereCost. ``apply`` returns out_cost. Under a
    vmap the caller's buffers are not written (fresh outputs)."""

    @staticmethod
    def forward(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
                mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None, return_loss=False,
                compute_esdf=False, sign_method=SignMethod.AUTO, compute_grad=None, snapshot=None):
        """apply's arguments (module docstring); apply runs SphereCost with them."""
        return SdfMeshWarpPy.apply(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance,
                                   mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx,
                                   return_loss, compute_esdf, sign_method, compute_grad, snapshot)

    @classmethod
    def apply(cls, *args, **kwargs):
        a = _internals.bind_arguments(cls, args, kwargs)
        query = Query(a[4], a[5], a[10], a[6], a[7], a[8], a[9], a[14], a[16], esdf=a[13],
                      compute_grad=_internals.may_need_gradient(a[0]) if a[15] is None else a[15],
                      outputs=(a[1], a[2], a[3]))
        if _internals.transforms_active():
            query = _unwrapped(query)
        return sphere_cost_apply(a[0], a[11], query)[0]


class SweptSdfMeshWarpPy(torch.autograd.Function):
    """Swept collision cost along trajectories (b, h steps, n spheres), cuRobo's signature
    (docs/design.md "Swept cost"), through SweptCost. out_grad holds, per sphere, the gradient of
    the summed cost (what cuRobo-style MPCs read); backward applies the chain rule for any
    grad_output. ``apply`` returns out_cost."""

    @staticmethod
    def forward(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt, mesh_idx,
                mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps=1, enable_speed_metric=False,
                env_query_idx=None, return_loss=False, sign_method=SignMethod.AUTO, compute_grad=None, snapshot=None):
        """apply's arguments (module docstring); apply runs SweptCost with them."""
        return SweptSdfMeshWarpPy.apply(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance,
                                        speed_dt, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist,
                                        sweep_steps, enable_speed_metric, env_query_idx, return_loss, sign_method,
                                        compute_grad, snapshot)

    @classmethod
    def apply(cls, *args, **kwargs):
        a = _internals.bind_arguments(cls, args, kwargs)
        query = Query(a[4], a[5], a[11], a[7], a[8], a[9], a[10], a[16], a[18], speed_dt=a[6], sweep_steps=a[12],
                      speed_metric=a[13], compute_grad=_internals.may_need_gradient(a[0]) if a[17] is None else a[17],
                      outputs=(a[1], a[2], a[3]))
        if _internals.transforms_active():
            query = _unwrapped(query)
        return swept_cost_apply(a[0], a[14], query)[0]
