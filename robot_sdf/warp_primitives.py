"""torch.autograd Functions over the Warp kernels, with cuRobo's forward signatures.

Shapes (docs/design.md "Tensor layouts"): query_spheres (b,h,n,4) float32; out_cost (b,h,n); out_grad
(b,h,n,4); sparsity_idx (b,h,n) uint8; scalars as (1,) float32 tensors; mesh_idx (E,M) int64;
mesh_pose_inverse (E,M,8) float32; mesh_enable (E,M) uint8; n_env_mesh (E,) int32;
env_query_idx (b,) int32 or None.

One argument beyond cuRobo's is accepted at the end of both: ``sign_method``: a SignMethod or its
name for every slot, or an (n_env, m) uint8 tensor with one SignMethod per slot (a MeshWorld's
``snapshot().sign_methods``, or robot_sdf.adopt_meshes' ``sign_methods``). The default, ``auto``,
uses each mesh's own method as MeshWorld (or adopt_meshes) recorded it in the mesh's sign data,
and Warp's normal-sign query for a mesh built elsewhere and not adopted: such meshes are passed
as they are (nothing is read back through their ids), searched out to max_dist + r + eta as
cuRobo does, plus robot_sdf's two corrections (deep centres costed, outputs fully rewritten).
A MeshWorld's WorldSnapshot itself may be passed there too: its per-slot sign methods are used
and, where its world's slot BVHs describe it, a sphere visits only the slots near it
(robot_sdf.slot_index); otherwise every slot of the sphere's environment is visited. Below the
public ``apply`` the two travel apart (sign_and_snapshot): ``sign_method`` holds a sign method
only, the snapshot its own ``snapshot`` argument, as in every launch function here and in
MeshWorld's own evaluations. A ``winding_number`` slot whose mesh MeshWorld built without winding-number support is
refused (ValueError): Warp would read memory the mesh does not have. The tensors may live on the CPU or on CUDA (the mesh tensors on
the spheres' device); Warp runs there, on torch's current stream. Outputs are fully rewritten on
every call; gradients are computed only when query_spheres requires grad (else out_grad is
zero-filled). SdfMeshWarpPy's ``backward`` returns grad_output[..., None] * out_grad for the
spheres. A swept step's cost depends on its two neighbours as well: SweptSdfMeshWarpPy's out_grad
is the gradient of the summed cost, and its ``backward`` applies the exact chain rule for any
grad_output from per-step partials kept from forward (swept_chain_rule).

The whole autograd.Function contract (setup_context style): both work under torch.func (grad,
vmap - the vmapped dimension folds into b, one launch -, jacrev, jacfwd, jvp) and forward-mode
AD, with the ordinary backward's numbers. A second trailing argument, ``compute_grad`` (None:
robot_sdf._internals.may_need_gradient, which also sees torch.func transforms and forward-mode
tangents), says whether out_grad / the swept partials are filled. Inside, each public class's
``apply`` runs a Function whose forward returns (out_cost, gradient or partials) so that every
torch.func level sees the second output; ``apply`` returns out_cost as cuRobo's does.
SdfMeshWarpPy has exact second derivatives (SphereGradient / SphereHessian over
launch_sphere_hessian); SweptSdfMeshWarpPy refuses double backward with torch's
once_differentiable error. float64 spheres are refused (ValueError): the buffers are float32.
"""
from __future__ import annotations

import numpy as np
import torch

from robot_sdf import _internals, kernels
from robot_sdf.launch import argument_positions, direct_cpu_call, flat_descriptor, launch_kernel
from robot_sdf.snapshot_lifetime import graveyard
from robot_sdf.types import SignMethod, WorldSnapshot
from robot_sdf.world_args import constant_arguments, env_descriptor, env_tensor, scalar_descriptor


class _Outputs:
    """Contiguous views of the caller's output buffers; copies back if the caller's were strided."""

    def __init__(self, out_cost: torch.Tensor, out_grad: torch.Tensor, sparsity_idx: torch.Tensor, shape: tuple,
                 device: torch.device):
        b, h, n = shape
        if out_cost.shape != shape or sparsity_idx.shape != shape or out_grad.shape != (b, h, n, 4):
            for name, t, want in (("out_cost", out_cost, (b, h, n)), ("out_grad", out_grad, (b, h, n, 4)),
                                  ("sparsity_idx", sparsity_idx, (b, h, n))):
                if t.shape != want:
                    raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
        if out_cost.dtype != torch.float32 or out_grad.dtype != torch.float32:
            raise ValueError("out_cost and out_grad must be float32")
        if out_cost.device != device or out_grad.device != device or sparsity_idx.device != device:
            raise ValueError(f"out_cost, out_grad and sparsity_idx must be on the spheres' device {device}")
        self._targets = (out_cost, out_grad, sparsity_idx)
        if out_cost.is_contiguous() and out_grad.is_contiguous() and sparsity_idx.dtype == torch.uint8 \
                and sparsity_idx.is_contiguous():
            # The common case: the kernel writes the caller's buffers, nothing to copy back.
            self.cost, self.grad, self.sparsity = out_cost, out_grad, sparsity_idx
            self._copies = False
            return
        self._copies = True
        self.cost = out_cost if out_cost.is_contiguous() else torch.empty_like(out_cost, memory_format=torch.contiguous_format)
        self.grad = out_grad if out_grad.is_contiguous() else torch.empty_like(out_grad, memory_format=torch.contiguous_format)
        sp = sparsity_idx if sparsity_idx.dtype == torch.uint8 else sparsity_idx.to(torch.uint8)
        self.sparsity = sp if sp.is_contiguous() else sp.contiguous()

    def warp_arrays(self) -> list:
        return [flat_descriptor(self.cost, 4), flat_descriptor(self.grad, 16), flat_descriptor(self.sparsity, 1)]

    def finish(self) -> None:
        if not self._copies:
            return
        for target, mine in zip(self._targets, (self.cost, self.grad, self.sparsity)):
            if target.data_ptr() != mine.data_ptr() or target.dtype != mine.dtype:
                target.copy_(mine)


