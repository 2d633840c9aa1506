"""Inside tests by the generalised winding number, and the bounds that spare evaluating it.

Warp's fast winding number (native.winding_number) is evaluated in tiers: a coarse accuracy first,
whose verdict stands where it is clear of the 1/2 threshold by its margin, then Warp's default
accuracy, which always decides (winding_inside, winding_clearance; batched_winding_inside for the
points of one swept step in shared traversals). Far from a surface the bounds of the sign data
decide without evaluating it (open_winding_outside: the surface's area, and outside its box the
rim, rim_escape_bound), and along a swept step the rim chunks bound
how fast the exact winding number can change (rim_slope, rim_settled_lanes: the rim shortcut,
docs/sign_methods.md "Swept samples on open surfaces"). Points are mesh-frame, lengths in m.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.closest_point import UNBOUNDED
from robot_sdf.kernels.mesh_queries import mesh_winding_numbers, winding_number
from robot_sdf.kernels.sign_data import (FACE_OPEN, FACE_SETTLED, box_lower, box_upper, face_winding,
                                         rim_chunk_count, rim_chunk_length,
                                         rim_chunk_lower, rim_chunk_row, rim_chunk_upper, surface_area,
                                         winding_radius)

wp.set_module_options({"enable_backward": False})

# Warp's default accuracy of the fast winding number and the inside threshold of its sign.
WINDING_ACCURACY = wp.constant(2.0)
WINDING_THRESHOLD = wp.constant(0.5)
# The inside test (winding_inside) evaluates the winding number at a coarse accuracy first and
# settles the sign there where it is clear of the threshold by its margin; the rest take Warp's
# default accuracy, so the sign is Warp's own wherever the coarse accuracy stays within its margin
# of it. Measured over 3 M points in, around and near every hard-mesh corpus mesh and the
# perception scan of bench/core_bench.py (docs/sign_methods.md; test/sign_test.py checks half the
# margin): accuracy 1.25 differed from 2.0 by at most 0.084 (sliver box; capsule 0.083, perception
# scan 0.070; margin 0.25, a factor of 3). Accuracy 1.0 is no option: it differed by up to 0.78.
# Per evaluation 1.25 costs about 60 % of 1.5 near a surface and 70 % in free space around the
# perception scan, where every free-space sphere within the winding radius pays one. A middle tier
# (1.5, margin 0.15) was dropped: it settled too few of the points that 1.25 left (on the scan 1.15
# of 3.71 per swept sphere) to pay for itself; without it MeshWorld auto on the scan is 6-7 %
# faster and no corpus mesh slower (docs/history/benchmarks.md).
COARSEST_WINDING_ACCURACY = wp.constant(1.25)
COARSEST_WINDING_SETTLED = wp.constant(0.25)
# Bound on |Warp's winding number at WINDING_ACCURACY - the exact one| that the swept samples'
# shortcut counts twice (docs/sign_methods.md). Measured over the test corpus and the perception
# scan: at most 0.0047 (far-field expansion) farther from the surface than 0.1 % of the mesh's
# size, where sign_test keeps it below half this; closer, float32 rounding of the nearest
# triangles' solid angles reaches 0.022 (arm_link_fine, 60 um), below the 2x this that keeps the
# shortcut's verdict the exact winding number's (sign_test: below 1.5x).
WINDING_APPROXIMATION_ERROR = wp.constant(0.02)


@wp.func
def winding_verdict(w: float, margin: float) -> int:
    """What a winding number at a tier with ``margin`` says: 1 inside, 0 outside, -1 undecided
    (within the margin of the threshold; the last tier, margin 0, always decides)."""
    if w < WINDING_THRESHOLD - margin:
        return 0
    if w > WINDING_THRESHOLD + margin:
        return 1
    if margin == 0.0:
        return 0
    return -1


@wp.func
def winding_clearance(mesh: wp.uint64, p: wp.vec3):
    """(winding_inside(mesh, p), c): c > 0 bounds how far Warp's winding number of p at
    WINDING_ACCURACY is from WINDING_THRESHOLD (a coarse tier's value gives its own distance less
    the tier's margin)."""
    # One loop over the tiers, so that Warp's traversal is inlined once (not once per tier) into
    # the large CPU kernels; the last tier has no margin and always decides.
    accuracy = COARSEST_WINDING_ACCURACY
    margin = COARSEST_WINDING_SETTLED
    while True:
        w = winding_number(mesh, p, accuracy)
        verdict = winding_verdict(w, margin)
        if verdict >= 0:
            return verdict == 1, wp.abs(w - WINDING_THRESHOLD) - margin
        accuracy = WINDING_ACCURACY
        margin = 0.0
    return False, 0.0


@wp.func
def winding_inside(mesh: wp.uint64, p: wp.vec3) -> bool:
    """Warp's winding-number sign (inside above WINDING_THRESHOLD at WINDING_ACCURACY), from the
    coarsest evaluation that is clear of the threshold by its margin."""
    inside, clearance = winding_clearance(mesh, p)
    return inside


@wp.func
def batched_winding_inside(mesh: wp.uint64, p: wp.vec3, seg_prev: wp.vec3, seg_next: wp.vec3, ds: float,
                           n_prev: int, n_next: int, lanes: int) -> int:
    """winding_inside of the points of mesh_closest_points' first traversal of a step (p, then
    n_prev samples towards the previous step, n_next towards the next, s = ds, 2 ds, ...) whose
    bit is set in ``lanes``: bit j set where point j is inside. The same tiers as winding_inside,
    each tier one traversal for the points it has not settled."""
    inside = int(0)
    pending = lanes
    accuracy = COARSEST_WINDING_ACCURACY
    margin = COARSEST_WINDING_SETTLED
    while pending != 0:
        w = mesh_winding_numbers(mesh, p, seg_prev, ds, n_prev, seg_next, ds, n_next, ds, accuracy, pending)
        for j in range(16):
            bit = 1 << j
            if (pending & bit) != 0:
                verdict = winding_verdict(w[j], margin)
                if verdict >= 0:
                    pending = pending ^ bit
                    if verdict == 1:
                        inside = inside | bit
        accuracy = WINDING_ACCURACY
        margin = 0.0
    return inside


@wp.func
def box_gap(lower: wp.vec3, upper: wp.vec3, p: wp.vec3) -> float:
    """Distance (m) from p to the axis-aligned box [lower, upper] (0 inside)."""
    return wp.length(wp.max(wp.max(lower - p, p - upper), wp.vec3(0.0, 0.0, 0.0)))


@wp.func
def rim_escape_bound(mesh: wp.uint64, data: int, p: wp.vec3, spread: float) -> float:
    """A bound on |w(q)| of the exact winding number at every point q within ``spread`` of
    mesh-frame p, where they all lie outside the mesh's box, by the rim chunks
    (robot_sdf.mesh_analysis module docstring, "Rim"); UNBOUNDED where some may not.

    The ray from q straight away from the box (from the box's closest point through q) never meets
    the surface, and w is 0 at its far end, so |w(q)| is at most the integral of the rim's bound
    on |grad w| along it. At distance s along the ray a chunk's box is at least max(g_c - s,
    g + s) away (g_c its distance from q, g the mesh box's, which holds the chunk's box), so chunk
    c adds at most length_c / (4 pi) * (4 / (g_c + g) - 1 / g_c), which falls as either distance
    grows: p's distances less ``spread`` bound it for every q."""
    gap = box_gap(box_lower(mesh, data), box_upper(mesh, data), p) - spread
    if gap <= 0.0:
        return UNBOUNDED
    total = float(0.0)
    for c in range(rim_chunk_count(mesh, data)):
        row = rim_chunk_row(mesh, data, c)
        chunk_gap = wp.max(gap, box_gap(rim_chunk_lower(mesh, row), rim_chunk_upper(mesh, row), p) - spread)
        total += rim_chunk_length(mesh, row) * (4.0 / (chunk_gap + gap) - 1.0 / chunk_gap)
    # float32 rounding of the sum and the distances: far below the margin it is compared with.
    return total * (1.0001 / (4.0 * wp.pi))


@wp.func
def open_winding_outside(mesh: wp.uint64, data: int, p: wp.vec3, searched: float, spread: float) -> bool:
    """Whether every point q within ``spread`` of mesh-frame p that has no surface of the mesh
    within ``searched`` is outside (spread 0: p itself), by the bounds of the exact winding number
    of a surface that is not closed (its winding number may pass 0.5 outside its box): beyond the
    winding radius; |w(q)| <= A / (4 pi d^2) < 1/2 with d q's distance to the surface, at least
    ``searched`` and at least its distance to the box; or, outside the box, rim_escape_bound below
    1/2 by WINDING_APPROXIMATION_ERROR (so that Warp's winding number says outside too)."""
    if wp.length(p) - spread > winding_radius(mesh, data):
        return True
    far = wp.max(searched, box_gap(box_lower(mesh, data), box_upper(mesh, data), p) - spread)
    if surface_area(mesh, data) < 2.0 * wp.pi * far * far:
        return True
    return rim_escape_bound(mesh, data, p, spread) < WINDING_THRESHOLD - WINDING_APPROXIMATION_ERROR


@wp.func
def rim_slope(mesh: wp.uint64, data: int, p: wp.vec3, reach: float) -> float:
    """A bound on |grad w| of the exact winding number everywhere within ``reach`` of mesh-frame
    p off the surface (robot_sdf.mesh_analysis module docstring, "Rim"): (1/4 pi) sum over the rim
    chunks of length / (box distance - reach)^2; UNBOUNDED where a chunk's box comes within reach."""
    total = float(0.0)
    for c in range(rim_chunk_count(mesh, data)):
        row = rim_chunk_row(mesh, data, c)
        gap = box_gap(rim_chunk_lower(mesh, row), rim_chunk_upper(mesh, row), p) - reach
        if gap <= 0.0:
            return UNBOUNDED
        total += rim_chunk_length(mesh, row) / (gap * gap)
    # float32 rounding of the sum and the distances: far below the margin.
    return total * (1.0001 / (4.0 * wp.pi))


@wp.func
def rim_settled_lanes(n_prev: int, n_next: int, len_prev: float, len_next: float, inv_2k: float, apart: float,
                      slope_prev: float, slope_next: float, clearance: float) -> int:
    """Lanes of mesh_closest_points' first traversal of a step (p, n_prev samples at distances
    k inv_2k len_prev, k = 1.., then n_next at k inv_2k len_next) whose inside test Warp's winding
    number decides as it decides p's (docs/sign_methods.md, "Swept samples on open surfaces"): the
    segment from p meets no surface (shorter than ``apart``), and along it the exact winding number
    moves less than p's ``clearance`` (rim_slope of each side's half length, times the distance)
    less twice WINDING_APPROXIMATION_ERROR."""
    lanes = int(0)
    for j in range(1, 16):
        if j <= n_prev + n_next:
            on_prev = j <= n_prev
            reach = float(wp.where(on_prev, j, j - n_prev)) * inv_2k * wp.where(on_prev, len_prev, len_next)
            if reach < apart and reach * wp.where(on_prev, slope_prev, slope_next) \
                    + 2.0 * WINDING_APPROXIMATION_ERROR < clearance:
                lanes = lanes | (1 << j)
    return lanes


@wp.func
def settled_winding_inside(mesh: wp.uint64, data: int, face: int, inner: bool, interior: bool, p: wp.vec3,
                           distance: float) -> int:
    """The winding-number verdict of mesh-frame p from the face row of ``face``, the triangle
    holding its closest surface point or the first one a ray from it meets, ``distance`` (m) away
    with nothing between (``inner``: p is on the inner side of it, by the pseudo-normal of the
    closest feature or the ray's direction; ``interior``: that closest point or hit lies inside
    the face, not on an edge or corner): 1 inside, 0 outside, -1 where the row does not settle it
    (robot_sdf.face_winding).

    On a closed surface the row's outer winding number (+1 on the inner side) holds all the way to
    p (a face whose corners' fans are not clean: for interior points only). On an open surface
    (FACE_OPEN, interior points only) the path from p to the face and along it to where the row was
    evaluated stays within distance + the row's reach of p, where the rim bounds |grad w|
    (rim_slope): the row holds where it is clear of 1/2 by that change, plus three times
    WINDING_APPROXIMATION_ERROR (Warp's value at p, at the row's point, and the inner side's one
    jump taken as 1)."""
    row = face_winding(mesh, face)
    if row[2] == 0.0 or (row[2] != FACE_SETTLED and not interior):
        return -1
    w = row[0] + wp.where(inner, 1.0, 0.0)
    if row[2] == FACE_OPEN:
        reach = distance + row[1]
        margin = rim_slope(mesh, data, p, reach) * reach + 3.0 * WINDING_APPROXIMATION_ERROR
        if wp.abs(w - WINDING_THRESHOLD) <= margin:
            return -1
    return wp.where(w > WINDING_THRESHOLD, 1, 0)
