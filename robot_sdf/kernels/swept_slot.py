"""One mesh's share of a swept step's cost (docs/design.md "Swept cost"), in the mesh frame (p and
the segments to the neighbouring steps (m) moved by the slot's pose). A sample is skipped where
its cost is provably 0 (within the clearance of an evaluated point of its side: the distance to
one mesh is 1-Lipschitz). Two variants, chosen per mesh by swept.swept_step_cost (open_swept_sign):
swept_slot_cost, where closed surfaces with robot_sdf's sign data search p and the samples in
shared BVH traversals (native.mesh_closest_points) and other meshes and stationary steps search
sample after sample; and open_swept_slot_cost, for moving steps on meshes whose sign is not a
closed surface's (open surfaces, an open surface's winding number, meshes built elsewhere under
Warp's normal sign), where no clearance frees a sample: every sample takes the plain query, in
shared traversals, the winding numbers too unless the rim shortcut (winding.rim_settled_lanes)
gives a sample p's verdict.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.closest_point import UNBOUNDED, closest_feature, closest_feature_face, signed_result
from robot_sdf.kernels.mesh_queries import (SWEPT_BATCH, SWEPT_SIDE_BATCH, face_of, mesh_closest_points, vec16,
                                            warp_inside)
from robot_sdf.kernels.plain_cost import penetration_cost
from robot_sdf.kernels.sign_data import SIGN_NORMAL, SIGN_WINDING_NUMBER, box_lower, box_upper, has_slivers
from robot_sdf.kernels.signed_distance import (REACH_MARGIN, REACH_SLACK, closed_inside_bound, deep_winding_inside,
                                               mesh_sign_method, mesh_signed_distance, out_of_reach, sign_is_closed,
                                               warp_tie_margin, winding_feature)
from robot_sdf.kernels.winding import (WINDING_APPROXIMATION_ERROR, batched_winding_inside, box_gap,
                                       open_winding_outside, rim_settled_lanes, rim_slope, settled_winding_inside,
                                       winding_clearance, winding_inside)
from robot_sdf.kernels.warp_release import OUT_OF_LINE

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
def side_bit(k: int) -> int:
    """Bit of sample k in a side's evaluation mask (samples beyond 30 share the last bit)."""
    return 1 << wp.min(k, 30)


@wp.func
def batched_feature(mesh: wp.uint64, data: int, q: wp.vec3, face: int, winding: bool):
    """closest_feature of a point whose closest triangle a shared traversal found, signed by the
    pseudo-normal, or on a winding-number mesh (sign data at ``data``) by its winding number at q
    (winding_feature)."""
    if winding:
        return winding_feature(mesh, data, q, face)
    return closest_feature(mesh, q, face, 1.0, True)


@wp.struct
class SweptBatches:
    """The shared BVH traversals of one mesh's swept step on swept_slot_cost's batched path
    (mesh_closest_points: lane 0 the centre p, then samples), and the samples each covers; a
    side's samples are counted from k = 1. swept_centre makes it, once per mesh and step;
    swept_slot_cost then writes its fields in place and passes it to functions that only read it:
    a function returning it, or an assignment of it in a branch, copies it whole (Warp's code
    merges the values each branch assigns), which, once per sample, was measurable in the swept
    cost of contact-heavy trajectories."""

    first: vec16  # p, then side 0's samples 1 .. n_first, then side 1's (lanes of the sides that exist)
    n_first: int
    # Where p is inside deeper than r + eta: side 0's samples deep_lo0 .. deep_hi0 - 1, then side 1's
    # deep_lo1 .. deep_hi1 - 1 (each side's range empty until searched).
    deep: vec16
    deep_done: bool
    deep_lo0: int
    deep_hi0: int
    deep_lo1: int
    deep_hi1: int
    # The current side's samples side_start .. side_end - 1 (lanes 1 ..), searched beyond the others.
    side: vec16
    side_start: int
    side_end: int


@wp.struct
class SideChain:
    """What swept_slot_cost carries along one side from sample to sample: the last point
    evaluated (its fraction s, its exact distance or the bound it was found beyond, whether it
    is inside, whether that distance is exact), the reach freed by the clearances so far, and the
    side's evaluation mask."""

    last_s: float
    last_abs: float
    last_inside: bool
    last_exact: bool
    free_reach: float
    mask: int


