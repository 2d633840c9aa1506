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
A MeshWorld's WorldSnapshot itself may be passed there too (MeshWorld's own evaluations do): its
per-slot sign methods are used and, where its world's slot BVHs describe it, a sphere visits only
the slots near it (robot_sdf.slot_index); otherwise every slot of the sphere's environment is
visited. A ``winding_number`` slot whose mesh MeshWorld built without winding-number support is
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

import operator

import numpy as np
import torch
import warp as wp

from robot_sdf import _internals, kernels
from robot_sdf.launch import (descriptor, direct_cpu_call, flat_descriptor,
                              launch_kernel, owning_descriptor, warp_device)
from robot_sdf.types import SignMethod, WorldSnapshot

# Descriptors of tensors that callers keep across calls (a snapshot's tensors, cached scalar
# constants), keyed by the tensors' identities. An entry holds the tensors themselves, so an id is
# never reused while its entry exists, and it is checked on every use against every tensor it
# wraps (_validator): a caller may set_() or resize a kept tensor, or write into it in place.
_descriptor_cache: dict = {}
_DESCRIPTOR_CACHE_SIZE = 64
_data_ptr = torch.Tensor.data_ptr
_version_of = operator.attrgetter("_version")
_shape_of = operator.attrgetter("shape")
_stride_of = torch.Tensor.stride
_is_inference = torch.Tensor.is_inference


def _tracked(tensors: tuple) -> tuple:
    """Addresses and version counters of ``tensors``. torch bumps a tensor's version on every
    in-place change, of its metadata too (set_, resize_, as_strided_, transpose_, ...), so equal
    versions and addresses mean the shapes and strides baked into a descriptor still hold, at about
    half the cost of reading them (the per-call path). Not seen: ``t.data = other``, which torch's
    autograd does not track either."""
    return tuple(map(_data_ptr, tensors)), tuple(map(_version_of, tensors))


def _layout(tensors: tuple) -> tuple:
    """Addresses, shapes and strides of ``tensors``: for inference tensors (no version counter)."""
    return tuple(map(_data_ptr, tensors)), tuple(map(_shape_of, tensors)), tuple(map(_stride_of, tensors))


def _validator(tensors: tuple, content: bool):
    """How an entry over ``tensors`` is checked on every use (_tracked or _layout), or None when it
    must not be kept: ``content`` entries depend on the values of the tensors (converted copies,
    the winding-number check of sign tensors), which only a version counter follows."""
    if any(map(_is_inference, tensors)):
        return None if content else _layout
    return _tracked


def _cached(key: tuple, tensors: tuple, build, content=False):
    """build(), kept under ``key`` while every one of ``tensors`` is unchanged (see _validator);
    ``content`` a bool, or a callable deciding it from the built value."""
    entry = _descriptor_cache.get(key)
    if entry is not None:
        kept, signature, value, check, layout = entry
        if check(kept) == signature:
            return value
        if layout is not None and _layout(kept) == layout:
            # Only values were written in place (a caller updating poses, say): descriptors of
            # the tensors' own memory still hold.
            _descriptor_cache[key] = (kept, check(kept), value, check, layout)
            return value
    value = build()
    content = content(value) if callable(content) else content
    check = _validator(tensors, content)
    if check is not None:
        if len(_descriptor_cache) >= _DESCRIPTOR_CACHE_SIZE:
            _descriptor_cache.clear()
        layout = None if content or check is _layout else _layout(tensors)
        _descriptor_cache[key] = (tensors, check(tensors), value, check, layout)
    return value


def _scalar(t, device: torch.device) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        t = torch.tensor([float(t)], dtype=torch.float32)
    if t.device == device and t.dtype == torch.float32 and t.dim() == 1 and t.shape[0] >= 1:
        return t
    return t.reshape(-1)[:1].to(device=device, dtype=torch.float32)


def _scalar_warp(t, device: torch.device):
    """Descriptor of a (1,) float32 scalar tensor on ``device`` (cached for tensors kept by the caller)."""
    if isinstance(t, torch.Tensor) and t.device == device and t.dtype == torch.float32 and t.dim() == 1:
        return _cached(("scalar", id(t)), (t,), lambda: descriptor(t))
    return owning_descriptor(_scalar(t, device))


