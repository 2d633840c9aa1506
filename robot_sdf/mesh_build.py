"""One build of a mesh's sign data, for both owners of meshes robot_sdf signs: MeshWorld
(world_geometry.Geometry) and adopt_meshes (adoption.Twin).

The steps, in this order (build_mesh):
1. the facts of the triangles (mesh_topology.surface_facts: flat triangles, areas), which the
   classification and the winding repair share (they do not depend on the winding);
2. the classification of the triangles as given (mesh_classification.classify), where the sign
   method asks for one; its self-intersection test builds the Warp mesh with the sign data,
   kept when the mesh is signed by pseudo-normals;
3. the winding repair (mesh_orientation.orient_components): each edge-connected patch oriented
   consistently, closed ones outward. The boundary of a solid as given needs no repair, so a
   caller that reports none skips it there; classified again if the repair reversed any face;
4. the sign topology and sign data (mesh_analysis) of the oriented triangles, with the chosen
   sign method and the closed-shell flag;
5. the Warp mesh (with winding-number support under ``winding_number``) and, for a
   winding-number mesh that is not a solid's boundary, its face rows (face_winding). A caller
   may defer this step (finish_mesh): adoption builds a winding twin at its first use.

Points are in the frame the Warp mesh holds (MeshWorld: re-centred; adoption: the caller's).
Runs once per geometry, never per query.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

from robot_sdf import face_winding, mesh_analysis
from robot_sdf.kernels.sign_data import ROW_AREA, ROW_MARKER, extra_row
from robot_sdf.mesh_classification import MeshClass, classify
from robot_sdf.mesh_orientation import OrientationRepair, orient_components
from robot_sdf.mesh_topology import surface_facts
from robot_sdf.types import SignMethod

# Sign methods whose build classifies the mesh: auto's choice; for ``normal``, whether the
# pseudo-normal sign is exact at any distance (the closed-shell flag).
CLASSIFIED_METHODS = (SignMethod.AUTO, SignMethod.NORMAL)


@dataclass(eq=False)
class MeshBuild:
    """What the build of one mesh found and made; arrays in the frame of ``points``."""

    points: np.ndarray                   # (V,3) float32 [m]
    triangles: np.ndarray                # (T,3) int32, read-only: oriented (as given if not repaired)
    welded: np.ndarray                   # (V,) int64 first vertex at the same position (weld)
    device: wp.context.Device
    orientation: OrientationRepair | None  # None: no repair ran (trusted, or a solid as given)
    classification: MeshClass | None     # None: the method asks for none, or trusted
    method: SignMethod                   # the mesh's own sign method (its marker row)
    closed_shell: bool                   # a solid's boundary: the pseudo-normal sign is exact everywhere
    topology: mesh_analysis.SignTopology
    # Made by the classification's BVH build or by finish_mesh; empty while deferred.
    data: np.ndarray | None = None       # (V + 4T + 3K + 5, 3) float32 sign data, final once finished
    arrays: tuple = ()                   # Warp (points, flat indices, sign data) the mesh reads
    mesh: wp.Mesh | None = None

    @property
    def winding_number(self) -> bool:
        """The Warp mesh supports Warp's winding number (the sign data's marker says so)."""
        return self.method == SignMethod.WINDING_NUMBER


def build_mesh(points: np.ndarray, triangles: np.ndarray, welded: np.ndarray, requested: SignMethod, device,
               trusted: bool = False, orient_solids: bool = True, solids_by_normal: bool = False,
               defer_winding: bool = False) -> MeshBuild:
    """The build of one mesh (module docstring): ``points`` (V,3) float32 [m], C-contiguous,
    ``triangles`` (T,3) valid vertex indices (not changed), ``welded`` (V,) mesh_topology.weld of
    the points, ``requested`` the sign method asked for, ``device`` a Warp device.

    ``trusted``: the caller vouches that the triangles bound solids (closed, wound outward, not
    self-intersecting): no repair, no classification, a closed shell signed by ``normal``.
    ``orient_solids``: run the repair on a mesh classified as a solid's boundary too (MeshWorld
    reports its counts for every mesh); False keeps such a mesh as given (adoption).
    ``solids_by_normal``: under ``auto``, every solid's boundary gets ``normal`` (adoption's solid
    twin), where the design contract's rule gives it to one shell only (MeshWorld).
    ``defer_winding``: a winding-number mesh is left to finish_mesh (returned without data,
    arrays or mesh); anything else is finished here."""
    given = np.asarray(triangles, np.int64).reshape(-1, 3)
    facts = None if trusted else surface_facts(np.asarray(points, np.float64), given, welded[given])
    oriented = np.array(given, np.int32, copy=True)
    classification, staged = None, None
    if requested in CLASSIFIED_METHODS and not trusted:
        classification, staged = _classify(points, oriented, welded, facts, device)
    orientation = None
    if not trusted and (orient_solids or classification is None or not classification.solid):
        repaired, orientation = orient_components(points, given, welded, facts)
        if orientation.faces_reversed:
            oriented = repaired
            if classification is not None:  # it saw the triangles before the repair
                classification, staged = _classify(points, oriented, welded, facts, device)
    oriented.setflags(write=False)
    method = requested
    if requested == SignMethod.AUTO and classification is not None:
        method = SignMethod.NORMAL if solids_by_normal and classification.solid else classification.method
    closed_shell = trusted or (classification is not None and classification.solid)
    topology = staged.topology if staged is not None else mesh_analysis.sign_topology(oriented, welded, points)
    build = MeshBuild(points, oriented, welded, wp.get_device(device), orientation, classification, method,
                      closed_shell, topology)
    if defer_winding and build.winding_number:
        return build  # the classification's mesh (pseudo-normals) is not the one kept
    if staged is not None:
        build.data, build.arrays, build.mesh = staged.data, staged.arrays, staged.mesh
    finish_mesh(build)
    return build


def finish_mesh(build: MeshBuild) -> None:
    """Step 5 of the build: the final sign data (chosen method, closed-shell flag) on the device,
    the Warp mesh and, for a winding-number mesh that is not a solid's boundary, its face rows.
    Reuses what the classification made (its sign data, arrays and, under ``normal``, its mesh).
    On CUDA the BVH is built on Warp's stream: the caller synchronises before other streams read it."""
    winding = build.winding_number
    if build.data is None:
        build.data = mesh_analysis.sign_data(build.points, build.triangles, winding, build.method,
                                             topology=build.topology)
    data = build.data
    data[extra_row(ROW_MARKER), 1:] = (1.0 if winding else 0.0, float(int(build.method)))
    data[extra_row(ROW_AREA), 1] = 1.0 if build.closed_shell else 0.0
    if build.arrays:
        build.arrays[2].assign(wp.array(data, dtype=wp.vec3, device=build.device))
    else:
        build.arrays = _device_arrays(build.points, build.triangles, data, build.device)
    points, indices, velocities = build.arrays
    if build.mesh is None or winding:
        build.mesh = wp.Mesh(points=points, indices=indices, velocities=velocities, support_winding_number=winding)
    if winding and not build.closed_shell:
        # Where the sign may come from the closest feature (a refit clears these rows).
        face_winding.write_face_rows(build.mesh, velocities, build.points, build.topology)