@wp.struct
class SweptSlotResult:
    """One mesh's share of a swept step's cost, unweighted (swept_slot_cost, open_swept_slot_cost:
    vectors in the mesh frame), or the step's sum over the meshes of its environment
    (swept.swept_step_cost: vectors in the world frame, masks or-ed). Costs in m (the penetration
    cost of docs/design.md), gradients d cost / d position (m/m); for sample k of a side at
    fraction s_k = k / (2K) with quadrature weight w_k (swept_sample_weight) and cost c_k,
    gradient g_k:"""

    centre_cost: float  # c0: the cost at the step's centre p
    centre_grad: wp.vec3  # g0: its gradient
    sample_delta: float  # sum_k w_k (c_k - c0) over the samples of both sides
    own: wp.vec3  # sum_k w_k (1 - s_k) g_k: the samples' partials towards p
    to_prev: wp.vec3  # sum_k w_k s_k g_k over the previous side's samples: towards that neighbour
    to_next: wp.vec3  # the same over the next side's samples
    mask_prev: int  # bit side_bit(k): the previous side's sample k took a closest point or a full test
    mask_next: int  # the same for the next side


@wp.func
def swept_regime(mesh: wp.uint64, sign_method: int, seg_prev: wp.vec3, seg_next: wp.vec3, has_prev: int,
                 has_next: int):
    """How swept_slot_cost evaluates a mesh: (its sign data offset, whether its sign is a closed
    surface's, whether a closed winding-number surface, whether p and the samples share
    traversals). Only a closed surface's sign changes only where the surface is crossed:
    elsewhere a point free of the surface may still be inside, so no clearance frees a sample and
    every sample takes the plain query (max_dist + r + eta): the step's cost is the mean of the
    plain costs at its samples, as defined. A closed winding-number surface (overlapping or nested
    shells: the box bounds its inside) shares the traversals, each point found signed by its
    winding number. A stationary step keeps p's plain query: the plain cost bit for bit."""
    data, method = mesh_sign_method(mesh, sign_method)
    sign_closed = sign_is_closed(mesh, data)
    winding = method == SIGN_WINDING_NUMBER and data >= 0 and sign_closed
    batched = sign_closed and (winding or (method == SIGN_NORMAL and data >= 0)) and has_prev + has_next > 0 and (
        (has_prev == 1 and wp.length_sq(seg_prev) > 0.0) or (has_next == 1 and wp.length_sq(seg_next) > 0.0))
    return data, sign_closed, winding, batched


@wp.func
def side_chain_start(clearance: float, chain_abs: float, chain_inside: bool, found: int) -> SideChain:
    """A side's chain at its start, p: the reach p's clearance frees, p's distance (exact when
    found, else the bound it was searched to) and whether p is inside."""
    chain = SideChain()
    chain.free_reach = wp.max(clearance, 0.0)
    chain.last_s = 0.0
    chain.last_abs = chain_abs
    chain.last_inside = chain_inside
    chain.last_exact = found != 0
    chain.mask = 0
    return chain


@wp.func
def swept_centre(mesh: wp.uint64, cull_radius: float, sign_method: int, p: wp.vec3, seg_prev: wp.vec3,
                 seg_next: wp.vec3, has_prev: int, has_next: int, reach_b: float, bound_p: float, half_len: float,
                 sweep_steps: int, data: int, sign_closed: bool, winding: bool, batched: bool):
    """swept_slot_cost's query of the step's centre p: (found, sd, grad_sd, the bound p's result
    holds to, the traversals). Batched: p within its bound and the samples of both sides within
    r + eta in one traversal; where nothing is within p's bound and p may be deep inside (in the
    mesh's box, one ray or its winding number says so), p and the samples in one more traversal.
    Otherwise mesh_signed_distance, within what the cost and the clearance of the farthest sample
    need."""
    batches = SweptBatches()
    found = int(0)
    sd = float(0.0)
    grad_sd = wp.vec3(0.0, 0.0, 0.0)
    if batched:
        # p (within its bound) and the samples of both sides (within r + eta: their cost needs
        # nothing farther) in one traversal.
        inv_2k = 1.0 / (2.0 * float(sweep_steps))
        n_first = wp.min(sweep_steps, SWEPT_SIDE_BATCH)
        batches.n_first = n_first
        batches.first = mesh_closest_points(mesh, p, bound_p, seg_prev, inv_2k, has_prev * n_first, seg_next, inv_2k,
                                            has_next * n_first, inv_2k, reach_b, -1.0, False, False,
                                            has_slivers(mesh, data))
        face = face_of(batches.first[0])
        if face >= 0:
            d_vec, dist, inside, outward = batched_feature(mesh, data, p, face, winding)
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
                    if deep_winding_inside(mesh, data, p):
                        search = UNBOUNDED
                else:
                    search = closed_inside_bound(mesh, p)
            if search > 0.0:
                batches.deep = mesh_closest_points(mesh, p, search, seg_prev, inv_2k, has_prev * n_first, seg_next,
                                                   inv_2k, has_next * n_first, inv_2k, reach_b, search, True, False,
                                                   has_slivers(mesh, data))
                face = face_of(batches.deep[0])
                if face >= 0:
                    # inside: the winding number said so (pseudo False keeps it), or the pseudo-normal says
                    d_vec, dist, inside, outward = closest_feature(mesh, p, face, wp.where(winding, -1.0, 1.0),
                                                                   not winding)
                    if inside < 0.0:
                        sd, grad_sd = signed_result(d_vec, dist, inside, outward)
                        found = 1
                        batches.deep_done = True
                        batches.deep_lo0 = 1
                        batches.deep_hi0 = 1 + has_prev * n_first
                        batches.deep_lo1 = 1
                        batches.deep_hi1 = 1 + has_next * n_first
    else:
        # p's result is needed within r + eta (its cost) and, as a clearance, out to the farthest
        # sample (half_len): where mesh_signed_distance may search within need first, nothing
        # found there still frees every sample (the clearance below exceeds half_len).
        need_p = wp.min(bound_p, reach_b + half_len * REACH_MARGIN + REACH_SLACK)
        if not sign_closed:
            need_p = reach_b
        found, sd, grad_sd = mesh_signed_distance(mesh, p, bound_p, cull_radius, sign_method, need_p)
        bound_p = need_p
    return found, sd, grad_sd, bound_p, batches