def _ready(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if t.device == device and t.dtype == dtype and t.is_contiguous():
        return t
    return t.to(device=device, dtype=dtype).contiguous()


_no_env_query: dict[torch.device, torch.Tensor] = {}
_no_slot_sign: dict[torch.device, torch.Tensor] = {}
# Warp mesh id -> built with winding-number support, for the meshes MeshWorld builds.
_winding_support: dict[int, bool] = {}
# kernels.SIGN_PER_SLOT: the kernels read the per-slot tensor.
_SIGN_PER_SLOT = kernels.SIGN_PER_SLOT


def register_mesh(mesh_id: int, winding_number: bool) -> None:
    """Record whether a Warp mesh (by id) supports winding-number queries."""
    _winding_support[int(mesh_id)] = bool(winding_number)


def unregister_mesh(mesh_id: int) -> None:
    _winding_support.pop(int(mesh_id), None)


# Per device: (a (1,) int64 tensor holding the id of a BVH no query meets, that BVH, its descriptor).
_no_slot_bvh: dict[torch.device, tuple] = {}


def _slot_bvh_arguments(sign_method, mesh_idx: torch.Tensor, mesh_pose_inverse: torch.Tensor,
                        device: torch.device) -> tuple:
    """(the sign method to use, the kernels' slot_bvh descriptor).

    The trailing argument may be a WorldSnapshot (what MeshWorld's evaluations pass): its per-slot
    sign methods are used and, when the call's mesh tensors are the snapshot's own and its world's
    slot BVHs describe it (slot_index), so are those; anything else visits every slot."""
    if type(sign_method) is WorldSnapshot:
        snap = sign_method
        sign_method = snap.sign_methods if snap.sign_methods is not None else snap.sign_method
        ids = snap.slot_bvh() if snap.mesh_idx is mesh_idx and snap.mesh_pose_inverse is mesh_pose_inverse else None
        if ids is not None and ids.device == device and ids.shape[0] == mesh_idx.shape[0] + 1:
            return sign_method, _cached(("slot_bvh", id(ids)), (ids,), lambda: descriptor(ids))
    entry = _no_slot_bvh.get(device)
    if entry is None:
        from robot_sdf.slot_index import placeholder_bvh

        bvh = placeholder_bvh(warp_device(device))
        ids = torch.tensor([np.uint64(bvh.id).astype(np.int64)], dtype=torch.int64, device=device)
        entry = _no_slot_bvh.setdefault(device, (ids, bvh, descriptor(ids)))
    return sign_method, entry[2]


def _sign_arguments(sign_method, mesh_idx: torch.Tensor, device: torch.device) -> tuple:
    """(scalar code, (n_env, m) uint8 Warp array) for the kernels' sign arguments: one method for
    every slot (the array then unused), or _SIGN_PER_SLOT and the caller's per-slot tensor."""
    if isinstance(sign_method, torch.Tensor):
        if tuple(sign_method.shape) != tuple(mesh_idx.shape):
            raise ValueError(f"sign_method tensor must be (n_env, m) = {tuple(mesh_idx.shape)} like mesh_idx, "
                             f"got {tuple(sign_method.shape)}")
        if sign_method.device != device:
            raise ValueError(f"sign_method tensor is on {sign_method.device}, the spheres on {device}")
        ready = _ready(sign_method, device, torch.uint8)
        if ready is sign_method:
            return _SIGN_PER_SLOT, _cached(("sign", id(ready), id(mesh_idx)), (ready, mesh_idx),
                                           lambda: _checked_slot_signs(ready, mesh_idx), content=True)
        return _SIGN_PER_SLOT, _checked_slot_signs(ready, mesh_idx)
    method = SignMethod.parse(sign_method)
    if method == SignMethod.WINDING_NUMBER:
        _check_call_wide_winding(mesh_idx)
    unused = _no_slot_sign.get(device)
    if unused is None:
        with _internals.plain_tensors():
            unused = _no_slot_sign.setdefault(device, torch.zeros((1, 1), dtype=torch.uint8, device=device))
    return int(method), _cached(("no_sign", id(unused)), (unused,), lambda: descriptor(unused))


def _check_call_wide_winding(mesh_idx: torch.Tensor) -> None:
    """Refuse a call-wide winding_number on any mesh of the world built without support: a host
    copy of the ids (a device sync on CUDA), only for this override."""
    _check_winding_support(mesh_idx.detach().reshape(-1).cpu().numpy().astype(np.uint64))


def _check_winding_support(ids: np.ndarray) -> None:
    for mesh_id in np.unique(ids[ids != 0]):
        if _winding_support.get(int(mesh_id)) is False:
            raise ValueError(
                "sign_method winding_number: a mesh of this world was built without winding-number "
                "support; add it with sign_method='winding_number' (or let auto choose it), or pass "
                "the world's per-slot snapshot().sign_methods")


def _checked_slot_signs(signs: torch.Tensor, mesh_idx: torch.Tensor):
    """Descriptor of a per-slot sign tensor, after refusing values that are no SignMethod and
    winding_number on any slot whose mesh has no winding-number data (Warp would read memory the
    mesh does not have; on CUDA an illegal address ends the process's CUDA context). A host copy,
    so callers cache the result per tensor."""
    host = signs.detach().cpu().numpy()
    if host.size and int(host.max()) > int(SignMethod.AUTO):
        raise ValueError(f"sign_method tensor holds {int(host.max())}: each slot's value must be a SignMethod "
                         f"(0..{int(SignMethod.AUTO)})")
    wanted = host == int(SignMethod.WINDING_NUMBER)
    if wanted.any():
        _check_winding_support(mesh_idx.detach().cpu().numpy().astype(np.uint64)[wanted])
    return owning_descriptor(signs)


def _check_world_tensors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device) -> tuple:
    """Validated descriptors of the world tensors; a snapshot's tensors (the same objects call after
    call) are validated and wrapped once."""
    if mesh_idx.device != device:
        raise ValueError(f"mesh_idx is on {mesh_idx.device} but query_spheres on {device}: "
                         "the world and the spheres must share a device")
    tensors = (mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh)
    # The entry keeps the tensors it describes (converted copies included) alive.
    return _cached(("world", device) + tuple(map(id, tensors)), tensors,
                   lambda: _world_descriptors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device),
                   content=lambda built: _converted(built[0], tensors))[0]


