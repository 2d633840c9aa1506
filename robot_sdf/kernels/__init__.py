"""robot_sdf's Warp kernels, one module per stage of a query (each tested by test/<module>_test.py):

    warp_release     what differs between the Warp releases robot_sdf runs on, decided at import
    sign_data        the sign-data layout in each mesh's ``velocities`` array, and its accessors
    closest_point    exact closest point on a mesh (float64 on the triangle found), pseudo-normals
    portable         the functions below in pure Warp, for a Warp native was not checked against
    native           the same functions in C++ (func_native), on the Warp releases it was checked on
    native_winding   native's shared winding-number traversal of a swept step's points
    mesh_queries     the one of the two sets the kernels use, chosen at import (ROBOT_SDF_KERNELS)
    winding          winding-number inside tests and the bounds that spare evaluating them
    signed_distance  signed distance to one mesh: the search, the sign regime, deep points
    slot_walk        the World struct (the world as the query kernels take it); the slots a query
                     visits (slot BVH), their poses and sign methods
    plain_cost       sphere_cost_kernel: the plain cost and the ESDF
    swept_slot       one mesh's share of a swept step (closed surfaces; open ones when moving)
    swept            swept_sphere_cost_kernel: the swept cost
    hessian          sphere_hessian_kernel: second derivatives of the plain cost and the ESDF

A module imports only modules above it in this list. The query kernels take one sphere per
thread on CUDA and a run of mesh_queries.CPU_SPHERES_PER_THREAD on the CPU (slot_walk.thread_spheres); every
kernel writes every output element it owns, so callers may hand in uninitialised buffers. Gradients are
analytic, so no Warp adjoint code is generated (enable_backward False, here and in each module).

The four kernels (sphere_cost_kernel, swept_sphere_cost_kernel, sphere_hessian_kernel,
slot_boxes_kernel) belong to one Warp module named after this package, "robot_sdf.kernels": they
compile as one unit, with the functions they share compiled once, and load together
(robot_sdf.launch.warp_device loads the module once per device, under a lock, since Warp's
module loading is not thread-safe). The other modules hold functions only, compiled into it.

The names below are those the host code, the benchmarks and the tests use.
"""
from __future__ import annotations

import warp as wp

# Warp's banner and per-module load lines are noise in a node's log.
wp.config.log_level = wp.LOG_WARNING
# The options of the kernels' Warp module, "robot_sdf.kernels" (see above).
wp.set_module_options({"enable_backward": False})

from robot_sdf.kernels.closest_point import UNBOUNDED  # noqa: E402
from robot_sdf.kernels.hessian import sphere_hessian_kernel  # noqa: E402
from robot_sdf.kernels.mesh_queries import (face_of, mesh_closest_points, mesh_winding_numbers,  # noqa: E402
                                            warp_inside, winding_number)
from robot_sdf.kernels.plain_cost import point_world_esdf, sphere_cost_kernel, sphere_world_cost  # noqa: E402
from robot_sdf.kernels.sign_data import (SIGN_AUTO, SIGN_DEFAULT, SIGN_NORMAL, SIGN_PARITY,  # noqa: E402
                                         SIGN_PER_SLOT, SIGN_WINDING_NUMBER, sign_data_offset)
from robot_sdf.kernels.slot_walk import World, slot_boxes_kernel, slot_pose  # noqa: E402
from robot_sdf.kernels.swept import swept_sphere_cost_kernel  # noqa: E402
from robot_sdf.kernels.winding import (COARSEST_WINDING_ACCURACY, COARSEST_WINDING_SETTLED,  # noqa: E402
                                       WINDING_ACCURACY, WINDING_APPROXIMATION_ERROR, rim_slope)

__all__ = [
    "COARSEST_WINDING_ACCURACY", "COARSEST_WINDING_SETTLED", "SIGN_AUTO", "SIGN_DEFAULT", "SIGN_NORMAL",
    "SIGN_PARITY", "SIGN_PER_SLOT", "SIGN_WINDING_NUMBER", "UNBOUNDED", "WINDING_ACCURACY",
    "WINDING_APPROXIMATION_ERROR", "World", "face_of", "mesh_closest_points", "mesh_winding_numbers", "rim_slope",
    "sign_data_offset", "slot_boxes_kernel", "slot_pose", "sphere_cost_kernel", "sphere_hessian_kernel",
    "point_world_esdf", "sphere_world_cost", "swept_sphere_cost_kernel", "warp_inside", "winding_number",
]
