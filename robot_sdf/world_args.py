"""The kernels' kept arguments, marshalled in one place: the scalar tensors and the world.

The query kernels take the world as one kernels.World struct (kernels/slot_walk.py): the four
world tensors (docs/design.md "Tensor layouts"), the call's sign selection (one SignMethod for
every slot, or PER_SLOT and the per-slot tensor) and the slot BVHs of a MeshWorld's snapshot.
``constant_arguments`` validates and converts them and returns the scalars' descriptors and that
struct's value, kept per set of argument tensors (keyed by their identities) and checked on every
call against each tensor's address and version counter, so that a caller passing the same tensors
call after call pays a dictionary lookup. Also here: which meshes support winding-number queries
(the refusals that keep the kernels from reading memory a mesh does not have) and the env index.
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from robot_sdf import _internals, kernels
from robot_sdf.launch import descriptor, owning_descriptor, warp_device, world_value
from robot_sdf.types import SignMethod

_CACHE_SIZE = 64
_data_ptr = torch.Tensor.data_ptr
_version_of = operator.attrgetter("_version")
_stride_of = torch.Tensor.stride
_is_inference = torch.Tensor.is_inference
_SIGN_PER_SLOT = kernels.SIGN_PER_SLOT
_WINDING = int(SignMethod.WINDING_NUMBER)

# Warp mesh id -> built with winding-number support, for the meshes MeshWorld builds.
_winding_support: dict[int, bool] = {}
# key -> (tensors, signature, values, layout or None, positions whose values were read, check)
_constant_sets: dict = {}
# (device, sign_method, tensors, key, entry) of the set served last.
_last: tuple | None = None
# Per device: the unused env / per-slot sign tensors, and (ids, BVH) of a BVH no query meets.
_unused: dict[tuple, object] = {}


def register_mesh(mesh_id: int, winding_number: bool) -> None:
    """Record whether a Warp mesh (by id) supports winding-number queries."""
    _winding_support[int(mesh_id)] = bool(winding_number)


def unregister_mesh(mesh_id: int) -> None:
    _winding_support.pop(int(mesh_id), None)


def _versions(tensors: tuple) -> tuple:
    """Addresses and version counters: torch bumps a version on every in-place change, of the
    metadata too (set_, resize_, ...), so equal ones mean every descriptor built still holds."""
    return tuple(map(_data_ptr, tensors)), tuple(map(_version_of, tensors))


def _signature(tensors: tuple) -> tuple:
    """_versions, or for inference tensors (no version counter) their _layout."""
    return (_layout if any(map(_is_inference, tensors)) else _versions)(tensors)


def _layout(tensors: tuple) -> tuple:
    return tuple(map(_data_ptr, tensors)), tuple(t.shape for t in tensors), tuple(map(_stride_of, tensors))


def _is_kept_scalar(t, device: torch.device) -> bool:
    return isinstance(t, torch.Tensor) and t.device == device and t.dtype == torch.float32 and t.dim() == 1


def _scalar(t, device: torch.device) -> torch.Tensor:
    if _is_kept_scalar(t, device) and t.shape[0] >= 1:
        return t
    if not isinstance(t, torch.Tensor):
        t = torch.tensor([float(t)], dtype=torch.float32)
    return t.reshape(-1)[:1].to(device=device, dtype=torch.float32)


def constant_arguments(scalars: tuple, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, sign_method,
                       device: torch.device, snapshot=None) -> tuple:
    """(descriptor of each scalar (1,) float32 tensor in ``scalars``, the WorldValue) for a launch
    on ``device``. ``sign_method``: a SignMethod (or name) for every slot, or an (n_env, m) uint8
    tensor; ``snapshot``: the MeshWorld snapshot the world tensors come from, if any (its slot
    BVHs). Raises ValueError on tensors of the wrong shape or device, or a sign the meshes lack."""
    slot_bvh = _slot_bvh_ids(snapshot, mesh_idx, mesh_pose_inverse, device)
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # Built afresh and kept nowhere: a graph replays the addresses it captured, so a copy
        # converted inside the capture is made again by every replay from the caller's tensor.
        try:
            return _build(scalars, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, sign_method, slot_bvh,
                          device)[0]
        except RuntimeError as error:  # a host read refused by the capture
            raise RuntimeError("robot_sdf: the sign methods of this call were not validated before the CUDA "
                               "graph capture; make one call with the same tensors outside it first") from error
    global _last
    per_slot = isinstance(sign_method, torch.Tensor)
    tensors = (*scalars, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh) \
        + ((sign_method,) if per_slot else ()) + ((slot_bvh,) if slot_bvh is not None else ())
    last = _last
    # The set served last (a caller repeating its arguments, the common case), without a key.
    if last is not None and last[0] == device and last[1] is sign_method and len(last[2]) == len(tensors) \
            and all(map(operator.is_, last[2], tensors)):
        key, entry = last[3], last[4]
    else:
        key = (device, None if per_slot else sign_method, *map(id, tensors))
        try:
            entry = _constant_sets.get(key)
        except TypeError:  # an unhashable sign_method: SignMethod.parse says what is wrong
            entry = key = None
    if entry is not None:
        kept, signature, values, layout, read_at, check = entry
        now = check(kept)
        if now != signature:
            # Values written in place (poses, say) keep the entry when none of them was read to build it.
            if layout is None or any(now[1][i] != signature[1][i] for i in read_at) or _layout(kept) != layout:
                entry = None
            else:
                entry = _constant_sets[key] = (kept, now, values, layout, read_at, check)
        if entry is not None:
            _last = (device, sign_method, kept, key, entry)
            return values
    values, code, converted = _build(scalars, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, sign_method,
                                     slot_bvh, device)
    # Kept unless a scalar or the per-slot signs are per-call copies.
    if key is not None and all(_is_kept_scalar(s, device) for s in scalars) \
            and (not per_slot or (sign_method.dtype == torch.uint8 and sign_method.is_contiguous())):
        n = len(scalars)
        # Positions of the tensors whose values the entry was built from.
        read_at = ((n, n + 4) if per_slot else (n,) if code == _WINDING else ()) \
            + (tuple(range(n, n + 4)) if converted else ())
        inference = any(map(_is_inference, tensors))
        # Converted copies of inference tensors (no version counter) could not follow their values.
        if not (inference and converted):
            if len(_constant_sets) >= _CACHE_SIZE:
                _constant_sets.clear()
            check = _layout if inference else _versions
            _constant_sets[key] = (tensors, check(tensors), values, None if inference else _layout(tensors),
                                   read_at, check)
    return values


def _build(scalars, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, sign_method, slot_bvh, device) -> tuple:
    """(constant_arguments' values, the sign code, whether a world tensor was converted)."""
    world, ready = _world_descriptors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device)
    code, slot_signs = _sign_arguments(sign_method, mesh_idx, device)
    ids = _placeholder_ids(device) if slot_bvh is None else slot_bvh
    values = tuple(owning_descriptor(_scalar(s, device)) for s in scalars) \
        + (world_value(world, code, slot_signs, descriptor(ids)),)
    converted = any(r is not t for r, t in zip(ready, (mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh)))
    return values, code, converted


