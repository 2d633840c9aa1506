"""Meshes built outside robot_sdf (a cuRobo user's ``wp.Mesh`` ids in the world tensors): how
each is classified, as MeshWorld's ``auto`` classifies the meshes it is given, and twins that let
the kernels evaluate them as MeshWorld's own.

Why it matters: without robot_sdf's sign data, a mesh's sign is Warp's own query at the closest
triangle, and on an open surface (a ground plane, a scanned patch) that says "inside" on the
back side at any distance within the search: such a mesh is searched out to
max_dist + r + eta, as cuRobo does. Each mesh content is analysed once (Twin): its patches are
oriented consistently, closed ones outward (mesh_analysis.orient_components, as MeshWorld does),
then
- the boundary of a solid (mesh_analysis.classify's ``normal`` verdict: closed, consistently
  oriented shells without self-intersections, one shell or several: separate bodies, cavities)
  has a bounded inside, and Baerentzen's pseudo-normal sign is exact for it at any distance. Its twin
  is a Warp mesh of the same points (same frame, same device) and the oriented triangles that
  carries robot_sdf's sign data with the closed-shell flag. Under ``auto`` and ``normal`` the
  call's mesh ids are replaced by the twins' ids (warp_primitives), so these meshes take every
  fast path of MeshWorld's classified shells: the plain cost searched within r + eta first, the
  swept cost's one traversal for a step's samples, and the exact sign at edges and corners
  (Warp's normal sign is not exact there: on a capsule's axis it calls deep centres outside).
  Under ``winding_number`` the raw mesh is kept and only flagged (CLOSED_SHELL in its slot's
  sign code): searched within r + eta first, its own winding number decides.
- any other closed surface (nested, touching or overlapping shells; self-intersecting ones:
  every edge used as often in each direction) is what MeshWorld's ``auto`` makes a
  winding-number mesh. Under ``auto`` it is evaluated through a winding-number twin (winding
  support, sign data): searched within r + eta first, its winding number decides, 0 outside its
  box. It was searched to the full bound before, with Warp's normal sign (wrong inside an
  inside-out or overlapping body).
- a surface that is not closed keeps its raw mesh and Warp's sign under every method: MeshWorld
  gives it the winding number, which is fractional near such a surface and costs several times
  Warp's own query to evaluate there (Twin's docstring), so raw open meshes keep cuRobo's speed
  and their back sides read inside within the search (the one place where raw tensors under
  ``auto`` and MeshWorld's ``auto`` differ).

What is read, and when: the ids of the enabled slots below each environment's count, on the
host (a device synchronisation on CUDA), whenever the mesh_idx, mesh_enable or n_env_mesh tensor
of a call is new or was written in place (torch's version counters; a caller writing the same
tensors call after call pays nothing more). Each new id's points and indices are copied out
through the id (mesh_analysis.read_meshes) and digested; the analysis (and twin) is kept per
(digest, device), so an id that Warp reuses for another mesh after a free is
judged by its new content, and per (mesh_idx tensor, id) until that tensor is written.
Classification and twin cost about what MeshWorld's ``auto`` costs when adding the mesh (the
twin's BVH is the one the self-intersection test builds), once per geometry; the twin's memory
is about that of the original mesh. Twins of content that no kept call arguments use are
dropped beyond TWIN_CACHE_BYTES (then rebuilt when met again); on CUDA a dropped twin is freed
only after a device synchronisation at the next read of world ids (release_retired), as a
kernel queued before it was dropped may still read it.

Not classified (searched to the full bound with Warp's sign, as before): world tensors created
under torch.inference_mode (they have no version counter to follow writes), MeshWorld's meshes
(they carry their own sign data and flags), the call-wide methods ``default`` and ``parity``.
A mesh refitted in place (wp.Mesh.refit after writing its points) is not seen by itself: its twin
keeps the content it was built from. cuRobo builds a new mesh for new geometry and never refits;
a caller that refits must then write the mesh_idx tensor in place (``mesh_idx.add_(0)`` will do),
and the next call reads every id again. Writes that torch does not count (through a numpy view
or a Warp array aliasing the tensor's memory) are not seen either: the slot keeps the twin of the
mesh it held; write through torch, or bump the tensor as above.

Under CUDA graph capture the raw world tensors are passed as they are (no twins, no flags):
warp_primitives.stream_capturing.
"""
from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict

import numpy as np
import torch
import warp as wp

