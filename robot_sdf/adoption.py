"""Meshes built outside robot_sdf (a cuRobo user's ``wp.Mesh`` ids in the world tensors), adopted
explicitly: ``adopt_meshes(mesh_idx)`` reads each mesh once through its id, classifies it as
MeshWorld's ``auto`` classifies the meshes it is given, and returns ids and per-slot sign codes
to pass to the autograd Functions in place of the caller's (docs/design.md "Meshes built
elsewhere").

Passed as they are, such meshes keep Warp's own signed query (searched out to
max_dist + r + eta, as cuRobo does) plus robot_sdf's two corrections: nothing is read back or
classified behind the caller's back. Adopted, each mesh's patches are oriented consistently
(closed ones outward, mesh_orientation.orient_components, as MeshWorld does), then
- the boundary of a solid (closed, consistently oriented shells without self-intersections: one
  shell, separate bodies, cavities) gets a twin: a Warp mesh of the same points (same frame, same
  device) and the oriented triangles, carrying robot_sdf's sign data (pseudo-normals, the
  closed-shell bound): the ``solid`` regime, exact at edges and corners and searched within
  r + eta first;
- any other closed surface (nested, touching or overlapping shells, self-intersecting ones:
  every edge used as often in each direction) gets a winding-number twin: the ``winding`` regime,
  as MeshWorld's ``auto`` gives it;
- a surface that is not closed gets a winding-number twin as well (``winding``), as MeshWorld's
  ``auto`` gives it: Warp's own sign reads its back side inside within the search, and calls
  points of real CAD meshes with cracks inside or outside wrongly at up to 5 cm (rtb-data's
  visual meshes, test/real_mesh_test.py); its winding number costs more to evaluate;
- a mesh that already carries robot_sdf's sign data (MeshWorld built it) is kept as it is.

The twins live as long as the returned AdoptedMeshes does. A mesh rebuilt or refitted elsewhere
is adopted again by calling adopt_meshes again (the twins hold copies of the content read). On
CUDA a twin whose last reference goes is freed once the kernels queued before have run (retire).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import warp as wp

from robot_sdf import mesh_analysis
from robot_sdf.kernels.sign_data import sign_data_offset
from robot_sdf.mesh_build import MeshBuild, build_mesh, finish_mesh
from robot_sdf.mesh_topology import weld
from robot_sdf.types import SignMethod
from robot_sdf.cuda_streams import queued_work_events
from robot_sdf.launch import warp_device
from robot_sdf.snapshot_lifetime import graveyard

# Sign methods under which a closed shell is evaluated through its twin (pseudo-normal sign).
SHELL_TWIN_METHODS = (SignMethod.AUTO, SignMethod.NORMAL)
# Sign methods under which any other surface, closed or open, is evaluated through its
# winding-number twin.
WINDING_TWIN_METHODS = (SignMethod.AUTO,)
# What adoption made of a slot (AdoptedMeshes.regimes).
EMPTY, SOLID, WINDING, PASSTHROUGH, OWN = "empty", "solid", "winding", "passthrough", "robot_sdf"
_retired_lock = threading.Lock()


class Twin:
    """What robot_sdf knows of one mesh content built elsewhere, on one device, and its twin: a
    Warp mesh of the same points in the same frame, with the triangles of each patch oriented
    consistently (closed patches outward, mesh_orientation.orient_components, as MeshWorld stores
    them), carrying robot_sdf's sign data for the method ``auto`` chooses.

    ``closed_shell``: the oriented mesh bounds a solid: closed shells without self-intersections
    (classify's ``normal`` verdict: one shell, or several such as separate bodies or cavities);
    its twin, built with the classification (whose self-intersection test needs that BVH), has
    pseudo-normals and the closed-shell flag.
    ``winding``: any other closed surface (every edge used as often in each direction: nested,
    touching or overlapping shells, self-intersecting ones), whose winding number is an
    integer and 0 outside its box; it gets a winding-number twin at its first use under
    ``auto`` (``twin_id``). A surface that is not closed (a scan, a sheet, a cup) is neither: its
    winding number is fractional out to sqrt(area / 2 pi) from it; it too gets a winding-number
    twin at its first use under ``auto``. ``nbytes``: device memory of the twin's arrays and BVH
    (estimate), or the host copies kept to build it."""

    def __init__(self, points: np.ndarray, triangles: np.ndarray, welded: np.ndarray, device) -> None:
        """``points`` (V,3) float32 in the caller's frame, ``triangles`` (T,3) int32 as given,
        ``welded`` mesh_topology.weld of the points, ``device`` a Warp device."""
        self.mesh: wp.Mesh | None = None
        self._arrays: tuple = ()
        self._build_lock = threading.Lock()
        # A solid's boundary as given needs no repair (orient_solids=False); every solid gets the
        # pseudo-normal twin, any other surface a winding-number twin, built at its first use.
        self._build: MeshBuild | None = build_mesh(points, triangles, welded, SignMethod.AUTO, device,
                                                   orient_solids=False, solids_by_normal=True,
                                                   defer_winding=True)
        self.closed_shell = self._build.closed_shell
        self.winding = not self.closed_shell and self._build.topology.balanced
        if self._build.mesh is not None:
            self._keep()
        else:  # host copies kept to build the twin: the points and the topology its sign data reuses
            topology = self._build.topology
            self.nbytes = points.nbytes + sum(a.nbytes for a in (topology.triangles, topology.welded,
                                                                 topology.welded_corner, topology.edge_of_corner))

    def _keep(self) -> None:
        build, self._build = self._build, None
        self._arrays = build.arrays  # points, indices, sign data: the mesh reads them
        self.mesh = build.mesh
        n_points, n_indices = build.arrays[0].shape[0], build.arrays[1].shape[0]
        # Points and sign data (12 B per row), indices, and about two BVH nodes of 32 B per triangle.
        self.nbytes = 12 * (n_points + build.arrays[2].shape[0]) + 4 * n_indices + 64 * (n_indices // 3)

    @property
    def twin_id(self) -> int:
        """The twin's Warp mesh id (as an int64, the world tensors' type): a closed shell's, or the
        winding-number twin of any other surface, closed or open (built here, once)."""
        if self.mesh is None:
            with self._build_lock:
                if self.mesh is None:
                    finish_mesh(self._build)
                    if not self._build.device.is_cpu:
                        # The BVH is built on Warp's stream, the kernels run on torch's: wait
                        # (the shells' BVH is waited for by the self-intersection count).
                        wp.synchronize_device(self._build.device)
                    self._keep()
        return int(np.uint64(self.mesh.id).astype(np.int64))

    def __del__(self) -> None:
        try:
            if self.mesh is not None and _defer_free(self.mesh.device):
                try:
                    retire(self.mesh.device, self.mesh, self._arrays)
                except RuntimeError:  # no event could be recorded: the synchronised release
                    _retired.append((self.mesh.device, self.mesh, self._arrays))
        except (AttributeError, TypeError):  # interpreter shutdown
            pass


# Twins dropped on CUDA, not yet freed: (device, mesh, arrays), released by release_retired.
_retired: list = []
# Tests set this to follow the CUDA path of retirement on the CPU.
DEFER_FREE_ON_CPU = False


def _defer_free(device) -> bool:
    return DEFER_FREE_ON_CPU or not device.is_cpu


def retire(device, mesh, arrays) -> None:
    """A twin dropped on CUDA: a kernel queued before (on any stream) may still read it. It is
    freed once events on the streams robot_sdf launches on have passed (cuda_streams.queued_work_events;
    snapshot_lifetime's graveyard, checked on later launches and world changes: no host wait),
    or, where no such events can be recorded (a stream capturing a graph), at the next
    release_retired after a device synchronisation."""
    events = None if device.is_cpu else queued_work_events(torch.device(str(device)))
    if events is None:
        _retired.append((device, mesh, arrays))  # atomic under the GIL
    else:
        graveyard.add(events, (mesh,), arrays)


def release_retired() -> int:
    """Free the twins dropped since the last call, after synchronising their devices (every
    stream: whatever was queued when they were dropped has then run); returns how many. Called
    by adopt_meshes, which waits for the device anyway (it reads the world's ids)."""
    if not _retired:
        return 0
    with _retired_lock:
        taken = _retired[:]
        del _retired[:len(taken)]
    for device in {str(d): d for d, _, _ in taken}.values():
        if not device.is_cpu:
            wp.synchronize_device(device)
    count = len(taken)
    taken.clear()  # the meshes and arrays go here
    return count


def _valid_triangles(points: np.ndarray, indices: np.ndarray) -> bool:
    if indices.size == 0 or indices.size % 3 or points.shape[0] == 0:
        return False
    return 0 <= int(indices.min()) and int(indices.max()) < points.shape[0] and bool(np.isfinite(points).all())


def analyse(points: np.ndarray, indices: np.ndarray, device) -> Twin | None:
    """The Twin of a mesh's points (V, 3) float32 and flat indices (3T,) int32 on Warp
    ``device``, or None for anything that is not a valid triangle list (it keeps Warp's sign and
    the full search). The twin is built as MeshWorld builds its meshes (mesh_build.build_mesh), so
    a mesh evaluates the same through its twin as through a MeshWorld under the same method."""
    points = np.ascontiguousarray(points, np.float32)
    indices = np.ascontiguousarray(indices, np.int32).reshape(-1)
    if not _valid_triangles(points, indices):
        return None
    return Twin(points, indices.reshape(-1, 3), weld(points), device)


@dataclass(eq=False)
class AdoptedMeshes:
    """What adopt_meshes returns; pass ``mesh_idx`` in place of the caller's and ``sign_methods``
    as the Functions' trailing sign argument.

    mesh_idx:     (n_env, m) int64 Warp mesh ids on the given tensor's device: a twin's id where
                  the slot's mesh was adopted as ``solid`` or ``winding``, the caller's id elsewhere
    sign_methods: (n_env, m) uint8 SignMethod per slot (NORMAL for solid twins, WINDING_NUMBER
                  for winding twins, the requested method elsewhere)
    regimes:      (n_env, m) numpy array of str: empty, solid, winding, passthrough or robot_sdf
                  (a mesh that already carried robot_sdf's sign data), per slot
    """

    mesh_idx: torch.Tensor
    sign_methods: torch.Tensor
    regimes: np.ndarray
    twins: list = field(default_factory=list, repr=False)  # keeps the twins' meshes alive


def _requested_methods(sign_method, shape: tuple, device: torch.device) -> np.ndarray:
    if isinstance(sign_method, torch.Tensor):
        if tuple(sign_method.shape) != shape:
            raise ValueError(f"sign_method tensor must be (n_env, m) = {shape} like mesh_idx, "
                             f"got {tuple(sign_method.shape)}")
        host = sign_method.detach().cpu().numpy().astype(np.int64)
        if host.size and (host.min() < 0 or host.max() > int(SignMethod.AUTO)):
            raise ValueError(f"sign_method tensor holds {int(host.max())}: each slot's value must be a "
                             f"SignMethod (0..{int(SignMethod.AUTO)})")
        return host.astype(np.uint8)
    return np.full(shape, int(SignMethod.parse(sign_method)), np.uint8)


# Both kernels belong to the Warp module of every build-time kernel, robot_sdf.mesh_analysis's:
# compiled and loaded with it, once per device (robot_sdf.launch.warp_device).
@wp.kernel(module=mesh_analysis.__name__)
def mesh_layout_kernel(ids: wp.array(dtype=wp.uint64), layout: wp.array2d(dtype=wp.int64)):
    """Per Warp mesh id: point count, index count, offset of robot_sdf's sign data (-1: none)."""
    i = wp.tid()
    m = wp.mesh_get(ids[i])
    layout[i, 0] = wp.int64(m.points.shape[0])
    layout[i, 1] = wp.int64(m.indices.shape[0])
    layout[i, 2] = wp.int64(sign_data_offset(ids[i]))


@wp.kernel(module=mesh_analysis.__name__)
def copy_mesh_kernel(mesh: wp.uint64, points: wp.array(dtype=wp.vec3), indices: wp.array(dtype=wp.int32)):
    """The points and indices a Warp mesh was built from, read through its id."""
    i = wp.tid()
    m = wp.mesh_get(mesh)
    if i < points.shape[0]:
        points[i] = m.points[i]
    if i < indices.shape[0]:
        indices[i] = m.indices[i]


def read_meshes(ids: np.ndarray, device) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """(points (V, 3) float32, flat indices (3T,) int32) of each Warp mesh id on ``device`` (a
    Warp device), or None for a mesh that carries robot_sdf's sign data (MeshWorld built it).
    The ids must be live meshes of that device: Warp reads whatever an id points at."""
    if len(ids) == 0:
        return []
    id_array = wp.array(np.asarray(ids, np.uint64), dtype=wp.uint64, device=device)
    layout = wp.zeros((len(ids), 3), dtype=wp.int64, device=device)
    wp.launch(mesh_layout_kernel, dim=len(ids), inputs=[id_array], outputs=[layout], device=device)
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for mesh_id, (n_points, n_indices, data) in zip(ids, layout.numpy()):
        if data >= 0:
            out.append(None)
            continue
        points = wp.empty(int(n_points), dtype=wp.vec3, device=device)
        indices = wp.empty(int(n_indices), dtype=wp.int32, device=device)
        wp.launch(copy_mesh_kernel, dim=int(max(n_points, n_indices, 1)), inputs=[wp.uint64(int(mesh_id))],
                  outputs=[points, indices], device=device)
        out.append((points.numpy(), indices.numpy()))
    return out


def adopt_meshes(mesh_idx: torch.Tensor, sign_method="auto", mesh_enable: torch.Tensor | None = None,
                 n_env_mesh: torch.Tensor | None = None) -> AdoptedMeshes:
    """Adopt the Warp meshes of a world's ``mesh_idx`` (n_env, m) int64 tensor (ids of meshes
    built elsewhere, 0 = empty slot), on its device: robot_sdf's sign regimes for them (module
    docstring). ``sign_method``: one SignMethod (or its name) for every slot, or an (n_env, m)
    uint8 tensor of them; ``auto`` and ``normal`` give closed shells their solid twin, ``auto``
    gives every other surface its winding twin; every other slot keeps its mesh and the
    requested method. ``mesh_enable`` (n_env, m) and ``n_env_mesh`` (n_env,), when given, limit
    the read to the enabled slots below each environment's count (ids elsewhere may be stale:
    Warp reads whatever an id points at). Reads every adopted mesh back to the host (a device
    synchronisation on CUDA): call it when the world's meshes change, not per query."""
    if not isinstance(mesh_idx, torch.Tensor) or mesh_idx.dim() != 2:
        raise ValueError(f"mesh_idx must be an (n_env, m) tensor of Warp mesh ids, got "
                         f"{getattr(mesh_idx, 'shape', type(mesh_idx).__name__)}")
    release_retired()
    device = mesh_idx.device
    wdev = warp_device(device)
    shape = tuple(mesh_idx.shape)
    requested = _requested_methods(sign_method, shape, device)
    ids = mesh_idx.detach().cpu().numpy().astype(np.int64)
    used = ids != 0
    if mesh_enable is not None:
        used &= mesh_enable.detach().cpu().numpy().reshape(shape) != 0
    if n_env_mesh is not None:
        counts = n_env_mesh.detach().reshape(-1).cpu().numpy().astype(np.int64)
        used &= np.arange(shape[1])[None, :] < counts[:, None]
    distinct = np.unique(ids[used]).tolist()
    contents = read_meshes(np.array(distinct, np.int64).astype(np.uint64), wdev)
    own = {mesh_id for mesh_id, content in zip(distinct, contents) if content is None}
    twins = {mesh_id: analyse(*content, wdev) for mesh_id, content in zip(distinct, contents) if content is not None}
    out_ids, codes = ids.copy(), requested.copy()
    regimes = np.full(shape, EMPTY, dtype=object)
    kept: dict[int, Twin] = {}
    for env, slot in zip(*np.nonzero(used)):
        mesh_id, method = int(ids[env, slot]), SignMethod(int(requested[env, slot]))
        twin = twins.get(mesh_id)
        if mesh_id in own:
            regimes[env, slot] = OWN
        elif twin is not None and twin.closed_shell and method in SHELL_TWIN_METHODS:
            out_ids[env, slot], codes[env, slot], regimes[env, slot] = twin.twin_id, SignMethod.NORMAL, SOLID
            kept[id(twin)] = twin
        elif twin is not None and method in WINDING_TWIN_METHODS:
            out_ids[env, slot], codes[env, slot], regimes[env, slot] = twin.twin_id, SignMethod.WINDING_NUMBER, WINDING
            kept[id(twin)] = twin
        else:
            regimes[env, slot] = PASSTHROUGH
    twins = list(kept.values())
    adopted_ids = torch.from_numpy(out_ids).to(device)
    # The ids tensor keeps the twins alive as well: a caller may keep it and drop the rest.
    adopted_ids.adopted_twins = twins
    return AdoptedMeshes(adopted_ids, torch.from_numpy(codes).to(device), regimes.astype(str), twins)