def _converted(descriptors, tensors) -> bool:
    """Whether any descriptor describes a converted copy rather than its tensor's own memory."""
    return any(d.data != _data_ptr(t) for d, t in zip(descriptors, tensors))


def _world_descriptors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device) -> tuple:
    if mesh_idx.dim() != 2:
        raise ValueError(f"mesh_idx must be (n_env, m), got {tuple(mesh_idx.shape)}")
    n_env, m = mesh_idx.shape
    if tuple(mesh_pose_inverse.shape) != (n_env, m, 8):
        raise ValueError(f"mesh_pose_inverse must be ({n_env}, {m}, 8), got {tuple(mesh_pose_inverse.shape)}")
    if tuple(mesh_enable.shape) != (n_env, m):
        raise ValueError(f"mesh_enable must be ({n_env}, {m}), got {tuple(mesh_enable.shape)}")
    if tuple(n_env_mesh.reshape(-1).shape) != (n_env,):
        raise ValueError(f"n_env_mesh must be ({n_env},), got {tuple(n_env_mesh.shape)}")
    # Mesh ids are addresses on the device the meshes were built on: never move them.
    if mesh_idx.device != device:
        raise ValueError(f"mesh_idx is on {mesh_idx.device} but query_spheres on {device}: "
                         "the world and the spheres must share a device")
    ready = (_ready(mesh_idx, device, torch.int64), _ready(mesh_pose_inverse, device, torch.float32),
             _ready(mesh_enable, device, torch.uint8), _ready(n_env_mesh.reshape(-1), device, torch.int32))
    # Owning descriptors: an entry that is not kept (see _validator) must still keep converted
    # copies alive until the launch.
    return tuple(map(owning_descriptor, ready)), ready


def _env_tensor(env_query_idx, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """(contiguous (batch,) int32 tensor on ``device``, 1) for env_query_idx, or (an unused
    one-element tensor, 0) for None."""
    if env_query_idx is None:
        unused = _no_env_query.get(device)
        if unused is None:
            with _internals.plain_tensors():
                unused = _no_env_query.setdefault(device, torch.zeros(1, dtype=torch.int32, device=device))
        return unused, 0
    env = env_query_idx.reshape(-1)
    if env.shape[0] != batch:
        raise ValueError(f"env_query_idx must have one entry per batch row ({batch}), got {env.shape[0]}")
    return _ready(env, device, torch.int32), 1


def _env_descriptor(env: torch.Tensor, use: int):
    """Launch descriptor of _env_tensor's tensor (cached for the unused one)."""
    if not use:
        return _cached(("no_env", id(env)), (env,), lambda: descriptor(env))
    return owning_descriptor(env)


def _env_query(env_query_idx, batch: int, device: torch.device):
    env, use = _env_tensor(env_query_idx, batch, device)
    return _env_descriptor(env, use), use


# Launch arguments that callers keep across calls: the three scalar tensors, the four world
# tensors and the sign arguments, validated and converted together once per set of tensors
# (keyed by identities, checked against every tensor as _cached does).
_constant_sets: dict = {}
# (device, the eight arguments, entry) of the last set served: a caller repeating its arguments
# (the common case) skips building and hashing the key; the entry is checked all the same.
_last_set: tuple | None = None
_WINDING = int(SignMethod.WINDING_NUMBER)


def _is_kept_scalar(t, device: torch.device) -> bool:
    """A scalar tensor _scalar_warp describes without a per-call copy."""
    return isinstance(t, torch.Tensor) and t.device == device and t.dtype == torch.float32 and t.dim() == 1


def _constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                        sign_method, device: torch.device) -> tuple:
    """(weight, activation_distance, max_distance, mesh_idx, pose_inverse, enable, n_env_mesh,
    sign code, slot signs, slot BVHs) as launch arguments, after the same checks as on every call."""
    if type(sign_method) is WorldSnapshot:
        sign_method, slot_bvh = _slot_bvh_arguments(sign_method, mesh_idx, mesh_pose_inverse, device)
        return _constant_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                             n_env_mesh, sign_method, device)[:-1] + (slot_bvh,)
    return _constant_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                         sign_method, device)