@dataclass
class _Staged:
    """What the classification's self-intersection test built for the triangles it saw."""

    topology: mesh_analysis.SignTopology
    data: np.ndarray
    arrays: tuple
    mesh: wp.Mesh


def _classify(points: np.ndarray, triangles: np.ndarray, welded: np.ndarray, facts, device
              ) -> tuple[MeshClass, _Staged | None]:
    """classify ``triangles`` (T,3) int32; the BVH its self-intersection test needs is the signed
    mesh's (its sign data's flags are set at finish_mesh), returned with its topology and data."""
    staged: list[_Staged] = []

    def signed_mesh() -> wp.Mesh:
        topology = mesh_analysis.sign_topology(triangles, welded, points)
        data = mesh_analysis.sign_data(points, triangles, False, SignMethod.NORMAL, topology=topology)
        arrays = _device_arrays(points, triangles, data, device)
        staged.append(_Staged(topology, data, arrays, wp.Mesh(points=arrays[0], indices=arrays[1],
                                                              velocities=arrays[2])))
        return staged[-1].mesh

    classification, _ = classify(points, triangles, welded, signed_mesh, facts)
    return classification, staged[-1] if staged else None


def _device_arrays(points: np.ndarray, triangles: np.ndarray, data: np.ndarray, device) -> tuple:
    """Warp (points (V,) vec3, flat indices (3T,) int32, sign data (rows,) vec3) on ``device``."""
    return (wp.array(points, dtype=wp.vec3, device=device),
            wp.array(np.ascontiguousarray(triangles, np.int32).reshape(-1), dtype=wp.int32, device=device),
            wp.array(data, dtype=wp.vec3, device=device))