from robot_sdf import mesh_analysis
from robot_sdf.types import SignMethod

# kernels.SIGN_CLOSED_SHELL: added to a slot's sign code.
CLOSED_SHELL = 16
# Switch for side-by-side checks (tests, benchmarks): False searches every mesh built elsewhere
# to the full bound with Warp's own sign.
ENABLED = True
# Sign methods under which the meshes of raw world tensors are classified: a twin, or the
# closed shells' short search (mesh_signed_distance's raw_closed), serves each of them.
SHORT_SEARCH_METHODS = (SignMethod.AUTO, SignMethod.NORMAL, SignMethod.WINDING_NUMBER)
# Sign methods under which a closed shell is evaluated through its twin (pseudo-normal sign).
SHELL_TWIN_METHODS = (SignMethod.AUTO, SignMethod.NORMAL)
# Sign methods under which any other closed surface is evaluated through its winding-number twin.
WINDING_TWIN_METHODS = (SignMethod.AUTO,)
_VERDICT_CACHE_SIZE = 4096
# Twins kept for content not in use by any kept world tensor (bytes on their devices).
TWIN_CACHE_BYTES = 1 << 30
_verdicts: OrderedDict[tuple, Twin | None] = OrderedDict()
# Per mesh_idx tensor (by id): (weak reference, (address, version) when made, twins by mesh id).
_TENSOR_MEMO_SIZE = 64
_by_tensor: OrderedDict[int, tuple] = OrderedDict()
_verdicts_lock = threading.Lock()