# The traversal a sample on swept_slot_cost's batched path still needs (batched_face).
NO_TRAVERSAL = wp.constant(0)  # none: a traversal made already found its face, or decides it
DEEP_TRAVERSAL = wp.constant(1)  # the deep one: p is inside deeper than r + eta (deep_sample_ranges)
SIDE_TRAVERSAL = wp.constant(2)  # one of this side's samples from here on


@wp.func
def batched_face(batches: SweptBatches, side: int, k: int, has_prev: int, p_inside: bool, last_inside: bool):
    """(face, traversal) of sample k of a side on swept_slot_cost's batched path: the closest
    triangle the traversal that covers it found (-1 for none), and the traversal it still needs:
    where a sample searched within r + eta at most found nothing, the deep one if p (``p_inside``)
    and the side's last point evaluated (``last_inside``) are inside, once per step (this side's
    samples on, and the other's its first missed), else this side's samples on; inside p they are searched
    within the Lipschitz bound from p (found for sure), else within r + eta or that bound."""
    n_first = batches.n_first
    covered = k >= batches.side_start and k < batches.side_end
    in_deep = (side == 0 and k >= batches.deep_lo0 and k < batches.deep_hi0) or (
        side == 1 and k >= batches.deep_lo1 and k < batches.deep_hi1)
    face = int(-1)
    if covered:
        face = face_of(batches.side[1 + k - batches.side_start])
    elif in_deep:
        face = face_of(batches.deep[wp.where(side == 0, 1 + k - batches.deep_lo0,
                                             1 + batches.deep_hi0 - batches.deep_lo0 + k - batches.deep_lo1)])
    elif k <= n_first:
        face = face_of(batches.first[wp.where(side == 1, has_prev * n_first, 0) + k])
    traversal = int(NO_TRAVERSAL)
    if face < 0 and not (covered or in_deep):
        deep_now = k <= n_first and p_inside and last_inside
        if deep_now and not batches.deep_done:
            traversal = DEEP_TRAVERSAL
        elif k > n_first or deep_now:
            traversal = SIDE_TRAVERSAL
    return face, traversal


@wp.func
def deep_sample_ranges(side: int, k: int, has_next: int, n_first: int, next_first_face: int):
    """(lo0, hi0, lo1, hi1): the samples of the deep traversal that sample k of ``side`` starts
    (p inside deeper than r + eta): this side's from k on and, when the other side's first sample
    (its face in the first traversal: next_first_face) found nothing within r + eta either, that
    side's; each range lo .. hi - 1, empty when lo == hi."""
    if side == 0:
        if has_next == 1 and next_first_face < 0:
            return k, n_first + 1, 1, n_first + 1
        return k, n_first + 1, 0, 0
    return 0, 0, k, n_first + 1


@wp.func
def batched_result(mesh: wp.uint64, data: int, q: wp.vec3, face: int, winding: bool, chain: SideChain, sk: float,
                   seg_len: float, reach_b: float):
    """(found, sd, grad_sd, whether the full test must still decide) of a sample at q on
    swept_slot_cost's batched path from its closest face (-1 for none within its traversal's
    reach): nothing within r + eta needs the full test only where the last point of the side
    evaluated is inside or near enough for a crossing in between."""
    if face >= 0:
        d_vec, dist, inside, outward = batched_feature(mesh, data, q, face, winding)
        sd, grad_sd = signed_result(d_vec, dist, inside, outward)
        return int(1), sd, grad_sd, False
    full = chain.last_inside or chain.last_abs + reach_b <= (sk - chain.last_s) * seg_len
    return int(0), float(0.0), wp.vec3(0.0, 0.0, 0.0), full


