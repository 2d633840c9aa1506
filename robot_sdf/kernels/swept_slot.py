"""One mesh's share of a swept step's cost (docs/design.md "Swept cost"), in the mesh frame.

A step's samples lie on the segments from its centre p towards the neighbouring steps; per mesh a
sample is skipped where its cost is provably 0 (within the clearance of an evaluated point of its
side: the distance to one mesh is 1-Lipschitz). Two variants, chosen per mesh by the kernel
(swept.swept_sphere_cost_kernel, open_swept_sign):

- swept_slot_cost: closed surfaces with robot_sdf's sign data search p and the samples in shared
  BVH traversals (native.mesh_closest_points); other meshes, and stationary steps, search sample
  after sample.
- open_swept_slot_cost: moving steps on meshes whose sign is not a closed surface's (open
  surfaces, the winding number of an open surface, meshes built elsewhere under Warp's normal
  sign), where a point free of the surface may still be inside and no clearance frees a sample:
  every sample takes the plain query, with p and the samples searched in shared traversals and
  their winding numbers evaluated in shared traversals too, except where the rim shortcut
  (winding.rim_settled_lanes) gives a sample the verdict of p.

p and the segments to the neighbours (m) are rotated and translated by the slot's pose.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.closest_point import UNBOUNDED, closest_feature, signed_result
from robot_sdf.kernels.native import (SWEPT_BATCH, SWEPT_SIDE_BATCH, face_of, mesh_closest_points, vec16,
                                      warp_inside)
from robot_sdf.kernels.sign_data import SIGN_NORMAL, SIGN_WINDING_NUMBER, box_lower, box_upper
from robot_sdf.kernels.signed_distance import (REACH_MARGIN, REACH_SLACK, closed_inside_bound, mesh_sign_method,
                                               mesh_signed_distance, sign_is_closed, warp_tie_margin)
from robot_sdf.kernels.winding import (WINDING_APPROXIMATION_ERROR, batched_winding_inside, open_winding_outside,
                                       rim_settled_lanes, rim_slope, winding_clearance, winding_inside)

wp.set_module_options({"enable_backward": False})


@wp.func
def swept_sample_weight(k: int, sweep_steps: int, n_sides: int) -> float:
    """Quadrature weight of sample k (1..K) of one side of a slot with ``n_sides`` sides.

    Trapezoid rule in time over each half segment [p[t], midpoint], nodes at s_k = k / (2K):
    p[t] weighs 1 / (2K) (set by the caller), inner samples 1 / (K n_sides), the half-way point
    1 / (2K n_sides); the weights of one slot sum to 1. The half-way point is shared with the
    neighbouring step's slot, so along a whole trajectory every node carries the same weight.
    """
    w = 1.0 / (float(sweep_steps) * float(n_sides))
    if k == sweep_steps:
        w = 0.5 * w
    return w


@wp.func
def penetration_cost(sd: float, radius: float, eta: float):
    """cost_i of docs/design.md "Cost definition" for signed distance sd and d cost_i / d (-sd)."""
    d = radius + eta - sd
    cost = float(0.0)
    dcost = float(0.0)
    if d > 0.0:
        dcost = 1.0
        if d <= eta:
            cost = d * d / (2.0 * eta)
            dcost = d / eta
        else:
            cost = d - 0.5 * eta
    return cost, dcost


@wp.func
def side_bit(k: int) -> int:
    """Bit of sample k in a side's evaluation mask (samples beyond 30 share the last bit)."""
    return 1 << wp.min(k, 30)


@wp.func
def batched_feature(mesh: wp.uint64, q: wp.vec3, face: int, data: int, winding: bool):
    """closest_feature of a point whose closest triangle a shared traversal found, signed by the
    pseudo-normal, or on a winding-number mesh by its winding number at q."""
    inside = float(1.0)
    if winding:
        if winding_inside(mesh, q):
            inside = -1.0
    return closest_feature(mesh, q, face, inside, data, not winding)


