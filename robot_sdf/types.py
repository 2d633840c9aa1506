"""Data layout shared by the world, the kernels and the autograd Functions.

Poses are 7-vectors ``x, y, z, qw, qx, qy, qz`` (metres, unit quaternion, scalar first).
The kernel-side inverse pose has 8 floats per slot: the world->mesh transform in the same
order plus one float of padding; robot_sdf stores the radius of a sphere about the mesh-frame
origin that bounds the mesh in that padding (0 = unknown) so kernels can skip far meshes.
MeshWorld builds each Warp mesh re-centred on the centre c of its bounding box and folds -c into
the translation, so "mesh frame" for the kernels is the user's mesh frame shifted by c (tight
bounding sphere, and float32 coordinates small even for meshes given in world coordinates).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

import torch

POSE_SIZE = 7
POSE_INVERSE_SIZE = 8
IDENTITY_POSE = (0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)


class SignMethod(enum.IntEnum):
    """How a Warp mesh query decides inside from outside.

    NORMAL: angle-weighted pseudo-normal of the closest feature. Cheapest (no extra traversal);
        exact for watertight, consistently wound, non-self-intersecting meshes.
    DEFAULT: Warp's ``mesh_query_point``: majority vote of three axis-aligned rays. Tolerates small
        defects; three ray traversals per query make it the slowest closed-mesh option.
    WINDING_NUMBER: fast generalised winding number. Meaningful for open (non-watertight) meshes;
        the mesh is built with winding-number support, which costs memory and build time.
    PARITY: crossing parity of one perturbed ray. One extra traversal; wrong near cracks.
    AUTO: chosen per geometry when it is added (robot_sdf.mesh_classification.classify), after the
        add has oriented every closed patch consistently and outward (orient_components, for
        every method): NORMAL for the boundary of a solid (closed, consistently oriented shells
        without self-intersections, each with the solid behind it: one body, separate bodies,
        cavities), WINDING_NUMBER for anything else (open, overlapping or nested bodies, ...).
    """

    NORMAL = 0
    DEFAULT = 1
    WINDING_NUMBER = 2
    PARITY = 3
    AUTO = 4

    @classmethod
    def parse(cls, value: "SignMethod | str | int") -> "SignMethod":
        if isinstance(value, SignMethod):
            return value
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                names = ", ".join(m.name.lower() for m in cls)
                raise ValueError(f"unknown sign_method {value!r}; expected one of {names}") from None
        return cls(int(value))


@dataclass(frozen=True)
class WorldSnapshot:
    """An immutable, consistent view of a MeshWorld, as the kernels consume it.

    mesh_idx:          (n_env, m) int64, ``wp.Mesh.id`` per slot (0 in unused slots)
    mesh_pose_inverse: (n_env, m, 8) float32, world->mesh transform per slot
    mesh_enable:       (n_env, m) uint8, 0 = slot ignored
    n_env_mesh:        (n_env,) int32, slots in use per environment
    revision:          world revision this view was taken at
    sign_method:       the world's default SignMethod (may be AUTO)
    sign_methods:      (n_env, m) uint8, the concrete SignMethod of each slot (what ``auto`` chose
                       for its geometry, or the method the mesh was added with); the autograd
                       Functions take it as ``sign_method``, or the snapshot itself as
                       ``snapshot`` (then with its world's slot BVHs, see slot_bvh)
    """

    mesh_idx: torch.Tensor
    mesh_pose_inverse: torch.Tensor
    mesh_enable: torch.Tensor
    n_env_mesh: torch.Tensor
    revision: int
    sign_method: SignMethod
    sign_methods: torch.Tensor | None = None
    # Keeps the Warp meshes referenced by mesh_idx alive for as long as this view exists.
    _keepalive: tuple[Any, ...] = field(default=(), repr=False, compare=False)
    # The world's slot BVHs (robot_sdf.slot_index.SlotIndex), or None.
    _slot_index: Any = field(default=None, repr=False, compare=False)

    def slot_bvh(self) -> "torch.Tensor | None":
        """The (n_env + 1,) int64 slot-BVH ids the kernels take when they describe this snapshot
        (its world has brought them up to date for it: evaluations inside ``reading()``), else
        None (the kernels then visit every slot: same results, slower)."""
        index = self._slot_index
        if index is None or not index.serves(self.revision):
            return None
        return index.ids

    @property
    def device(self) -> torch.device:
        return self.mesh_idx.device

    def before_use(self) -> None:
        """Call before queueing kernels that read this snapshot (on CUDA: the caller's current
        stream waits for the BVH builds and refits it depends on, the slot BVHs' too; nothing on
        the CPU)."""
        index = self._slot_index
        if index is not None and index.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(index.ready)
        for keep in self._keepalive:
            hook = getattr(keep, "before_use", None)
            if hook is not None:
                hook()

    def after_use(self) -> None:
        """Call after queueing kernels that read this snapshot (on CUDA: records an event on the
        caller's current stream; the snapshot's meshes and tensors outlive that work even if the
        snapshot is dropped at once; nothing on the CPU)."""
        for keep in self._keepalive:
            hook = getattr(keep, "after_use", None)
            if hook is not None:
                hook()

    @property
    def num_envs(self) -> int:
        return int(self.mesh_idx.shape[0])
