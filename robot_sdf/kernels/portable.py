"""The pure-Warp kernel set: every function of kernels.native, written with Warp's public builtins
only, for a Warp whose internals native's C++ was not checked against (mesh_queries picks the set
once at import; ROBOT_SDF_KERNELS=portable forces it for tests and benchmarks).

Same names, signatures and results to float32 rounding; slower, since public queries cannot share
a traversal or read the BVH's nodes:

- winding_number: Warp's own fast winding number, read back through its public signed query by
  bisecting the query's threshold (the value itself, to about 1e-13): 48 queries instead of one;
- mesh_box_beyond: "no triangle box within the reach" from six half-space box queries (each ends at
  the BVH's root when nothing lies beyond): the box's L-infinity gap instead of its Euclidean one,
  so a mesh is passed over a little less often (a cull only; the same answers);
- mesh_closest_face: Warp's closest triangle, then every triangle whose box meets the ball it
  bounds measured in float64 (every triangle, not only thin ones: the closest up to rounding);
- mesh_closest_points / mesh_winding_numbers: each point searched on its own (Warp's own signed
  query where Warp's sign is asked for);
- mesh_supports_winding: not readable through public API; True (a mesh given a winding-number
  slot without support is the caller's error, as in Warp itself);
- one sphere per kernel thread on every device (spheres_per_thread).

Also the constants both sets share (native imports them from here).
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.closest_point import closest_on_triangle

wp.set_module_options({"enable_backward": False})

# Spheres one thread of a query kernel handles on the CPU (robot_sdf.launch sizes launches by it).
CPU_SPHERES_PER_THREAD = 1
# Slots a query visits, collected by slot_bvh_hits: entries 0..31, the count in entry 32.
SLOT_HITS = wp.constant(32)
slot_hits_t = wp.types.vector(length=33, dtype=wp.int32)
# Longest edge / height above which native's searches measure a triangle in float64.
THIN_ASPECT = 10.0
# Samples mesh_closest_points searches with the centre at once: both sides of sweep_steps up to 7,
# beyond that 15 at a time per side.
SWEPT_BATCH = wp.constant(15)
SWEPT_SIDE_BATCH = wp.constant(7)
vec16 = wp.types.vector(length=16, dtype=wp.float32)

# A search bound beyond any mesh, whose square stays finite in float32.
_EVERYWHERE = wp.constant(1.0e18)
# The bisection's bracket of a winding number and its number of halvings (16 / 2^48 ~ 6e-14).
_WINDING_BRACKET = wp.constant(4.0)
_WINDING_HALVINGS = wp.constant(48)
# Entries of mesh_closest_points: the face index as a float (exact below 2^24 triangles); a face
# Warp's sign calls inside is stored as -2 - index; -1 is none.
_INSIDE_BASE = wp.constant(-2.0)


@wp.func
def _winding_above(mesh: wp.uint64, p: wp.vec3, accuracy: float, threshold: float) -> bool:
    inside = float(0.0)
    face = int(0)
    u = float(0.0)
    v = float(0.0)
    hit = wp.mesh_query_point_sign_winding_number(mesh, p, _EVERYWHERE, inside, face, u, v, accuracy, threshold)
    return hit and inside < 0.0


@wp.func
def winding_number(mesh: wp.uint64, p: wp.vec3, accuracy: float) -> float:
    """Warp's fast generalised winding number of p at ``accuracy``: the query calls p inside
    exactly where that number exceeds its threshold, so the bracket [lo, hi) with lo below and hi
    at or above it halves down to adjacent floats (or 2^-48 of the bracket near 0)."""
    lo = float(-_WINDING_BRACKET)
    hi = float(_WINDING_BRACKET)
    if not _winding_above(mesh, p, accuracy, lo):
        return lo
    if _winding_above(mesh, p, accuracy, hi):
        return hi
    for _ in range(_WINDING_HALVINGS):
        mid = 0.5 * (lo + hi)
        if mid <= lo or mid >= hi:
            break
        if _winding_above(mesh, p, accuracy, mid):
            lo = mid
        else:
            hi = mid
    return hi


@wp.func
def _nothing_in(mesh: wp.uint64, lower: wp.vec3, upper: wp.vec3) -> bool:
    query = wp.mesh_query_aabb(mesh, lower, upper)
    face = int(0)
    return not wp.mesh_query_aabb_next(query, face)


@wp.func
def mesh_box_beyond(mesh: wp.uint64, p: wp.vec3, reach: float) -> bool:
    """Whether every triangle's box is farther than ``reach`` (>= 0) from mesh-frame p along some
    axis (the L-infinity gap to the mesh's box): six half-space box queries."""
    far = _EVERYWHERE
    if _nothing_in(mesh, wp.vec3(p[0] - reach, -far, -far), wp.vec3(far, far, far)):
        return True
    if _nothing_in(mesh, wp.vec3(-far, -far, -far), wp.vec3(p[0] + reach, far, far)):
        return True
    if _nothing_in(mesh, wp.vec3(-far, p[1] - reach, -far), wp.vec3(far, far, far)):
        return True
    if _nothing_in(mesh, wp.vec3(-far, -far, -far), wp.vec3(far, p[1] + reach, far)):
        return True
    if _nothing_in(mesh, wp.vec3(-far, -far, p[2] - reach), wp.vec3(far, far, far)):
        return True
    return _nothing_in(mesh, wp.vec3(-far, -far, -far), wp.vec3(far, far, p[2] + reach))


@wp.func
def mesh_average_edge_length(mesh: wp.uint64) -> float:
    """The mean edge length over the mesh's triangles (what Warp keeps for its sign tolerance),
    summed triangle by triangle."""
    m = wp.mesh_get(mesh)
    count = m.indices.shape[0] // 3
    total = float(0.0)
    for tri in range(count):
        a = m.points[m.indices[tri * 3 + 0]]
        b = m.points[m.indices[tri * 3 + 1]]
        c = m.points[m.indices[tri * 3 + 2]]
        total += wp.length(b - a) + wp.length(c - b) + wp.length(a - c)
    return total / float(wp.max(3 * count, 1))


@wp.func
def mesh_supports_winding(mesh: wp.uint64) -> bool:
    """Public API cannot tell: assumed (the caller's promise, as with Warp's own queries)."""
    return True


@wp.func
def spheres_per_thread() -> int:
    return CPU_SPHERES_PER_THREAD


@wp.func
def slot_bvh_hits(id: wp.uint64, lower: wp.vec3, upper: wp.vec3) -> slot_hits_t:
    """Items of BVH ``id`` whose boxes overlap [lower, upper]: entries 0..min(n, 32)-1, n in
    entry 32 (n > 32: more than fit)."""
    out = slot_hits_t()
    query = wp.bvh_query_aabb(id, lower, upper)
    item = int(0)
    n = int(0)
    while wp.bvh_query_next(query, item):
        if n < 32:
            out[n] = item
        n += 1
    out[32] = n
    return out


@wp.func
def _triangle_distance_sq(mesh: wp.uint64, tri: int, p: wp.vec3) -> float:
    """Squared distance of p to triangle ``tri``, in float64 relative to its first corner."""
    m = wp.mesh_get(mesh)
    a = wp.vec3d(m.points[m.indices[tri * 3 + 0]])
    b = wp.vec3d(m.points[m.indices[tri * 3 + 1]]) - a
    c = wp.vec3d(m.points[m.indices[tri * 3 + 2]]) - a
    q = wp.vec3d(p) - a
    closest, feature = closest_on_triangle(q, b, c)
    return float(wp.length_sq(q - closest))


@wp.func
def mesh_closest_face(mesh: wp.uint64, p: wp.vec3, max_dist: float) -> int:
    """The triangle closest to mesh-frame p among those nearer than ``max_dist``, -1 if none:
    Warp's pick bounds the search, then every triangle whose box meets that ball is measured."""
    bound_sq = max_dist * max_dist
    query = wp.mesh_query_point_no_sign(mesh, p, max_dist)
    if query.result:
        bound_sq = wp.min(bound_sq, _triangle_distance_sq(mesh, query.face, p) * 1.0001 + 1.0e-12)
    reach = wp.sqrt(bound_sq)
    box = wp.vec3(reach, reach, reach)
    best_sq = max_dist * max_dist
    best = int(-1)
    candidates = wp.mesh_query_aabb(mesh, p - box, p + box)
    tri = int(0)
    while wp.mesh_query_aabb_next(candidates, tri):
        d_sq = _triangle_distance_sq(mesh, tri, p)
        if d_sq < best_sq:
            best_sq = d_sq
            best = tri
    return best


@wp.func
def _sample_offset(d1: wp.vec3, s1: float, n1: int, d2: wp.vec3, s2: float, ds: float, j: int) -> wp.vec3:
    """Offset from a of point j of a shared traversal: 0, then d1 (s1 + i ds) for the n1 of the
    first side, then d2 (s2 + i ds), computed as native computes it."""
    if j == 0:
        return wp.vec3(0.0, 0.0, 0.0)
    if j <= n1:
        return d1 * (s1 + ds * float(j - 1))
    return d2 * (s2 + ds * float(j - 1 - n1))


@wp.func
def _point_count(n1: int, n2: int):
    n1c = wp.clamp(n1, 0, 15)
    n2c = wp.clamp(n2, 0, 15 - n1c)
    return n1c, 1 + n1c + n2c


@wp.func
def mesh_closest_points(mesh: wp.uint64, a: wp.vec3, bound_a: float, d1: wp.vec3, s1: float, n1: int, d2: wp.vec3,
                        s2: float, n2: int, ds: float, reach: float, base: float, base_inside: bool,
                        warp_sign: bool, exact_thin: bool) -> vec16:
    """native.mesh_closest_points, one point after the other (see there): entry 0 for a within
    ``bound_a`` (none when bound_a <= 0), then the samples, each within ``reach`` or, where a's
    distance ``base`` (>= 0) is known, within base plus its distance to a when that is less
    (always when a is inside). Candidates and measures as native's: Warp's closest triangle,
    mesh_closest_face's with ``exact_thin``, Warp's normal-signed query with ``warp_sign``."""
    out = vec16()
    for j in range(16):
        out[j] = -1.0
    n1c, count = _point_count(n1, n2)
    tie = float(0.0)
    if warp_sign:
        tie = mesh_average_edge_length(mesh) * 1.0e-3
    for j in range(count):
        offset = _sample_offset(d1, s1, n1c, d2, s2, ds, j)
        pt = a + offset
        bound = bound_a
        if j > 0:
            bound = reach
            if base >= 0.0:
                lip = (base + wp.length(offset)) * 1.0001 + 1.0e-6 + 3.0 * tie
                bound = wp.where(base_inside, lip, wp.min(reach, lip))
        if bound <= 0.0:
            continue
        if warp_sign:
            query = wp.mesh_query_point_sign_normal(mesh, pt, bound)
            if query.result:
                out[j] = wp.where(query.sign < 0.0, _INSIDE_BASE - float(query.face), float(query.face))
        elif exact_thin:
            face = mesh_closest_face(mesh, pt, bound)
            if face >= 0:
                out[j] = float(face)
        else:
            query = wp.mesh_query_point_no_sign(mesh, pt, bound)
            if query.result:
                out[j] = float(query.face)
    return out


@wp.func
def mesh_winding_numbers(mesh: wp.uint64, a: wp.vec3, d1: wp.vec3, s1: float, n1: int, d2: wp.vec3, s2: float,
                         n2: int, ds: float, accuracy: float, lanes: int) -> vec16:
    """native.mesh_winding_numbers, one point after the other: the winding numbers of the points
    mesh_closest_points would search whose bit is set in ``lanes``, 0 for the others."""
    out = vec16()
    n1c, count = _point_count(n1, n2)
    for j in range(count):
        if (lanes >> j) & 1 != 0:
            out[j] = winding_number(mesh, a + _sample_offset(d1, s1, n1c, d2, s2, ds, j), accuracy)
    return out


@wp.func
def face_of(x: float) -> int:
    """The triangle of an entry of mesh_closest_points, -1 for none."""
    if x >= 0.0:
        return int(x)
    if x <= _INSIDE_BASE:
        return int(_INSIDE_BASE - x)
    return -1


@wp.func
def warp_inside(x: float) -> float:
    """Warp's sign of an entry that mesh_closest_points found with warp_sign: -1 inside (else 1)."""
    return wp.where(x <= _INSIDE_BASE, -1.0, 1.0)