@wp.func
def swept_slot_cost(
    mesh: wp.uint64,
    cull_radius: float,
    sign_method: int,
    p: wp.vec3,
    seg_prev: wp.vec3,
    seg_next: wp.vec3,
    has_prev: int,
    has_next: int,
    radius: float,
    eta: float,
    max_dist: float,
    bound0: float,
    sweep_steps: int,
    n_sides: int,
):
    """One mesh's share of a step's swept cost, in the mesh frame (p, segments to the neighbours).

    Returns (c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next): the cost at p and its
    gradient, sum_k w_k (c_k - c0) over the samples of both sides, the samples' gradient partials
    w (1 - s) g towards p and w s g towards each neighbour, and per side the samples whose cost
    took a closest point or a full test.

    Skipping is per mesh: a sample is skipped for this mesh when it lies strictly within this
    mesh's clearance of an evaluated point of its side (its share of the cost is provably 0; the
    distance to one mesh is 1-Lipschitz). With robot_sdf's pseudo-normal sign, and with the
    winding number of a closed surface with robot_sdf's sign data (each point found is then
    signed by its winding number; p's inside test in the box is the winding number, not a ray),
    p and the samples of both sides are searched in one BVH traversal (mesh_closest_points; p
    within its bound, the samples within r + eta: their cost needs nothing farther). A sample
    with no surface within r + eta is outside when the last point of its side evaluated is
    outside and too far from the surface for a crossing in between (|sd| + r + eta > their
    distance; closed meshes only); otherwise the full test decides (deep centres are costed).
    Other sign methods search sample after sample, each bound as far as its clearance could
    still free a later sample.
    """
    c0 = float(0.0)
    g0 = wp.vec3(0.0, 0.0, 0.0)
    delta = float(0.0)
    own = wp.vec3(0.0, 0.0, 0.0)
    to_prev = wp.vec3(0.0, 0.0, 0.0)
    to_next = wp.vec3(0.0, 0.0, 0.0)
    mask_prev = int(0)
    mask_next = int(0)
    reach_b = radius + eta
    data, method = mesh_sign_method(mesh, sign_method)
    # Only the sign of a closed surface changes where the surface is crossed: elsewhere (open
    # surfaces; the winding number of an open surface, which passes 0.5 off the surface) a point
    # free of the surface may still be inside, so the clearance of a point frees no sample, and
    # p and every sample take the plain query (max_dist + r + eta), which makes the step's cost
    # the mean of the plain costs at its samples, as defined. (The kernel hands moving steps on
    # such meshes to open_swept_slot_cost where the sign lets their points share traversals.)
    sign_closed = sign_is_closed(mesh, data)
    if not sign_closed:
        bound0 = max_dist
    bound_p = bound0 + radius + eta
    half_len = wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next)) * 0.5
    if cull_radius > 0.0:
        # Beyond the cull sphere by more than any search of the slot reaches: nothing to find,
        # and no point of the slot can be inside (the mesh itself is not touched).
        if wp.length(p) > cull_radius + bound_p + half_len:
            return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
    # A closed winding-number surface (several, overlapping or nested shells: the box bounds its
    # inside) shares the traversal too; the winding number at each point found gives the sign.
    winding = method == SIGN_WINDING_NUMBER and data >= 0 and sign_closed
    # A stationary step keeps the plain query of p, so that it reproduces the plain cost bit for bit.
    batched = sign_closed and (winding or (method == SIGN_NORMAL and data >= 0)) and n_sides > 0 and (
        (has_prev == 1 and wp.length_sq(seg_prev) > 0.0) or (has_next == 1 and wp.length_sq(seg_next) > 0.0))
    inv_2k = float(0.0)
    n_first = int(0)
    batch = vec16()
    found = int(0)
    sd = float(0.0)
    grad_sd = wp.vec3(0.0, 0.0, 0.0)
    # Samples of both sides searched in one more traversal when p is inside deeper than r + eta
    # (deep_batch: side 0's samples deep_lo0 .. deep_hi0 - 1, then side 1's deep_lo1 .. deep_hi1 - 1).
    deep_batch = vec16()
    deep_done = bool(False)
    deep_lo0 = int(0)
    deep_hi0 = int(0)
    deep_lo1 = int(0)
    deep_hi1 = int(0)
    if batched:
        # p (within its bound) and the samples of both sides (within r + eta: their cost needs
        # nothing farther) in one traversal.
        inv_2k = 1.0 / (2.0 * float(sweep_steps))
        n_first = wp.min(sweep_steps, SWEPT_SIDE_BATCH)
        batch = mesh_closest_points(mesh, p, bound_p, seg_prev, inv_2k, has_prev * n_first, seg_next, inv_2k,
                                    has_next * n_first, inv_2k, reach_b, -1.0, False, False)
        face = face_of(batch[0])
        if face >= 0:
            d_vec, dist, inside, outward = batched_feature(mesh, p, face, data, winding)
            sd, grad_sd = signed_result(d_vec, dist, inside, outward)
            found = 1
        else:
            # Nothing within bound_p: outside unless p is deep inside, which only a point in the
            # mesh's box can be (mesh_signed_distance's inside test). One ray decides; where p
            # may be inside, p and the samples of both sides are searched in one traversal, the
            # samples within the Lipschitz bound from p (found for sure, tightened as p's
            # search narrows).
            lo = box_lower(mesh, data)
            hi = box_upper(mesh, data)
            search = float(-1.0)
            if p[0] >= lo[0] and p[1] >= lo[1] and p[2] >= lo[2] and p[0] <= hi[0] and p[1] <= hi[1] and p[2] <= hi[2]:
                if winding:
                    if winding_inside(mesh, p):
                        search = UNBOUNDED
                else:
                    search = closed_inside_bound(mesh, p)
            if search > 0.0:
                deep_batch = mesh_closest_points(mesh, p, search, seg_prev, inv_2k, has_prev * n_first, seg_next,
                                                 inv_2k, has_next * n_first, inv_2k, reach_b, search, True, False)
                face = face_of(deep_batch[0])
                if face >= 0:
                    # inside: the winding number said so (pseudo False keeps it), or the pseudo-normal says
                    d_vec, dist, inside, outward = closest_feature(mesh, p, face, wp.where(winding, -1.0, 1.0), data,
                                                                   not winding)
                    if inside < 0.0:
                        sd, grad_sd = signed_result(d_vec, dist, inside, outward)
                        found = 1
                        deep_done = True
                        deep_lo0 = 1
                        deep_hi0 = 1 + has_prev * n_first
                        deep_lo1 = 1
                        deep_hi1 = 1 + has_next * n_first
    else:
        # p's result is needed within r + eta (its cost) and, as a clearance, out to the farthest
        # sample (half_len): where mesh_signed_distance may search within need first, nothing
        # found there still frees every sample (the clearance below exceeds half_len).
        need_p = wp.min(bound_p, reach_b + half_len * REACH_MARGIN + REACH_SLACK)
        if not sign_closed:
            need_p = reach_b
        found, sd, grad_sd = mesh_signed_distance(mesh, p, bound_p, cull_radius, sign_method, need_p)
        bound_p = need_p
    clearance = bound_p - reach_b
    chain_abs = bound_p
    chain_inside = bool(False)
    if found != 0:
        dc = float(0.0)
        c0, dc = penetration_cost(sd, radius, eta)
        g0 = grad_sd * (-dc)
        clearance = sd - reach_b
        chain_abs = wp.abs(sd)
        chain_inside = sd < 0.0
    if n_sides == 0:
        return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
    inv_2k = 1.0 / (2.0 * float(sweep_steps))
    for side in range(2):
        if (side == 0 and has_prev == 0) or (side == 1 and has_next == 0):
            continue
        segment = seg_prev
        first_entry = 0
        if side == 1:
            segment = seg_next
            first_entry = has_prev * n_first
        seg_len = wp.length(segment)
        free_reach = wp.max(clearance, 0.0)
        last_s = float(0.0)
        last_abs = chain_abs
        last_inside = chain_inside
        # last_abs is the exact distance of the last point evaluated (it was found).
        last_exact = found != 0
        to_neighbour = wp.vec3(0.0, 0.0, 0.0)
        mask = int(0)
        side_batch = vec16()
        batch_start = int(0)
        batch_end = int(0)
        for k in range(1, sweep_steps + 1):
            sk = float(k) * inv_2k
            wk = swept_sample_weight(k, sweep_steps, n_sides)
            # Where the sign is not a closed surface's, no clearance frees a sample (see above).
            if sign_closed and sk * seg_len < free_reach:
                delta -= wk * c0
                continue
            ck = float(0.0)
            gk = wp.vec3(0.0, 0.0, 0.0)
            if seg_len == 0.0:
                # Every sample sits on p: its cost is c0, bit for bit.
                ck = c0
                gk = g0
                mask = mask | side_bit(k)
            else:
                q = p + segment * sk
                search = wp.min(max_dist, (0.5 - sk) * seg_len * REACH_MARGIN + REACH_SLACK) + reach_b
                known = search
                full = bool(True)
                found_k = int(0)
                sd_k = float(0.0)
                grad_k = wp.vec3(0.0, 0.0, 0.0)
                if batched:
                    # Searched within r + eta already: a full test only asks whether it is inside.
                    search = 0.0
                    known = reach_b
                    face = int(-1)
                    covered = k >= batch_start and k < batch_end
                    in_deep = (side == 0 and k >= deep_lo0 and k < deep_hi0) or (
                        side == 1 and k >= deep_lo1 and k < deep_hi1)
                    if covered:
                        face = face_of(side_batch[1 + k - batch_start])
                    elif in_deep:
                        face = face_of(deep_batch[wp.where(side == 0, 1 + k - deep_lo0,
                                                           1 + deep_hi0 - deep_lo0 + k - deep_lo1)])
                    elif k <= n_first:
                        face = face_of(batch[first_entry + k])
                    if face < 0 and not covered and not in_deep and k <= n_first and chain_inside and last_inside \
                            and not deep_done:
                        # p is inside deeper than r + eta: this side's samples from here on and, when
                        # the other side's first sample found nothing within r + eta either, that
                        # side's samples, in one traversal (each within the Lipschitz bound from p:
                        # found for sure, no ray).
                        deep_done = True
                        if side == 0:
                            deep_lo0 = k
                            deep_hi0 = n_first + 1
                            if has_next == 1:
                                if face_of(batch[first_entry + n_first + 1]) < 0:
                                    deep_lo1 = 1
                                    deep_hi1 = n_first + 1
                        else:
                            deep_lo1 = k
                            deep_hi1 = n_first + 1
                        deep_batch = mesh_closest_points(mesh, p, 0.0, seg_prev, float(deep_lo0) * inv_2k,
                                                         deep_hi0 - deep_lo0, seg_next, float(deep_lo1) * inv_2k,
                                                         deep_hi1 - deep_lo1, inv_2k, reach_b, chain_abs, True, False)
                        face = face_of(deep_batch[1])
                        in_deep = True
                    if face < 0 and not covered and not in_deep and (k > n_first or (chain_inside and last_inside)):
                        # The samples from here on, in one more traversal: beyond the first batch,
                        # or p is inside deeper than r + eta (each sample is then searched within
                        # the Lipschitz bound from p: found for sure, no ray).
                        batch_start = k
                        batch_end = wp.min(sweep_steps + 1, k + SWEPT_BATCH)
                        side_batch = mesh_closest_points(mesh, p, 0.0, segment, sk, batch_end - k, segment, 0.0, 0,
                                                         inv_2k, reach_b, wp.where(found != 0, chain_abs, -1.0),
                                                         chain_inside, False)
                        face = face_of(side_batch[1])
                    if face >= 0:
                        d_vec, dist, inside, outward = batched_feature(mesh, q, face, data, winding)
                        sd_k, grad_k = signed_result(d_vec, dist, inside, outward)
                        found_k = 1
                        full = False
                    elif not last_inside and last_abs + reach_b > (sk - last_s) * seg_len:
                        full = False
                if not sign_closed:
                    # The plain query of q (see above), bounded by the last exact distance plus the
                    # distance moved where that is nearer: the closest point lies within it, and a
                    # bound beyond it by Warp's tie tolerance finds the same one (same sign).
                    search = max_dist + reach_b
                    if last_exact:
                        search = wp.min(search, (last_abs + (sk - last_s) * seg_len) * REACH_MARGIN + REACH_SLACK
                                        + warp_tie_margin(mesh))
                if full:
                    found_k, sd_k, grad_k = mesh_signed_distance(mesh, q, search, cull_radius, sign_method,
                                                                 wp.where(sign_closed, search, reach_b))
                if full or found_k != 0:
                    mask = mask | side_bit(k)
                clearance_k = known - reach_b
                last_abs = known
                last_inside = False
                if found_k != 0:
                    dck = float(0.0)
                    ck, dck = penetration_cost(sd_k, radius, eta)
                    gk = grad_k * (-dck)
                    clearance_k = sd_k - reach_b
                    last_abs = wp.abs(sd_k)
                    last_inside = sd_k < 0.0
                last_exact = found_k != 0
                last_s = sk
                free_reach = wp.max(free_reach, sk * seg_len + clearance_k)
            delta += wk * (ck - c0)
            own += gk * (wk * (1.0 - sk))
            to_neighbour += gk * (wk * sk)
        if side == 0:
            to_prev = to_neighbour
            mask_prev = mask
        else:
            to_next = to_neighbour
            mask_next = mask
    return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next