def _check_spheres(query_spheres: torch.Tensor) -> tuple[int, int, int]:
    if query_spheres.dim() != 4 or query_spheres.shape[-1] != 4:
        raise ValueError(f"query_spheres must be (b, h, n, 4), got {tuple(query_spheres.shape)}")
    if query_spheres.dtype != torch.float32:
        raise ValueError(f"query_spheres must be float32, got {query_spheres.dtype}")
    b, h, n, _ = query_spheres.shape
    return int(b), int(h), int(n)


def launch_sphere_cost(
    query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
    mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None,
    compute_esdf: bool = False, compute_grad: bool = True, sign_method=SignMethod.AUTO, snapshot=None,
) -> None:
    """Fill out_cost (b,h,n), out_grad (b,h,n,4) and sparsity_idx for SdfMeshWarpPy's cost.

    ``snapshot``: the MeshWorld snapshot the world tensors come from, if any (its slot BVHs:
    robot_sdf.world_args.slot_bvh_ids); ``sign_method`` is then usually its ``sign_methods``."""
    b, h, n = _check_spheres(query_spheres)
    outs = _Outputs(out_cost, out_grad, sparsity_idx, (b, h, n), query_spheres.device)
    _sphere_cost_into(query_spheres, outs.cost, outs.grad, outs.sparsity, b, h, n, weight, activation_distance,
                      mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, compute_esdf,
                      compute_grad, sign_method, snapshot)
    outs.finish()


def launch_sphere_cost_fresh(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
                             mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None,
                             compute_esdf: bool = False, compute_grad: bool = True,
                             sign_method=SignMethod.AUTO, snapshot=None) -> None:
    """launch_sphere_cost for output buffers the caller has just made for this call, as
    robot_sdf.cost does: query_spheres (b,h,n,4) float32, out_cost (b,h,n) and out_grad (b,h,n,4)
    float32, sparsity_idx (b,h,n) uint8, all contiguous on the spheres' device (the checks
    launch_sphere_cost makes of caller-held buffers are skipped; everything else is checked)."""
    b, h, n, _ = query_spheres.shape
    _sphere_cost_into(query_spheres, out_cost, out_grad, sparsity_idx, b, h, n, weight, activation_distance,
                      mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, compute_esdf,
                      compute_grad, sign_method, snapshot)


def _sphere_cost_into(query_spheres, cost, grad, sparsity, b, h, n, weight, activation_distance, mesh_idx,
                      mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, compute_esdf, compute_grad,
                      sign_method, snapshot) -> None:
    """The launch itself, into contiguous cost/grad/sparsity buffers of the right shapes."""
    device = query_spheres.device
    # Keep the contiguous tensor referenced until the launch: a descriptor holds only its address.
    spheres_data = query_spheres.detach().contiguous()
    env, use_env = env_tensor(env_query_idx, b, device)
    constants = constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                                   n_env_mesh, sign_method, device, snapshot)
    total = b * h * n
    call = direct_cpu_call(kernels.sphere_cost_kernel, device, total)
    if call is not None:
        # Small CPU launches: the per-call tensors go straight into the recorded argument struct.
        call.set_constants(_SPHERE_COST_CONSTANTS, constants)
        call.set_flats(_SPHERE_COST_FLATS, (spheres_data, env, cost, grad, sparsity))
        call.set_values(_SPHERE_COST_VALUES,
                        (use_env, h * n, int(bool(compute_esdf)), int(bool(compute_grad)), 0, total))
        call.run()
        return
    inputs = [flat_descriptor(spheres_data, 16), *constants, env_descriptor(env, use_env), use_env, h * n,
              int(bool(compute_esdf)), int(bool(compute_grad))]
    _launch_reading(snapshot, kernels.sphere_cost_kernel, total, inputs,
                    [flat_descriptor(cost, 4), flat_descriptor(grad, 16), flat_descriptor(sparsity, 1)], device)


def _launch_reading(snapshot, kernel, total: int, inputs: list, outputs: list, device: torch.device) -> None:
    """launch_kernel, reading a MeshWorld snapshot on CUDA as MeshWorld.reading() does: the stream
    waits for the builds and refits the snapshot depends on, and an event after the launch keeps
    its meshes and tensors alive (and in-place refits waiting) until the kernel has run, also for
    callers that hand a snapshot to the Functions themselves. On the CPU kernels have run when the
    launch returns."""
    reads = snapshot if device.type == "cuda" else None
    if device.type == "cuda":
        graveyard.purge()  # what dropped snapshots and adopted meshes left, once their kernels ran
    if reads is not None:
        reads.before_use()
    launch_kernel(kernel, total, inputs, outputs, device)
    if reads is not None:
        reads.after_use()


