"""The swept kernel's shared winding-number traversal in C++ (``wp.func_native``): Warp's fast
winding numbers of a step's points in one BVH traversal (mesh_winding_numbers). Like
kernels.native it reads Warp's internals (``wp::Mesh``'s solid-angle properties, BVH nodes and
robust_solid_angle, evaluate_node_solid_angle), so it loads only behind native's Warp version check.
"""
from __future__ import annotations

import warp as wp

from robot_sdf.kernels.native import vec16

wp.set_module_options({"enable_backward": False})


@wp.func_native("""
const wp::Mesh m = wp::mesh_get(mesh);
const int n1c = n1 < 15 ? (n1 > 0 ? n1 : 0) : 15;
const int n2c = n2 < 15 - n1c ? (n2 > 0 ? n2 : 0) : 15 - n1c;
const int count_pts = 1 + n1c + n2c;
wp::vec3 pts[16];
for (int j = 0; j < count_pts; ++j) {
    const bool first_side = j >= 1 && j <= n1c;
    const float s = j == 0 ? 0.0f : (first_side ? s1 + ds * (float)(j - 1) : s2 + ds * (float)(j - 1 - n1c));
    pts[j] = a + (first_side ? d1 : d2) * s;
}
wp::vec_t<16, float> out;
for (int j = 0; j < 16; ++j)
    out[j] = 0.0f;
unsigned int todo = lanes & ((1u << count_pts) - 1u);
#if defined(__CUDA_ARCH__)
// A GPU thread gains nothing from sharing (no vector lanes) and would pay the partial sums in
// local memory: point after point.
for (int j = 0; j < count_pts; ++j)
    if (todo & (1u << j))
        out[j] = wp::mesh_query_winding_number(mesh, pts[j], accuracy);
#else
// Warp's solid_angle_iterative for every point at once: a depth-first walk in Warp's order, each
// point descending where Warp's would (its own far-field test) and keeping its own partial sum
// per level, added to its parent's in Warp's order, so that each value is Warp's to the bit. The
// nodes and triangles are read once for all points.
const float accuracy_sq = accuracy * accuracy;
int stack[BVH_QUERY_STACK_SIZE];
int at_child[BVH_QUERY_STACK_SIZE];
unsigned int reach_mask[BVH_QUERY_STACK_SIZE];
unsigned int down_mask[BVH_QUERY_STACK_SIZE];
float angle[BVH_QUERY_STACK_SIZE][16];
stack[0] = *m.bvh.root;
at_child[0] = 0;
reach_mask[0] = todo;
for (int j = 0; j < 16; ++j)
    angle[0][j] = 0.0f;
int count = todo ? 1 : 0;
while (count) {
    const int level = count - 1;
    const int node = stack[level];
    const wp::BVHPackedNodeHalf lower = m.bvh.node_lowers[node];
    const wp::BVHPackedNodeHalf upper = m.bvh.node_uppers[node];
    if (lower.b) {
        const unsigned int here = reach_mask[level];
        for (int j = 0; j < count_pts; ++j)
            angle[level][j] = 0.0f;
        for (int prim = (int)lower.i; prim < (int)upper.i; ++prim) {
            const int tri = m.bvh.primitive_indices[prim];
            const wp::vec3 p = m.points[m.indices[tri * 3 + 0]];
            const wp::vec3 q = m.points[m.indices[tri * 3 + 1]];
            const wp::vec3 r = m.points[m.indices[tri * 3 + 2]];
            for (unsigned int left = here; left != 0u; left &= left - 1u) {
                const int j = __builtin_ctz(left);
                angle[level][j] += wp::robust_solid_angle(p, q, r, pts[j]);
            }
        }
        count--;
    } else if (at_child[level] == 0) {
        unsigned int down = 0u;
        for (unsigned int left = reach_mask[level]; left != 0u; left &= left - 1u) {
            const int j = __builtin_ctz(left);
            if (wp::evaluate_node_solid_angle(pts[j], &m.solid_angle_props[node], angle[level][j], accuracy_sq))
                down |= 1u << j;
        }
        if (down) {
            down_mask[level] = down;
            at_child[level] = 1;
            stack[count] = (int)lower.i;
            reach_mask[count] = down;
            at_child[count] = 0;
            count++;
        } else {
            count--;
        }
    } else {
        for (unsigned int left = down_mask[level]; left != 0u; left &= left - 1u) {
            const int j = __builtin_ctz(left);
            angle[level][j] += angle[level + 1][j];
        }
        if (at_child[level] == 1) {
            at_child[level] = 2;
            stack[count] = (int)upper.i;
            reach_mask[count] = down_mask[level];
            at_child[count] = 0;
            count++;
        } else {
            count--;
        }
    }
}
for (int j = 0; j < count_pts; ++j)
    if (todo & (1u << j))
        out[j] = (float)((double)angle[0][j] * 0.07957747154);
#endif
return out;""")
def mesh_winding_numbers(mesh: wp.uint64, a: wp.vec3, d1: wp.vec3, s1: float, n1: int, d2: wp.vec3, s2: float,
                         n2: int, ds: float, accuracy: float, lanes: int) -> vec16:
    """Warp's fast winding numbers (mesh_query_winding_number at ``accuracy``) of the points that
    mesh_closest_points would search with the same arguments (a, then a + d1 (s1 + i ds), then
    a + d2 (s2 + i ds)), for the points whose bit is set in ``lanes`` (0 for the others), in one
    traversal on the CPU."""
    ...