def _world_arguments(sign_method, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device: torch.device) -> tuple:
    """(the four world descriptors the kernels read, whether the caller's own tensors were
    converted, sign code, slot signs). The caller's mesh ids are passed as they are: meshes built
    elsewhere get robot_sdf's sign regimes only through robot_sdf.adopt_meshes."""
    world = _check_world_tensors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device)
    code, slot_signs = _sign_arguments(sign_method, mesh_idx, device)
    converted = _converted(world, (mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh))
    return world, converted, code, slot_signs


def _constant_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                  sign_method, device: torch.device) -> tuple:
    """_constant_arguments' values, kept per set of argument tensors."""
    global _last_set
    last = _last_set
    if last is not None and last[1] is weight and last[2] is activation_distance and last[3] is max_dist \
            and last[4] is mesh_idx and last[5] is mesh_pose_inverse and last[6] is mesh_enable \
            and last[7] is n_env_mesh and last[8] is sign_method and last[0] == device:
        entry = last[9]
        if entry[3](entry[0]) == entry[1]:
            return entry[2]
    per_slot = isinstance(sign_method, torch.Tensor)
    key = (device, id(weight), id(activation_distance), id(max_dist), id(mesh_idx), id(mesh_pose_inverse),
           id(mesh_enable), id(n_env_mesh), id(sign_method) if per_slot else sign_method)
    try:
        entry = _constant_sets.get(key)
    except TypeError:  # an unhashable sign_method: SignMethod.parse below says what is wrong
        entry = key = None
    if entry is not None:
        kept, signature, values, check, layout, content_at = entry
        now = check(kept)
        if now != signature:
            # Values written in place keep the entry when none of them was read to build it
            # (the per-slot signs and mesh ids for the winding-number check, converted copies).
            if layout is None or any(now[1][i] != signature[1][i] for i in content_at) or _layout(kept) != layout:
                entry = None
            else:
                _constant_sets[key] = entry = (kept, now, values, check, layout, content_at)
        if entry is not None:
            _last_set = (device, weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                         n_env_mesh, sign_method, entry)
            return values
    world, converted, code, slot_signs = _world_arguments(sign_method, mesh_idx, mesh_pose_inverse, mesh_enable,
                                                         n_env_mesh, device)
    values = (_scalar_warp(weight, device), _scalar_warp(activation_distance, device), _scalar_warp(max_dist, device),
              *world, code, slot_signs,
              _slot_bvh_arguments(None, mesh_idx, mesh_pose_inverse, device)[1])  # the loop's placeholder
    # Kept only when nothing in it is a per-call copy and no call-wide winding_number check
    # (which reads the mesh ids on every call) is involved.
    if key is not None and _is_kept_scalar(weight, device) and _is_kept_scalar(activation_distance, device) \
            and _is_kept_scalar(max_dist, device) \
            and (sign_method.dtype == torch.uint8 and sign_method.is_contiguous() if per_slot else values[7] != _WINDING):
        tensors = (weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh)
        tensors += (sign_method,) if per_slot else ()
        # Positions of the tensors whose values the entry depends on.
        content_at = ((3, 7) if per_slot else ()) + ((3, 4, 5, 6) if converted else ())
        check = _validator(tensors, bool(content_at))
        if check is not None:
            if len(_constant_sets) >= _DESCRIPTOR_CACHE_SIZE:
                _constant_sets.clear()
            layout = _layout(tensors) if check is _tracked else None
            _constant_sets[key] = entry = (tensors, check(tensors), values, check, layout, content_at)
            _last_set = (device, weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse,
                         mesh_enable, n_env_mesh, sign_method, entry)
    return values


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
    compute_esdf: bool = False, compute_grad: bool = True, sign_method=SignMethod.AUTO,
) -> None:
    """Fill out_cost (b,h,n), out_grad (b,h,n,4) and sparsity_idx for SdfMeshWarpPy's cost."""
    b, h, n = _check_spheres(query_spheres)
    outs = _Outputs(out_cost, out_grad, sparsity_idx, (b, h, n), query_spheres.device)
    _sphere_cost_into(query_spheres, outs.cost, outs.grad, outs.sparsity, b, h, n, weight, activation_distance,
                      mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, compute_esdf,
                      compute_grad, sign_method)
    outs.finish()


