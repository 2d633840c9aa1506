"""The functions the kernels use beyond Warp's public mesh queries, from one of two sets chosen
once at import:

- kernels.native: C++ that reads Warp's internals (shared BVH traversals, float64 searches, the
  root box), on the Warp releases it was checked against (warp_release.CHECKED_RELEASES);
- kernels.portable: the same functions in pure Warp, slower, on any other Warp.

ROBOT_SDF_KERNELS=portable picks the portable set on a checked Warp too (tests and the bench
compare the two); =native insists on native (an unchecked Warp is then refused at import, naming
the checked range). Default: native where checked, portable elsewhere. NATIVE says which loaded.
"""
from __future__ import annotations

import os

from robot_sdf.kernels.warp_release import WARP_CHECKED

_CHOICE = os.environ.get("ROBOT_SDF_KERNELS", "auto").strip().lower()
if _CHOICE not in ("auto", "native", "portable"):
    raise RuntimeError(f"ROBOT_SDF_KERNELS={_CHOICE!r}: expected auto, native or portable")
NATIVE = _CHOICE == "native" or (_CHOICE == "auto" and WARP_CHECKED)

if NATIVE:
    from robot_sdf.kernels.native import (CPU_SPHERES_PER_THREAD, SLOT_HITS, SWEPT_BATCH, SWEPT_SIDE_BATCH,
                                          THIN_ASPECT, face_of, mesh_average_edge_length, mesh_box_beyond,
                                          mesh_closest_face, mesh_closest_points, mesh_supports_winding,
                                          slot_bvh_hits, slot_hits_t, spheres_per_thread, vec16, warp_inside,
                                          winding_number)
    from robot_sdf.kernels.native_winding import mesh_winding_numbers
else:
    from robot_sdf.kernels.portable import (CPU_SPHERES_PER_THREAD, SLOT_HITS, SWEPT_BATCH, SWEPT_SIDE_BATCH,
                                            THIN_ASPECT, face_of, mesh_average_edge_length, mesh_box_beyond,
                                            mesh_closest_face, mesh_closest_points, mesh_supports_winding,
                                            mesh_winding_numbers, slot_bvh_hits, slot_hits_t, spheres_per_thread,
                                            vec16, warp_inside, winding_number)

__all__ = ["CPU_SPHERES_PER_THREAD", "NATIVE", "SLOT_HITS", "SWEPT_BATCH", "SWEPT_SIDE_BATCH", "THIN_ASPECT",
           "face_of", "mesh_average_edge_length", "mesh_box_beyond", "mesh_closest_face", "mesh_closest_points",
           "mesh_supports_winding", "mesh_winding_numbers", "slot_bvh_hits", "slot_hits_t", "spheres_per_thread",
           "vec16", "warp_inside", "winding_number"]
