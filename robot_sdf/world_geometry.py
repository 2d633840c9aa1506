"""One geometry of a MeshWorld: a Warp mesh with its BVH and robot_sdf's sign data, built once per
content (vertices, triangles, requested sign method) and shared by every slot that holds that
content; its content key, and the estimate of its size that bounds the world's geometry cache.

The BVH build, the winding repair, the sign data and auto's classification run once per content
(mesh_build.build_mesh, which adoption's twins use too); a vertex refit keeps the topology and is
prepared here while queries still read the old shape, then swapped in while MeshWorld holds
readers off.
"""
from __future__ import annotations

import hashlib
import logging
import threading

import numpy as np
import torch
import warp as wp

from robot_sdf import geometry, mesh_analysis, mesh_build, mesh_topology
from robot_sdf.kernels.sign_data import ROW_BOUNDS, extra_row
from robot_sdf.launch import warp_device
from robot_sdf.types import SignMethod
from robot_sdf.world_args import register_mesh, unregister_mesh

# auto's choice is logged under the world's logger (docs/sign_methods.md).
_log = logging.getLogger("robot_sdf.world")


class Geometry:
    """One Warp mesh, shared by every slot whose vertices, triangles and requested sign method
    are identical.

    The Warp mesh holds the vertices re-centred on ``centre`` (the middle of their bounding box):
    the snapshot folds -centre into each slot's inverse-pose translation, so the bounding sphere
    (``radius``) is tight and float32 coordinates stay small for meshes given in world
    coordinates. Its ``velocities`` array carries robot_sdf's sign data (mesh_analysis).
    """

    def __init__(self, key: bytes, vertices: np.ndarray, triangles: np.ndarray, device: torch.device,
                 requested: SignMethod, name: str = "", oriented: bool = False):
        """``oriented``: the caller vouches that the triangles bound solids (closed, wound
        counter-clockwise seen from outside, not self-intersecting); ``requested`` is then
        ``normal``, and the winding repair and the classification, which would find nothing to
        do, are skipped (MeshWorld.add_mesh)."""
        self.key = key
        self.oriented = bool(oriented)
        # Private read-only copies: the content key must keep describing what the BVH holds.
        self.vertices = np.array(vertices, dtype=np.float32, copy=True)
        self.vertices.setflags(write=False)
        # The digest of the triangles as given: the content key names the input, whose winding
        # the stored copy may repair.
        self.triangles_digest = _triangles_digest(np.asarray(triangles, np.int32))
        v64 = self.vertices.astype(np.float64)
        self.centre = 0.5 * (v64.min(axis=0) + v64.max(axis=0))
        centred = self._centred(self.vertices)
        self.radius = geometry.bounding_radius(centred)
        self.requested = requested
        self.welded = mesh_topology.weld(self.vertices)
        # Closed surfaces bound a solid whatever their winding: the build orients each patch
        # consistently, closed ones outward, on its private copy of the triangles, before the sign
        # data sees it (unless the caller vouched for the winding: oriented).
        build = mesh_build.build_mesh(centred, triangles, self.welded, requested, warp_device(device),
                                      trusted=self.oriented)
        self.triangles, self.orientation = build.triangles, build.orientation
        # Rows reversed by the repair: the triangles as given are recoverable (same_triangles).
        self.reversed_rows = np.flatnonzero(np.any(self.triangles != np.asarray(triangles, np.int64), axis=1)) \
            if self.orientation is not None and self.orientation.faces_reversed else np.zeros(0, np.int64)
        # Kept while the geometry is in use: a refit reuses it (weld groups, edge indices).
        self.sign_topology: mesh_analysis.SignTopology | None = build.topology
        self.points, self.indices, self.velocities = build.arrays
        self.mesh = build.mesh
        self.method = build.method
        self.winding_number = build.winding_number
        # The classification proved the pseudo-normal sign exact, or the caller vouched for it
        # (oriented); a refit rewrites the data without it.
        self.closed_shell = build.closed_shell
        # auto's choice (a ``normal`` build is classified too, for closed_shell only).
        self.classification = build.classification if requested == SignMethod.AUTO else None
        if self.classification is not None:
            _log.info("mesh %r: sign method auto -> %s (%s; %d triangles, classified in %.3f s)", name,
                      self.method.name.lower(), self.classification.reason, len(self.triangles),
                      self.classification.seconds)
        # Kernels skip the mesh beyond this radius (+ the search bound): no surface is there and
        # no inside point (for winding_number on a surface that is not closed, that reaches
        # out to the winding radius).
        bounds = build.data[extra_row(ROW_BOUNDS)]
        self.cull_radius = max(self.radius, float(bounds[0]) if bounds[1] == 0.0 else 0.0)
        register_mesh(self.mesh.id, self.winding_number)
        self.users = 0
        # Device arrays of the topology and scratch sums, made at the first refit and kept.
        self.sign_writer: mesh_analysis.SignDataWriter | None = None
        self._refit_prepare_lock = threading.Lock()  # one scratch set per writer

    def given_triangles(self) -> np.ndarray:
        """(T,3) int32: the triangles as they were given, before the winding repair."""
        if self.reversed_rows.size == 0:
            return self.triangles
        t = np.array(self.triangles, copy=True)
        t[self.reversed_rows] = t[self.reversed_rows, ::-1]
        return t

    def _centred(self, vertices: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(vertices.astype(np.float64) - self.centre, dtype=np.float32)

    def prepare_refit(self, vertices: np.ndarray) -> tuple:
        """Everything of a refit that can run while queries still read this geometry: the new
        centred points and their sign data, staged in arrays of their own by Warp kernels
        (mesh_analysis.SignDataWriter), with the new bounding and winding radii.

        ``vertices`` (V,3) float32, C-contiguous (validated). Few calls that release the GIL: in
        the node each one waits for the service threads to hand it back."""
        dev = self.points.device
        with self._refit_prepare_lock:
            if self.sign_writer is None:
                if self.sign_topology is None:  # dropped while the geometry sat in the cache
                    self.sign_topology = mesh_analysis.sign_topology(self.triangles, self.welded, vertices)
                self.sign_writer = mesh_analysis.SignDataWriter(self.sign_topology, dev)
            if dev.is_cpu:  # views of numpy memory: no allocation or copy calls into Warp
                host = (np.empty_like(vertices), np.empty((self.sign_writer.rows, 3), np.float32))
                raw = mesh_analysis.host_array(vertices)
                points, data = mesh_analysis.host_array(host[0]), mesh_analysis.host_array(host[1])
            else:
                host = None
                raw = wp.array(vertices, dtype=wp.vec3, device=dev)
                points = wp.empty(vertices.shape[0], dtype=wp.vec3, device=dev)
                data = wp.empty(self.sign_writer.rows, dtype=wp.vec3, device=dev)
            radius, winding_radius = self.sign_writer.write(raw, self.centre, points, data, self.winding_number,
                                                            self.method)
        return points, data, radius, winding_radius, host

    def refit(self, vertices: np.ndarray, prepared: tuple | None = None) -> None:
        """New vertex positions, same topology: refit the BVH about the same centre (so a snapshot
        taken before stays consistent) and swap in the new sign data (``prepared``: the result of
        prepare_refit(vertices), if already computed). Callers hold readers off (MeshWorld)."""
        points, data, radius, winding_radius, host = prepared if prepared is not None else self.prepare_refit(vertices)
        if host is not None:
            # CPU: the mesh takes the staged arrays (setting its points refits it); no reader
            # runs meanwhile, so the old ones can go. The numpy memory stays referenced here.
            self.mesh.points = points
            self.mesh.velocities = data
            self.points, self.velocities, self._host_arrays = points, data, host
        else:
            # CUDA: in place, ordered on Warp's stream after the evaluations queued so far
            # (MeshWorld._sync_device_before_write); replacing the arrays would free memory
            # that queued kernels may still read.
            self.points.assign(points)
            self.mesh.refit()
            self.velocities.assign(data)
        self.vertices = np.array(vertices, dtype=np.float32, copy=True)
        self.vertices.setflags(write=False)
        self.radius = radius
        self.closed_shell = False  # the refit's sign data carries no classification
        self.cull_radius = max(radius, 0.0 if self.sign_writer.topology.balanced else winding_radius)

    def info(self) -> dict:
        out = {"sign_method": self.method.name.lower(), "requested_sign_method": self.requested.name.lower(),
               "vertices": int(self.vertices.shape[0]), "triangles": int(self.triangles.shape[0]),
               "bounding_centre": self.centre.tolist(), "bounding_radius": self.radius,
               "winding_number_support": self.winding_number, "oriented": self.oriented,
               # Trusted as given (oriented): no repair ran.
               "orientation": None if self.orientation is None else self.orientation.as_dict()}
        if self.classification is not None:
            out["auto"] = self.classification.as_dict()
        if self.requested in (SignMethod.AUTO, SignMethod.NORMAL):
            # Classified (auto, normal): searched within r + eta first by the plain cost.
            out["closed_shell"] = self.closed_shell
        return out

    def __del__(self) -> None:
        mesh = getattr(self, "mesh", None)
        if mesh is not None:
            unregister_mesh(mesh.id)



def _triangles_digest(triangles: np.ndarray) -> bytes:
    return hashlib.blake2b(np.ascontiguousarray(triangles, np.int32).tobytes(), digest_size=20).digest()


def content_key(vertices: np.ndarray, triangles: np.ndarray | bytes, requested: SignMethod,
                oriented: bool = False) -> bytes:
    """Identity of a geometry: requested sign method, whether its orientation was vouched for
    (Geometry's ``oriented``: built without the repair), vertices and triangles (or the
    triangles' _triangles_digest, which a geometry keeps: a refit then hashes its vertices only)."""
    h = hashlib.blake2b(digest_size=20)
    h.update(bytes([int(requested)]) if not oriented else bytes([int(requested), 1]))
    h.update(np.int64(vertices.shape[0]).tobytes())
    h.update(triangles if isinstance(triangles, bytes) else _triangles_digest(triangles))
    _hash_holding_gil(h, vertices.tobytes())
    return h.digest()


# hashlib releases the GIL for every update of 2048 bytes or more; re-taking it costs up to a
# switch interval while the node's service threads run. Small buffers go in pieces below that.
_HASH_PIECE = 2047
_HASH_PIECES_MAX = 64


def _hash_holding_gil(h, data: bytes) -> None:
    if len(data) > _HASH_PIECE * _HASH_PIECES_MAX:
        h.update(data)  # big: the release is worth it
        return
    view = memoryview(data)
    for start in range(0, len(data), _HASH_PIECE):
        h.update(view[start:start + _HASH_PIECE])


# Estimated device-side bytes of a Warp BVH per triangle (2T-1 nodes of two bounds, plus the
# primitive bounds and index arrays Warp keeps next to it); measured RSS per triangle on the
# CPU device is in docs/reliability.md.
_BVH_BYTES_PER_TRIANGLE = 96


def geometry_bytes(geo) -> int:
    """Estimated bytes a geometry holds: host copies, device arrays and the BVH."""
    v, t = geo.vertices.nbytes, geo.triangles.nbytes
    return 2 * (v + t) + _BVH_BYTES_PER_TRIANGLE * (t // 12)

