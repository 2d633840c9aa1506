"""The winding number beside each face of a closed surface in the winding regime: what lets the
kernels take a sign from the closest feature instead of evaluating the winding number.

On a closed surface (every edge used as often in each direction; nested, overlapping, touching or
self-intersecting shells) the winding number is an integer that changes only where the surface is
crossed. For a point p whose closest surface point c lies on face f (found by the search), the
segment from p to c crosses no surface, so w(p) is the winding number just off c on p's side.
Where the surface around c is a clean oriented patch (every edge at f's corners used twice in
opposite directions, one fan of faces around each corner, none of those faces crossed by another
part of the mesh), p's side is the side the angle-weighted pseudo-normal of c's feature gives,
and just off c the winding number is that of f's outer side, plus 1 on its inner side
(kernels.winding's settled_winding_inside). Faces joined by such an edge share their outer
winding number, so it is evaluated once per patch.

face_rows computes, per face, (w_out, reach, settled): the winding number on the outer side of
the face, the distance from its centroid to its farthest corner, and FACE_SETTLED where the patch
around the face is clean as above. A face that is sound itself (not crossed, not degenerate, its
winding numbers on the two sides one apart) but has a corner whose fan is not clean (an edge used
by four faces, shells touching at a corner) gets FACE_INTERIOR_SETTLED: its winding numbers hold
for a point whose closest point lies inside the face, where the side is the face's normal's, and
for a ray's hit clear of its edges, not for one whose closest feature is an edge or a corner.
Elsewhere 0 (the kernels then evaluate the winding number). Rows for
robot_sdf.kernels.sign_data (its face rows), kernel frame, metres.

On an open surface the winding number varies off the surface, but only as fast as the rim lets it
(robot_sdf.mesh_analysis, "Rim"). open_face_rows evaluates it beside each face (not crossed, not
degenerate, its two sides one apart within the winding number's approximation error), at a point
a fiftieth of the face's size off its centroid, and marks the row FACE_OPEN: a point whose closest
point or ray hit lies inside the face takes the row's verdict where the rim bound over the way
there cannot carry the winding number across 1/2 (kernels.winding.settled_winding_inside). Two
winding numbers per face at add: 0.2-0.5 s for the 13k-20k-triangle open CAD meshes of the
benchmark (one thread, 2-core AMD EPYC; 0.03-0.05 s without); a surface of more than OPEN_ROWS_MAX_TRIANGLES triangles (a perception scan, added
again and again) gets none.
"""
from __future__ import annotations

import numpy as np
import warp as wp
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from robot_sdf.kernels.mesh_queries import winding_number
from robot_sdf.kernels.sign_data import FACE_INTERIOR_SETTLED, FACE_OPEN, FACE_SETTLED, face_rows_start
from robot_sdf.kernels.winding import WINDING_APPROXIMATION_ERROR

wp.set_module_options({"enable_backward": False})

# Warp's default accuracy of the fast winding number (kernels.winding.WINDING_ACCURACY).
ACCURACY = 2.0
# Offset of the two evaluation points from a face's centroid, relative to the square root of its
# area, and at least this absolute offset (m): close enough that no other surface lies between the
# point and the face on any corpus mesh, far enough from the face's plane for float32.
RELATIVE_OFFSET = 1.0e-3
MIN_OFFSET = 1.0e-6
# A face whose winding numbers on its two sides do not differ by 1 within this tolerance lies on
# another surface (a duplicate, a reversed twin, an overlap): not settled.
JUMP_TOLERANCE = 0.25
# Open surfaces: the evaluation points lie this fraction of a face's reach (centroid to farthest
# corner) off its centroid. Nearer, float32 rounding of the face's own solid angle grows (Warp's
# value 0.05 from the exact one at 1e-3 of a face's size on kr10_link2_visual; at 0.02 of its
# reach within 0.005 on the benchmark's three open CAD meshes, 600 faces each).
OPEN_RELATIVE_OFFSET = 0.02
# Open surfaces with more triangles get no rows (module docstring).
OPEN_ROWS_MAX_TRIANGLES = 30_000


@wp.kernel
def _side_winding_kernel(mesh: wp.uint64, points: wp.array(dtype=wp.vec3), accuracy: float,
                         out: wp.array(dtype=wp.float32), nearest: wp.array(dtype=wp.float32)):
    i = wp.tid()
    p = points[i]
    out[i] = winding_number(mesh, p, accuracy)
    q = wp.mesh_query_point_no_sign(mesh, p, 1.0e6)
    nearest[i] = wp.length(p - wp.mesh_eval_position(mesh, q.face, q.u, q.v))