@wp.func
def open_swept_sign(mesh: wp.uint64, sign_method: int) -> bool:
    """Whether open_swept_slot_cost serves a mesh: its sign is not a closed surface's (swept_slot_cost
    then evaluates every sample) and comes from the closest triangle or the winding number."""
    data, method = mesh_sign_method(mesh, sign_method)
    return (not sign_is_closed(mesh, data)) and (method == SIGN_NORMAL or (method == SIGN_WINDING_NUMBER and data >= 0))


# Out of line: inlined, its traversal arrays and long-lived state would join the swept kernel's
# stack frame and spills on the GPU for every mesh (ptxas: kernel spills 748 / 632 B -> 2,636 /
# 2,044 B, sm_90); called, they are paid only on the meshes it serves. On the CPU no slower.
@wp.func(inline=False)
def open_swept_slot_cost(
    mesh: wp.uint64,
    cull_radius: float,
    sign_method: int,
    p: wp.vec3,
    seg_prev: wp.vec3,
    seg_next: wp.vec3,
    has_prev: int,
    has_next: int,
    radius: float,
    eta: float,
    max_dist: float,
    sweep_steps: int,
    n_sides: int,
):
    """swept_slot_cost on a mesh whose sign is not a closed surface's (open_swept_sign) and a
    moving step: the same results (every sample takes the plain query; nothing is skipped), with
    p and the samples searched in shared traversals (mesh_closest_points: on a mesh without sign
    data signed as Warp's normal sign signs them, else by robot_sdf's pseudo-normal or the winding
    number at each point found), each point within its plain query's first bound (the winding
    number's r + eta, else max_dist + r + eta). A point found nothing for takes the plain query,
    bounded by its side's last exact distance plus the distance moved (plus Warp's tie tolerance).
    """
    c0 = float(0.0)
    g0 = wp.vec3(0.0, 0.0, 0.0)
    delta = float(0.0)
    own = wp.vec3(0.0, 0.0, 0.0)
    to_prev = wp.vec3(0.0, 0.0, 0.0)
    to_next = wp.vec3(0.0, 0.0, 0.0)
    mask_prev = int(0)
    mask_next = int(0)
    reach_b = radius + eta
    bound = max_dist + reach_b
    half_len = wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next)) * 0.5
    if cull_radius > 0.0:
        if wp.length(p) > cull_radius + bound + half_len:
            return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
    data, method = mesh_sign_method(mesh, sign_method)
    winding = method == SIGN_WINDING_NUMBER and data >= 0
    reach = wp.where(winding, reach_b * REACH_MARGIN + REACH_SLACK, bound)
    inv_2k = 1.0 / (2.0 * float(sweep_steps))
    n_first = wp.min(sweep_steps, SWEPT_SIDE_BATCH)
    batch = vec16()
    tie_margin = warp_tie_margin(mesh)
    side_batch = vec16()
    batch_start = int(0)
    batch_end = int(0)
    inside_lanes = int(0)
    p_abs = float(-1.0)
    last_abs = float(-1.0)
    last_s = float(0.0)
    to_neighbour = wp.vec3(0.0, 0.0, 0.0)
    mask = int(0)
    # The rim shortcut of the winding number (rim_settled_lanes): p's verdict, once known, and what
    # it settles.
    p_known = bool(False)
    p_inside = bool(False)
    p_clearance = float(0.0)
    p_apart = float(0.0)
    slope_prev = float(0.0)
    slope_next = float(0.0)
    settled = int(0)
    p_delta = wp.vec3(0.0, 0.0, 0.0)
    p_dist = float(0.0)
    p_outward = wp.vec3(0.0, 0.0, 0.0)
    # Point 0 is p, then side 0's samples k = 1..K, then side 1's: one evaluation site for all.
    for i in range(2 * sweep_steps + 1):
        side = wp.where(i > sweep_steps, 1, 0)
        k = i - side * sweep_steps
        if i > 0 and ((side == 0 and has_prev == 0) or (side == 1 and has_next == 0)):
            continue
        segment = wp.where(side == 0, seg_prev, seg_next)
        if k == 1:
            # A side starts: its chain of exact distances starts at p.
            batch_start = 0
            batch_end = 0
            last_abs = p_abs
            last_s = 0.0
            to_neighbour = wp.vec3(0.0, 0.0, 0.0)
            mask = 0
        sk = float(k) * inv_2k
        q = p + segment * sk
        # The traversals, at one call site: first p and up to n_first samples a side, then, where
        # a side has more, SWEPT_BATCH more at a time (within the Lipschitz bound from p).
        first = i == 0
        if first or (k > n_first and k >= batch_end):
            n_more = wp.min(sweep_steps + 1, k + SWEPT_BATCH) - k
            fresh = mesh_closest_points(mesh, p, wp.where(first, reach, 0.0), wp.where(first, seg_prev, segment),
                                        wp.where(first, inv_2k, sk), wp.where(first, has_prev * n_first, n_more),
                                        seg_next, inv_2k, wp.where(first, has_next * n_first, 0), inv_2k, reach,
                                        wp.where(first, -1.0, p_abs), False, data < 0)
            if first:
                batch = fresh
                if winding:
                    # The winding numbers of the points found, in shared traversals too, except
                    # where the rim shortcut gives a sample p's verdict.
                    found_lanes = int(0)
                    for j in range(16):
                        if face_of(batch[j]) >= 0:
                            found_lanes = found_lanes | (1 << j)
                    p_face = face_of(batch[0])
                    # No surface within p_apart of p: a sample nearer p reaches it without crossing.
                    p_apart = reach_b
                    if p_face >= 0:
                        p_delta, p_dist, unused_inside, p_outward = closest_feature(mesh, p, p_face, 1.0, data, False)
                        p_apart = p_dist * 0.9999
                    if has_prev != 0:
                        slope_prev = rim_slope(mesh, data, p, 0.5 * wp.length(seg_prev))
                    if has_next != 0:
                        slope_next = rim_slope(mesh, data, p, 0.5 * wp.length(seg_next))
                    wanted = found_lanes
                    if p_face >= 0 or not open_winding_outside(mesh, data, p, reach_b):
                        wanted = -1
                    # p's winding number is evaluated on its own only where it may settle a
                    # sample (a clearance above 1/2 needs nested surfaces).
                    if rim_settled_lanes(has_prev * n_first, has_next * n_first, wp.length(seg_prev),
                                         wp.length(seg_next), inv_2k, p_apart, slope_prev, slope_next,
                                         0.5) & wanted & ~1 != 0:
                        p_inside, p_clearance = winding_clearance(mesh, p)
                        p_known = True
                        settled = rim_settled_lanes(has_prev * n_first, has_next * n_first, wp.length(seg_prev),
                                                    wp.length(seg_next), inv_2k, p_apart, slope_prev, slope_next,
                                                    p_clearance) | 1
                        found_lanes = found_lanes & ~settled
                    inside_lanes = batched_winding_inside(mesh, p, seg_prev, seg_next, inv_2k, has_prev * n_first,
                                                          has_next * n_first, found_lanes)
                    if p_inside:
                        inside_lanes = inside_lanes | settled
            else:
                side_batch = fresh
                batch_start = k
                batch_end = k + n_more
        entry = batch[0]
        lane = int(0)
        in_side_batch = i > 0 and k >= batch_start and k < batch_end
        if in_side_batch:
            entry = side_batch[1 + k - batch_start]
        elif i > 0:
            lane = side * has_prev * n_first + k
            entry = batch[lane]
        face = face_of(entry)
        found = int(0)
        sd = float(0.0)
        grad_sd = wp.vec3(0.0, 0.0, 0.0)
        # p's verdict holds here (the rim shortcut), for a sample of a later batch too.
        as_p = bool(False)
        if p_known:
            if in_side_batch:
                reach_q = sk * wp.length(segment)
                as_p = reach_q < p_apart and reach_q * wp.where(side == 0, slope_prev, slope_next) \
                    + 2.0 * WINDING_APPROXIMATION_ERROR < p_clearance
            else:
                as_p = ((settled >> lane) & 1) != 0
        if face >= 0:
            inside_q = warp_inside(entry)
            if winding:
                if in_side_batch and not as_p:
                    inside_q = wp.where(winding_inside(mesh, q), -1.0, 1.0)
                elif in_side_batch:
                    inside_q = wp.where(p_inside, -1.0, 1.0)
                else:
                    inside_q = wp.where(((inside_lanes >> lane) & 1) != 0, -1.0, 1.0)
            if i == 0 and winding:
                sd, grad_sd = signed_result(p_delta, p_dist, inside_q, p_outward)
            else:
                d_vec, dist, inside, outward = closest_feature(mesh, q, face, inside_q, data,
                                                               data >= 0 and not winding)
                sd, grad_sd = signed_result(d_vec, dist, inside, outward)
            found = 1
        elif as_p and not p_inside:
            # Outside and nothing within r + eta: no cost, as mesh_signed_distance would find.
            found = 0
        else:
            search = bound
            if last_abs >= 0.0:
                # The closest point lies within the last exact distance plus the distance moved,
                # and a bound beyond it by Warp's tie tolerance finds the same one (same sign).
                search = wp.min(search, (last_abs + (sk - last_s) * wp.length(segment)) * REACH_MARGIN
                                + REACH_SLACK + tie_margin)
            found, sd, grad_sd = mesh_signed_distance(mesh, q, search, cull_radius, sign_method, reach_b)
        c = float(0.0)
        g = wp.vec3(0.0, 0.0, 0.0)
        last_abs = -1.0
        if found != 0:
            dc = float(0.0)
            c, dc = penetration_cost(sd, radius, eta)
            g = grad_sd * (-dc)
            last_abs = wp.abs(sd)
        last_s = sk
        if i == 0:
            c0 = c
            g0 = g
            p_abs = last_abs
            continue
        wk = swept_sample_weight(k, sweep_steps, n_sides)
        delta += wk * (c - c0)
        own += g * (wk * (1.0 - sk))
        to_neighbour += g * (wk * sk)
        mask = mask | side_bit(k)
        if k == sweep_steps:
            if side == 0:
                to_prev = to_neighbour
                mask_prev = mask
            else:
                to_next = to_neighbour
                mask_next = mask
    return c0, g0, delta, own, to_prev, to_next, mask_prev, mask_next