@wp.func
def swept_sample(mesh: wp.uint64, cull_radius: float, sign_method: int, p: wp.vec3, seg_prev: wp.vec3,
                 seg_next: wp.vec3, segment: wp.vec3, side: int, k: int, sk: float, has_prev: int, has_next: int,
                 radius: float, eta: float, max_dist: float, sweep_steps: int, sign_closed: bool, batched: bool,
                 found_k: int, sd_k: float, grad_k: wp.vec3, full: bool, chain: SideChain):
    """Cost and cost gradient (mesh frame) of sample k of a side that no clearance skipped, with
    the side's chain brought up to date: (ck, gk, chain). Batched, the traversals gave its closest
    point within r + eta (batched_result's found_k, sd_k, grad_k, and whether the full test must
    still decide); else, and where the full test must decide, mesh_signed_distance: on a closed
    surface within what a later sample's clearance could use, elsewhere the plain query."""
    reach_b = radius + eta
    seg_len = wp.length(segment)
    q = p + segment * sk
    search = wp.min(max_dist, (0.5 - sk) * seg_len * REACH_MARGIN + REACH_SLACK) + reach_b
    known = search
    if batched:
        # Searched within r + eta already: a full test only asks whether it is inside.
        search = 0.0
        known = reach_b
    if not sign_closed:
        # The plain query of q (see swept_slot_cost), bounded by the last exact distance plus the
        # distance moved where that is nearer: the closest point lies within it, and a bound
        # beyond it by Warp's tie tolerance finds the same one (same sign).
        search = max_dist + reach_b
        if chain.last_exact:
            search = wp.min(search, (chain.last_abs + (sk - chain.last_s) * seg_len) * REACH_MARGIN + REACH_SLACK
                            + warp_tie_margin(mesh))
    if full:
        found_k, sd_k, grad_k = mesh_signed_distance(mesh, q, search, cull_radius, sign_method,
                                                     wp.where(sign_closed, search, reach_b))
    if full or found_k != 0:
        chain.mask = chain.mask | side_bit(k)
    ck = float(0.0)
    gk = wp.vec3(0.0, 0.0, 0.0)
    clearance_k = known - reach_b
    chain.last_abs = known
    chain.last_inside = False
    if found_k != 0:
        dck = float(0.0)
        ck, dck, _ = penetration_cost(sd_k, radius, eta)
        gk = grad_k * (-dck)
        clearance_k = sd_k - reach_b
        chain.last_abs = wp.abs(sd_k)
        chain.last_inside = sd_k < 0.0
    chain.last_exact = found_k != 0
    chain.last_s = sk
    chain.free_reach = wp.max(chain.free_reach, sk * seg_len + clearance_k)
    return ck, gk, chain