# sphere_cost_kernel's arguments by kind, for the direct CPU call: those constant_arguments gives,
# the per-call tensors written as flat arrays, the per-call numbers.
_SPHERE_COST_CONSTANTS = argument_positions(kernels.sphere_cost_kernel, "weight", "activation_distance",
                                            "max_distance", "world")
_SPHERE_COST_FLATS = argument_positions(kernels.sphere_cost_kernel, "spheres", "env_query", "out_cost", "out_grad",
                                        "out_sparsity")
_SPHERE_COST_VALUES = argument_positions(kernels.sphere_cost_kernel, "use_env_query", "spheres_per_batch",
                                         "compute_esdf", "compute_grad", "start", "total")


class SweptPartials:
    """The swept cost's partial derivatives, kept by forward for the chain rule: one (3,b,h,n,4)
    float32 buffer, world frame, by the step they are taken at.

    Row k of sphere (b,t,n) is d cost_{t-1+k} / d p[t]: row 0 the previous step's cost, row 1 the
    step's own, row 2 the next step's (0 where that step does not exist, where its sphere is off,
    and for the neighbour partials of a step where the speed metric applies); component 3 (the
    radius) is 0. So the gradient of the summed cost is the sum over rows, and the chain rule for
    any upstream gradient g is sum_k g[t-1+k] row k (swept_chain_rule): the kernel
    (kernels.swept_sphere_cost_kernel) writes each step's three partials into the rows of the
    steps they are taken at.
    """

    def __init__(self, b: int, h: int, n: int, device: torch.device):
        self.buffer = torch.empty((3, b, h, n, 4), dtype=torch.float32, device=device)


def swept_chain_rule(partials: torch.Tensor, grad_output: torch.Tensor) -> torch.Tensor:
    """d (sum_t grad_output[t] cost_t) / d spheres (b,h,n,4) from the partials (3,b,h,n,4,
    SweptPartials) and grad_output (b,h,n): sphere (b,t,n) gets sum_k g[t-1+k] row k, g 0 beyond
    the trajectory's ends. The radius gets no gradient (its row components are 0)."""
    g = grad_output.to(partials.dtype)
    # g repeated over the 4 components (b, h + 2, n, 4), padded by one step at each end: the
    # products then run over contiguous rows (a broadcast over the last dimension ran 2x slower).
    g4 = torch.nn.functional.pad(g.unsqueeze(-1).expand(*g.shape, 4), (0, 0, 0, 0, 1, 1))
    grad = partials[1] * g4[:, 1:-1]
    grad.addcmul_(partials[0], g4[:, :-2])
    return grad.addcmul_(partials[2], g4[:, 2:])


def launch_swept_sphere_cost(
    query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt, mesh_idx,
    mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps: int = 1,
    enable_speed_metric: bool = False, env_query_idx=None, compute_grad: bool = True,
    sign_method=SignMethod.AUTO, out_evaluations: torch.Tensor | None = None, snapshot=None,
) -> SweptPartials | None:
    """Fill the outputs with SweptSdfMeshWarpPy's cost (docs/design.md "Swept cost").

    out_cost[t] = cost_t (b,h,n); out_grad = d (sum_t' cost_t') / d p[t] (b,h,n,4), the
    gradient of the summed cost that cuRobo-style callers read directly (zero-filled unless
    compute_grad). Returns the partials (for autograd with any grad_output) when compute_grad,
    else None. out_evaluations: optional (b,h,n) int32 tensor (contiguous, on the spheres'
    device) that receives the number of cost evaluations made per sphere (benchmarks).
    ``snapshot``: as for launch_sphere_cost.
    """
    b, h, n = _check_spheres(query_spheres)
    if int(sweep_steps) < 0:
        raise ValueError(f"sweep_steps must be >= 0, got {sweep_steps}")
    device = query_spheres.device
    outs = _Outputs(out_cost, out_grad, sparsity_idx, (b, h, n), device)
    # Keep the contiguous tensor referenced until the launch: a descriptor holds only its address.
    spheres_data = query_spheres.detach().contiguous()
    env, use_env = env_tensor(env_query_idx, b, device)
    constants = constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                                   n_env_mesh, sign_method, device, snapshot)
    if out_evaluations is not None and (tuple(out_evaluations.shape) != (b, h, n) or out_evaluations.dtype != torch.int32
                                        or out_evaluations.device != device or not out_evaluations.is_contiguous()):
        raise ValueError(f"out_evaluations must be a contiguous ({b}, {h}, {n}) int32 tensor on {device}")
    partials = SweptPartials(b, h, n, device) if compute_grad else _unused_partials(device)
    evaluations = out_evaluations if out_evaluations is not None else _unused_int(device)
    total = b * h * n
    numbers = (use_env, h, n, int(sweep_steps), int(bool(enable_speed_metric)), int(bool(compute_grad)),
               int(out_evaluations is not None))
    flats = (spheres_data, env, outs.cost, outs.sparsity, partials.buffer, evaluations)
    call = direct_cpu_call(kernels.swept_sphere_cost_kernel, device, total)
    if call is not None:
        # Small CPU launches: the per-call tensors go straight into the recorded argument struct.
        call.set_constants(_SWEPT_CONSTANTS, constants)
        call.set_values(_SWEPT_SPEED_DT, (scalar_descriptor(speed_dt, device),))
        call.set_flats(_SWEPT_FLATS, flats)
        call.set_values(_SWEPT_VALUES, numbers + (0, total))
        call.run()
    else:
        weight_d, activation_d, max_dist_d, world = constants
        inputs = [flat_descriptor(spheres_data, 16), weight_d, activation_d, max_dist_d,
                  scalar_descriptor(speed_dt, device), world, env_descriptor(env, use_env), *numbers]
        outputs = [flat_descriptor(outs.cost, 4), flat_descriptor(outs.sparsity, 1),
                   flat_descriptor(partials.buffer, 16), flat_descriptor(evaluations, 4)]
        _launch_reading(snapshot, kernels.swept_sphere_cost_kernel, total, inputs, outputs, device)
    if compute_grad:
        # The sum over the rows, as two adds (torch.sum over the leading dimension took 1.5x longer).
        torch.add(partials.buffer[0], partials.buffer[1], out=outs.grad).add_(partials.buffer[2])
    else:
        outs.grad.zero_()
    outs.finish()
    return partials if compute_grad else None