def launch_sphere_cost_fresh(query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
                             mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None,
                             compute_esdf: bool = False, compute_grad: bool = True,
                             sign_method=SignMethod.AUTO) -> None:
    """launch_sphere_cost for output buffers the caller has just made for this call, as
    robot_sdf.cost does: query_spheres (b,h,n,4) float32, out_cost (b,h,n) and out_grad (b,h,n,4)
    float32, sparsity_idx (b,h,n) uint8, all contiguous on the spheres' device (the checks
    launch_sphere_cost makes of caller-held buffers are skipped; everything else is checked)."""
    b, h, n, _ = query_spheres.shape
    _sphere_cost_into(query_spheres, out_cost, out_grad, sparsity_idx, b, h, n, weight, activation_distance,
                      mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, compute_esdf,
                      compute_grad, sign_method)


def _sphere_cost_into(query_spheres, cost, grad, sparsity, b, h, n, weight, activation_distance, mesh_idx,
                      mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, compute_esdf, compute_grad,
                      sign_method) -> None:
    """The launch itself, into contiguous cost/grad/sparsity buffers of the right shapes."""
    device = query_spheres.device
    # Keep the contiguous tensor referenced until the launch: a descriptor holds only its address.
    spheres_data = query_spheres.detach().contiguous()
    env, use_env = _env_tensor(env_query_idx, b, device)
    constants = _constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                                    n_env_mesh, sign_method, device)
    total = b * h * n
    call = direct_cpu_call(kernels.sphere_cost_kernel, device, total)
    if call is not None:
        # Small CPU launches: the per-call tensors go straight into the recorded argument struct.
        call.set_constants(_SPHERE_COST_CONSTANT_POSITIONS, constants)
        call.set_flats(_SPHERE_COST_FLAT_POSITIONS, (spheres_data, env, cost, grad, sparsity))
        call.set_values(_SPHERE_COST_VALUE_POSITIONS,
                        (use_env, h * n, int(bool(compute_esdf)), int(bool(compute_grad)), 0, total))
        call.run()
        return
    inputs = [flat_descriptor(spheres_data, 16), *constants[:7], _env_descriptor(env, use_env), use_env, h * n, *constants[7:],
              int(bool(compute_esdf)), int(bool(compute_grad))]
    launch_kernel(kernels.sphere_cost_kernel, total, inputs, [flat_descriptor(cost, 4), flat_descriptor(grad, 16), flat_descriptor(sparsity, 1)], device)


# sphere_cost_kernel's argument positions by kind, for the direct CPU call.
_SPHERE_COST_CONSTANT_POSITIONS = (1, 2, 3, 4, 5, 6, 7, 11, 12, 13)
_SPHERE_COST_FLAT_POSITIONS = (0, 8, 18, 19, 20)  # spheres, env_query, out_cost, out_grad, out_sparsity
_SPHERE_COST_VALUE_POSITIONS = (9, 10, 14, 15, 16, 17)  # use_env, per batch, esdf, grad, start, total


class SweptPartials:
    """Per-sphere partial derivatives of the swept cost, (b,h,n,3) float32 each, world frame.

    own[t] = d cost_t / d p[t], to_prev[t] = d cost_t / d p[t-1], to_next[t] = d cost_t / d p[t+1]
    (zero where the side does not exist, for spheres that are off, and for both neighbour partials
    of a step where the speed metric applies). Views of one (3,b,h,n,3) buffer.
    """

    def __init__(self, b: int, h: int, n: int, device: torch.device):
        self.buffer = torch.empty((3, b, h, n, 3), dtype=torch.float32, device=device)
        self.own, self.to_prev, self.to_next = self.buffer.unbind(0)

    def warp_arrays(self) -> list:
        return [descriptor(x.view(-1, 3), dtype=wp.vec3) for x in (self.own, self.to_prev, self.to_next)]


def swept_chain_rule(own: torch.Tensor, to_prev: torch.Tensor, to_next: torch.Tensor,
                     grad_output: torch.Tensor | None = None) -> torch.Tensor:
    """d (sum_t grad_output[t] cost_t) / d p[t] (b,h,n,3) from the partials (b,h,n,3 each).

    grad[t] = g[t] own[t] + g[t-1] to_next[t-1] + g[t+1] to_prev[t+1]; grad_output g (b,h,n),
    None meaning all ones (the gradient of the summed cost).
    """
    if grad_output is None:
        grad = own.clone()
        grad[:, 1:] += to_next[:, :-1]
        grad[:, :-1] += to_prev[:, 1:]
        return grad
    g = grad_output.unsqueeze(-1).to(own.dtype)
    grad = g * own
    grad[:, 1:] += g[:, :-1] * to_next[:, :-1]
    grad[:, :-1] += g[:, 1:] * to_prev[:, 1:]
    return grad