@wp.func
def centre_chain(found: int, sd: float, grad_sd: wp.vec3, bound_p: float, radius: float, eta: float):
    """(c0, g0, clearance, p_abs, p_inside) of the step's centre p from swept_centre's result (found,
    sd, grad_sd, the bound p's result holds to): its cost and gradient, the clearance (m) beyond
    r + eta that frees samples near p, its distance (exact when found, else that bound) and whether
    it is inside; the start of each side's chain (side_chain_start)."""
    reach_b = radius + eta
    c0 = float(0.0)
    g0 = wp.vec3(0.0, 0.0, 0.0)
    clearance = bound_p - reach_b
    p_abs = bound_p
    p_inside = bool(False)
    if found != 0:
        dc = float(0.0)
        c0, dc, _ = penetration_cost(sd, radius, eta)
        g0 = grad_sd * (-dc)
        clearance = sd - reach_b
        p_abs = wp.abs(sd)
        p_inside = sd < 0.0
    return c0, g0, clearance, p_abs, p_inside


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
) -> SweptSlotResult:
    """One mesh's share of a step's swept cost, in the mesh frame (p, segments to the neighbours;
    m): the cost at p and its gradient, and what the samples of both sides add (SweptSlotResult).

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
    result = SweptSlotResult()
    reach_b = radius + eta
    data, sign_closed, winding, batched = swept_regime(mesh, sign_method, seg_prev, seg_next, has_prev, has_next)
    if not sign_closed:
        bound0 = max_dist
    bound_p = bound0 + radius + eta
    half_len = wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next)) * 0.5
    if out_of_reach(mesh, data, cull_radius, p, bound_p + half_len):
        # Beyond any search of the slot: nothing to find, and no point of the slot can be inside.
        return result
    found, sd, grad_sd, bound_p, batches = swept_centre(mesh, cull_radius, sign_method, p, seg_prev, seg_next,
                                                        has_prev, has_next, reach_b, bound_p, half_len, sweep_steps,
                                                        data, sign_closed, winding, batched)
    c0, g0, clearance, p_abs, p_inside = centre_chain(found, sd, grad_sd, bound_p, radius, eta)
    result.centre_cost = c0
    result.centre_grad = g0
    if n_sides == 0:
        return result
    inv_2k = 1.0 / (2.0 * float(sweep_steps))
    delta = float(0.0)
    own = wp.vec3(0.0, 0.0, 0.0)
    for side in range(2):
        if (side == 0 and has_prev == 0) or (side == 1 and has_next == 0):
            continue
        segment = wp.where(side == 1, seg_next, seg_prev)
        seg_len = wp.length(segment)
        chain = side_chain_start(clearance, p_abs, p_inside, found)
        batches.side_start = 0
        batches.side_end = 0
        to_neighbour = wp.vec3(0.0, 0.0, 0.0)
        for k in range(1, sweep_steps + 1):
            sk = float(k) * inv_2k
            wk = swept_sample_weight(k, sweep_steps, n_sides)
            # Where the sign is not a closed surface's, no clearance frees a sample (see above).
            if sign_closed and sk * seg_len < chain.free_reach:
                delta -= wk * c0
                continue
            ck = c0
            gk = g0
            if seg_len == 0.0:
                # Every sample sits on p: its cost is c0, bit for bit.
                chain.mask = chain.mask | side_bit(k)
            else:
                found_k = int(0)
                sd_k = float(0.0)
                grad_k = wp.vec3(0.0, 0.0, 0.0)
                full = bool(True)
                if batched:
                    # The sample's closest face from the traversal that covers it, where needed from
                    # one more (batched_face says which).
                    face, traversal = batched_face(batches, side, k, has_prev, p_inside, chain.last_inside)
                    if traversal == DEEP_TRAVERSAL:
                        lo0, hi0, lo1, hi1 = deep_sample_ranges(
                            side, k, has_next, batches.n_first, face_of(batches.first[has_prev * batches.n_first + 1]))
                        batches.deep_done = True
                        batches.deep_lo0 = lo0
                        batches.deep_hi0 = hi0
                        batches.deep_lo1 = lo1
                        batches.deep_hi1 = hi1
                        batches.deep = mesh_closest_points(mesh, p, 0.0, seg_prev, float(lo0) * inv_2k, hi0 - lo0,
                                                           seg_next, float(lo1) * inv_2k, hi1 - lo1, inv_2k, reach_b,
                                                           p_abs, True, False, has_slivers(mesh, data))
                        face = face_of(batches.deep[1])
                    elif traversal == SIDE_TRAVERSAL:
                        batches.side_start = k
                        batches.side_end = wp.min(sweep_steps + 1, k + SWEPT_BATCH)
                        batches.side = mesh_closest_points(mesh, p, 0.0, segment, sk, batches.side_end - k, segment,
                                                           0.0, 0, inv_2k, reach_b, wp.where(found != 0, p_abs, -1.0),
                                                           p_inside, False, has_slivers(mesh, data))
                        face = face_of(batches.side[1])
                    found_k, sd_k, grad_k, full = batched_result(mesh, data, p + segment * sk, face, winding, chain,
                                                                 sk, seg_len, reach_b)
                ck, gk, chain = swept_sample(mesh, cull_radius, sign_method, p, seg_prev, seg_next, segment, side, k,
                                             sk, has_prev, has_next, radius, eta, max_dist, sweep_steps, sign_closed,
                                             batched, found_k, sd_k, grad_k, full, chain)
            delta += wk * (ck - c0)
            own += gk * (wk * (1.0 - sk))
            to_neighbour += gk * (wk * sk)
        if side == 0:
            result.to_prev = to_neighbour
            result.mask_prev = chain.mask
        else:
            result.to_next = to_neighbour
            result.mask_next = chain.mask
    result.sample_delta = delta
    result.own = own
    return result


@wp.func
def open_swept_sign(mesh: wp.uint64, sign_method: int) -> bool:
    """Whether open_swept_slot_cost serves a mesh: its sign is not a closed surface's (swept_slot_cost
    then evaluates every sample) and comes from the closest triangle or the winding number."""
    data, method = mesh_sign_method(mesh, sign_method)
    return (not sign_is_closed(mesh, data)) and (method == SIGN_NORMAL or (method == SIGN_WINDING_NUMBER and data >= 0))


@wp.struct
class RimShortcut:
    """open_swept_slot_cost's winding-number state of a step (open_centre_windings): p's verdict
    once known (known, inside, clearance), whether every point of the first traversal that found
    nothing within its reach is outside by the far bounds (free_outside), the distance p_apart within which no surface lies, the
    rim slopes towards each neighbour, the lanes of the first traversal that take p's verdict
    (settled), those found inside, and p's closest feature (delta, dist, outward)."""

    known: bool
    free_outside: bool
    inside: bool
    clearance: float
    apart: float
    slope_prev: float
    slope_next: float
    settled: int
    inside_lanes: int
    delta: wp.vec3
    dist: float
    outward: wp.vec3


