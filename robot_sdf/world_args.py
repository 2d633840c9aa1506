"""The kernels' world argument and the launch arguments callers keep, built, validated and cached on the host.

The query kernels take the world as one kernels.World struct (robot_sdf/kernels/slot_walk.py): the
four world tensors (docs/design.md "Tensor layouts"), the call's sign selection (one SignMethod
for every slot, or PER_SLOT and the per-slot tensor) and the slot BVHs of a MeshWorld's snapshot.
``constant_arguments`` gives a launch's kept arguments, the three scalar tensors' descriptors and
that struct's value (WorldValue), validated and built once per set of argument tensors and kept,
keyed by the tensors' identities and checked against every one of them on every call (_cached,
_constant_set), so that a caller passing the same tensors call after call pays a few identity
checks. Also here: which meshes support winding-number queries (register_mesh), the refusals
that protect the kernels from reading memory a mesh does not have, and the environment index.

A MeshWorld's snapshot travels as ``snapshot``: where its tensors are the call's own and its
world's slot BVHs describe it, a query visits only the slots near it (robot_sdf.slot_index);
otherwise every slot of its environment is visited (a placeholder BVH that matches nothing).
"""
from __future__ import annotations

import operator

import numpy as np
import torch

from robot_sdf import _internals, kernels
from robot_sdf.launch import descriptor, owning_descriptor, warp_device, world_value
from robot_sdf.types import SignMethod

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


# _cached's ``content`` for an entry that only validated the tensors' values (the sign codes, the
# meshes' winding-number support) and describes their own memory.
VALIDATED = "validated"


def _validator(tensors: tuple, content):
    """How an entry over ``tensors`` is checked on every use (_tracked or _layout), or None when it
    must not be kept: ``content`` entries depend on the values of the tensors (converted copies),
    which only a version counter follows. A VALIDATED entry over inference tensors (no version
    counter) is kept while their layout holds: values written in place into them later (inside
    inference_mode) are not checked again, and need not be for safety (the kernels sign a
    winding-number slot of a mesh without winding support by pseudo-normals and any code they
    do not know by ray parity, never reading memory a mesh lacks)."""
    if any(map(_is_inference, tensors)):
        return _layout if content in (False, VALIDATED) else None
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


def scalar_descriptor(t, device: torch.device):
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


# Per device: (a (1,) int64 tensor holding the id of a BVH no query meets, that BVH).
_no_slot_bvh: dict[torch.device, tuple] = {}


def slot_bvh_ids(snapshot, mesh_idx: torch.Tensor, mesh_pose_inverse: torch.Tensor,
                 device: torch.device) -> torch.Tensor | None:
    """The (n_env + 1,) int64 slot-BVH ids of a MeshWorld snapshot (kernels.World.slot_bvh), when
    the call's mesh tensors are the snapshot's own and its world's slot BVHs describe it
    (slot_index), else None: the kernels then get a placeholder (_placeholder_ids) and visit every
    slot."""
    if snapshot is not None and snapshot.mesh_idx is mesh_idx and snapshot.mesh_pose_inverse is mesh_pose_inverse:
        ids = snapshot.slot_bvh()
        if ids is not None and ids.device == device and ids.shape[0] == mesh_idx.shape[0] + 1:
            return ids
    return None


def _placeholder_ids(device: torch.device) -> torch.Tensor:
    """A (1,) int64 tensor holding the id of a BVH no query meets, per device (kept for good)."""
    entry = _no_slot_bvh.get(device)
    if entry is None:
        from robot_sdf.slot_index import placeholder_bvh

        bvh = placeholder_bvh(warp_device(device))
        ids = torch.tensor([np.uint64(bvh.id).astype(np.int64)], dtype=torch.int64, device=device)
        entry = _no_slot_bvh.setdefault(device, (ids, bvh))
    return entry[0]


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
                                           lambda: _checked_slot_signs(ready, mesh_idx), content=VALIDATED)
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
    """Refuse a call-wide winding_number on any mesh of the world built without support. It reads
    the ids on the host (a device sync on CUDA) once per ids tensor and version (or layout, for an
    inference tensor: _validator)."""
    _cached(("winding", id(mesh_idx)), (mesh_idx,),
            lambda: _check_winding_support(mesh_idx.detach().reshape(-1).cpu().numpy().astype(np.uint64)),
            content=VALIDATED)


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


def env_tensor(env_query_idx, batch: int, device: torch.device) -> tuple[torch.Tensor, int]:
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


def env_descriptor(env: torch.Tensor, use: int):
    """Launch descriptor of env_tensor's tensor (cached for the unused one)."""
    if not use:
        return _cached(("no_env", id(env)), (env,), lambda: descriptor(env))
    return owning_descriptor(env)


# Launch arguments that callers keep across calls: the three scalar tensors and the World (the
# four world tensors, the sign arguments, the slot BVHs), validated and converted together once
# per set of tensors (keyed by identities, checked against every tensor as _cached does).
_constant_sets: dict = {}
# (device, the nine arguments, entry) of the last set served: a caller repeating its arguments
# (the common case) skips building and hashing the key; the entry is checked all the same.
_last_set: tuple | None = None
_WINDING = int(SignMethod.WINDING_NUMBER)


def _is_kept_scalar(t, device: torch.device) -> bool:
    """A scalar tensor scalar_descriptor describes without a per-call copy."""
    return isinstance(t, torch.Tensor) and t.device == device and t.dtype == torch.float32 and t.dim() == 1