def launch_swept_sphere_cost(
    query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt, mesh_idx,
    mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps: int = 1,
    enable_speed_metric: bool = False, env_query_idx=None, compute_grad: bool = True,
    sign_method=SignMethod.AUTO, out_evaluations: torch.Tensor | None = None,
) -> SweptPartials | None:
    """Fill the outputs with SweptSdfMeshWarpPy's cost (docs/design.md "Swept cost").

    out_cost[t] = cost_t (b,h,n); out_grad[..., :3] = d (sum_t' cost_t') / d p[t] (b,h,n,4), the
    gradient of the summed cost that cuRobo-style callers read directly (zero-filled unless
    compute_grad). Returns the partials (for autograd with any grad_output) when compute_grad,
    else None. out_evaluations: optional (b,h,n) int32 tensor (contiguous, on the spheres'
    device) that receives the number of cost evaluations made per sphere (benchmarks).
    """
    b, h, n = _check_spheres(query_spheres)
    if int(sweep_steps) < 0:
        raise ValueError(f"sweep_steps must be >= 0, got {sweep_steps}")
    device = query_spheres.device
    outs = _Outputs(out_cost, out_grad, sparsity_idx, (b, h, n), device)
    # Keep the contiguous tensor referenced until the launch: a descriptor holds only its address.
    spheres_data = query_spheres.detach().contiguous()
    spheres = flat_descriptor(spheres_data, 16)
    env_arr, use_env = _env_query(env_query_idx, b, device)
    sign_method, slot_bvh = _slot_bvh_arguments(sign_method, mesh_idx, mesh_pose_inverse, device)
    world, _, code, slot_signs = _world_arguments(sign_method, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                                                  device)
    if out_evaluations is not None and (tuple(out_evaluations.shape) != (b, h, n) or out_evaluations.dtype != torch.int32
                                        or out_evaluations.device != device or not out_evaluations.is_contiguous()):
        raise ValueError(f"out_evaluations must be a contiguous ({b}, {h}, {n}) int32 tensor on {device}")
    partials = SweptPartials(b, h, n, device) if compute_grad else SweptPartials(1, 1, 1, device)
    evaluations = out_evaluations if out_evaluations is not None else _unused_int(device)
    inputs = [
        spheres, _scalar_warp(weight, device), _scalar_warp(activation_distance, device),
        _scalar_warp(max_dist, device), _scalar_warp(speed_dt, device), *world, env_arr, use_env,
        h, n, int(sweep_steps), int(bool(enable_speed_metric)), code, slot_signs,
        slot_bvh, int(bool(compute_grad)), int(out_evaluations is not None),
    ]
    outputs = [descriptor(outs.cost.view(-1)), descriptor(outs.sparsity.view(-1)), *partials.warp_arrays(),
               descriptor(evaluations.view(-1))]
    launch_kernel(kernels.swept_sphere_cost_kernel, b * h * n, inputs, outputs, device)
    if compute_grad:
        outs.grad[..., :3] = swept_chain_rule(partials.own, partials.to_prev, partials.to_next)
        outs.grad[..., 3] = 0.0
    else:
        outs.grad.zero_()
    outs.finish()
    return partials if compute_grad else None


_unused_ints: dict[torch.device, torch.Tensor] = {}


def _unused_int(device: torch.device) -> torch.Tensor:
    t = _unused_ints.get(device)
    if t is None:
        with _internals.plain_tensors():
            t = _unused_ints.setdefault(device, torch.zeros(1, dtype=torch.int32, device=device))
    return t


def launch_sphere_hessian(query_spheres, weight, activation_distance, mesh_idx, mesh_pose_inverse, mesh_enable,
                          n_env_mesh, max_dist, env_query_idx=None, compute_esdf: bool = False,
                          sign_method=SignMethod.AUTO) -> torch.Tensor:
    """d^2 out_cost / d p^2 (b,h,n,3,3) float32 of launch_sphere_cost's value, per sphere, world frame.

    Per mesh with penetration d > 0: c''(d) n n^T - c'(d) H_sd, H_sd the Hessian of the signed
    distance (0 on a face, (I - n n^T)/sd at a vertex, (I - n n^T - e e^T)/sd on an edge);
    compute_esdf: that of max_i(-sd_i). Undefined (as the gradient's jump) on medial axes and
    region boundaries; 0 within 1e-6 m of a surface."""
    b, h, n = _check_spheres(query_spheres)
    device = query_spheres.device
    spheres_data = query_spheres.detach().contiguous()
    env, use_env = _env_tensor(env_query_idx, b, device)
    constants = _constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                                    n_env_mesh, sign_method, device)
    hessian = torch.empty(b, h, n, 3, 3, dtype=torch.float32, device=device)
    inputs = [flat_descriptor(spheres_data, 16), *constants[:7], _env_descriptor(env, use_env), use_env, h * n, *constants[7:10],
              int(bool(compute_esdf))]
    launch_kernel(kernels.sphere_hessian_kernel, b * h * n, inputs, [flat_descriptor(hessian, 36)], device)
    return hessian