def _ready(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    if t.device == device and t.dtype == dtype and t.is_contiguous():
        return t
    return t.to(device=device, dtype=dtype).contiguous()


def _world_descriptors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device) -> tuple:
    """(descriptors of the four world tensors, the tensors they describe: converted copies where
    the caller's had another dtype or layout)."""
    # Mesh ids are addresses on the device the meshes were built on: never move them.
    if mesh_idx.device != device:
        raise ValueError(f"mesh_idx is on {mesh_idx.device} but query_spheres on {device}: "
                         "the world and the spheres must share a device")
    if mesh_idx.dim() != 2:
        raise ValueError(f"mesh_idx must be (n_env, m), got {tuple(mesh_idx.shape)}")
    n_env, m = mesh_idx.shape
    if tuple(mesh_pose_inverse.shape) != (n_env, m, 8):
        raise ValueError(f"mesh_pose_inverse must be ({n_env}, {m}, 8), got {tuple(mesh_pose_inverse.shape)}")
    if tuple(mesh_enable.shape) != (n_env, m):
        raise ValueError(f"mesh_enable must be ({n_env}, {m}), got {tuple(mesh_enable.shape)}")
    if tuple(n_env_mesh.reshape(-1).shape) != (n_env,):
        raise ValueError(f"n_env_mesh must be ({n_env},), got {tuple(n_env_mesh.shape)}")
    ready = (_ready(mesh_idx, device, torch.int64), _ready(mesh_pose_inverse, device, torch.float32),
             _ready(mesh_enable, device, torch.uint8), _ready(n_env_mesh.reshape(-1), device, torch.int32))
    return tuple(map(owning_descriptor, ready)), ready


def _sign_arguments(sign_method, mesh_idx: torch.Tensor, device: torch.device) -> tuple:
    """(sign code, per-slot sign descriptor): one method for every slot (the tensor then unused),
    or kernels.SIGN_PER_SLOT and the caller's (n_env, m) tensor, after refusing codes that are no
    SignMethod and winding_number where a mesh has no winding-number data (Warp would read memory
    the mesh does not have; on CUDA an illegal address ends the process's CUDA context)."""
    if isinstance(sign_method, torch.Tensor):
        if tuple(sign_method.shape) != tuple(mesh_idx.shape):
            raise ValueError(f"sign_method tensor must be (n_env, m) = {tuple(mesh_idx.shape)} like mesh_idx, "
                             f"got {tuple(sign_method.shape)}")
        if sign_method.device != device:
            raise ValueError(f"sign_method tensor is on {sign_method.device}, the spheres on {device}")
        signs = _ready(sign_method, device, torch.uint8)
        _validated(signs, mesh_idx, _check_slot_signs)
        return _SIGN_PER_SLOT, owning_descriptor(signs)
    method = SignMethod.parse(sign_method)
    if method == SignMethod.WINDING_NUMBER:
        _validated(None, mesh_idx, _check_call_wide_winding)
    return int(method), descriptor(unused_tensor("sign", device, (1, 1), torch.uint8))


