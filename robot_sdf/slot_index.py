"""Slot index: one Warp BVH per environment over the world-space boxes of its slots.

Without it every sphere visits every slot of its environment (about 11 ns per slot per sphere
even when the mesh is culled at once), so thousands of far obstacles dominate a query. With it a
sphere visits only the slots whose box meets its own reach box (centre +- the search bound).

Boxes: slot i's box is the cube of half-size its cull radius (mesh_pose_inverse[..., 7]: no
surface and no inside point lies farther from the mesh origin) around the origin's world
position. It is rotation-invariant, so a pose change only moves a box: a refit. The kernels still
test the slot's enable flag, so enabling and disabling touches no box at all.

Why one BVH per environment rather than one over all environments' boxes: environments are
usually copies of one workspace in the same coordinates, so one shared tree would make every
query traverse the boxes of every environment near its point (cost growing with num_envs);
a tree per environment keeps a query's cost independent of num_envs, and an update touches only
its environment's tree. Environments with fewer than MIN_SLOTS slots keep the plain loop (no
tree to build or keep; the loop is as fast there).

Maintenance is lazy (MeshWorld drives it): a world change only marks its environment (O(1));
before the next evaluation the marked trees are refitted (same slot count: poses, replaced
geometry) or rebuilt (slots added or removed), once for any number of changes in between.
``serves(snapshot)`` says whether the trees describe a given snapshot; evaluations of any other
snapshot fall back to the per-slot loop (same results, slower).

Kernel argument (``ids``): (num_envs + 1,) int64 tensor on the world's device, the Warp BVH id of
each environment (0 = plain loop) and, last, a placeholder BVH that matches nothing.
"""
from __future__ import annotations

import threading

import numpy as np
import torch
import warp as wp

from robot_sdf import kernels
from robot_sdf.cuda_streams import warp_torch_stream
from robot_sdf.snapshot_lifetime import graveyard

# Below this many slots an environment keeps the plain per-slot loop.
MIN_SLOTS = 8
# Far outside any world: the placeholder BVH's box, which no query box meets.
_NOWHERE = 1.0e30


def placeholder_bvh(wdev) -> wp.Bvh:
    """A BVH that no query meets (kernels need a valid id to start a query). Two boxes: a
    builder's one-item case is the least exercised."""
    box = wp.array(np.full((2, 3), _NOWHERE, np.float32), dtype=wp.vec3, device=wdev)
    return wp.Bvh(box, box)


