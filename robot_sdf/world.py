"""MeshWorld: the Warp meshes of every environment and the tensors the kernels read.

Concurrency model: every mutation validates first, prepares what it needs (a BVH build happens
here, without blocking readers) and then publishes a new immutable WorldSnapshot with one
reference assignment. A reader holding a snapshot therefore always sees one consistent world.
The only in-place change is a vertex refit (same topology), which takes the reader/writer lock
briefly; evaluations through this class hold the read side while their kernels run.

A geometry (one Warp mesh per distinct content, shared by slots) is world_geometry's Geometry;
what a snapshot keeps alive, and for how long on CUDA, is snapshot_lifetime's.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import warp as wp

from robot_sdf import cost, geometry
from robot_sdf.cuda_streams import warp_torch_stream
from robot_sdf.launch import init_warp, warp_device
from robot_sdf.slot_index import SlotIndex
from robot_sdf.snapshot_lifetime import Retention, StreamTracker, graveyard
from robot_sdf.types import POSE_INVERSE_SIZE, SignMethod, WorldSnapshot
from robot_sdf.world_geometry import Geometry, content_key, geometry_bytes


def resolve_device(device: str | torch.device) -> torch.device:
    """'auto' -> cuda:0 when torch and Warp both see a GPU, else cpu; otherwise torch.device(device)."""
    if str(device) == "auto":
        init_warp()
        if torch.cuda.is_available() and wp.get_cuda_device_count() > 0:
            return torch.device("cuda", 0)
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"invalid device {device!r}: expected auto, cpu or cuda[:N]") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but CUDA is not available to torch")
        dev = torch.device("cuda", dev.index or 0)
    elif dev.type != "cpu":
        raise ValueError(f"unsupported device {device!r}: expected auto, cpu or cuda[:N]")
    return dev


@dataclass
class _Slot:
    name: str
    geometry: Geometry
    pose: np.ndarray  # (7,) float64, mesh in world
    enabled: bool
    index: int = 0  # position in its env's slot list (kept by add_mesh / remove_mesh)


class _ReadWriteLock:
    """Many readers or one writer, writer-preferring; used only around in-place refits.

    A waiting writer stops new readers from entering, so a stream of overlapping evaluations
    cannot postpone a refit indefinitely.
    """

    def __init__(self) -> None:
        # Readers take the bare mutex (entered on every evaluation: cheaper than the Condition's
        # Python-level __enter__); the Condition built on it is only waited on and notified when
        # a writer is involved.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writing = False
        self._writers_waiting = 0
        self._held = threading.local()  # read depth of the calling thread

    def read(self) -> "_ReadHold":
        """Context manager holding the read side (a plain class: cheaper than a generator, and
        entered on every evaluation)."""
        return _ReadHold(self)

    def _acquire_read(self) -> None:
        held = self._held
        depth = getattr(held, "depth", 0)
        if depth:
            # Re-entered by a thread that already reads: waiting for the writer would deadlock.
            held.depth = depth + 1
            return
        with self._mutex:
            while self._writing or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        held.depth = 1

    def _release_read(self) -> None:
        held = self._held
        depth = held.depth
        held.depth = depth - 1
        if depth == 1:
            with self._mutex:
                self._readers -= 1
                # Only a writer can be waiting for the last reader to leave (readers wait only
                # while a writer waits or writes, and a writer's exit wakes them).
                if self._readers == 0 and self._writers_waiting:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            try:
                while self._writing or self._readers:
                    self._cond.wait()
            finally:
                self._writers_waiting -= 1
            self._writing = True
        try:
            yield
        finally:
            with self._cond:
                self._writing = False
                self._cond.notify_all()


class _ReadHold:
    __slots__ = ("_lock",)

    def __init__(self, lock: _ReadWriteLock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock._acquire_read()

    def __exit__(self, *exc) -> None:
        self._lock._release_read()


class _WorldRead:
    """``MeshWorld.reading()``: holds off refits and yields the snapshot current on entry; on CUDA
    the caller's stream waits for that snapshot's builds on entry and an event marks the work
    queued inside on exit (see snapshot_lifetime.Retention)."""

    __slots__ = ("_world", "_snapshot")

    def __init__(self, world: "MeshWorld") -> None:
        self._world = world

    def __enter__(self) -> WorldSnapshot:
        world = self._world
        if world._cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "a MeshWorld evaluation cannot be captured in a CUDA graph: a replay would read the tensors "
                "of the snapshot current at capture, which the world frees once it changes; capture "
                "SdfMeshWarpPy / SweptSdfMeshWarpPy on world tensors you own and update in place instead")
        if not world._slot_index.current():
            world._update_slot_index()
        world._refit_lock._acquire_read()
        snap = self._snapshot = world._snapshot
        if world._cuda:
            snap.before_use()
        return snap

    def __exit__(self, *exc) -> None:
        try:
            if self._world._cuda:
                self._snapshot.after_use()
        finally:
            self._world._refit_lock._release_read()


class MeshWorld:
    """Triangle-mesh obstacles in ``num_envs`` environments, kept on ``device`` for Warp.

    Args:
        device: "auto", "cpu", "cuda" or "cuda:N".
        num_envs: number of independent environments (batch rows pick one with env_index).
        mesh_capacity: initial slots per environment; grows (doubling) when full.
        sign_method: default SignMethod of added meshes, or its name ("auto", "normal", "default",
            "winding_number", "parity"); ``auto`` classifies each geometry once (mesh_info).
        max_distance: default search distance outside meshes (m) for the evaluation methods.
        geometry_cache_size: most unused geometries kept for re-adding identical meshes without a
            rebuild (least recently released leave first).
        geometry_cache_bytes: and at most this many bytes of them (host + device estimate, see
            geometry_bytes); 0 disables the cache.
    """

    def __init__(self, device: str | torch.device = "auto", num_envs: int = 1, mesh_capacity: int = 8,
                 sign_method: SignMethod | str = SignMethod.AUTO, max_distance: float = 0.5,
                 geometry_cache_size: int = 32, geometry_cache_bytes: int = 256 * 2**20):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if int(mesh_capacity) < 1:
            raise ValueError(f"mesh_capacity must be >= 1, got {mesh_capacity}")
        if not (np.isfinite(max_distance) and max_distance > 0):
            raise ValueError(f"max_distance must be a positive number of metres, got {max_distance}")
        self.device = resolve_device(device)
        self._cuda = self.device.type == "cuda"
        self.sign_method = SignMethod.parse(sign_method)
        self.max_distance = float(max_distance)
        self.num_envs = int(num_envs)
        init_warp()
        self._write_lock = threading.RLock()
        self._refit_lock = _ReadWriteLock()
        self._slots: list[list[_Slot]] = [[] for _ in range(self.num_envs)]
        # name -> slot per env: updates find their slot in O(1) among thousands of obstacles.
        self._by_name: list[dict[str, _Slot]] = [{} for _ in range(self.num_envs)]
        self._geometries: dict[bytes, Geometry] = {}
        self._unused: OrderedDict[bytes, Geometry] = OrderedDict()
        self._cache_size = int(geometry_cache_size)
        self._cache_bytes_limit = int(geometry_cache_bytes)
        self._cache_bytes = 0
        self._capacity = int(mesh_capacity)
        self._revision = 0
        self._streams = StreamTracker()
        self._snapshot: WorldSnapshot | None = None
        self._slot_index = SlotIndex(self.device, warp_device(self.device), self.num_envs)
        self._allocate_mirrors()
        self._publish_snapshot(structural=True)

    # ------------------------------------------------------------------ reading
    @property
    def revision(self) -> int:
        return self._snapshot.revision

    @property
    def capacity(self) -> int:
        return self._capacity

    def snapshot(self) -> WorldSnapshot:
        """The current view (cheap: no copy).

        Structural changes never alter a snapshot once taken. ``update_vertices`` refits a mesh in
        place, though: a snapshot taken before a refit sees the new vertices with the old bounding
        radius (the cull bound in mesh_pose_inverse[..., 7]). Take a fresh snapshot after refits,
        and evaluate inside ``reading()`` (as every evaluation method of this class does) so that
        no refit runs during the evaluation.
        """
        return self._snapshot

    def reading(self) -> "_WorldRead":
        """Context manager: hold off in-place refits while evaluating against the yielded snapshot."""
        return _WorldRead(self)

    # The accessors below take the writer lock (never held across a BVH build) so that they do
    # not see a slot half way through a replacement.
    def has_mesh(self, name: str, env: int = 0) -> bool:
        self.check_env(env)
        with self._write_lock:
            return self._find(name, env) is not None

    def mesh_names(self, env: int = 0) -> list[str]:
        self.check_env(env)
        with self._write_lock:
            return [s.name for s in self._slots[env]]

    def mesh_count(self) -> int:
        with self._write_lock:
            return sum(len(s) for s in self._slots)

    def mesh_geometry(self, name: str, env: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool]:
        """(vertices (V,3) float32, triangles (T,3) int32, pose (7,) float64, enabled) of a mesh.

        The arrays are the world's read-only copies (the same objects until the geometry changes);
        the triangles with their winding repaired at add (mesh_info "orientation")."""
        with self._write_lock:
            slot = self._require(name, env)
            return slot.geometry.vertices, slot.geometry.triangles, slot.pose.copy(), slot.enabled

    def same_triangles(self, name: str, triangles, env: int = 0) -> bool:
        """Whether ``triangles`` ((T,3) or flat) are those the mesh was added with, as given
        (before the winding repair): a re-sent mesh with them is a refit (update_vertices)."""
        t = np.asarray(triangles)
        with self._write_lock:
            geo = self._require(name, env).geometry
            stored = geo.triangles
            if t.size != stored.size:
                return False
            t = t.reshape(stored.shape)
            if geo.reversed_rows.size == 0:
                return bool(np.array_equal(t, stored))
            return bool(np.array_equal(t, geo.given_triangles()))

    def mesh_sign_method(self, name: str, env: int = 0) -> SignMethod:
        """The concrete sign method the kernels use for a mesh (what ``auto`` chose, if it was)."""
        with self._write_lock:
            return self._require(name, env).geometry.method

    def mesh_info(self, name: str, env: int = 0) -> dict:
        """Facts about a mesh's geometry: sign_method (concrete), requested_sign_method, vertices,
        triangles, bounding_centre/bounding_radius (m, mesh frame), winding_number_support, and
        oriented (add_mesh's promise), orientation (what the add repaired,
        mesh_orientation.orient_components: components, closed_components, non_orientable,
        components_reversed, faces_reversed, seconds; None for oriented meshes: no repair ran), and
        for ``auto`` the classification (key "auto": reason, closed, consistently_oriented,
        shells, self_intersections, degenerate_triangles, volume, classify_seconds) of the
        repaired triangles."""
        with self._write_lock:
            return self._require(name, env).geometry.info()

    def export_meshes(self) -> list[tuple[int, str, np.ndarray, np.ndarray, np.ndarray, bool]]:
        """Every slot as (env, name, vertices, triangles, pose, enabled) (see mesh_geometry), read
        under the writer lock: one consistent world state (used to persist the world)."""
        with self._write_lock:
            return [(env, slot.name) + self.mesh_geometry(slot.name, env)
                    for env, slots in enumerate(self._slots) for slot in slots]

    # ------------------------------------------------------------------ mutations
    def add_mesh(self, name: str, vertices, triangles, pose=None, env: int = 0, enabled: bool = True,
                 sign_method: SignMethod | str | None = None, oriented: bool = False) -> int:
        """Add a mesh, or replace the geometry, pose and enable flag of an existing ``name``.

        vertices (V,3) m in the mesh frame; triangles (T,3) vertex indices, counter-clockwise seen
        from outside (closed surfaces wound otherwise, inside out or partly flipped, are
        re-oriented on the stored copy: docs/sign_methods.md, mesh_info "orientation"); pose (7,)
        the mesh frame in the world; sign_method overrides the world's default for this mesh
        (``auto`` classifies the geometry once; the result is cached with it, see mesh_info).

        oriented=True: the caller vouches that the triangles bound solids: closed, wound
        counter-clockwise seen from outside and not self-intersecting (a marching-cubes surface
        closed inside its box, as robot_sdf.perception makes). Such a mesh is signed by
        pseudo-normals (``normal``, exact there), and the repair and the classification, which
        would find nothing to do, are skipped (measured: 0.5 s of a 0.55 s add of a 40k-triangle
        perceived surface). A mesh that breaks the promise gets wrong signs, silently.
        sign_method must then be None or ``normal``.
        Returns the new revision.
        """
        self._refuse_in_capture()
        self._check_name(name)
        self.check_env(env)
        requested = self.sign_method if sign_method is None else SignMethod.parse(sign_method)
        if oriented:
            if sign_method is not None and requested != SignMethod.NORMAL:
                raise ValueError(f"oriented meshes are signed by 'normal', got sign_method {sign_method!r}")
            requested = SignMethod.NORMAL
        v, t = geometry.validate_mesh(vertices, triangles)
        p = geometry.validate_pose(pose)
        key = content_key(v, t, requested, oriented)
        prebuilt = self._prebuild(key, v, t, requested, name, oriented)
        with self._write_lock:
            geo = self._acquire_geometry(key, v, t, requested, prebuilt, name, oriented)
            slot = self._find(name, env)
            if slot is None:
                slot = _Slot(name, geo, p, bool(enabled), len(self._slots[env]))
                self._slots[env].append(slot)
                self._by_name[env][name] = slot
                if len(self._slots[env]) > self._capacity:
                    self._capacity = max(self._capacity * 2, len(self._slots[env]))
                    self._allocate_mirrors()
                else:
                    self._mirror_slot(env, len(self._slots[env]) - 1)
                    self._counts[env] = len(self._slots[env])
            else:
                old = slot.geometry
                slot.geometry, slot.pose, slot.enabled = geo, p, bool(enabled)
                self._release_geometry(old)
                self._mirror_slot(env, self._index(env, slot))
            return self._publish(structural=True, env=env)

    def remove_mesh(self, name: str, env: int = 0) -> int:
        self._refuse_in_capture()
        with self._write_lock:
            slot = self._require(name, env)
            index = self._index(env, slot)
            del self._slots[env][index]
            del self._by_name[env][name]
            for later in self._slots[env][index:]:
                later.index -= 1
            self._release_geometry(slot.geometry)
            self._shift_out(env, index)  # later slots move up by one
            return self._publish(structural=True, env=env)

    def set_pose(self, name: str, pose, env: int = 0) -> int:
        """Move a mesh: only the inverse-pose tensor changes.

        Setting the pose a mesh already has changes nothing and keeps the revision, so a
        re-sent pose message is harmless."""
        self._refuse_in_capture()
        p = geometry.validate_pose(pose)
        with self._write_lock:
            slot = self._require(name, env)
            if np.array_equal(slot.pose, p):
                return self._revision
            slot.pose = p
            self._mirror_pose(env, self._index(env, slot))
            return self._publish(pose=True, env=env)

    def set_enabled(self, name: str, enabled: bool, env: int = 0) -> int:
        """Enable or disable a mesh; no change (and no new revision) if it already is."""
        self._refuse_in_capture()
        with self._write_lock:
            slot = self._require(name, env)
            if slot.enabled == bool(enabled):
                return self._revision
            slot.enabled = bool(enabled)
            self._enable[env, self._index(env, slot)] = 1 if slot.enabled else 0
            return self._publish(enable=True)

    def update_vertices(self, name: str, vertices, env: int = 0, pose=None) -> int:
        """New vertex positions (V,3) with the same topology: the BVH is refit, not rebuilt.

        pose (7,), optional: the mesh's new pose, published in the same revision as the vertices.
        If the geometry is shared with other slots (identical content), those keep the old shape
        and this slot gets its own copy.
        """
        self._refuse_in_capture()
        v = geometry.validate_vertices(vertices)
        p = None if pose is None else geometry.validate_pose(pose)
        with self._write_lock:
            old = self._require(name, env).geometry
        key = self._refit_key(name, v, old)
        # The numpy part of an in-place refit runs before the writer lock, so pose and enable
        # updates (and queries) wait only for the BVH refit itself. The geometry's triangles,
        # centre and method never change, so the result stays valid if it is still the slot's.
        prepared = old.prepare_refit(v) if old.users == 1 else None
        with self._write_lock:
            slot = self._require(name, env)
            if slot.geometry is not old:  # replaced meanwhile: check and prepare again, held
                old = slot.geometry
                key = self._refit_key(name, v, old)
                prepared = None
            if p is not None:
                slot.pose = p
            index = self._index(env, slot)
            if old.users > 1 or key in self._geometries or key in self._unused:
                # Shared (or already cached) content: this slot gets its own geometry.
                slot.geometry = self._acquire_geometry(key, v, old.given_triangles(), old.requested, name=name,
                                                       oriented=old.oriented)
                self._release_geometry(old)
                self._mirror_slot(env, index)
            else:
                # Readers must not run while the BVH is half refit. The sign method stays what it
                # was (same topology); the centre too, so older snapshots keep their translation.
                if prepared is None:
                    prepared = old.prepare_refit(v)
                with self._refit_lock.write():
                    self._sync_device_before_write()
                    old.refit(v, prepared)
                    self._sync_device_after_write()
                    del self._geometries[old.key]
                    old.key = key
                    self._geometries[key] = old
                    # Only this slot uses the geometry (users == 1): its cull radius and pose.
                    self._mirror_slot(env, index)
                    return self._publish(pose=True, env=env)
            return self._publish(structural=True, env=env)

    @staticmethod
    def _refit_key(name: str, v: np.ndarray, old: Geometry) -> bytes:
        """Content key of ``old``'s topology with vertices ``v`` (V,3), after checking that they fit it."""
        if v.shape != old.vertices.shape:
            raise ValueError(
                f"update_vertices: {name!r} has {old.vertices.shape[0]} vertices, got {v.shape[0]}; "
                "use add_mesh to change topology"
            )
        geometry.check_area(v, old.triangles)
        return content_key(v, old.triangles_digest, old.requested, old.oriented)

    # ------------------------------------------------------------------ checks
    def check_env(self, env) -> None:
        """Raise ValueError unless ``env`` is an environment index of this world (0..num_envs-1)."""
        if not isinstance(env, (int, np.integer)) or isinstance(env, bool) or not 0 <= int(env) < self.num_envs:
            raise ValueError(f"env {env!r} out of range: this world has {self.num_envs} environment(s)")

    def _refuse_in_capture(self) -> None:
        """World changes copy host data and build BVHs: inside a CUDA graph capture they would be
        recorded once and replayed with stale addresses. Refused with a clear message (and
        nothing changed) instead of failing deep inside torch or Warp."""
        if self._cuda and torch.cuda.is_current_stream_capturing():
            raise RuntimeError("MeshWorld changes (add_mesh, remove_mesh, set_pose, set_enabled, update_vertices) "
                               "cannot run inside a CUDA graph capture: make them before capturing or between "
                               "replays; a captured evaluation reads the world's tensors in place")

    # ------------------------------------------------------------------ internals
    def _warp_stream(self):
        """Warp's stream on this world's device (where builds and refits run), as a torch stream."""
        return warp_torch_stream(warp_device(self.device), self.device)

    def _sync_device_before_write(self) -> None:
        # Queries run on their callers' torch streams, builds and refits on Warp's: on CUDA, Warp's
        # stream waits (stream-ordered, no host wait) for the evaluations queued so far before a
        # BVH changes in place under them. Evaluations start inside reading(), which a refit
        # excludes, so none is queued between this wait and the refit.
        if self.device.type == "cuda":
            self._streams.make_wait(self._warp_stream())

    def _sync_device_after_write(self) -> None:
        # Nothing to wait for on the host: the snapshot published next records an event on Warp's
        # stream after the build or refit, and evaluations wait for it on their own stream.
        graveyard.purge()

    def _update_slot_index(self) -> None:
        """Refit or rebuild the slot BVHs of the environments changed since the last evaluation,
        for the current snapshot: once per evaluated revision however many changes came between.
        Like a mesh refit it changes trees in place, so it waits for running evaluations (never
        from a thread that is itself evaluating: nested reads keep the per-slot loop)."""
        if getattr(self._refit_lock._held, "depth", 0):
            return
        with self._write_lock:
            if self._slot_index.current():
                return
            with self._refit_lock.write():
                self._sync_device_before_write()
                snap = self._snapshot
                self._slot_index.update(snap.mesh_pose_inverse, self._counts, snap.revision)
                self._sync_device_after_write()

    @staticmethod
    def _check_name(name) -> None:
        if not isinstance(name, str) or not name:
            raise ValueError(f"mesh id must be a non-empty string, got {name!r}")

    def _find(self, name: str, env: int) -> _Slot | None:
        return self._by_name[env].get(name)

    def _index(self, env: int, slot: _Slot) -> int:
        return slot.index

    def _require(self, name: str, env: int) -> _Slot:
        self.check_env(env)
        slot = self._find(name, env)
        if slot is None:
            raise KeyError(f"no mesh {name!r} in env {env}")
        return slot

    def _prebuild(self, key: bytes, v: np.ndarray, t: np.ndarray, requested: SignMethod,
                  name: str = "", oriented: bool = False) -> Geometry | None:
        """Build the BVH of new content before taking the write lock, so that other writers
        (pose updates, enable flags) are not queued behind a build. None if cached."""
        with self._write_lock:
            if key in self._geometries or key in self._unused:
                return None
        return self._build_geometry(key, v, t, requested, name, oriented)

    def _build_geometry(self, key: bytes, v: np.ndarray, t: np.ndarray, requested: SignMethod,
                        name: str = "", oriented: bool = False) -> Geometry:
        geo = Geometry(key, v, t, self.device, requested, name, oriented)
        self._sync_device_after_write()  # the BVH is complete before any snapshot names it
        return geo

    def _acquire_geometry(self, key: bytes, v: np.ndarray, t: np.ndarray, requested: SignMethod,
                          prebuilt: Geometry | None = None, name: str = "", oriented: bool = False) -> Geometry:
        geo = self._geometries.get(key)
        if geo is None:
            geo = self._unused.pop(key, None)
            if geo is not None:
                self._cache_bytes -= geometry_bytes(geo)
            else:
                geo = prebuilt or self._build_geometry(key, v, t, requested, name, oriented)
            self._geometries[key] = geo
        geo.users += 1
        return geo

    def _release_geometry(self, geo: Geometry) -> None:
        geo.users -= 1
        if geo.users == 0:
            geo.sign_writer = geo.sign_topology = None  # refit data of live geometries only
            del self._geometries[geo.key]
            self._unused[geo.key] = geo
            self._cache_bytes += geometry_bytes(geo)
            while self._unused and (len(self._unused) > self._cache_size
                                    or self._cache_bytes > self._cache_bytes_limit):
                _, dropped = self._unused.popitem(last=False)
                self._cache_bytes -= geometry_bytes(dropped)

    def cache_info(self) -> tuple[int, int]:
        """(count, estimated bytes) of the unused geometries the cache holds."""
        with self._write_lock:
            return len(self._unused), self._cache_bytes

    # Snapshot machinery. Host (numpy) mirrors of every snapshot array are kept up to date slot by
    # slot under the writer lock, so a pose or enable change costs O(1) Python work plus one copy
    # of the arrays it touches (a memcpy on the CPU, one host-to-device copy on CUDA) instead of a
    # Python loop over all num_envs * capacity slots. Every publish hands out fresh tensors
    # (copy-on-write): a snapshot already taken never changes; tensors a change does not touch are
    # shared with the previous snapshot (they are never written either).
    def _allocate_mirrors(self) -> None:
        """(Re)create the mirrors for the current capacity and fill them from the slots: O(slots)."""
        e, m = self.num_envs, self._capacity
        self._ids = np.zeros((e, m), np.int64)
        self._pose_inv = np.zeros((e, m, POSE_INVERSE_SIZE), np.float32)
        self._enable = np.zeros((e, m), np.uint8)
        self._methods = np.zeros((e, m), np.uint8)
        self._counts = np.zeros(e, np.int32)
        for env in range(e):
            self._mirror_env(env)

    def _mirror_env(self, env: int) -> None:
        """Refill one environment's rows (after a removal shifted its slots): O(capacity)."""
        slots = self._slots[env]
        self._ids[env] = 0
        self._pose_inv[env] = 0.0
        self._pose_inv[env, :, 3] = 1.0
        self._enable[env] = 0
        self._methods[env] = 0
        self._counts[env] = len(slots)
        for i in range(len(slots)):
            self._mirror_slot(env, i)

    def _shift_out(self, env: int, i: int) -> None:
        """Slot i of env was removed: move the later rows up by one and clear the freed last row
        (numpy row copies, not a Python loop over the slots: thousands of obstacles per env)."""
        n = len(self._slots[env])  # after the removal
        for mirror in (self._ids, self._pose_inv, self._enable, self._methods):
            mirror[env, i:n] = mirror[env, i + 1:n + 1].copy()
        self._ids[env, n] = 0
        self._pose_inv[env, n] = 0.0
        self._pose_inv[env, n, 3] = 1.0
        self._enable[env, n] = 0
        self._methods[env, n] = 0
        self._counts[env] = n

    def _mirror_slot(self, env: int, i: int) -> None:
        """Write slot i of env (geometry, pose, enable flag) into the mirrors."""
        slot = self._slots[env][i]
        # Warp ids are uint64 addresses; the int64 tensor holds the same bits.
        self._ids[env, i] = np.uint64(slot.geometry.mesh.id).astype(np.int64)
        self._methods[env, i] = int(slot.geometry.method)
        self._enable[env, i] = 1 if slot.enabled else 0
        self._mirror_pose(env, i)

    def _mirror_pose(self, env: int, i: int) -> None:
        slot = self._slots[env][i]
        inverse = geometry.pose_inverse(slot.pose)
        # The Warp mesh is centred on the geometry's bounding-box centre.
        inverse[:3] -= slot.geometry.centre
        self._pose_inv[env, i, :7] = inverse
        self._pose_inv[env, i, 7] = slot.geometry.cull_radius

    def _tensor(self, mirror: np.ndarray) -> torch.Tensor:
        """A new tensor on the world's device holding a copy of ``mirror`` (never aliasing it).

        On CUDA without a host wait: staged in pinned memory (torch's host cache keeps the block
        until the copy has run) and copied on Warp's stream, before the snapshot's ready event is
        recorded there (_publish_snapshot). A copy from pageable memory would wait for all work
        queued on the device, evaluations included, on every pose or enable update."""
        with torch.inference_mode(False):
            # Ordinary tensors even when the world changes under inference_mode: inference tensors
            # have no version counter, so the launch layer could not keep what it validated and
            # converted from them (world_args) and would read them back on every call.
            if self.device.type == "cpu":
                return torch.from_numpy(mirror.copy())
            staged = torch.from_numpy(mirror).pin_memory()
            with torch.cuda.stream(self._warp_stream()):
                return staged.to(self.device, non_blocking=True)

    def _publish(self, structural: bool = False, pose: bool = False, enable: bool = False, env: int | None = None) -> int:
        """Publish the mirrors as a new snapshot; ``pose``/``enable`` name the only arrays that
        changed, ``structural`` (geometries, slots or capacity changed) copies every array.
        ``env``: the environment whose slot boxes moved (pose, geometry or slots changed): its
        slot BVH is brought up to date before the next evaluation (slot_index)."""
        self._revision += 1
        if env is not None:
            self._slot_index.mark(env, self._revision, int(self._counts[env]))
        self._publish_snapshot(structural, pose, enable)
        return self._revision

    def _publish_snapshot(self, structural: bool = False, pose: bool = False, enable: bool = False) -> None:
        prev = self._snapshot
        if structural or prev is None:
            # Keep every geometry a slot names alive while this view exists: exactly the
            # geometries in use (users > 0), O(distinct geometries) rather than O(slots).
            geometries = tuple(self._geometries.values())
            tensors = (self._tensor(self._ids), self._tensor(self._pose_inv), self._tensor(self._enable),
                       self._tensor(self._counts), self._tensor(self._methods))
        else:
            geometries = prev._keepalive[0].geometries
            tensors = (prev.mesh_idx, self._tensor(self._pose_inv) if pose else prev.mesh_pose_inverse,
                       self._tensor(self._enable) if enable else prev.mesh_enable, prev.n_env_mesh,
                       prev.sign_methods)
        ready = None
        if self.device.type == "cuda":
            # After the BVH builds and refits and the tensors' copies, all on Warp's stream.
            ready = torch.cuda.Event()
            ready.record(self._warp_stream())
        self._snapshot = WorldSnapshot(
            mesh_idx=tensors[0],
            mesh_pose_inverse=tensors[1],
            mesh_enable=tensors[2],
            n_env_mesh=tensors[3],
            revision=self._revision,
            sign_method=self.sign_method,
            sign_methods=tensors[4],
            _keepalive=(Retention(geometries, tensors, ready, self._streams, self.device),),
            _slot_index=self._slot_index,
        )

    def _build_snapshot(self) -> WorldSnapshot:
        """The snapshot rebuilt from the slots alone, without the mirrors: O(slots) Python. The
        reference the incremental path is tested against (world_test.py)."""
        e, m = self.num_envs, self._capacity
        ids = np.zeros((e, m), np.int64)
        pose_inv = np.zeros((e, m, POSE_INVERSE_SIZE), np.float32)
        pose_inv[:, :, 3] = 1.0
        enable = np.zeros((e, m), np.uint8)
        methods = np.zeros((e, m), np.uint8)
        counts = np.zeros(e, np.int32)
        keep = []
        for env, slots in enumerate(self._slots):
            counts[env] = len(slots)
            for i, slot in enumerate(slots):
                ids[env, i] = np.uint64(slot.geometry.mesh.id).astype(np.int64)
                inverse = geometry.pose_inverse(slot.pose)
                inverse[:3] -= slot.geometry.centre
                pose_inv[env, i, :7] = inverse
                pose_inv[env, i, 7] = slot.geometry.cull_radius
                methods[env, i] = int(slot.geometry.method)
                enable[env, i] = 1 if slot.enabled else 0
                keep.append(slot.geometry)
        dev = self.device
        return WorldSnapshot(
            mesh_idx=torch.from_numpy(ids).to(dev),
            mesh_pose_inverse=torch.from_numpy(pose_inv).to(dev),
            mesh_enable=torch.from_numpy(enable).to(dev),
            n_env_mesh=torch.from_numpy(counts).to(dev),
            revision=self._revision,
            sign_method=self.sign_method,
            sign_methods=torch.from_numpy(methods).to(dev),
            _keepalive=tuple(keep),
        )

    # ------------------------------------------------------------------ evaluation (see cost.py)
    # One direction only: these methods call cost.py, which uses nothing but this class's public
    # API (device, num_envs, max_distance, check_env, reading) and never imports this module.
    def sphere_cost(self, spheres, activation_distance=0.05, weight=1.0, env_index=None, max_distance=None):
        """Differentiable cost (b,h,n) of spheres (b,h,n,4) [x,y,z,r, m]; see cost.py."""
        return cost.sphere_cost(self, spheres, activation_distance, weight, env_index, max_distance)

    def swept_sphere_cost(self, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4, speed_dt=0.1,
                          enable_speed_metric=False, env_index=None, max_distance=None):
        """Differentiable swept cost (b,h,n) of trajectories of spheres (b,h,n,4); see cost.py."""
        return cost.swept_sphere_cost(self, spheres, activation_distance, weight, sweep_steps, speed_dt,
                                      enable_speed_metric, env_index, max_distance)

    def signed_distance(self, points, env=0, max_distance=None, return_revision=False):
        """Signed distance (n,) of points (n,3) to env's meshes, and its gradient (n,3); see cost.py."""
        return cost.signed_distance(self, points, env, max_distance, return_revision)

    def evaluate_sphere_cost(self, spheres, activation_distance=0.05, weight=1.0, env_index=None,
                             max_distance=None, compute_gradient=True, return_revision=False):
        """Cost (b,h,n) and gradient (b,h,n,3) or None, without autograd; see cost.py."""
        return cost.evaluate_sphere_cost(self, spheres, activation_distance, weight, env_index, max_distance,
                                         compute_gradient, return_revision)

    def evaluate_swept_sphere_cost(self, spheres, activation_distance=0.05, weight=1.0, sweep_steps=4,
                                   speed_dt=0.1, enable_speed_metric=False, env_index=None, max_distance=None,
                                   compute_gradient=True, return_revision=False):
        """Swept cost (b,h,n) and gradient (b,h,n,3) or None, without autograd; see cost.py."""
        return cost.evaluate_swept_sphere_cost(self, spheres, activation_distance, weight, sweep_steps, speed_dt,
                                               enable_speed_metric, env_index, max_distance, compute_gradient,
                                               return_revision)