def _validated(signs, mesh_idx, check) -> None:
    """check(signs, mesh_idx), skipped while both tensors are unchanged since it last passed: it
    reads them on the host (a device sync on CUDA), and a world whose poses move keeps both."""
    tensors = (mesh_idx,) if signs is None else (signs, mesh_idx)
    key = (check, *map(id, tensors))
    entry = _checks.get(key)
    if entry is not None and _signature(entry[0]) == entry[1]:
        return
    check(signs, mesh_idx)
    if len(_checks) >= _CACHE_SIZE:
        _checks.clear()
    _checks[key] = (tensors, _signature(tensors))  # the entry keeps the tensors: ids stay unique


_checks: dict = {}


def _check_slot_signs(signs: torch.Tensor, mesh_idx: torch.Tensor) -> None:
    host = signs.detach().cpu().numpy()
    if host.size and int(host.max()) > int(SignMethod.AUTO):
        raise ValueError(f"sign_method tensor holds {int(host.max())}: each slot's value must be a SignMethod "
                         f"(0..{int(SignMethod.AUTO)})")
    wanted = host == _WINDING
    if wanted.any():
        _check_winding_support(mesh_idx.detach().cpu().numpy().astype(np.uint64)[wanted])


def _check_call_wide_winding(_, mesh_idx: torch.Tensor) -> None:
    _check_winding_support(mesh_idx.detach().reshape(-1).cpu().numpy().astype(np.uint64))


def _check_winding_support(ids: np.ndarray) -> None:
    for mesh_id in np.unique(ids[ids != 0]):
        if _winding_support.get(int(mesh_id)) is False:
            raise ValueError(
                "sign_method winding_number: a mesh of this world was built without winding-number "
                "support; add it with sign_method='winding_number' (or let auto choose it), or pass "
                "the world's per-slot snapshot().sign_methods")


def _slot_bvh_ids(snapshot, mesh_idx: torch.Tensor, mesh_pose_inverse: torch.Tensor,
                  device: torch.device) -> torch.Tensor | None:
    """The (n_env + 1,) int64 slot-BVH ids of a MeshWorld snapshot (kernels.World.slot_bvh) when
    the call's mesh tensors are the snapshot's own and its world's slot BVHs describe it
    (robot_sdf.slot_index); else None: the kernels get a placeholder and visit every slot."""
    if snapshot is not None and snapshot.mesh_idx is mesh_idx and snapshot.mesh_pose_inverse is mesh_pose_inverse:
        ids = snapshot.slot_bvh()
        if ids is not None and ids.device == device and ids.shape[0] == mesh_idx.shape[0] + 1:
            return ids
    return None


def unused_tensor(kind: str, device: torch.device, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor for an array argument the kernel does not read or write (the env index of a
    call without one, an output not asked for), kept per device and ``kind``."""
    t = _unused.get((kind, device))
    if t is None:
        with _internals.plain_tensors():  # a plain tensor even when first asked for under torch.func
            t = _unused.setdefault((kind, device), torch.zeros(shape, dtype=dtype, device=device))
    return t


def _placeholder_ids(device: torch.device) -> torch.Tensor:
    """A (1,) int64 tensor holding the id of a BVH no query meets (kept with the BVH for good)."""
    entry = _unused.get(("bvh", device))
    if entry is None:
        from robot_sdf.slot_index import placeholder_bvh

        bvh = placeholder_bvh(warp_device(device))
        ids = torch.tensor([np.uint64(bvh.id).astype(np.int64)], dtype=torch.int64, device=device)
        entry = _unused.setdefault(("bvh", device), (ids, bvh))
    return entry[0]


def env_tensor(env_query_idx, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """(contiguous (batch,) int32 tensor on ``device``, 1) for env_query_idx, or (an unused
    one-element tensor, 0) for None."""
    if env_query_idx is None:
        unused = _unused.get(("env", device))
        return (unused_tensor("env", device, (1,), torch.int32) if unused is None else unused), 0
    env = env_query_idx.reshape(-1)
    if env.shape[0] != batch:
        raise ValueError(f"env_query_idx must have one entry per batch row ({batch}), got {env.shape[0]}")
    return _ready(env, device, torch.int32), 1