# swept_sphere_cost_kernel's arguments by kind, for the direct CPU call (as for sphere_cost_kernel).
_SWEPT_CONSTANTS = argument_positions(kernels.swept_sphere_cost_kernel, "weight", "activation_distance",
                                      "max_distance", "world")
_SWEPT_SPEED_DT = argument_positions(kernels.swept_sphere_cost_kernel, "speed_dt")
_SWEPT_FLATS = argument_positions(kernels.swept_sphere_cost_kernel, "spheres", "env_query", "out_cost",
                                  "out_sparsity", "out_partials", "out_evaluations")
_SWEPT_VALUES = argument_positions(kernels.swept_sphere_cost_kernel, "use_env_query", "horizon", "spheres_per_step",
                                   "sweep_steps", "enable_speed_metric", "compute_grad", "count_evaluations",
                                   "start", "total")


_unused: dict[tuple, object] = {}


def _unused_int(device: torch.device) -> torch.Tensor:
    """A one-element int32 tensor for an output array the kernel does not write."""
    t = _unused.get(("int", device))
    if t is None:
        with _internals.plain_tensors():
            t = _unused.setdefault(("int", device), torch.zeros(1, dtype=torch.int32, device=device))
    return t


def _unused_partials(device: torch.device) -> SweptPartials:
    """Partials of one sphere for a launch that writes none (compute_grad False)."""
    p = _unused.get(("partials", device))
    if p is None:
        with _internals.plain_tensors():
            p = _unused.setdefault(("partials", device), SweptPartials(1, 1, 1, device))
    return p


def launch_sphere_hessian(query_spheres, weight, activation_distance, mesh_idx, mesh_pose_inverse, mesh_enable,
                          n_env_mesh, max_dist, env_query_idx=None, compute_esdf: bool = False,
                          sign_method=SignMethod.AUTO, snapshot=None) -> torch.Tensor:
    """d^2 out_cost / d p^2 (b,h,n,3,3) float32 of launch_sphere_cost's value, per sphere, world frame.

    Per mesh with penetration d > 0: c''(d) n n^T - c'(d) H_sd, H_sd the Hessian of the signed
    distance (0 on a face, (I - n n^T)/sd at a vertex, (I - n n^T - e e^T)/sd on an edge);
    compute_esdf: that of max_i(-sd_i). Undefined (as the gradient's jump) on medial axes and
    region boundaries; 0 within 1e-6 m of a surface."""
    b, h, n = _check_spheres(query_spheres)
    device = query_spheres.device
    spheres_data = query_spheres.detach().contiguous()
    env, use_env = env_tensor(env_query_idx, b, device)
    constants = constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                                   n_env_mesh, sign_method, device, snapshot)
    hessian = torch.empty(b, h, n, 3, 3, dtype=torch.float32, device=device)
    inputs = [flat_descriptor(spheres_data, 16), *constants, env_descriptor(env, use_env), use_env, h * n,
              int(bool(compute_esdf))]
    _launch_reading(snapshot, kernels.sphere_hessian_kernel, b * h * n, inputs, [flat_descriptor(hessian, 36)], device)
    return hessian


# Elements below which torch runs an elementwise product on the calling thread (its grain size).
_INTRA_OP_GRAIN = 32768


