"""Every Warp function robot_sdf writes in C++ (``wp.func_native``), behind a Warp version check.

These snippets read Warp's internals: the layout of ``wp::Mesh`` (points, indices, BVH nodes,
solid-angle properties, average edge length) and ``wp::BVH``, BVH_QUERY_STACK_SIZE, and Warp's
own helpers (closest_point_to_triangle, robust_solid_angle, evaluate_node_solid_angle,
distance_to_aabb_sq). None of that is public API, so the module refuses to load on a Warp it was
not written and tested against (warp_release.CHECKED_RELEASES): a changed struct would otherwise
compile and read the wrong fields. To support another Warp, check each snippet against its
native/mesh.h, bvh.h and solid_angle.h, run the tests (test/native_test.py and the kernel tests),
then add its minor release there. The swept kernel's shared winding-number traversal lives in
kernels.native_winding, behind the same check.

Snippets that differ between the CPU and CUDA use ``__CUDA_ARCH__``; the macros they define
(SWEPT_LANES, WARP_TIES, RARELY_CALLED) are #undef'd at the end of the snippet that defines them.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.portable import SLOT_HITS, SWEPT_BATCH, SWEPT_SIDE_BATCH, THIN_ASPECT, slot_hits_t, vec16  # noqa: F401
from robot_sdf.kernels.warp_release import CHECKED_RELEASES, minor_release


def check_warp_version(version: str) -> None:
    """Raise RuntimeError unless Warp ``version`` (e.g. "1.19.0") is in a minor release these
    snippets were checked against (warp_release.CHECKED_RELEASES)."""
    if minor_release(version) not in CHECKED_RELEASES:
        supported = ", ".join(f"{v}.x" for v in CHECKED_RELEASES)
        raise RuntimeError(
            f"robot_sdf's native kernel functions (robot_sdf/kernels/native.py) read internals of Warp "
            f"{supported}, but Warp {version} is installed: install a warp-lang of that range "
            f"(requirements.txt pins one), or check the snippets against this Warp and add "
            f"{minor_release(version)!r} to warp_release.CHECKED_RELEASES")


check_warp_version(wp.config.version)

wp.set_module_options({"enable_backward": False})


# ------------------------------------------------------------------------------- mesh queries
@wp.func_native("""return wp::mesh_query_winding_number(mesh, p, accuracy);""")
def winding_number(mesh: wp.uint64, p: wp.vec3, accuracy: float) -> float:
    """Warp's fast generalised winding number of p (the mesh must support winding numbers);
    called directly so that an inside test far from the surface needs no closest-point search."""
    ...


@wp.func_native("""
const wp::Mesh& m = *(const wp::Mesh*)(mesh);
const int root = *m.bvh.root;
const wp::BVHPackedNodeHalf lo = m.bvh.node_lowers[root];
const wp::BVHPackedNodeHalf hi = m.bvh.node_uppers[root];
return wp::distance_to_aabb_sq(p, wp::vec3(lo.x, lo.y, lo.z), wp::vec3(hi.x, hi.y, hi.z));""")
def mesh_box_distance_sq(mesh: wp.uint64, p: wp.vec3) -> float:
    """Squared distance of mesh-frame p to the box of the mesh's BVH root (0 inside): Warp keeps
    that box enclosing every triangle across builds and refits, so it bounds any mesh, built
    anywhere, without cached host-side data that could outlive the mesh id."""
    ...


@wp.func_native("""
const wp::Mesh& m = *(const wp::Mesh*)(mesh);
const int root = *m.bvh.root;
const wp::BVHPackedNodeHalf lo = m.bvh.node_lowers[root];
const wp::BVHPackedNodeHalf hi = m.bvh.node_uppers[root];
return wp::distance_to_aabb_sq(p, wp::vec3(lo.x, lo.y, lo.z), wp::vec3(hi.x, hi.y, hi.z)) > reach * reach;""")
def mesh_box_beyond(mesh: wp.uint64, p: wp.vec3, reach: float) -> bool:
    """Whether mesh-frame p is farther than ``reach`` (>= 0) from the box of the mesh's BVH root
    (mesh_box_distance_sq's box)."""
    ...


@wp.func_native("""return ((const wp::Mesh*)(mesh))->solid_angle_props != nullptr;""")
def mesh_supports_winding(mesh: wp.uint64) -> bool:
    """Whether the mesh was built with ``support_winding_number=True`` (Warp's winding-number
    queries read the solid-angle data that flag builds, and fault on a mesh without it)."""
    ...


@wp.func_native("""return ((const wp::Mesh*)(mesh))->average_edge_length;""")
def mesh_average_edge_length(mesh: wp.uint64) -> float:
    """Warp's average edge length of the mesh, which scales the tie tolerance of its pseudo-normal
    sign query (1e-3 of it)."""
    ...


# ------------------------------------------------------------------ spheres per kernel thread
# A query kernel's thread handles CPU_SPHERES_PER_THREAD consecutive spheres on the CPU, one on
# CUDA (robot_sdf.launch sizes the launches to match). Warp's CPU launch copies every kernel
# argument, the World struct included, for each thread index: at one sphere a thread that cost
# about 3 ns a sphere, more than the whole query of a sphere far from every mesh. Read-only: the
# kernels' code holds the value it had when this module was imported.
CPU_SPHERES_PER_THREAD = 16


@wp.func_native(f"""
#if defined(__CUDA_ARCH__)
return 1;
#else
return {CPU_SPHERES_PER_THREAD};
#endif
""")
def spheres_per_thread() -> int:
    """Spheres one thread of a query kernel handles: CPU_SPHERES_PER_THREAD on the CPU, 1 on CUDA."""
    ...


# --------------------------------------------------------------------------------- slot BVH
# Slots a query visits (SLOT_HITS), collected by slot_bvh_hits. Warp's own wp.bvh_query_aabb keeps its
# traversal stack in CUDA shared memory (32 ints per thread of the block: 32 KB at 256 threads);
# beside the mesh queries' stack that passed the 48 KB static limit and ptxas refused both query
# kernels (test/cuda_build_test.py). This traversal keeps its stack in registers/local memory.


@wp.func_native("""
wp::vec_t<33, int> out;
const wp::BVH bvh = wp::bvh_get(id);
int stack[BVH_QUERY_STACK_SIZE];
stack[0] = *bvh.root;
int count = 1;
int n = 0;
while (count) {
    const int node = stack[--count];
    const wp::BVHPackedNodeHalf nl = bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf nu = bvh.node_uppers[node];
    if (nl.x > upper[0] || nl.y > upper[1] || nl.z > upper[2] || nu.x < lower[0] || nu.y < lower[1] || nu.z < lower[2])
        continue;
    if (nl.b) {
        for (int prim = (int)nl.i; prim < (int)nu.i; ++prim) {
            const int item = bvh.primitive_indices[prim];
            const wp::vec3 il = bvh.item_lowers[item];
            const wp::vec3 iu = bvh.item_uppers[item];
            if (il[0] > upper[0] || il[1] > upper[1] || il[2] > upper[2] || iu[0] < lower[0] || iu[1] < lower[1] || iu[2] < lower[2])
                continue;
            if (n < 32)
                out[n] = item;
            ++n;
        }
    } else if (count + 2 > BVH_QUERY_STACK_SIZE) {
        n = 33;  // deeper than the stack: the caller visits every slot instead
        break;
    } else {
        stack[count++] = (int)nl.i;
        stack[count++] = (int)nu.i;
    }
}
out[32] = n;
return out;""")
def slot_bvh_hits(id: wp.uint64, lower: wp.vec3, upper: wp.vec3) -> slot_hits_t:
    """Items of BVH ``id`` whose boxes overlap [lower, upper]: entries 0..min(n, 32)-1, n in
    entry 32 (n > 32: more than fit, or a tree deeper than the stack)."""
    ...


# ------------------------------------------------------------------ thin triangles in float64
# THIN_ASPECT (portable.py: the constants both sets share) is the longest edge / height above which
# a triangle counts as thin: the searches below measure its distance in float64 (Warp's float32
# distance of a 2000:1 sliver can be off by 1e-2 m, enough for a search to pick a farther
# triangle). Half the aspect of a sliver (mesh_analysis.SLIVER_ASPECT), so that float32 rounding
# never lets one pass as well-shaped; THIN_TRIANGLE_CPP writes its square.
# C++ shared by the searches that measure thin triangles exactly (pasted at the top of their
# snippets): is_thin(a, b, c); thin_delta(a, b, c, pt) = pt - its closest point on the triangle,
# in float64 relative to a (Ericson's region test, as closest_point.closest_on_triangle, which also
# names the feature; the same guards for coincident corners and zero area); and
# distance_sq(a, b, c, pt, thin, bary), the squared distance a search compares: thin_delta's where
# ``thin``, else Warp's float32 closest-point query's (its weights left in ``bary``).
THIN_TRIANGLE_CPP = """
auto is_thin = [](const wp::vec3& a, const wp::vec3& b, const wp::vec3& c) {
    const float longest2 = wp::max(wp::max(wp::length_sq(b - a), wp::length_sq(c - b)), wp::length_sq(a - c));
    return longest2 * longest2 > 100.0f * wp::length_sq(wp::cross(b - a, c - a));
};
auto segment_delta = [](const wp::vec3d& pt, const wp::vec3d& a, const wp::vec3d& b) {
    const wp::vec3d ab = b - a;
    const double len2 = wp::dot(ab, ab);
    const double t = len2 > 0.0 ? wp::clamp(wp::dot(pt - a, ab) / len2, 0.0, 1.0) : 0.0;
    return pt - (a + ab * t);
};
auto thin_delta = [&](const wp::vec3& a32, const wp::vec3& b32, const wp::vec3& c32, const wp::vec3& pt) {
    const wp::vec3d a(a32);
    const wp::vec3d b = wp::vec3d(b32) - a;
    const wp::vec3d c = wp::vec3d(c32) - a;
    const wp::vec3d q = wp::vec3d(pt) - a;
    const double d1 = wp::dot(b, q);
    const double d2 = wp::dot(c, q);
    if (d1 <= 0.0 && d2 <= 0.0)
        return q;
    const wp::vec3d bq = q - b;
    const double d3 = wp::dot(b, bq);
    const double d4 = wp::dot(c, bq);
    if (d3 >= 0.0 && d4 <= d3)
        return bq;
    const double vc = d1 * d4 - d3 * d2;
    if (vc <= 0.0 && d1 >= 0.0 && d3 <= 0.0 && d1 - d3 > 0.0)
        return q - b * (d1 / (d1 - d3));
    const wp::vec3d cq = q - c;
    const double d5 = wp::dot(b, cq);
    const double d6 = wp::dot(c, cq);
    if (d6 >= 0.0 && d5 <= d6)
        return cq;
    const double vb = d5 * d2 - d1 * d6;
    if (vb <= 0.0 && d2 >= 0.0 && d6 <= 0.0 && d2 - d6 > 0.0)
        return q - c * (d2 / (d2 - d6));
    const double va = d3 * d6 - d5 * d4;
    if (va <= 0.0 && d4 - d3 >= 0.0 && d5 - d6 >= 0.0 && (d4 - d3) + (d5 - d6) > 0.0)
        return q - (b + (c - b) * ((d4 - d3) / ((d4 - d3) + (d5 - d6))));
    const double denom = va + vb + vc;
    if (denom <= 0.0) {
        const wp::vec3d zero(0.0);
        wp::vec3d delta = segment_delta(q, zero, b);
        const wp::vec3d other = segment_delta(q, b, c);
        if (wp::length_sq(other) < wp::length_sq(delta))
            delta = other;
        const wp::vec3d last = segment_delta(q, c, zero);
        return wp::length_sq(last) < wp::length_sq(delta) ? last : delta;
    }
    return q - (b * (vb / denom) + c * (vc / denom));
};
auto distance_sq = [&](const wp::vec3& a, const wp::vec3& b, const wp::vec3& c, const wp::vec3& pt, bool thin,
                       wp::vec2& bary) -> float {
    if (thin)
        return (float)wp::length_sq(thin_delta(a, b, c, pt));
    bary = wp::closest_point_to_triangle(a, b, c, pt);
    return wp::length_sq(bary[0] * a + bary[1] * b + (1.0f - bary[0] - bary[1]) * c - pt);
};
"""


@wp.func_native(THIN_TRIANGLE_CPP + """
const wp::Mesh m = wp::mesh_get(mesh);
// Nearest child first, as Warp's mesh_query_point_no_sign; every triangle counts (Warp skips
// near-zero-area ones: they are thin here and measured exactly).
float best_sq = max_dist * max_dist;
int best = -1;
auto measure = [&](int tri) {
    const wp::vec3 a = m.points[m.indices[tri * 3 + 0]];
    const wp::vec3 b = m.points[m.indices[tri * 3 + 1]];
    const wp::vec3 c = m.points[m.indices[tri * 3 + 2]];
    wp::vec2 bary;
    const float dist_sq = distance_sq(a, b, c, p, is_thin(a, b, c), bary);
    if (dist_sq < best_sq) {
        best_sq = dist_sq;
        best = tri;
    }
};
int stack[BVH_QUERY_STACK_SIZE];
stack[0] = *m.bvh.root;
int count = 1;
bool overflow = false;
while (count) {
    const int node = stack[--count];
    const wp::BVHPackedNodeHalf nl = m.bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf nu = m.bvh.node_uppers[node];
    if (wp::distance_to_aabb_sq(p, wp::vec3(nl.x, nl.y, nl.z), wp::vec3(nu.x, nu.y, nu.z)) >= best_sq)
        continue;
    if (nl.b) {
        for (int prim = (int)nl.i; prim < (int)nu.i; ++prim)
            measure(m.bvh.primitive_indices[prim]);
    } else if (count + 2 > BVH_QUERY_STACK_SIZE) {
        overflow = true;  // a tree deeper than the stack (Warp's own queries would overrun it)
        break;
    } else {
        const int left = (int)nl.i;
        const int right = (int)nu.i;
        const wp::BVHPackedNodeHalf ll = m.bvh.node_lowers[left];
        const wp::BVHPackedNodeHalf lu = m.bvh.node_uppers[left];
        const wp::BVHPackedNodeHalf rl = m.bvh.node_lowers[right];
        const wp::BVHPackedNodeHalf ru = m.bvh.node_uppers[right];
        const float left_sq = wp::distance_to_aabb_sq(p, wp::vec3(ll.x, ll.y, ll.z), wp::vec3(lu.x, lu.y, lu.z));
        const float right_sq = wp::distance_to_aabb_sq(p, wp::vec3(rl.x, rl.y, rl.z), wp::vec3(ru.x, ru.y, ru.z));
        const bool left_first = left_sq < right_sq;
        const float far_sq = left_first ? right_sq : left_sq;
        const float near_sq = left_first ? left_sq : right_sq;
        if (far_sq < best_sq)
            stack[count++] = left_first ? right : left;
        if (near_sq < best_sq)
            stack[count++] = left_first ? left : right;
    }
}
if (overflow) {
    // Every triangle, as the traversal would have measured it: slow, and right.
    for (int tri = 0; tri < m.num_tris; ++tri)
        measure(tri);
}
return best;""")
def mesh_closest_face(mesh: wp.uint64, p: wp.vec3, max_dist: float) -> int:
    """The triangle closest to mesh-frame p among those nearer than ``max_dist`` (m), -1 if none:
    Warp's float32 closest-triangle search, except that a thin triangle (longest edge / height
    above THIN_ASPECT, zero-area ones included) is measured in float64 relative to its first
    corner. Warp's float32 distance of a 2000:1 sliver can be off by 1e-2 m, so that its own search
    picks a farther triangle; here only well-shaped triangles carry float32 rounding (that of the
    coordinates, about 6e-8 of their magnitude), so the triangle returned is the closest up to that
    rounding. A tree deeper than the traversal's stack is searched triangle by triangle."""
    ...


# ----------------------------------------------------------- swept samples: shared traversals
# Samples searched with the centre in one BVH traversal by mesh_closest_points: both sides of
# sweep_steps up to 7 at once; beyond that, 15 at a time per side (SWEPT_BATCH, SWEPT_SIDE_BATCH).


# mesh_closest_points' snippet is pasted together from the parts below, in this order (each uses
# names the parts before it declare): the per-point lane state, Warp's sign rule, the traversal's
# step at a leaf and at an inner node, the result's entries; the snippet's own body then sets the
# lanes up, walks the tree and writes the entries.

# Per point, in 16 lanes as a structure of arrays: its coordinates, squared pruning radius (best),
# offset from a and fractions along each side, closest face, the state of Warp's sign rule; then
# the traversal's state. Reads the arguments n1, n2 and the mesh m.
CLOSEST_POINTS_LANES_CPP = """
const wp::Mesh m = wp::mesh_get(mesh);
const int n1c = n1 < 15 ? (n1 > 0 ? n1 : 0) : 15;
const int n2c = n2 < 15 - n1c ? (n2 > 0 ? n2 : 0) : 15 - n1c;
const int count_pts = 1 + n1c + n2c;
// Per point, in 16 lanes as a structure of arrays (unused lanes: best 0, never in reach), so
// that the tests of all points against a leaf or a triangle are branch-free loops over fixed
// lanes (vectorised on the CPU); only the points that pass get a closest-point test. A GPU
// thread does not vectorise: there the loops run over the points in use only.
#if defined(__CUDA_ARCH__)
#define SWEPT_LANES count_pts
#else
#define SWEPT_LANES 16
#endif
float px[16];
float py[16];
float pz[16];
float best[16];
float off[16];
float fs1[16];
float fs2[16];
int best_face[16];
// Warp's sign rule (warp_sign, mesh_query_point_sign_normal): per point the distance of its
// closest face so far (its bound while none) and the faces within Warp's tie tolerance of it;
// best is then the squared pruning radius (closest + tie).
const float tie = warp_sign ? m.average_edge_length * 1.0e-3f : 0.0f;
float closest[16];
float acc_x[16];
float acc_y[16];
float acc_z[16];
// The weights (Warp's u, v) of each point's closest point on its closest face, as the test that
// took the face computed them: the sign needs that point again.
float best_u[16];
float best_v[16];
// The ties of each point since its last strictly closer face, kept as face indices and weighed
// when the traversal is done (most faces a point takes are passed by a closer one later); the
// ties beyond WARP_TIES are weighed at once.
#if defined(__CUDA_ARCH__)
#define WARP_TIES 2
#else
#define WARP_TIES 6
#endif
int ties[16][WARP_TIES];
int n_ties[16];
// The traversal's: the box of all points (lo, hi), the largest squared pruning radius of any point
// (worst) and the stack of nodes to visit.
wp::vec3 lo = a;
wp::vec3 hi = a;
float worst = 0.0f;
int stack[BVH_QUERY_STACK_SIZE];
int count = 0;
"""

# Warp's sign rule (warp_sign): a face's angle-weighted normal for a point, and a face within a
# point's pruning radius joining its ties (take_warp_candidate).
WARP_SIGN_TIES_CPP = """
// Warp's weighted normal of a face for a point: the angle of the feature nearest to the point's
// closest point on it (a corner's angle, pi on an edge, 2 pi inside) times its unit normal.
// Out of line on the CPU: rarely needed, and inlined (its acosf calls in the traversal's
// innermost loop) it slowed the whole traversal by 8 % (table scan, raw swept, 100k spheres).
#if defined(__CUDA_ARCH__)
#define RARELY_CALLED
#else
#define RARELY_CALLED __attribute__((noinline))
#endif
auto warp_weighted_normal = [&](int tri, const wp::vec3& pt) RARELY_CALLED {
    const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
    const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
    const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
    const wp::vec3 e0 = q - p;
    const wp::vec3 e1 = r - p;
    const wp::vec3 e2 = r - q;
    const wp::vec2 bary = wp::closest_point_to_triangle(p, q, r, pt);
    const float tie_sq = tie * tie;
    const float u = bary[0];
    const float v = bary[1];
    const float w = 1.0f - u - v;
    const wp::vec3 c = u * p + v * q + w * r;
    const wp::vec3 cp = c - p;
    const wp::vec3 cq = c - q;
    const wp::vec3 cr = c - r;
    const float cp_sq = wp::length_sq(cp);
    const float cq_sq = wp::length_sq(cq);
    const float cr_sq = wp::length_sq(cr);
    float weight;
    if (cp_sq < tie_sq) {
        weight = acosf(wp::dot(wp::normalize(e0), wp::normalize(e1)));
    } else if (cq_sq < tie_sq) {
        weight = acosf(wp::dot(wp::normalize(e2), wp::normalize(-e0)));
    } else if (cr_sq < tie_sq) {
        weight = acosf(wp::dot(wp::normalize(-e1), wp::normalize(-e2)));
    } else {
        const float e0_sq = wp::dot(e0, e0);
        const float e1_sq = wp::dot(e1, e1);
        const float e2_sq = wp::dot(e2, e2);
        const float e0cp = wp::dot(e0, cp);
        const float e2cq = wp::dot(e2, cq);
        const float e1cp = wp::dot(e1, cp);
        const bool on_edge = cp_sq * e0_sq - e0cp * e0cp < tie_sq * e0_sq
            || cq_sq * e2_sq - e2cq * e2cq < tie_sq * e2_sq || cp_sq * e1_sq - e1cp * e1cp < tie_sq * e1_sq;
        weight = on_edge ? 3.14159265359f : 2.0f * 3.14159265359f;
    }
    return weight * wp::normalize(wp::cross(e0, e1));
};
// A face within the pruning radius of point j: it joins the ties within the tolerance of the
// closest face, or, closer by more than the tolerance, starts them anew.
auto take_warp_candidate = [&](int j, int tri, float dist, const wp::vec2& bary) {
    if (dist > closest[j] - tie) {
        if (n_ties[j] < WARP_TIES) {
            ties[j][n_ties[j]++] = tri;
        } else {
            const wp::vec3 n = warp_weighted_normal(tri, wp::vec3(px[j], py[j], pz[j]));
            acc_x[j] += n[0];
            acc_y[j] += n[1];
            acc_z[j] += n[2];
        }
        if (dist < closest[j]) {
            closest[j] = dist;
            best_face[j] = tri;
            best_u[j] = bary[0];
            best_v[j] = bary[1];
        }
    } else {
        closest[j] = dist;
        best_face[j] = tri;
        best_u[j] = bary[0];
        best_v[j] = bary[1];
        ties[j][0] = tri;
        n_ties[j] = 1;
        acc_x[j] = 0.0f;
        acc_y[j] = 0.0f;
        acc_z[j] = 0.0f;
    }
    best[j] = (closest[j] + tie) * (closest[j] + tie);
};
"""

CLOSEST_POINTS_LEAF_CPP = """
// A leaf of the traversal (node halves nl, nu): its triangles tested against the points whose best
// so far is farther than the leaf's box (and whose tangent bound does not rule them out), then
// worst brought up to date.
auto search_leaf = [&](const wp::BVHPackedNodeHalf& nl, const wp::BVHPackedNodeHalf& nu) {
    // Points whose best so far is farther than the leaf's box (bit j for point j).
    unsigned int in_reach = 0u;
    for (int j = 0; j < SWEPT_LANES; ++j) {
        const float gx = wp::max(wp::max(nl.x - px[j], px[j] - nu.x), 0.0f);
        const float gy = wp::max(wp::max(nl.y - py[j], py[j] - nu.y), 0.0f);
        const float gz = wp::max(wp::max(nl.z - pz[j], pz[j] - nu.z), 0.0f);
        in_reach |= (gx * gx + gy * gy + gz * gz < best[j] ? 1u : 0u) << j;
    }
    for (int prim = (int)nl.i; in_reach != 0u && prim < (int)nu.i; ++prim) {
        const int tri = m.bvh.primitive_indices[prim];
        const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
        const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
        const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
        const wp::vec3 e0 = q - p;
        const wp::vec3 e1 = r - p;
        const wp::vec3 e2 = r - q;
        // With exact_thin a thin triangle is measured in float64 (near-zero-area ones too);
        // otherwise Warp's own closest-point queries skip these slivers: the same candidates.
        const bool thin = exact_thin && is_thin(p, q, r);
        if (!thin && wp::length(wp::cross(e0, e1)) / (wp::dot(e0, e0) + wp::dot(e1, e1) + wp::dot(e2, e2)) < 1.e-6f)
            continue;
        // The distance to a triangle (a convex set) is convex along each segment a + d s, so
        // it lies above its tangent at a: dist(s) >= dist(a) + s (a - c) / |a - c| . d.
        // Measured at a once, that rules the triangle out for nearly every other point.
        wp::vec2 bary_a(0.0f);
        wp::vec3 from_c;
        if (thin) {
            from_c = wp::vec3(thin_delta(p, q, r, a));
        } else {
            bary_a = wp::closest_point_to_triangle(p, q, r, a);
            from_c = a - (bary_a[0] * p + bary_a[1] * q + (1.0f - bary_a[0] - bary_a[1]) * r);
        }
        const float a_sq = wp::length_sq(from_c);
        const float a_dist = wp::sqrt(a_sq);
        if ((in_reach & 1u) && a_sq < best[0]) {
            if (warp_sign)
                take_warp_candidate(0, tri, a_dist, bary_a);
            else {
                best[0] = a_sq;
                best_face[0] = tri;
            }
            if (base_inside && !warp_sign) {
                // Each point's closest surface point is within a's best so far plus its
                // offset (1-Lipschitz): a loose base tightens as a's search goes.
                for (int j = 1; j < count_pts; ++j) {
                    const float b = (a_dist + off[j]) * 1.0001f + 1.0e-6f;
                    best[j] = wp::min(best[j], b * b);
                }
            }
        }
        float slope1 = 0.0f;
        float slope2 = 0.0f;
        float slack = 1.0e30f;
        if (a_dist > 1.0e-6f) {
            slope1 = wp::dot(from_c, d1) / a_dist;
            slope2 = wp::dot(from_c, d2) / a_dist;
            // Float32 rounding of the distances stays far below this margin [m].
            slack = 2.0e-6f + 1.0e-5f * a_dist;
        }
        // Points in reach that the tangent bound does not rule out (never a itself).
        unsigned int test = 0u;
        for (int j = 1; j < SWEPT_LANES; ++j) {
            const float sure = a_dist + fs1[j] * slope1 + fs2[j] * slope2 - slack;
            test |= (sure > 0.0f && sure * sure >= best[j] ? 0u : 1u) << j;
        }
        test &= in_reach;
        while (test != 0u) {
#if defined(__CUDA_ARCH__)
            const int j = __ffs(test) - 1;
#else
            const int j = __builtin_ctz(test);
#endif
            test &= test - 1u;
            const wp::vec3 pt(px[j], py[j], pz[j]);
            wp::vec2 bary(0.0f);
            const float dist_sq = distance_sq(p, q, r, pt, thin, bary);
            if (dist_sq < best[j]) {
                if (warp_sign)
                    take_warp_candidate(j, tri, wp::sqrt(dist_sq), bary);
                else {
                    best[j] = dist_sq;
                    best_face[j] = tri;
                }
            }
        }
    }
    worst = 0.0f;
    for (int j = 0; j < SWEPT_LANES; ++j)
        worst = wp::max(worst, best[j]);
};
"""

CLOSEST_POINTS_CHILDREN_CPP = """
// An inner node of the traversal (node halves nl, nu): each child pushed where some point's best
// so far is farther than the child's box.
auto push_children = [&](const wp::BVHPackedNodeHalf& nl, const wp::BVHPackedNodeHalf& nu) {
    const int children[2] = {(int)nl.i, (int)nu.i};
    float child_gap[2];
    for (int c = 0; c < 2; ++c) {
        const wp::BVHPackedNodeHalf cl = m.bvh.node_lowers[children[c]];
        const wp::BVHPackedNodeHalf cu = m.bvh.node_uppers[children[c]];
        const wp::vec3 g = wp::max(wp::max(wp::vec3(cl.x, cl.y, cl.z) - hi, lo - wp::vec3(cu.x, cu.y, cu.z)),
                                   wp::vec3(0.0f));
        child_gap[c] = wp::length_sq(g);
        if (child_gap[c] < worst) {
            // Some point's best so far farther than the child's box?
            bool any = false;
            for (int j = 0; j < SWEPT_LANES; ++j) {
                const float gx = wp::max(wp::max(cl.x - px[j], px[j] - cu.x), 0.0f);
                const float gy = wp::max(wp::max(cl.y - py[j], py[j] - cu.y), 0.0f);
                const float gz = wp::max(wp::max(cl.z - pz[j], pz[j] - cu.z), 0.0f);
                any |= gx * gx + gy * gy + gz * gz < best[j];
            }
            if (!any)
                child_gap[c] = worst;
        }
    }
    // The nearer child last, so that it is searched first.
    const int first = child_gap[0] < child_gap[1] ? 1 : 0;
    if (child_gap[first] < worst)
        stack[count++] = children[first];
    if (child_gap[1 - first] < worst)
        stack[count++] = children[1 - first];
};
"""

CLOSEST_POINTS_ENTRY_CPP = """
// Entry j of the result: point j's closest face as float bits (face_of), -1 for none and for unused
// lanes; with warp_sign, bit 30 set where Warp's sign says the point is inside (warp_inside).
auto entry_of = [&](int j) -> float {
    union { int i; float f; } bits;
    bits.i = j < count_pts ? best_face[j] : -1;
    if (warp_sign && bits.i >= 0) {
        // Warp's sign: inside where the accumulated normal faces away from the point.
        const int tri = bits.i;
        const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
        const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
        const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
        const wp::vec3 pt(px[j], py[j], pz[j]);
        // Warp's closest point, weights rounded as it rounds them.
        const float v = best_v[j];
        const float w = 1.0f - best_u[j] - best_v[j];
        const wp::vec3 to_point = pt - (p * (1.0f - v - w) + q * v + r * w);
        // Where every tie's normal faces the same way, so does their weighted sum (the weights
        // are positive); only ties that disagree are weighed.
        bool outside = true;
        bool agree = acc_x[j] == 0.0f && acc_y[j] == 0.0f && acc_z[j] == 0.0f;
        for (int t = 0; t < n_ties[j] && agree; ++t) {
            const int f = ties[j][t];
            const wp::vec3 fp = m.points[m.indices[f * 3 + 0]];
            const float side = wp::dot(wp::cross(m.points[m.indices[f * 3 + 1]] - fp,
                                                 m.points[m.indices[f * 3 + 2]] - fp), to_point);
            if (t == 0)
                outside = side > 0.0f;
            agree = side != 0.0f && (side > 0.0f) == outside;
        }
        if (!agree) {
            wp::vec3 acc(acc_x[j], acc_y[j], acc_z[j]);
            for (int t = 0; t < n_ties[j]; ++t)
                acc += warp_weighted_normal(ties[j][t], pt);
            outside = wp::dot(acc, to_point) > 0.0f;
        }
        if (!outside)
            bits.i |= 1 << 30;
    }
    return bits.f;
};
"""


@wp.func_native(THIN_TRIANGLE_CPP + CLOSEST_POINTS_LANES_CPP + WARP_SIGN_TIES_CPP + CLOSEST_POINTS_LEAF_CPP
                 + CLOSEST_POINTS_CHILDREN_CPP + CLOSEST_POINTS_ENTRY_CPP + """
for (int j = 0; j < 16; ++j) {
    px[j] = a[0];
    py[j] = a[1];
    pz[j] = a[2];
    best[j] = 0.0f;
    off[j] = 0.0f;
    fs1[j] = 0.0f;
    fs2[j] = 0.0f;
    best_face[j] = -1;
    best_u[j] = 0.0f;
    best_v[j] = 0.0f;
    closest[j] = 0.0f;
    n_ties[j] = 0;
    acc_x[j] = 0.0f;
    acc_y[j] = 0.0f;
    acc_z[j] = 0.0f;
}
closest[0] = bound_a;
best[0] = bound_a > 0.0f ? (bound_a + tie) * (bound_a + tie) : 0.0f;
worst = best[0];
for (int j = 1; j < count_pts; ++j) {
    const bool first_side = j <= n1c;
    const float s = first_side ? s1 + ds * (float)(j - 1) : s2 + ds * (float)(j - 1 - n1c);
    // The fraction along each side's direction (0 on the other side): the tangent bound below.
    fs1[j] = first_side ? s : 0.0f;
    fs2[j] = first_side ? 0.0f : s;
    const wp::vec3 offset = (first_side ? d1 : d2) * s;
    const wp::vec3 pt = a + offset;
    px[j] = pt[0];
    py[j] = pt[1];
    pz[j] = pt[2];
    off[j] = wp::length(offset);
    // 1-Lipschitz: the closest surface point of a is within base of a (under Warp's sign rule
    // with room for the faces that tie with the closest one).
    float b = reach;
    if (base >= 0.0f) {
        const float lip = (base + off[j]) * 1.0001f + 1.0e-6f + 3.0f * tie;
        b = base_inside ? lip : wp::min(reach, lip);
    }
    closest[j] = b;
    best[j] = (b + tie) * (b + tie);
    lo = wp::min(lo, pt);
    hi = wp::max(hi, pt);
    worst = wp::max(worst, best[j]);
}
stack[0] = *m.bvh.root;
count = worst > 0.0f ? 1 : 0;
while (count) {
    const int node = stack[--count];
    const wp::BVHPackedNodeHalf nl = m.bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf nu = m.bvh.node_uppers[node];
    const wp::vec3 node_lo(nl.x, nl.y, nl.z);
    const wp::vec3 node_hi(nu.x, nu.y, nu.z);
    const wp::vec3 gap = wp::max(wp::max(node_lo - hi, lo - node_hi), wp::vec3(0.0f));
    if (wp::length_sq(gap) >= worst)
        continue;
    if (nl.b)
        search_leaf(nl, nu);
    else
        push_children(nl, nu);
}
#undef SWEPT_LANES
#undef WARP_TIES
#undef RARELY_CALLED
wp::vec_t<16, float> out;
for (int j = 0; j < 16; ++j)
    out[j] = entry_of(j);
return out;""")
def mesh_closest_points(mesh: wp.uint64, a: wp.vec3, bound_a: float, d1: wp.vec3, s1: float, n1: int, d2: wp.vec3,
                        s2: float, n2: int, ds: float, reach: float, base: float, base_inside: bool,
                        warp_sign: bool, exact_thin: bool) -> vec16:
    """Closest triangles of up to 16 points in one traversal of the mesh's BVH: entry 0 for a
    within ``bound_a`` (not searched when bound_a <= 0), entries 1..n1 for a + d1 (s1 + i ds),
    the next n2 for a + d2 (s2 + i ds), i = 0, 1, ... (n1 + n2 <= SWEPT_BATCH). Each of those is
    searched within ``reach``, or, where a's unsigned distance ``base`` (>= 0) is known, within
    base + its distance to a (1-Lipschitz; always when a is inside: a deep point is found without
    a ray), whichever is smaller. The points lie on two short segments from a, so their searches
    visit nearly the same nodes; a child node is entered only where its box is nearer than some
    point's best, and a leaf's triangles are tested against a point only where the leaf's box is
    nearer than the point's best (a per-triangle box test cost more than it saved). The per-point
    tests against a box or a triangle's tangent bound run over 16 fixed lanes without branches
    (the CPU compiler vectorises them); only the points that pass get a closest-point test.
    Entries hold the triangle's index as float bits (face_of reads them), -1 for none. Candidates are those of Warp's mesh_query_point_no_sign (slivers
    skipped alike), measured as it measures them; with ``exact_thin`` (not with warp_sign) every
    triangle counts and thin ones are measured in float64, as mesh_closest_face does.

    With ``warp_sign`` each point found is signed as Warp's mesh_query_point_sign_normal signs
    it (warp_inside reads it): by the angle-weighted normals of the faces within its tie
    tolerance (1e-3 of the mesh's average edge length) of the closest one, weighed only where
    their normals disagree. The traversal differs from Warp's, so where faces tie in a chain
    wider than the tolerance the sign may differ from Warp's own (Warp's depends on its visit
    order there). Where a is inside and ``base_inside``, the others' bounds tighten as a's
    search narrows (the distance is 1-Lipschitz); elsewhere that cost more than it saved."""
    ...


@wp.func_native("""union { float f; int i; } bits; bits.f = x; return bits.i < 0 ? -1 : bits.i & ~(1 << 30);""")
def face_of(x: float) -> int:
    """The triangle whose index mesh_closest_points stored in a float entry, -1 for none."""
    ...


@wp.func_native("""union { float f; int i; } bits; bits.f = x; return bits.i >= 0 && (bits.i & (1 << 30)) ? -1.f : 1.f;""")
def warp_inside(x: float) -> float:
    """Warp's sign of an entry that mesh_closest_points found with warp_sign: -1 inside (else 1)."""
    ...