@wp.struct
class LaterBatch:
    """open_swept_slot_cost's traversal of a side's samples beyond the first traversal: its entries
    (lane 1 on: samples start .. end - 1; mesh_closest_points)."""

    entries: vec16
    start: int
    end: int


@wp.func
def open_centre_windings(mesh: wp.uint64, data: int, p: wp.vec3, seg_prev: wp.vec3, seg_next: wp.vec3,
                         has_prev: int, has_next: int, n_first: int, inv_2k: float, reach_b: float,
                         batch: vec16) -> RimShortcut:
    """The winding numbers of the points the first traversal found (p, then up to n_first samples
    a side), in shared traversals too (batched_winding_inside), except where the rim shortcut
    (rim_settled_lanes) gives a sample p's verdict or the face row of a point's closest face
    settles it (settled_winding_inside); p's own winding number is evaluated only where it may
    settle a sample (a clearance above 1/2 needs nested surfaces)."""
    rim = RimShortcut()
    found_lanes = int(0)
    for j in range(16):
        if face_of(batch[j]) >= 0:
            found_lanes = found_lanes | (1 << j)
    p_face = face_of(batch[0])
    # No surface within apart of p: a sample nearer p reaches it without crossing.
    rim.apart = reach_b
    if p_face >= 0:
        p_delta, p_dist, unused_inside, p_outward = closest_feature(mesh, p, p_face, 1.0, False)
        rim.delta = p_delta
        rim.dist = p_dist
        rim.outward = p_outward
        rim.apart = p_dist * 0.9999
    # Every point of the step lies within half the longer segment of p.
    spread = 0.5 * wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next))
    rim.free_outside = open_winding_outside(mesh, data, p, reach_b, spread)
    # Samples whose verdict p's may give: those found near a surface, and every one unless the far
    # bounds declare those that found nothing outside.
    wanted = found_lanes
    if p_face >= 0 or not rim.free_outside:
        wanted = -1
    if wanted & ~1 != 0:
        if has_prev != 0:
            rim.slope_prev = rim_slope(mesh, data, p, 0.5 * wp.length(seg_prev))
        if has_next != 0:
            rim.slope_next = rim_slope(mesh, data, p, 0.5 * wp.length(seg_next))
    if wanted & ~1 != 0 and rim_settled_lanes(has_prev * n_first, has_next * n_first, wp.length(seg_prev),
                                              wp.length(seg_next), inv_2k, rim.apart, rim.slope_prev,
                                              rim.slope_next, 0.5) & wanted & ~1 != 0:
        p_inside, p_clearance = winding_clearance(mesh, p)
        rim.inside = p_inside
        rim.clearance = p_clearance
        rim.known = True
        rim.settled = rim_settled_lanes(has_prev * n_first, has_next * n_first, wp.length(seg_prev),
                                        wp.length(seg_next), inv_2k, rim.apart, rim.slope_prev, rim.slope_next,
                                        rim.clearance) | 1
        found_lanes = found_lanes & ~rim.settled
    # Found points whose closest face's row settles them (settled_winding_inside) need no winding
    # number. A loop of variable length: Warp would unroll a fixed one 16 times.
    n_prev = has_prev * n_first
    row_inside = int(0)
    for j in range(1 + n_prev + has_next * n_first):
        bit = 1 << j
        if (found_lanes & bit) != 0:
            q = p
            if j > 0:
                on_prev = j <= n_prev
                q = p + wp.where(on_prev, seg_prev, seg_next) * (float(wp.where(on_prev, j, j - n_prev)) * inv_2k)
            delta, dist, side, outward, closest, feature = closest_feature_face(mesh, q, face_of(batch[j]), 1.0, True)
            verdict = settled_winding_inside(mesh, data, closest, side < 0.0, feature == 0, q, dist)
            if verdict >= 0:
                found_lanes = found_lanes ^ bit
                if verdict == 1:
                    row_inside = row_inside | bit
    rim.inside_lanes = batched_winding_inside(mesh, p, seg_prev, seg_next, inv_2k, n_prev, has_next * n_first,
                                              found_lanes) | row_inside
    if rim.inside:
        rim.inside_lanes = rim.inside_lanes | rim.settled
    return rim


@wp.func
def open_traversal(mesh: wp.uint64, p: wp.vec3, first: bool, k: int, sk: float, segment: wp.vec3, seg_prev: wp.vec3,
                   seg_next: wp.vec3, has_prev: int, has_next: int, n_first: int, sweep_steps: int, inv_2k: float,
                   reach: float, p_abs: float, data: int):
    """(lanes, samples searched) of one of open_swept_slot_cost's shared traversals: the first (p
    within ``reach``, up to n_first samples a side), else the side's samples from k on, up to
    SWEPT_BATCH of them, each within the Lipschitz bound from p (p's distance p_abs)."""
    n_more = wp.min(sweep_steps + 1, k + SWEPT_BATCH) - k
    fresh = mesh_closest_points(mesh, p, wp.where(first, reach, 0.0), wp.where(first, seg_prev, segment),
                                wp.where(first, inv_2k, sk), wp.where(first, has_prev * n_first, n_more),
                                seg_next, inv_2k, wp.where(first, has_next * n_first, 0), inv_2k, reach,
                                wp.where(first, -1.0, p_abs), False, data < 0, has_slivers(mesh, data))
    return fresh, n_more