class SphereCostArgs:
    """Everything of a sphere-cost launch but the spheres and env_query_idx (launch_sphere_cost's
    other arguments), handed to the autograd Functions below as one opaque argument: torch.func
    treats it as a leaf (a tuple of ten members would be walked on every call and level), so
    env_query_idx, which a vmap may batch, travels as a tensor argument of its own."""

    __slots__ = ("weight", "activation_distance", "mesh_idx", "mesh_pose_inverse", "mesh_enable", "n_env_mesh",
                 "max_dist", "compute_esdf", "sign_method", "second_order", "snapshot", "reading")

    def __init__(self, weight, activation_distance, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist,
                 compute_esdf: bool, sign_method, second_order: bool = True, snapshot=None, reading=None):
        self.weight, self.activation_distance, self.max_dist = weight, activation_distance, max_dist
        self.mesh_idx, self.mesh_pose_inverse, self.mesh_enable, self.n_env_mesh = \
            mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh
        self.compute_esdf, self.sign_method = bool(compute_esdf), sign_method
        # Under a torch.func transform (robot_sdf.cost then uses its torch.func Function, whose
        # gradient output is differentiable).
        self.second_order = second_order
        # The MeshWorld snapshot the world tensors come from, if any (launch_sphere_cost), and its
        # world's ``reading`` (MeshWorld.reading), if any: the Hessian, launched later by a
        # backward, holds off the world's in-place refits as the forward's launch did.
        self.snapshot = snapshot
        self.reading = reading

    def launch(self, spheres: torch.Tensor, env: torch.Tensor | None,
               compute_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(cost (b,h,n), gradient (b,h,n,4)) of float32 spheres (b,h,n,4), in fresh buffers."""
        b, h, n, _ = spheres.shape
        cost = torch.empty(b, h, n, dtype=torch.float32, device=spheres.device)
        grad = torch.empty_like(spheres, memory_format=torch.contiguous_format)
        sparsity = torch.empty_like(cost, dtype=torch.uint8)
        launch_sphere_cost_fresh(spheres, cost, grad, sparsity, self.weight, self.activation_distance, self.mesh_idx,
                                 self.mesh_pose_inverse, self.mesh_enable, self.n_env_mesh, self.max_dist, env,
                                 compute_esdf=self.compute_esdf, compute_grad=compute_grad,
                                 sign_method=self.sign_method, snapshot=self.snapshot)
        return cost, grad

    def hessian(self, spheres: torch.Tensor, env: torch.Tensor | None) -> torch.Tensor:
        if self.reading is not None:
            with self.reading():
                return self._hessian(spheres, env)
        return self._hessian(spheres, env)

    def _hessian(self, spheres: torch.Tensor, env: torch.Tensor | None) -> torch.Tensor:
        return launch_sphere_hessian(spheres, self.weight, self.activation_distance, self.mesh_idx,
                                     self.mesh_pose_inverse, self.mesh_enable, self.n_env_mesh, self.max_dist, env,
                                     self.compute_esdf, self.sign_method, self.snapshot)


# --- torch.func (vmap) support: a vmapped dimension folds into the batch dimension b.

def _vmap_batch(info, tensors_and_dims) -> tuple:
    """Each (tensor or None, its vmapped dim or None) -> the tensor with the vmapped dimension
    (batch size info.batch_size) first; an unbatched tensor is expanded to it."""
    out = []
    for t, dim in tensors_and_dims:
        if t is None:
            out.append(None)
        elif dim is None:
            out.append(t.unsqueeze(0).expand(info.batch_size, *t.shape))
        else:
            out.append(t.movedim(dim, 0))
    return tuple(out)


def _fold(t: torch.Tensor | None) -> torch.Tensor | None:
    """(B, b, ...) -> (B*b, ...)."""
    return None if t is None else t.reshape(t.shape[0] * t.shape[1], *t.shape[2:])


def _refuse_batched_world(names_and_dims) -> None:
    for name, dim in names_and_dims:
        if dim is not None:
            raise ValueError(f"robot_sdf: vmap over {name} is not supported (vmap over spheres and env_query_idx; "
                             "world tensors are shared by every sample)")


def fold_spheres_env(info, spheres, spheres_dim, env, env_dim):
    """spheres (B,b,h,n,4) folded to (B*b,h,n,4) and env_query_idx ((B,b), (b,) or None) to match."""
    spheres_b, env_b = _vmap_batch(info, ((spheres, spheres_dim), (env, env_dim)))
    return _fold(spheres_b), (None if env_b is None else env_b.reshape(-1))


def unfold_batch(t: torch.Tensor, batch_size: int) -> torch.Tensor:
    return t.reshape(batch_size, t.shape[0] // batch_size, *t.shape[1:])


def _pad_radius(g3: torch.Tensor) -> torch.Tensor:
    """(..., 3) -> (..., 4) with a zero radius component."""
    return torch.cat([g3, torch.zeros_like(g3[..., :1])], dim=-1)


def hessian_product(spheres: torch.Tensor, vector: torch.Tensor, env, args: SphereCostArgs) -> torch.Tensor:
    """H v (b,h,n,4), H the per-sphere Hessian of the cost, v (b,h,n,4) (its radius ignored)."""
    hess = SphereHessian.apply(spheres, env, args)
    return _pad_radius(torch.matmul(hess.to(vector.dtype), vector[..., :3].unsqueeze(-1)).squeeze(-1))


class SphereHessian(torch.autograd.Function):
    """SphereHessian.apply(spheres (b,h,n,4), env_query_idx, args: SphereCostArgs) -> (b,h,n,3,3):
    the per-sphere Hessian of the cost, for second derivatives. Third derivatives are refused."""

    @staticmethod
    def forward(spheres, env, args):
        return args.hessian(spheres, env)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad_output):
        raise RuntimeError("robot_sdf: derivatives of the collision cost beyond the second are not implemented")

    @staticmethod
    def vmap(info, in_dims, spheres, env, args):
        folded, fenv = fold_spheres_env(info, spheres, in_dims[0], env, in_dims[1])
        return unfold_batch(SphereHessian.apply(folded, fenv, args), info.batch_size), 0


class SphereGradient(torch.autograd.Function):
    """SphereGradient.apply(spheres, gradient (b,h,n,4), env_query_idx, args) -> gradient: the
    cost gradient computed in forward, passed through as a function of the spheres whose own
    derivative is the Hessian (double backward, forward-over-reverse)."""

    @staticmethod
    def forward(spheres, gradient, env, args):
        return gradient.clone()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0], inputs[2])
        ctx.save_for_forward(inputs[0])
        ctx.env = inputs[2]  # integer, never differentiated (save_for_forward wants floating tensors)
        ctx.args = inputs[3]

    @staticmethod
    def backward(ctx, grad_output):
        spheres, env = ctx.saved_tensors
        return hessian_product(spheres, grad_output, env, ctx.args), None, None, None

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        (spheres,) = ctx.saved_tensors
        return hessian_product(spheres, spheres_tangent, ctx.env, ctx.args)

    @staticmethod
    def vmap(info, in_dims, spheres, gradient, env, args):
        folded, fenv = fold_spheres_env(info, spheres, in_dims[0], env, in_dims[2])
        (grad_b,) = _vmap_batch(info, ((gradient, in_dims[1]),))
        return unfold_batch(SphereGradient.apply(folded, _fold(grad_b), fenv, args), info.batch_size), 0


def sphere_cost_vjp(grad_output: torch.Tensor, spheres: torch.Tensor, gradient: torch.Tensor, env,
                    args: SphereCostArgs) -> torch.Tensor:
    """d (sum grad_output * cost) / d spheres (b,h,n,4) from the forward's gradient (b,h,n,4): the
    backward shared by SdfMeshWarpPy and robot_sdf.cost. With create_graph the gradient goes
    through SphereGradient, so that a second backward gets the Hessian."""
    if torch.is_grad_enabled():
        return grad_output.unsqueeze(-1) * SphereGradient.apply(spheres, gradient, env, args)
    # out_grad[..., 3] is zero, so the radius gets no gradient.
    if gradient.numel() >= _INTRA_OP_GRAIN and gradient.device.type == "cpu" \
            and grad_output.dtype == torch.float32 and not grad_output.requires_grad \
            and type(grad_output) is torch.Tensor and grad_output.layout == torch.strided:
        # The same float32 products on the calling thread: torch splits a product this
        # large over its intra-op threads, and on a loaded CPU that barrier waits for a
        # busy core (5-8 ms per call on 2 shared cores, against 0.2-0.4 ms for the product).
        # Smaller products run on one thread anyway: torch's own path is cheaper there.
        try:
            return torch.from_numpy(np.multiply(grad_output.resolve_neg().numpy()[..., None], gradient.numpy()))
        except (RuntimeError, TypeError):  # a tensor numpy cannot view (torch.func wrapper): torch's path
            pass
    return grad_output.unsqueeze(-1) * gradient


def sphere_cost_jvp(tangent: torch.Tensor, gradient: torch.Tensor) -> torch.Tensor:
    """Forward-mode tangent (b,h,n) of the cost: the gradient (b,h,n,4) dotted with the spheres'
    tangent (b,h,n,4) (gradient[..., 3] is 0: the radius does not count)."""
    return (gradient.to(tangent.dtype) * tangent).sum(-1)


def sign_and_snapshot(sign_method) -> tuple:
    """(sign method, snapshot) of the Functions' trailing ``sign_method`` argument, which may be a
    MeshWorld's WorldSnapshot (module docstring): then its per-slot sign methods and the snapshot
    itself (its slot BVHs), else (the argument, None). Below the Functions the two travel apart."""
    if type(sign_method) is WorldSnapshot:
        signs = sign_method.sign_methods
        return (signs if signs is not None else sign_method.sign_method), sign_method
    return sign_method, None


class _SdfMeshWarpPy(torch.autograd.Function):
    """SdfMeshWarpPy's Function: forward returns (out_cost, a non-differentiable second output).
    Its arguments are apply's, with a sign method in ``sign_method`` and a trailing ``snapshot``
    (sign_and_snapshot)."""

    @staticmethod
    def forward(
        query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
        mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None, return_loss=False,
        compute_esdf=False, sign_method=SignMethod.AUTO, compute_grad=None, snapshot=None,
    ):
        launch_sphere_cost(
            query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
            mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx,
            compute_esdf=compute_esdf, compute_grad=bool(compute_grad), sign_method=sign_method, snapshot=snapshot,
        )
        return out_cost, out_grad.view_as(out_grad)  # a view: an input returned as-is may not be saved

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        # No zero-filled grad_output for the non-differentiable output at each backward (nor
        # zero-filled tangents: backward and jvp take None for "zero" instead).
        ctx.set_materialize_grads(False)
        ctx.args = SphereCostArgs(*inputs[4:11], inputs[13], inputs[14], True, inputs[16])
        env = inputs[11]
        ctx.save_for_backward(inputs[0], output[1], env if isinstance(env, torch.Tensor) else None)
        ctx.save_for_forward(output[1])

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad_spheres = None
        if ctx.needs_input_grad[0]:
            spheres, gradient, env = ctx.saved_tensors
            if grad_output is None:
                grad_spheres = torch.zeros_like(spheres)
            else:
                grad_spheres = sphere_cost_vjp(grad_output, spheres, gradient, env, ctx.args)
        return (grad_spheres,) + (None,) * 16

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        (gradient,) = ctx.saved_tensors
        if spheres_tangent is None:  # a tangent on another input only: the cost does not move
            return gradient.new_zeros(gradient.shape[:-1]), None
        return sphere_cost_jvp(spheres_tangent, gradient), None

    @staticmethod
    def vmap(info, in_dims, query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
             mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, return_loss, compute_esdf,
             sign_method, compute_grad, snapshot):
        _refuse_batched_world(zip(("weight", "activation_distance", "mesh_idx", "mesh_pose_inverse", "mesh_enable",
                                   "n_env_mesh", "max_dist", "sign_method"), in_dims[4:11] + in_dims[14:15]))
        spheres, env = fold_spheres_env(info, query_spheres, in_dims[0], env_query_idx, in_dims[11])
        b, h, n, _ = spheres.shape
        cost = torch.empty(b, h, n, dtype=torch.float32, device=spheres.device)
        grad = torch.empty(b, h, n, 4, dtype=torch.float32, device=spheres.device)
        sparsity = torch.empty(b, h, n, dtype=torch.uint8, device=spheres.device)
        cost, grad = _SdfMeshWarpPy.apply(
            spheres, cost, grad, sparsity, weight, activation_distance, mesh_idx, mesh_pose_inverse, mesh_enable,
            n_env_mesh, max_dist, env, return_loss, compute_esdf, sign_method, compute_grad, snapshot)
        return (unfold_batch(cost, info.batch_size), unfold_batch(grad, info.batch_size)), (0, 0)


# _SdfMeshWarpPy.apply without torch's Python wrapper where that is safe (robot_sdf._internals).
_sdf_apply = _internals.direct_apply(_SdfMeshWarpPy)


class SdfMeshWarpPy(_SdfMeshWarpPy):
    """Collision cost of spheres against the meshes of a world (docs/design.md "Tensor layouts", "Cost definition").

    ``apply`` returns out_cost as cuRobo's does. Inside, forward returns (out_cost, out_grad), the
    gradient a non-differentiable second output, so that torch.func sees it at every level.
    Besides ordinary backward: torch.func (grad, vmap, jacrev, jacfwd, jvp), forward-mode AD and
    exact double backward (robot_sdf.cost's notes). Under a vmap the vmapped dimension folds into
    b and fresh outputs are used (the caller's buffers are not written). Where a derivative may be
    asked for (robot_sdf._internals.may_need_gradient) out_grad is filled, else zero-filled. A
    trailing ``compute_grad`` (None: decide so) may force either.
    """

    @staticmethod
    def forward(
        query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
        mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None, return_loss=False,
        compute_esdf=False, sign_method=SignMethod.AUTO, compute_grad=None,
    ):
        """apply's arguments (docs/design.md "Tensor layouts"); apply runs _SdfMeshWarpPy with them."""
        sign_method, snapshot = sign_and_snapshot(sign_method)
        return _SdfMeshWarpPy.forward(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance,
                                      mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx,
                                      return_loss, compute_esdf, sign_method, compute_grad, snapshot)

    @classmethod
    def apply(cls, *args, **kwargs):
        full = _internals.bind_arguments(cls, args, kwargs)
        if full[15] is None:
            full[15] = _internals.may_need_gradient(full[0])
        if type(full[14]) is WorldSnapshot:
            full[14], snapshot = sign_and_snapshot(full[14])
            return _sdf_apply(*full, snapshot)[0]
        return _sdf_apply(*full, None)[0]


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
    once_differentiable error (torch's decorator alone gives a result that does not require grad,
    whose second backward fails with a message that names nothing)."""
    if torch.is_grad_enabled() and spheres.requires_grad:
        return _SecondOrderRefused.apply(gradient, spheres)
    return gradient


def swept_jvp(tangent: torch.Tensor, partials: torch.Tensor) -> torch.Tensor:
    """Forward-mode tangent (b,h,n) of the swept costs from the partials (3,b,h,n,4, SweptPartials)
    and the spheres' tangent (b,h,n,4): cost_t moves by row 2 of step t-1, row 1 of step t and
    row 0 of step t+1, each dotted with that step's tangent (the radius rows are 0)."""
    moved = (partials.to(tangent.dtype) * tangent).sum(-1)
    out = moved[1]
    out[:, 1:] = out[:, 1:] + moved[2, :, :-1]
    out[:, :-1] = out[:, :-1] + moved[0, :, 1:]
    return out


class _SweptSdfMeshWarpPy(torch.autograd.Function):
    """SweptSdfMeshWarpPy's Function: forward returns (out_cost, a non-differentiable second output).
    Its arguments are apply's, with a sign method in ``sign_method`` and a trailing ``snapshot``
    (sign_and_snapshot)."""

    @staticmethod
    def forward(
        query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
        mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps=1,
        enable_speed_metric=False, env_query_idx=None, return_loss=False, sign_method=SignMethod.AUTO,
        compute_grad=None, snapshot=None,
    ):
        partials = launch_swept_sphere_cost(
            query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
            mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps,
            enable_speed_metric, env_query_idx, compute_grad=bool(compute_grad), sign_method=sign_method,
            snapshot=snapshot,
        )
        return out_cost, (partials.buffer if partials is not None else out_cost.new_empty((3, 0)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        # No zero-filled grad_output for the partials (3 x the spheres' size) at each backward (nor
        # zero-filled tangents: backward and jvp take None for "zero" instead).
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(output[1], inputs[0])
        ctx.save_for_forward(output[1])
        ctx.cost_shape = output[0].shape

    @staticmethod
    def _checked(partials: torch.Tensor) -> torch.Tensor:
        if partials.dim() == 2:
            raise RuntimeError("SweptSdfMeshWarpPy: derivatives asked for a call made with compute_grad=False")
        return partials

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad_spheres = None
        if ctx.needs_input_grad[0]:
            partials, spheres = ctx.saved_tensors
            if grad_output is None:
                grad_spheres = torch.zeros_like(spheres)
            else:
                grad_spheres = swept_chain_rule(_SweptSdfMeshWarpPy._checked(partials), grad_output)
            grad_spheres = refuse_second_order(grad_spheres, spheres)
        return (grad_spheres,) + (None,) * 18

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        partials = ctx.saved_tensors[0]
        if spheres_tangent is None:  # a tangent on another input only: the cost does not move
            return partials.new_zeros(ctx.cost_shape), None
        return swept_jvp(spheres_tangent, _SweptSdfMeshWarpPy._checked(partials)), None

    @staticmethod
    def vmap(info, in_dims, query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
             mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps, enable_speed_metric,
             env_query_idx, return_loss, sign_method, compute_grad, snapshot):
        _refuse_batched_world(zip(("weight", "activation_distance", "speed_dt", "mesh_idx", "mesh_pose_inverse",
                                   "mesh_enable", "n_env_mesh", "max_dist", "sign_method"),
                                  in_dims[4:12] + in_dims[16:17]))
        spheres, env = _vmap_batch(info, ((query_spheres, in_dims[0]), (env_query_idx, in_dims[14])))
        spheres = _fold(spheres)
        env = None if env is None else env.reshape(-1)
        b, h, n, _ = spheres.shape
        cost, partials = _SweptSdfMeshWarpPy.apply(
            spheres, torch.empty(b, h, n, dtype=torch.float32, device=spheres.device),
            torch.empty(b, h, n, 4, dtype=torch.float32, device=spheres.device),
            torch.empty(b, h, n, dtype=torch.uint8, device=spheres.device), weight, activation_distance, speed_dt,
            mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps, enable_speed_metric, env,
            return_loss, sign_method, compute_grad, snapshot)
        if partials.dim() == 2:
            return (unfold_batch(cost, info.batch_size), partials), (0, None)
        # (3, B*b, h, n, 4) -> (3, B, b, h, n, 4): the vmapped dimension is 1.
        partials = partials.reshape(3, info.batch_size, b // info.batch_size, h, n, 4)
        return (unfold_batch(cost, info.batch_size), partials), (0, 1)


# _SweptSdfMeshWarpPy.apply without torch's Python wrapper where that is safe (robot_sdf._internals).
_swept_apply = _internals.direct_apply(_SweptSdfMeshWarpPy)


class SweptSdfMeshWarpPy(_SweptSdfMeshWarpPy):
    """Swept collision cost along trajectories (b, h steps, n spheres) (docs/design.md "Swept cost").

    cost_t depends on p[t-1], p[t] and p[t+1]. out_grad holds, per sphere, the gradient of the
    summed cost (what cuRobo-style MPCs read); backward applies the chain rule for any
    grad_output from the per-step partials computed in forward (swept_chain_rule), jvp the
    forward-mode one (swept_jvp). ``apply`` returns out_cost; inside, forward also returns the
    partials (3,b,h,n,4) as a non-differentiable output. torch.func's transforms work as for
    SdfMeshWarpPy; double backward is refused with torch's once_differentiable error. A trailing
    ``compute_grad`` (None: robot_sdf._internals.may_need_gradient) may force or skip the partials.
    """

    @staticmethod
    def forward(
        query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
        mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps=1,
        enable_speed_metric=False, env_query_idx=None, return_loss=False, sign_method=SignMethod.AUTO,
        compute_grad=None,
    ):
        """apply's arguments (docs/design.md "Tensor layouts"); apply runs _SweptSdfMeshWarpPy with them."""
        sign_method, snapshot = sign_and_snapshot(sign_method)
        return _SweptSdfMeshWarpPy.forward(query_spheres, out_cost, out_grad, sparsity_idx, weight,
                                           activation_distance, speed_dt, mesh_idx, mesh_pose_inverse, mesh_enable,
                                           n_env_mesh, max_dist, sweep_steps, enable_speed_metric, env_query_idx,
                                           return_loss, sign_method, compute_grad, snapshot)

    @classmethod
    def apply(cls, *args, **kwargs):
        full = _internals.bind_arguments(cls, args, kwargs)
        if full[17] is None:
            full[17] = _internals.may_need_gradient(full[0])
        if type(full[16]) is WorldSnapshot:
            full[16], snapshot = sign_and_snapshot(full[16])
            return _swept_apply(*full, snapshot)[0]
        return _swept_apply(*full, None)[0]


def swept_cost_of_snapshot(spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
                           snapshot, max_dist, sweep_steps: int, enable_speed_metric: bool, env_query_idx,
                           compute_grad: bool) -> torch.Tensor:
    """SweptSdfMeshWarpPy.apply on a MeshWorld snapshot's tensors, its per-slot sign methods and
    its slot BVHs (what robot_sdf.cost's swept_sphere_cost evaluates): out_cost, differentiable."""
    return _swept_apply(spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
                        snapshot.mesh_idx, snapshot.mesh_pose_inverse, snapshot.mesh_enable, snapshot.n_env_mesh,
                        max_dist, int(sweep_steps), bool(enable_speed_metric), env_query_idx, False,
                        snapshot.sign_methods, compute_grad, snapshot)[0]