# Elements below which torch runs an elementwise product on the calling thread (its grain size).
_INTRA_OP_GRAIN = 32768


class SphereCostArgs:
    """Everything of a sphere-cost launch but the spheres and env_query_idx (launch_sphere_cost's
    other arguments), handed to the autograd Functions below as one opaque argument: torch.func
    treats it as a leaf (a tuple of ten members would be walked on every call and level), so
    env_query_idx, which a vmap may batch, travels as a tensor argument of its own."""

    __slots__ = ("weight", "activation_distance", "mesh_idx", "mesh_pose_inverse", "mesh_enable", "n_env_mesh",
                 "max_dist", "compute_esdf", "sign_method", "second_order")

    def __init__(self, weight, activation_distance, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist,
                 compute_esdf: bool, sign_method, second_order: bool = True):
        self.weight, self.activation_distance, self.max_dist = weight, activation_distance, max_dist
        self.mesh_idx, self.mesh_pose_inverse, self.mesh_enable, self.n_env_mesh = \
            mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh
        self.compute_esdf, self.sign_method = bool(compute_esdf), sign_method
        # Under a torch.func transform (robot_sdf.cost then uses its torch.func Function, whose
        # gradient output is differentiable).
        self.second_order = second_order

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
                                 sign_method=self.sign_method)
        return cost, grad

    def hessian(self, spheres: torch.Tensor, env: torch.Tensor | None) -> torch.Tensor:
        return launch_sphere_hessian(spheres, self.weight, self.activation_distance, self.mesh_idx,
                                     self.mesh_pose_inverse, self.mesh_enable, self.n_env_mesh, self.max_dist, env,
                                     self.compute_esdf, self.sign_method)


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


class _SdfMeshWarpPy(torch.autograd.Function):
    """SdfMeshWarpPy's Function: forward returns (out_cost, a non-differentiable second output)."""

    @staticmethod
    def forward(
        query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
        mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx=None, return_loss=False,
        compute_esdf=False, sign_method=SignMethod.AUTO, compute_grad=None,
    ):
        launch_sphere_cost(
            query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
            mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx,
            compute_esdf=compute_esdf, compute_grad=bool(compute_grad), sign_method=sign_method,
        )
        return out_cost, out_grad.view_as(out_grad)  # a view: an input returned as-is may not be saved

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.args = SphereCostArgs(*inputs[4:11], inputs[13], inputs[14])
        env = inputs[11]
        ctx.save_for_backward(inputs[0], output[1], env if isinstance(env, torch.Tensor) else None)
        ctx.save_for_forward(output[1])

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad_spheres = None
        if ctx.needs_input_grad[0]:
            spheres, gradient, env = ctx.saved_tensors
            grad_spheres = sphere_cost_vjp(grad_output, spheres, gradient, env, ctx.args)
        return (grad_spheres,) + (None,) * 15

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        (gradient,) = ctx.saved_tensors
        return sphere_cost_jvp(spheres_tangent, gradient), None

    @staticmethod
    def vmap(info, in_dims, query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, mesh_idx,
             mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, env_query_idx, return_loss, compute_esdf,
             sign_method, compute_grad):
        _refuse_batched_world(zip(("weight", "activation_distance", "mesh_idx", "mesh_pose_inverse", "mesh_enable",
                                   "n_env_mesh", "max_dist", "sign_method"), in_dims[4:11] + in_dims[14:15]))
        spheres, env = fold_spheres_env(info, query_spheres, in_dims[0], env_query_idx, in_dims[11])
        b, h, n, _ = spheres.shape
        cost = torch.empty(b, h, n, dtype=torch.float32, device=spheres.device)
        grad = torch.empty(b, h, n, 4, dtype=torch.float32, device=spheres.device)
        sparsity = torch.empty(b, h, n, dtype=torch.uint8, device=spheres.device)
        cost, grad = _SdfMeshWarpPy.apply(
            spheres, cost, grad, sparsity, weight, activation_distance, mesh_idx, mesh_pose_inverse, mesh_enable,
            n_env_mesh, max_dist, env, return_loss, compute_esdf, sign_method, compute_grad)
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

    @classmethod
    def apply(cls, *args, **kwargs):
        full = _internals.bind_arguments(cls, args, kwargs)
        if full[15] is None:
            full[15] = _internals.may_need_gradient(full[0])
        return _sdf_apply(*full)[0]


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
    """Forward-mode tangent (b,h,n) of the swept costs: own[t].dp[t] + to_prev[t].dp[t-1] +
    to_next[t].dp[t+1], from the partials (3,b,h,n,3) and the spheres' tangent (b,h,n,4)."""
    own, to_prev, to_next = partials.to(tangent.dtype).unbind(0)
    dp = tangent[..., :3]
    out = (own * dp).sum(-1)
    out[:, 1:] = out[:, 1:] + (to_prev[:, 1:] * dp[:, :-1]).sum(-1)
    out[:, :-1] = out[:, :-1] + (to_next[:, :-1] * dp[:, 1:]).sum(-1)
    return out