class Twin:
    """What robot_sdf knows of one mesh content built elsewhere, on one device, and its twin: a
    Warp mesh of the same points in the same frame, with the triangles of each patch oriented
    consistently (closed patches outward, mesh_analysis.orient_components, as MeshWorld stores
    them), carrying robot_sdf's sign data for the method ``auto`` chooses.

    ``closed_shell``: the oriented mesh bounds a solid: closed shells without self-intersections
    (classify's ``normal`` verdict: one shell, or several such as separate bodies or cavities);
    its twin, built with the classification (whose self-intersection test needs that BVH), has
    pseudo-normals and the closed-shell flag.
    ``winding``: any other closed surface (every edge used as often in each direction: nested,
    touching or overlapping shells, self-intersecting ones), whose winding number is an
    integer and 0 outside its box; it gets a winding-number twin at its first use under
    ``auto`` (``twin_id``). A surface that is not closed (a scan, a sheet, a cup) has neither:
    its winding number is fractional out to sqrt(area / 2 pi) from it, and evaluating it near
    the surface costs several times Warp's own signed query (2.4-4.6 x on a 60k-triangle table
    scan, docs/benchmarks.md), so it keeps the raw mesh and Warp's sign. ``nbytes``: device
    memory of the twin's arrays and BVH (estimate), or the host copies kept to build it."""

    def __init__(self, points: np.ndarray, triangles: np.ndarray, welded: np.ndarray, device) -> None:
        self.device = device
        self.mesh: wp.Mesh | None = None
        self._arrays: tuple = ()
        self._source: tuple | None = None
        self._build_lock = threading.Lock()
        arrays: list = []

        def shell() -> wp.Mesh:
            # Only for meshes that passed the topology checks (closed, consistently oriented,
            # positive volume): their pseudo-normals are the exact sign if no self-intersection or
            # nesting turns up, and the mesh is only kept then.
            data = mesh_analysis.sign_data(points, triangles, False, SignMethod.NORMAL, welded=welded)
            data[-1, 1] = 1.0  # closed shell (mesh_analysis module docstring, row B + 4, the last)
            arrays[:] = self._device_arrays(points, triangles, data)
            return wp.Mesh(points=arrays[0], indices=arrays[1], velocities=arrays[2])

        verdict, mesh = mesh_analysis.classify(points, triangles, welded, shell)
        self.closed_shell = verdict.solid and mesh is not None
        topology = None if self.closed_shell else mesh_analysis.sign_topology(triangles, welded, points)
        self.winding = topology is not None and topology.balanced
        self.nbytes = 0
        if self.closed_shell:
            self._keep(mesh, tuple(arrays))
        elif self.winding:
            self._source = (points, triangles, topology)  # the twin's sign data reuses the topology
            self.nbytes = points.nbytes + sum(a.nbytes for a in (topology.triangles, topology.welded,
                                                                 topology.welded_corner, topology.edge_of_corner))

    def _device_arrays(self, points: np.ndarray, triangles: np.ndarray, data: np.ndarray) -> tuple:
        return (wp.array(points, dtype=wp.vec3, device=self.device),
                wp.array(triangles.reshape(-1), dtype=wp.int32, device=self.device),
                wp.array(data, dtype=wp.vec3, device=self.device))

    def _keep(self, mesh: wp.Mesh, arrays: tuple) -> None:
        self._arrays = arrays  # points, indices, sign data: the mesh reads them
        self.mesh = mesh
        n_points, n_indices = arrays[0].shape[0], arrays[1].shape[0]
        # Points and sign data (12 B per row), indices, and about two BVH nodes of 32 B per triangle.
        self.nbytes = 12 * (n_points + arrays[2].shape[0]) + 4 * n_indices + 64 * (n_indices // 3)

    @property
    def twin_id(self) -> int:
        """The twin's Warp mesh id (as an int64, the world tensors' type) of a closed shell or a
        ``winding`` surface (which gets its winding-number twin here, once)."""
        if not (self.closed_shell or self.winding):
            raise ValueError("a surface that is not closed has no twin")
        if self.mesh is None:
            with self._build_lock:
                if self.mesh is None:
                    points, triangles, topology = self._source
                    data = mesh_analysis.sign_data(points, triangles, True, SignMethod.WINDING_NUMBER,
                                                   topology=topology)
                    arrays = self._device_arrays(points, triangles, data)
                    mesh = wp.Mesh(points=arrays[0], indices=arrays[1], velocities=arrays[2],
                                   support_winding_number=True)
                    if not self.device.is_cpu:
                        # The BVH is built on Warp's stream, the kernels run on torch's: wait
                        # (the shells' BVH is waited for by the self-intersection count).
                        wp.synchronize_device(self.device)
                    self._keep(mesh, arrays)
                    self._source = None
        return int(np.uint64(self.mesh.id).astype(np.int64))

    def __del__(self) -> None:
        # On CUDA a kernel queued before the last reference went (on any stream) may still read
        # the twin: its mesh and arrays wait in _retired for a device synchronisation.
        try:
            if self.mesh is not None and _defer_free(self.mesh.device):
                _retired.append((self.mesh.device, self.mesh, self._arrays))  # atomic under the GIL
        except (AttributeError, TypeError):  # interpreter shutdown
            pass


# Twins dropped on CUDA, not yet freed: (device, mesh, arrays), released by release_retired.
_retired: list = []
# Tests set this to follow the CUDA path of retirement on the CPU.
DEFER_FREE_ON_CPU = False


def _defer_free(device) -> bool:
    return DEFER_FREE_ON_CPU or not device.is_cpu


def release_retired() -> int:
    """Free the twins dropped since the last call, after synchronising their devices (every
    stream: whatever was queued when they were dropped has then run); returns how many. Called
    where the host waits for the device anyway (twin_slots reads the world's ids);
    never during a CUDA graph capture, which could not synchronise."""
    if not _retired:
        return 0
    with _verdicts_lock:
        taken = _retired[:]
        del _retired[:len(taken)]
    for device in {str(d): d for d, _, _ in taken}.values():
        if not device.is_cpu:
            wp.synchronize_device(device)
    count = len(taken)
    taken.clear()  # the meshes and arrays go here
    return count


def content_digest(points: np.ndarray, indices: np.ndarray) -> bytes:
    """Identity of a mesh's content: its points and indices, with their counts."""
    h = hashlib.blake2b(digest_size=20)
    h.update(np.int64(points.shape[0]).tobytes())
    h.update(np.ascontiguousarray(points, np.float32).tobytes())
    h.update(np.int64(indices.shape[0]).tobytes())
    h.update(np.ascontiguousarray(indices, np.int32).tobytes())
    return h.digest()


def _valid_triangles(points: np.ndarray, indices: np.ndarray) -> bool:
    if indices.size == 0 or indices.size % 3 or points.shape[0] == 0:
        return False
    return 0 <= int(indices.min()) and int(indices.max()) < points.shape[0] and bool(np.isfinite(points).all())


def analyse(points: np.ndarray, indices: np.ndarray, device) -> Twin | None:
    """The Twin of a mesh's points (V, 3) float32 and flat indices (3T,) int32 on Warp
    ``device``, or None for anything that is not a valid triangle list (it keeps Warp's sign and
    the full search). Patches are oriented first, as MeshWorld orients the meshes it is given, so
    a mesh evaluates the same through its twin as through a MeshWorld under the same method."""
    points = np.ascontiguousarray(points, np.float32)
    indices = np.ascontiguousarray(indices, np.int32).reshape(-1)
    if not _valid_triangles(points, indices):
        return None
    welded = mesh_analysis.weld(points)
    given = Twin(points, indices.reshape(-1, 3), welded, device)
    if given.closed_shell:
        return given  # a solid's boundary as given: orienting would reverse nothing
    triangles, repair = mesh_analysis.orient_components(points, indices.reshape(-1, 3), welded)
    if not repair.faces_reversed:
        return given
    return Twin(points, np.ascontiguousarray(triangles, np.int32), welded, device)


def _analysis(content: tuple[np.ndarray, np.ndarray], device) -> Twin | None:
    key = (content_digest(*content), str(device))
    with _verdicts_lock:
        if key in _verdicts:
            _verdicts.move_to_end(key)
            return _verdicts[key]
    twin = analyse(*content, device)
    with _verdicts_lock:
        if key in _verdicts:  # another thread was quicker: keep one twin
            return _verdicts[key]
        _verdicts[key] = twin
        # Sizes now (a winding twin built since its entry was made has grown).
        total = sum(t.nbytes for t in _verdicts.values() if t is not None)
        while len(_verdicts) > _VERDICT_CACHE_SIZE or (total > TWIN_CACHE_BYTES and len(_verdicts) > 1):
            _, dropped = _verdicts.popitem(last=False)
            total -= dropped.nbytes if dropped is not None else 0
    return twin


def classifiable(mesh_idx: torch.Tensor, mesh_enable: torch.Tensor, n_env_mesh: torch.Tensor) -> bool:
    """Whether writes to these world tensors can be followed (see the module docstring)."""
    return ENABLED and not (mesh_idx.is_inference() or mesh_enable.is_inference() or n_env_mesh.is_inference())


def _known_twins(mesh_idx: torch.Tensor) -> dict[int, Twin | None]:
    """Twins (None: none) by mesh id for this mesh_idx tensor, kept while it is the same object
    at the same address and version (a write starts a new dict)."""
    state = (mesh_idx.data_ptr(), mesh_idx._version)
    with _verdicts_lock:
        for key in [k for k, e in _by_tensor.items() if e[0]() is None]:
            del _by_tensor[key]  # a collected tensor's twins need not stay alive
        entry = _by_tensor.get(id(mesh_idx))
        if entry is not None and entry[0]() is mesh_idx and entry[1] == state:
            _by_tensor.move_to_end(id(mesh_idx))
            return entry[2]
        known: dict[int, Twin | None] = {}
        _by_tensor[id(mesh_idx)] = (weakref.ref(mesh_idx), state, known)
        while len(_by_tensor) > _TENSOR_MEMO_SIZE:
            _by_tensor.popitem(last=False)
        return known


def twin_slots(mesh_idx: torch.Tensor, mesh_enable: torch.Tensor, n_env_mesh: torch.Tensor,
               warp_device) -> np.ndarray:
    """(E, M) object array: the Twin of each enabled slot below its environment's count whose
    mesh was built outside robot_sdf (and is a valid triangle list), None elsewhere. Ids met
    before in this mesh_idx tensor, unchanged since, are not read again."""
    release_retired()
    known = _known_twins(mesh_idx)
    ids = mesh_idx.detach().cpu().numpy().astype(np.int64)
    enabled = mesh_enable.detach().cpu().numpy() != 0
    counts = n_env_mesh.detach().reshape(-1).cpu().numpy().astype(np.int64)
    used = enabled & (np.arange(ids.shape[1])[None, :] < counts[:, None]) & (ids != 0)
    twins = np.full(ids.shape, None, dtype=object)
    if not used.any():
        return twins
    new = [i for i in np.unique(ids[used]).tolist() if i not in known]
    if new:
        contents = mesh_analysis.read_meshes(np.array(new, np.int64).astype(np.uint64), warp_device)
        for mesh_id, content in zip(new, contents):
            known[mesh_id] = None if content is None else _analysis(content, warp_device)
    found = [known[i] for i in ids[used].tolist()]
    column = np.empty(len(found), dtype=object)
    column[:] = found
    twins[used] = column
    return twins