class SlotIndex:
    """The per-environment slot BVHs of one MeshWorld (see the module docstring).

    mark() is called by the world's writers (under its write lock); update() by the reader path
    with the world's write lock and the refit lock's write side held (no evaluation runs).
    """

    def __init__(self, device: torch.device, wdev, num_envs: int) -> None:
        self.device = device
        self._wdev = wdev
        self._placeholder = placeholder_bvh(wdev)
        self._trees: list[tuple | None] = [None] * num_envs  # (bvh, slot count)
        # World-space slot boxes, (num_envs, capacity) vec3 each; env e's tree is built over the
        # first count entries of row e (views), so one launch refreshes every changed env.
        self._lowers = None
        self._uppers = None
        self._host_ids = np.zeros(num_envs + 1, np.uint64)
        self._host_ids[-1] = self._placeholder.id
        with torch.inference_mode(False):
            # An ordinary tensor even for a world made under inference_mode: update() writes it
            # in place, which torch refuses for an inference tensor outside that mode.
            self.ids = torch.from_numpy(self._host_ids.view(np.int64).copy()).to(device)
        self._lock = threading.Lock()
        self._dirty: set[int] = set()
        # The trees describe every snapshot with applied <= revision < stale_from.
        self.applied = 0
        self.stale_from: int | None = None
        self.builds = 0
        self.refits = 0
        # CUDA: an event on Warp's stream after the last update's builds, refits and id copy.
        self.ready = None

    # ------------------------------------------------------------------ writers
    def mark(self, env: int, revision: int, count: int) -> None:
        """Environment ``env`` changed (a pose, a geometry, or its slots) in ``revision``, after
        which it holds ``count`` slots. O(1); an env with no tree and too few slots needs none."""
        if self._trees[env] is None and count < MIN_SLOTS:
            return
        with self._lock:
            self._dirty.add(env)
            if self.stale_from is None:
                self.stale_from = revision

    # ------------------------------------------------------------------ readers
    def serves(self, revision: int) -> bool:
        stale = self.stale_from
        return self.applied <= revision and (stale is None or revision < stale)

    def current(self) -> bool:
        return self.stale_from is None

    def update(self, pose_inverse: torch.Tensor, counts: np.ndarray, revision: int) -> None:
        """Bring the marked environments' trees to the snapshot of ``revision`` (its
        (n_env, m, 8) inverse poses, its (n_env,) host slot counts)."""
        with self._lock:
            dirty, self._dirty = self._dirty, set()
            self.stale_from = None
        if not dirty:
            return
        capacity = int(pose_inverse.shape[1])
        retired = []  # replaced trees (and box storage) live until the device is done with them (CUDA)
        if self._lowers is None or self._lowers.shape[1] != capacity:
            # The world's capacity grew: new box storage, and every tree (a view of the old
            # storage) is rebuilt.
            retired.append((self._lowers, self._uppers))
            shape = (len(self._trees), capacity)
            self._lowers = wp.empty(shape, dtype=wp.vec3, device=self._wdev)
            self._uppers = wp.empty(shape, dtype=wp.vec3, device=self._wdev)
            dirty |= {env for env, tree in enumerate(self._trees) if tree is not None}
            retired.append(self._trees)
            self._trees = [None] * len(self._trees)
        envs = sorted(dirty)
        pose = wp.from_torch(pose_inverse.detach().contiguous(), dtype=wp.float32)
        # One launch for the boxes of every changed environment (a launch per environment cost
        # ~30 us each on the CPU: 1024 moved environments took 46 ms; now one launch and a refit each).
        wp.launch(kernels.slot_boxes_kernel, dim=(len(envs), capacity),
                  inputs=[pose, wp.array(np.asarray(envs, np.int32), dtype=wp.int32, device=self._wdev),
                          self._lowers, self._uppers], device=self._wdev)
        for env in envs:
            count = int(counts[env])
            tree = self._trees[env]
            if count < MIN_SLOTS:
                retired.append(tree)
                self._trees[env] = None
                self._host_ids[env] = 0
            elif tree is not None and tree[1] == count:
                tree[0].refit()
                self.refits += 1
            else:
                # A view of the env's row of the box storage: the tree reads it on every refit.
                bvh = wp.Bvh(self._lowers[env][:count], self._uppers[env][:count])
                retired.append(tree)
                self._trees[env] = (bvh, count)
                self._host_ids[env] = bvh.id
                self.builds += 1
        if self.device.type == "cuda":
            # Stream-ordered, no host wait: the ids go up on Warp's stream (where the builds and
            # refits ran, after the evaluations the world tracked: MeshWorld._update_slot_index),
            # staged in pinned memory that torch's host cache keeps until the copy has run; every
            # evaluation's stream waits for ``ready`` (WorldSnapshot.before_use), and the replaced
            # trees are freed once it has passed.
            stream = warp_torch_stream(self._wdev, self.device)
            staged = torch.from_numpy(self._host_ids.view(np.int64).copy()).pin_memory()
            with torch.cuda.stream(stream):
                self.ids.copy_(staged, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(stream)
            self.ready = ready
            graveyard.add((ready,), tuple(retired), ())
        else:
            self.ids.copy_(torch.from_numpy(self._host_ids.view(np.int64)))
        del retired
        self.applied = revision

    def tree_count(self) -> int:
        return sum(tree is not None for tree in self._trees)