class _SweptSdfMeshWarpPy(torch.autograd.Function):
    """SweptSdfMeshWarpPy's Function: forward returns (out_cost, a non-differentiable second output)."""

    @staticmethod
    def forward(
        query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
        mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps=1,
        enable_speed_metric=False, env_query_idx=None, return_loss=False, sign_method=SignMethod.AUTO,
        compute_grad=None,
    ):
        partials = launch_swept_sphere_cost(
            query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
            mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps,
            enable_speed_metric, env_query_idx, compute_grad=bool(compute_grad), sign_method=sign_method,
        )
        return out_cost, (partials.buffer if partials is not None else out_cost.new_empty((3, 0)))

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(output[1], inputs[0])
        ctx.save_for_forward(output[1])

    @staticmethod
    def _partials(ctx):
        partials = ctx.saved_tensors[0]
        if partials.dim() == 2:
            raise RuntimeError("SweptSdfMeshWarpPy: derivatives asked for a call made with compute_grad=False")
        return partials

    @staticmethod
    def backward(ctx, grad_output, *_):
        grad_spheres = None
        if ctx.needs_input_grad[0]:
            own, to_prev, to_next = _SweptSdfMeshWarpPy._partials(ctx).unbind(0)
            # The radius gets no gradient.
            grad_spheres = _pad_radius(swept_chain_rule(own, to_prev, to_next, grad_output))
            grad_spheres = refuse_second_order(grad_spheres, ctx.saved_tensors[1])
        return (grad_spheres,) + (None,) * 17

    @staticmethod
    def jvp(ctx, spheres_tangent, *_):
        return swept_jvp(spheres_tangent, _SweptSdfMeshWarpPy._partials(ctx)), None

    @staticmethod
    def vmap(info, in_dims, query_spheres, out_cost, out_grad, sparsity_idx, weight, activation_distance, speed_dt,
             mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, max_dist, sweep_steps, enable_speed_metric,
             env_query_idx, return_loss, sign_method, compute_grad):
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
            return_loss, sign_method, compute_grad)
        if partials.dim() == 2:
            return (unfold_batch(cost, info.batch_size), partials), (0, None)
        # (3, B*b, h, n, 3) -> (3, B, b, h, n, 3): the vmapped dimension is 1.
        partials = partials.reshape(3, info.batch_size, b // info.batch_size, h, n, 3)
        return (unfold_batch(cost, info.batch_size), partials), (0, 1)


# _SweptSdfMeshWarpPy.apply without torch's Python wrapper where that is safe (robot_sdf._internals).
_swept_apply = _internals.direct_apply(_SweptSdfMeshWarpPy)


class SweptSdfMeshWarpPy(_SweptSdfMeshWarpPy):
    """Swept collision cost along trajectories (b, h steps, n spheres) (docs/design.md "Swept cost").

    cost_t depends on p[t-1], p[t] and p[t+1]. out_grad holds, per sphere, the gradient of the
    summed cost (what cuRobo-style MPCs read); backward applies the chain rule for any
    grad_output from the per-step partials computed in forward (swept_chain_rule), jvp the
    forward-mode one (swept_jvp). ``apply`` returns out_cost; inside, forward also returns the
    partials (3,b,h,n,3) as a non-differentiable output. torch.func's transforms work as for
    SdfMeshWarpPy; double backward is refused with torch's once_differentiable error. A trailing
    ``compute_grad`` (None: robot_sdf._internals.may_need_gradient) may force or skip the partials.
    """

    @classmethod
    def apply(cls, *args, **kwargs):
        full = _internals.bind_arguments(cls, args, kwargs)
        if full[17] is None:
            full[17] = _internals.may_need_gradient(full[0])
        return _swept_apply(*full)[0]