def _side_windings(mesh: wp.Mesh, probes: np.ndarray) -> tuple:
    """(Warp's winding number at each of probes (N,3) float32, kernel frame, at ACCURACY; the
    distance from each to the surface): numpy float32 arrays."""
    device = mesh.points.device
    values = wp.empty(probes.shape[0], dtype=wp.float32, device=device)
    nearest = wp.empty(probes.shape[0], dtype=wp.float32, device=device)
    wp.launch(_side_winding_kernel, dim=probes.shape[0],
              inputs=[mesh.id, wp.array(probes, dtype=wp.vec3, device=device), ACCURACY],
              outputs=[values, nearest], device=device)
    return values.numpy(), nearest.numpy()


@wp.func
def _segment_crosses(p: wp.vec3, q: wp.vec3, a: wp.vec3, b: wp.vec3, c: wp.vec3) -> bool:
    """Whether the closed segment pq crosses triangle abc (not in its plane)."""
    e1 = b - a
    e2 = c - a
    d = q - p
    h = wp.cross(d, e2)
    det = wp.dot(e1, h)
    if wp.abs(det) <= 1.0e-7 * wp.length(e1) * wp.length(e2) * wp.length(d):
        return False
    inv = 1.0 / det
    s = p - a
    bu = inv * wp.dot(s, h)
    qv = wp.cross(s, e1)
    bv = inv * wp.dot(d, qv)
    t = inv * wp.dot(e2, qv)
    eps = float(1.0e-6)
    return not (bu < -eps or bv < -eps or bu + bv > 1.0 + eps or t < -eps or t > 1.0 + eps)


@wp.kernel
def _crossed_faces_kernel(mesh: wp.uint64, edges: wp.array2d(dtype=wp.int32),
                          welded_triangles: wp.array2d(dtype=wp.int32), crossed: wp.array(dtype=wp.int32),
                          edge_crosses: wp.array(dtype=wp.int32)):
    """Faces crossed by edge i (a segment between two corners), not counting faces that share a
    welded vertex with it; edge_crosses[i] = 1 where it crosses any."""
    i = wp.tid()
    m = wp.mesh_get(mesh)
    p = m.points[edges[i, 0]]
    q = m.points[edges[i, 1]]
    wu = edges[i, 2]
    wv = edges[i, 3]
    pad = wp.vec3(1.0e-6, 1.0e-6, 1.0e-6)
    query = wp.mesh_query_aabb(mesh, wp.min(p, q) - pad, wp.max(p, q) + pad)
    face = int(0)
    while wp.mesh_query_aabb_next(query, face):
        w0 = welded_triangles[face, 0]
        w1 = welded_triangles[face, 1]
        w2 = welded_triangles[face, 2]
        if w0 == wu or w1 == wu or w2 == wu or w0 == wv or w1 == wv or w2 == wv:
            continue
        if _segment_crosses(p, q, m.points[m.indices[face * 3]], m.points[m.indices[face * 3 + 1]],
                            m.points[m.indices[face * 3 + 2]]):
            crossed[face] = 1
            edge_crosses[i] = 1


def _sound_faces(mesh: wp.Mesh, points: np.ndarray, welded_corner: np.ndarray) -> tuple:
    """Per face of ``mesh`` (T > 0; arguments as for face_rows): (centroid (T,3), reach (T,): the
    distance from it to the farthest corner, normal (T,3) of length area2 (T,): twice the area,
    float64; sound (T,) bool: not degenerate and not crossed by another part of the mesh)."""
    v64 = np.asarray(points, np.float64).reshape(-1, 3)
    tri = mesh.indices.numpy().reshape(-1, 3).astype(np.int64)
    corners = v64[tri]
    centroid = corners.mean(axis=1)
    reach = np.sqrt(((corners - centroid[:, None, :]) ** 2).sum(-1).max(axis=1))
    normal = np.cross(corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0])
    area2 = np.linalg.norm(normal, axis=1)
    longest2 = max(float((np.ptp(v64, axis=0) ** 2).sum()), 1.0e-30)
    sound = (area2 > 1.0e-12 * longest2) & ~_crossed(mesh, tri, welded_corner)
    return centroid, reach, normal, area2, sound