@wp.func
def open_entry(batch: vec16, side_batch: vec16, i: int, k: int, side: int, has_prev: int, n_first: int,
               batch_start: int, batch_end: int):
    """(traversal entry, lane of the first traversal, whether from the side's later traversal) of
    point i of open_swept_slot_cost's step (sample k of ``side``; i = 0: p)."""
    entry = batch[0]
    lane = int(0)
    in_side_batch = i > 0 and k >= batch_start and k < batch_end
    if in_side_batch:
        entry = side_batch[1 + k - batch_start]
    elif i > 0:
        lane = side * has_prev * n_first + k
        entry = batch[lane]
    return entry, lane, in_side_batch


@wp.func
def open_point(mesh: wp.uint64, cull_radius: float, sign_method: int, q: wp.vec3, i: int, side: int, sk: float,
               segment: wp.vec3, entry: float, lane: int, in_side_batch: bool, winding: bool, data: int,
               rim: RimShortcut, bound: float, reach_b: float, last_abs: float, last_s: float, tie_margin: float):
    """(found, sd, grad_sd) of point i of open_swept_slot_cost's step (q: p for i = 0, else sample
    sk of ``side``) from its traversal entry (lane ``lane`` of the first traversal, or of the
    side's later one): signed as the mesh's sign says, by the winding numbers evaluated in
    shared traversals, or by p's verdict where the rim shortcut gives it; found nothing for, the
    plain query, bounded by the side's last exact distance plus the distance moved (plus Warp's
    tie tolerance)."""
    face = face_of(entry)
    found = int(0)
    sd = float(0.0)
    grad_sd = wp.vec3(0.0, 0.0, 0.0)
    # p's verdict holds here (the rim shortcut), for a sample of a later batch too.
    as_p = bool(False)
    if rim.known:
        if in_side_batch:
            reach_q = sk * wp.length(segment)
            as_p = reach_q < rim.apart and reach_q * wp.where(side == 0, rim.slope_prev, rim.slope_next) \
                + 2.0 * WINDING_APPROXIMATION_ERROR < rim.clearance
        else:
            as_p = ((rim.settled >> lane) & 1) != 0
    if face >= 0:
        inside_q = warp_inside(entry)
        if winding:
            if in_side_batch and not as_p:
                inside_q = wp.where(winding_inside(mesh, q), -1.0, 1.0)
            elif in_side_batch:
                inside_q = wp.where(rim.inside, -1.0, 1.0)
            else:
                inside_q = wp.where(((rim.inside_lanes >> lane) & 1) != 0, -1.0, 1.0)
        if i == 0 and winding:
            sd, grad_sd = signed_result(rim.delta, rim.dist, inside_q, rim.outward)
        else:
            d_vec, dist, inside, outward = closest_feature(mesh, q, face, inside_q, data >= 0 and not winding)
            sd, grad_sd = signed_result(d_vec, dist, inside, outward)
        found = 1
    elif as_p and not rim.inside:
        # Outside and nothing within r + eta: no cost, as mesh_signed_distance would find.
        found = 0
    elif winding and not in_side_batch and rim.free_outside:
        # The first traversal searched q within its reach (r + eta and a margin) and found
        # nothing, and the far bounds declare such points of the step outside: no cost.
        found = 0
    else:
        search = bound
        if last_abs >= 0.0:
            # The closest point lies within the last exact distance plus the distance moved, and a
            # bound beyond it by Warp's tie tolerance finds the same one (same sign).
            search = wp.min(search, (last_abs + (sk - last_s) * wp.length(segment)) * REACH_MARGIN
                            + REACH_SLACK + tie_margin)
        found, sd, grad_sd = mesh_signed_distance(mesh, q, search, cull_radius, sign_method, reach_b)
    return found, sd, grad_sd