def constant_arguments(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                       sign_method, device: torch.device, snapshot=None) -> tuple:
    """(weight, activation_distance, max_distance, world) as launch arguments: three scalar
    descriptors and the WorldValue, after the same checks as on every call. ``snapshot``: the
    MeshWorld snapshot the world tensors come from, if any (its slot BVHs, slot_bvh_ids)."""
    slot_bvh = None if snapshot is None else slot_bvh_ids(snapshot, mesh_idx, mesh_pose_inverse, device)
    return _constant_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                         sign_method, slot_bvh, device)


def _world_arguments(sign_method, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device: torch.device) -> tuple:
    """(the four world descriptors the kernels read, whether the caller's own tensors were
    converted, sign code, slot signs). The caller's mesh ids are passed as they are: meshes built
    elsewhere get robot_sdf's sign regimes only through robot_sdf.adopt_meshes."""
    world = _check_world_tensors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device)
    code, slot_signs = _sign_arguments(sign_method, mesh_idx, device)
    converted = _converted(world, (mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh))
    return world, converted, code, slot_signs


def _constant_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                  sign_method, slot_bvh: torch.Tensor | None, device: torch.device) -> tuple:
    """constant_arguments' values, kept per set of argument tensors; slot_bvh None: the placeholder."""
    global _last_set
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return _captured_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable,
                             n_env_mesh, sign_method, slot_bvh, device)
    last = _last_set
    if last is not None and last[1] is weight and last[2] is activation_distance and last[3] is max_dist \
            and last[4] is mesh_idx and last[5] is mesh_pose_inverse and last[6] is mesh_enable \
            and last[7] is n_env_mesh and last[8] is sign_method and last[9] is slot_bvh and last[0] == device:
        entry = last[10]
        if entry[3](entry[0]) == entry[1]:
            return entry[2]
    per_slot = isinstance(sign_method, torch.Tensor)
    key = (device, id(weight), id(activation_distance), id(max_dist), id(mesh_idx), id(mesh_pose_inverse),
           id(mesh_enable), id(n_env_mesh), id(sign_method) if per_slot else sign_method, id(slot_bvh))
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
                         n_env_mesh, sign_method, slot_bvh, entry)
            return values
    world, converted, code, slot_signs = _world_arguments(sign_method, mesh_idx, mesh_pose_inverse, mesh_enable,
                                                         n_env_mesh, device)
    ids = _placeholder_ids(device) if slot_bvh is None else slot_bvh
    values = (scalar_descriptor(weight, device), scalar_descriptor(activation_distance, device),
              scalar_descriptor(max_dist, device), world_value(world, code, slot_signs, descriptor(ids)))
    # Kept only when nothing in it is a per-call copy and no call-wide winding_number check
    # (which reads the mesh ids on every call) is involved.
    if key is not None and _is_kept_scalar(weight, device) and _is_kept_scalar(activation_distance, device) \
            and _is_kept_scalar(max_dist, device) \
            and (sign_method.dtype == torch.uint8 and sign_method.is_contiguous() if per_slot else code != _WINDING):
        tensors = (weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh)
        tensors += (sign_method,) if per_slot else ()
        # A snapshot's slot BVH ids (the placeholder is robot_sdf's own, kept unchanged for good).
        tensors += (slot_bvh,) if slot_bvh is not None else ()
        # Positions of the tensors whose values the entry depends on.
        content_at = ((3, 7) if per_slot else ()) + ((3, 4, 5, 6) if converted else ())
        check = _validator(tensors, bool(content_at))
        if check is not None:
            if len(_constant_sets) >= _DESCRIPTOR_CACHE_SIZE:
                _constant_sets.clear()
            layout = _layout(tensors) if check is _tracked else None
            _constant_sets[key] = entry = (tensors, check(tensors), values, check, layout, content_at)
            _last_set = (device, weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse,
                         mesh_enable, n_env_mesh, sign_method, slot_bvh, entry)
    return values


def _captured_set(weight, activation_distance, max_dist, mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh,
                  sign_method, slot_bvh, device: torch.device) -> tuple:
    """_constant_set's values for a launch inside a CUDA graph capture, built afresh and kept
    nowhere: a graph replays the addresses it captured, so a converted copy made before the
    capture (and freed by the caches later) must not be used; one converted inside it is a
    captured copy that every replay makes again from the caller's tensor, so in-place updates of
    that tensor reach the kernels. Value checks that read tensors back cannot run inside a capture:
    they are served from what an earlier call outside it validated."""
    world = _world_descriptors(mesh_idx, mesh_pose_inverse, mesh_enable, n_env_mesh, device)[0]
    try:
        code, slot_signs = _sign_arguments(sign_method, mesh_idx, device)
    except RuntimeError as error:  # a host read refused by the capture
        raise RuntimeError("robot_sdf: the sign methods of this call were not validated before the CUDA graph "
                           "capture; make one call with the same tensors outside the capture first") from error
    ids = _placeholder_ids(device) if slot_bvh is None else slot_bvh
    return (owning_descriptor(_scalar(weight, device)), owning_descriptor(_scalar(activation_distance, device)),
            owning_descriptor(_scalar(max_dist, device)), world_value(world, code, slot_signs, descriptor(ids)))