def face_rows(mesh: wp.Mesh, points: np.ndarray, welded_corner: np.ndarray, edge_of_corner: np.ndarray,
              n_edges: int) -> np.ndarray:
    """(T, 3) float32 rows (w_out, reach, settled) of the module docstring, for a closed surface.

    ``mesh``: the Warp mesh (built with winding-number support, kernel frame); ``points`` (V,3)
    its vertices; ``welded_corner`` (3T,) welded vertex of corner k of face f at 3 f + k;
    ``edge_of_corner`` (3T,) undirected welded edge (corners k, k + 1) of face f at 3 f + k, of
    ``n_edges``."""
    n_faces = mesh.indices.shape[0] // 3
    rows = np.zeros((n_faces, 3), np.float32)
    if n_faces == 0:
        return rows
    centroid, reach, normal, area2, good = _sound_faces(mesh, points, welded_corner)
    rows[:, 1] = (reach * (1.0 + 1.0e-5) + 1.0e-7).astype(np.float32)

    # Edges used exactly twice, in opposite directions (collapsed edges count as bad).
    wt = np.asarray(welded_corner, np.int64).reshape(-1, 3)
    edge = np.asarray(edge_of_corner, np.int64)
    direction = np.sign(np.roll(wt, -1, axis=1) - wt).reshape(-1)
    uses = np.bincount(edge, minlength=n_edges)
    balance = np.bincount(edge, weights=direction.astype(np.float64), minlength=n_edges)
    collapsed = np.bincount(edge, weights=(direction == 0).astype(np.float64), minlength=n_edges)
    clean_edge = (uses == 2) & (balance == 0) & (collapsed == 0)
    # The two corners of each clean edge: corner c runs it from its vertex to the next corner's.
    pair = np.flatnonzero(clean_edge[edge])
    order = np.argsort(edge[pair], kind="stable")
    first, second = pair[order[0::2]], pair[order[1::2]]

    # The winding number just off the centroid on both sides, of one good face per patch of good
    # faces joined by clean edges.
    joined = good[first // 3] & good[second // 3]
    patches = coo_matrix((np.ones(int(joined.sum())), (first[joined] // 3, second[joined] // 3)),
                         shape=(n_faces, n_faces))
    patch = connected_components(patches, directed=False)[1]
    by_area = np.lexsort((-area2, patch))  # within each patch, the largest face first
    leaders = by_area[np.r_[True, patch[by_area[1:]] != patch[by_area[:-1]]]]
    probe_faces = leaders[good[leaders]]
    unit = normal[probe_faces] / area2[probe_faces, None]
    offset = np.maximum(RELATIVE_OFFSET * np.sqrt(0.5 * area2[probe_faces]), MIN_OFFSET)[:, None] * unit
    probes = np.concatenate([centroid[probe_faces] + offset, centroid[probe_faces] - offset]).astype(np.float32)
    outer = np.zeros(n_faces)
    inner = np.zeros(n_faces)
    if probes.shape[0]:
        values, nearest = _side_windings(mesh, probes)
        w = values.astype(np.float64)
        # A probe nearer to another surface than to its face (a thin part around the face) would
        # read that surface's winding number too, on both sides alike: its patch is not settled.
        clear = (nearest.reshape(2, -1) >= 0.5 * np.linalg.norm(offset, axis=1)).all(axis=0)
        w[:probe_faces.shape[0]][~clear] = np.nan
        # Each face takes its patch's values.
        by_patch_outer = np.zeros(n_faces)
        by_patch_inner = np.zeros(n_faces)
        by_patch_outer[patch[probe_faces]] = w[:probe_faces.shape[0]]
        by_patch_inner[patch[probe_faces]] = w[probe_faces.shape[0]:]
        outer, inner = by_patch_outer[patch], by_patch_inner[patch]
    w_out = np.nan_to_num(np.round(0.5 * (outer + inner - 1.0)))
    good &= np.abs(inner - outer - 1.0) < JUMP_TOLERANCE  # (False where a probe was not clear: NaN)

    # One fan of faces around each welded vertex: corners joined across their clean edges.
    n_vertices = int(wt.max()) + 1
    corner_vertex = wt.reshape(-1)
    nxt = lambda c: 3 * (c // 3) + (c % 3 + 1) % 3  # noqa: E731
    # The faces run the edge in opposite directions: a corner of one meets the other's next one.
    graph = coo_matrix((np.ones(2 * first.shape[0]),
                        (np.concatenate([first, nxt(first)]), np.concatenate([nxt(second), second]))),
                       shape=(3 * n_faces, 3 * n_faces))
    label = connected_components(graph, directed=False)[1]
    fan_keys = np.unique(corner_vertex * np.int64(3 * n_faces) + label)
    fans = np.bincount(fan_keys // np.int64(3 * n_faces), minlength=n_vertices)

    # A vertex is clean when its one fan is made of good faces on clean edges with one w_out.
    next_vertex = np.roll(wt, -1, axis=1).reshape(-1)
    edge_bad = ~clean_edge[edge]
    face_bad = np.repeat(~good, 3)
    bad_count = (np.bincount(corner_vertex, weights=edge_bad | face_bad, minlength=n_vertices)
                 + np.bincount(next_vertex, weights=edge_bad, minlength=n_vertices))
    lo = np.full(n_vertices, np.inf)
    hi = np.full(n_vertices, -np.inf)
    np.minimum.at(lo, corner_vertex, np.repeat(w_out, 3))
    np.maximum.at(hi, corner_vertex, np.repeat(w_out, 3))
    bad_vertex = (fans != 1) | (bad_count > 0) | (hi > lo)
    settled = good & ~bad_vertex[wt].any(axis=1)
    rows[:, 0] = w_out.astype(np.float32)
    rows[:, 2] = np.where(settled, float(FACE_SETTLED), np.where(good, float(FACE_INTERIOR_SETTLED), 0.0))
    return rows


def open_face_rows(mesh: wp.Mesh, points: np.ndarray, welded_corner: np.ndarray) -> np.ndarray:
    """(T, 3) float32 rows (w_out, reach, FACE_OPEN or 0) of an open surface (module docstring):
    the winding number at OPEN_RELATIVE_OFFSET of the face's reach off its centroid on its outer
    side, and the face's reach plus that offset. Arguments as for face_rows."""
    rows = np.zeros((mesh.indices.shape[0] // 3, 3), np.float32)
    if rows.shape[0] == 0:
        return rows
    centroid, reach, normal, area2, sound = _sound_faces(mesh, points, welded_corner)
    good = np.flatnonzero(sound)
    offset = np.maximum(OPEN_RELATIVE_OFFSET * reach[good], MIN_OFFSET)
    step = offset[:, None] * normal[good] / area2[good, None]
    probes = np.concatenate([centroid[good] + step, centroid[good] - step]).astype(np.float32)
    if probes.shape[0]:
        values, nearest = _side_windings(mesh, probes)
        outer, inner = values.astype(np.float64).reshape(2, -1)
        # As for closed surfaces: a point nearer another surface than its face, or two sides not one
        # apart, say that another surface lies there.
        clear = (nearest.reshape(2, -1) >= 0.5 * offset).all(axis=0)
        settled = clear & (np.abs(inner - outer - 1.0) < float(WINDING_APPROXIMATION_ERROR))
        rows[good, 0] = outer.astype(np.float32)
        # The way from a point inside the face to the evaluation point: along the face to the
        # centroid, then off it (a straight line could pass over something lying on the face).
        rows[good, 1] = ((reach[good] + offset) * (1.0 + 1.0e-5) + 1.0e-7).astype(np.float32)
        rows[good, 2] = np.where(settled, float(FACE_OPEN), 0.0)
    return rows


def _crossed(mesh: wp.Mesh, tri: np.ndarray, welded_corner: np.ndarray) -> np.ndarray:
    """(T,) bool: faces crossed by an edge of a face that shares no welded vertex with them, and
    the faces of such edges."""
    device = mesh.points.device
    n_faces = tri.shape[0]
    wt = np.asarray(welded_corner, np.int64).reshape(-1, 3)
    ends = np.stack([tri, np.roll(tri, -1, axis=1)], axis=-1).reshape(-1, 2)
    edges = np.concatenate([ends, wt.reshape(-1)[:, None], np.roll(wt, -1, axis=1).reshape(-1)[:, None]], axis=1)
    crossed = wp.zeros(n_faces, dtype=wp.int32, device=device)
    edge_crosses = wp.zeros(edges.shape[0], dtype=wp.int32, device=device)
    wp.launch(_crossed_faces_kernel, dim=edges.shape[0],
              inputs=[mesh.id, wp.array(edges.astype(np.int32), dtype=wp.int32, device=device),
                      wp.array(wt.astype(np.int32), dtype=wp.int32, device=device)],
              outputs=[crossed, edge_crosses], device=device)
    return (crossed.numpy() != 0) | (edge_crosses.numpy().reshape(-1, 3).max(axis=1) != 0)


def write_face_rows(mesh: wp.Mesh, velocities: wp.array, points: np.ndarray, topology) -> np.ndarray | None:
    """face_rows (a closed surface) or open_face_rows (an open one) of ``mesh`` written into its
    sign data ``velocities`` (the array the mesh was built with, robot_sdf.kernels.sign_data's face
    rows); ``topology``: the geometry's mesh_analysis.SignTopology. Returns the rows (None for an
    open surface of more than OPEN_ROWS_MAX_TRIANGLES triangles: its rows stay 0, nothing
    settled)."""
    n_faces = mesh.indices.shape[0] // 3
    if topology.balanced:
        rows = face_rows(mesh, points, topology.welded_corner, topology.edge_of_corner, topology.n_edges)
    elif n_faces <= OPEN_ROWS_MAX_TRIANGLES:
        rows = open_face_rows(mesh, points, topology.welded_corner)
    else:
        return None
    if n_faces:
        start = face_rows_start(mesh.points.shape[0], n_faces)
        velocities[start:start + n_faces].assign(wp.array(rows, dtype=wp.vec3, device=velocities.device))
    return rows