# Out of line: inlined, its traversal arrays and long-lived state would join the swept kernel's
# stack frame and spills on the GPU for every mesh (ptxas: kernel spills 748 / 632 B -> 2,636 /
# 2,044 B, sm_90); called, they are paid only on the meshes it serves. On the CPU no slower.
# Warp before 1.18 has no ``inline`` option and inlines it (the same results).
@wp.func(**OUT_OF_LINE)
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
) -> SweptSlotResult:
    """swept_slot_cost on a mesh whose sign is not a closed surface's (open_swept_sign) and a
    moving step: the same results (every sample takes the plain query; nothing is skipped), with
    p and the samples searched in shared traversals (mesh_closest_points: on a mesh without sign
    data signed as Warp's normal sign signs them, else by robot_sdf's pseudo-normal or the winding
    number at each point found), each point within its plain query's first bound (the winding
    number's r + eta, else max_dist + r + eta). A point found nothing for takes the plain query,
    bounded by its side's last exact distance plus the distance moved (plus Warp's tie tolerance).
    """
    result = SweptSlotResult()
    reach_b = radius + eta
    bound = max_dist + reach_b
    half_len = wp.max(float(has_prev) * wp.length(seg_prev), float(has_next) * wp.length(seg_next)) * 0.5
    data, method = mesh_sign_method(mesh, sign_method)
    if out_of_reach(mesh, data, cull_radius, p, bound + half_len):
        return result
    winding = method == SIGN_WINDING_NUMBER and data >= 0
    reach = wp.where(winding, reach_b * REACH_MARGIN + REACH_SLACK, bound)
    if winding and box_gap(box_lower(mesh, data), box_upper(mesh, data), p) - half_len > reach:
        # No point of the step has a surface within its reach, so each costs only if inside: where
        # the far bounds declare them all outside, the step costs nothing on this mesh.
        if open_winding_outside(mesh, data, p, reach, half_len):
            return result
    inv_2k = 1.0 / (2.0 * float(sweep_steps))
    n_first = wp.min(sweep_steps, SWEPT_SIDE_BATCH)
    tie_margin = warp_tie_margin(mesh)
    # The first traversal (p and up to n_first samples a side) and the winding numbers of what it
    # found, before the loop: assigned in it, they would be copied at every branch of every point.
    batch, unused_n = open_traversal(mesh, p, True, 0, 0.0, seg_prev, seg_prev, seg_next, has_prev, has_next,
                                     n_first, sweep_steps, inv_2k, reach, -1.0, data)
    rim = RimShortcut()
    if winding:
        rim = open_centre_windings(mesh, data, p, seg_prev, seg_next, has_prev, has_next, n_first, inv_2k, reach_b,
                                   batch)
    later = LaterBatch()
    p_abs = float(-1.0)
    last_abs = float(-1.0)
    last_s = float(0.0)
    to_neighbour = wp.vec3(0.0, 0.0, 0.0)
    mask = int(0)
    # Point 0 is p, then side 0's samples k = 1..K, then side 1's: one evaluation site for all.
    for i in range(2 * sweep_steps + 1):
        side = wp.where(i > sweep_steps, 1, 0)
        k = i - side * sweep_steps
        if i > 0 and ((side == 0 and has_prev == 0) or (side == 1 and has_next == 0)):
            continue
        segment = wp.where(side == 0, seg_prev, seg_next)
        if k == 1:
            # A side starts: its chain of exact distances starts at p.
            later.start = 0
            later.end = 0
            last_abs = p_abs
            last_s = 0.0
            to_neighbour = wp.vec3(0.0, 0.0, 0.0)
            mask = 0
        sk = float(k) * inv_2k
        q = p + segment * sk
        if k > n_first and k >= later.end:
            # Where a side has more samples than the first traversal took, SWEPT_BATCH more at a
            # time (within the Lipschitz bound from p).
            fresh, n_more = open_traversal(mesh, p, False, k, sk, segment, seg_prev, seg_next, has_prev, has_next,
                                           n_first, sweep_steps, inv_2k, reach, p_abs, data)
            later.entries = fresh
            later.start = k
            later.end = k + n_more
        entry, lane, in_side_batch = open_entry(batch, later.entries, i, k, side, has_prev, n_first, later.start,
                                                later.end)
        found, sd, grad_sd = open_point(mesh, cull_radius, sign_method, q, i, side, sk, segment, entry, lane,
                                        in_side_batch, winding, data, rim, bound, reach_b, last_abs, last_s,
                                        tie_margin)
        c = float(0.0)
        g = wp.vec3(0.0, 0.0, 0.0)
        last_abs = -1.0
        if found != 0:
            dc = float(0.0)
            c, dc, _ = penetration_cost(sd, radius, eta)
            g = grad_sd * (-dc)
            last_abs = wp.abs(sd)
        last_s = sk
        if i == 0:
            result.centre_cost = c
            result.centre_grad = g
            p_abs = last_abs
            continue
        wk = swept_sample_weight(k, sweep_steps, n_sides)
        result.sample_delta += wk * (c - result.centre_cost)
        result.own += g * (wk * (1.0 - sk))
        to_neighbour += g * (wk * sk)
        mask = mask | side_bit(k)
        if k == sweep_steps:
            if side == 0:
                result.to_prev = to_neighbour
                result.mask_prev = mask
            else:
                result.to_next = to_neighbour
                result.mask_next = mask
    return result
