"""Build-time analysis of a mesh: pseudo-normals for the ``normal`` sign, and the ``auto`` choice.

Everything here runs once per geometry when it is added (numpy, float64, plus one Warp kernel
for self-intersections), never per query.

Sign data: the per-mesh rows robot_sdf keeps next to the BVH in each Warp mesh's ``velocities``
array (pseudo-normals, rim chunks, box, flags), written here (sign_data, SignDataWriter) and read
by the kernels. Its layout, constants and accessors have one home: robot_sdf.kernels.sign_data.

Rim: the welded edges whose uses in one direction and the other do not cancel (the boundary of an
open surface; flipped and non-manifold edges too), each with that net multiplicity. Off the
surface, the gradient of the exact winding number is a line integral over the rim alone (the
solid angle's gradient is the Biot-Savart field of the boundary curve), so
|grad w(x)| <= sum over rim edges of multiplicity x length / (4 pi dist(x, edge)^2). The rim is
cut into at most RIM_CHUNKS spatially compact chunks (a median split along the longest axis of
the edge midpoints at build; a refit keeps the chunks and rewrites their boxes and lengths);
the kernels bound that sum with each chunk's box distance and length, and a swept step's samples
then share the winding number verdict of its centre where the bound allows (docs/sign_methods.md).

Inside test far from the surface: a closed surface (every edge used as often in one direction
as in the other, any number of shells) has an integer winding number, 0 outside its bounding
box, so no point outside the box is inside. Any other surface can have a winding number above
0.5 outside its box (flipped faces, folds); |w| <= A / (4 pi (D - R)^2) at distance D from the
centre of a surface of area A within radius R, so beyond the winding radius R + sqrt(A / (2 pi))
no point is inside; likewise |w| <= A / (4 pi d^2) at distance d from the surface (or from its
bounding box), so a point farther than sqrt(A / (2 pi)) from the box is outside.

Pseudo-normals follow Baerentzen & Aanaes (2005): for a closed, consistently oriented,
non-self-intersecting surface, the sign of dot(p - c, n) with c the closest surface point and n
the pseudo-normal of the feature (face, edge or vertex) that contains c is the exact inside test,
whichever of several equally close features is picked.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import warp as wp

from robot_sdf.kernels.sign_data import (RIM_CHUNKS, RIM_LENGTH, RIM_LOWER, RIM_ROWS_PER_CHUNK, RIM_UPPER,
                                         ROW_AREA, ROW_BOUNDS, ROW_BOX_LOWER, ROW_BOX_UPPER, ROW_MARKER,
                                         SIGN_DATA_EXTRA, SIGN_DATA_MAGIC, row_count, sign_data_offset)
from robot_sdf.types import SignMethod

# Build-time analysis differentiates nothing: no adjoint kernels (half the compile).
wp.set_module_options({"enable_backward": False})

# Longest edge / height above which a triangle is a sliver: Warp's float32 closest-point search
# may then pick a triangle up to ~1e-4 m farther than the closest one.
SLIVER_ASPECT = 20.0
FLAT_RATIO = 1e-6  # 2 * area / longest edge^2 (= height / longest edge) of a flat triangle


# ---------------------------------------------------------------------------------------- topology
def weld(vertices: np.ndarray) -> np.ndarray:
    """(V,) index of the first vertex at the same exact position: soups (STL) share no indices,
    but their corners do share bit-identical coordinates."""
    # Rows compared by their float32 bits (+0.0 folds -0.0 into 0.0, as a float comparison
    # would). A stable lexsort instead of np.unique(axis=0): that one sorts a structured dtype
    # while holding the GIL (1.8 s for 500k vertices), which stalls the node's query threads.
    bits = (np.ascontiguousarray(vertices, np.float32).reshape(-1, 3) + np.float32(0.0)).view(np.uint32)
    n = bits.shape[0]
    if n == 0:
        return np.zeros(0, np.int64)
    order = np.lexsort((bits[:, 2], bits[:, 1], bits[:, 0]))
    rows = bits[order]
    starts = np.empty(n, bool)
    starts[0] = True
    starts[1:] = np.any(rows[1:] != rows[:-1], axis=1)
    group = np.cumsum(starts.astype(np.int64)) - 1
    out = np.empty(n, np.int64)
    out[order] = order[starts][group]  # stable sort: the group's first entry is its lowest index
    return out


def _unique(x: np.ndarray, return_index: bool = False, return_inverse: bool = False,
            return_counts: bool = False):
    """np.unique of a 1-D integer array (sorted values, first indices, inverse, counts) built
    from operations that release the GIL: numpy's own hash-table path and its cumulative sum
    of a bool mask hold it for hundreds of ms on million-element arrays, stalling queries
    answered meanwhile by other threads of the node."""
    x = np.asarray(x).reshape(-1)
    perm = np.argsort(x, kind="stable")
    aux = x[perm]
    starts = np.empty(aux.shape[0], bool)
    starts[:1] = True
    starts[1:] = aux[1:] != aux[:-1]
    out = [aux[starts]]
    if return_index:
        out.append(perm[starts])
    if return_inverse:
        inverse = np.empty(x.shape[0], np.int64)
        inverse[perm] = np.cumsum(starts.astype(np.int64)) - 1
        out.append(inverse)
    if return_counts:
        begin = np.flatnonzero(starts)
        out.append(np.diff(np.append(begin, aux.shape[0])))
    return out[0] if len(out) == 1 else tuple(out)


def _face_normals(v64: np.ndarray, tri: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unit normals (T,3) (zero for degenerate triangles) and twice the areas (T,)."""
    a, b, c = v64[tri[:, 0]], v64[tri[:, 1]], v64[tri[:, 2]]
    n = np.cross(b - a, c - a)
    area2 = np.linalg.norm(n, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        unit = np.where(area2[:, None] > 0.0, n / area2[:, None], 0.0)
    return unit, area2


def _edge_keys(welded_tri: np.ndarray, n_vertices: int) -> np.ndarray:
    """(T,3) undirected key of edge k (corners k, k+1) of each triangle."""
    lo = np.minimum(welded_tri, np.roll(welded_tri, -1, axis=1))
    hi = np.maximum(welded_tri, np.roll(welded_tri, -1, axis=1))
    return lo * np.int64(n_vertices) + hi


@dataclass(frozen=True)
class SignTopology:
    """The part of the sign data that depends only on the triangles and the weld: computed once
    per geometry (at build) and reused by every refit (same topology, new vertex positions),
    whose sign data is then only SignDataWriter's kernels. Compact: int32, 24 bytes per triangle."""

    triangles: np.ndarray       # (T,3) int32
    welded: np.ndarray          # (V,) first vertex at the same position (weld)
    welded_corner: np.ndarray   # (3T,) int32 welded vertex of corner k of triangle f at 3 f + k
    edge_of_corner: np.ndarray  # (3T,) int32 undirected welded edge k (corners k, k+1) of triangle f
    n_edges: int
    balanced: bool              # every welded edge used as often in each direction
    # The rim (module docstring), edges grouped by chunk: chunk c holds rim edges
    # rim_start[c] .. rim_start[c + 1] - 1; each joins welded vertices rim_ends[i] with that
    # net multiplicity rim_multiplicity[i].
    rim_ends: np.ndarray        # (R,2) int32
    rim_multiplicity: np.ndarray  # (R,) float32, >= 1
    rim_start: np.ndarray       # (K + 1,) int32

    @property
    def rim_chunks(self) -> int:
        return self.rim_start.shape[0] - 1

    @property
    def rows(self) -> int:
        """Rows of the sign data: V + 4T + 3K + 5 (robot_sdf.kernels.sign_data)."""
        return row_count(self.welded.shape[0], self.triangles.shape[0], self.rim_chunks)


def _rim_chunk_order(midpoints: np.ndarray, chunks: int) -> tuple[np.ndarray, np.ndarray]:
    """(order of the edges, (chunks + 1,) chunk starts in that order): median splits along the
    longest axis of the midpoints' extent, so that each chunk's box stays small."""
    pieces = [(np.arange(midpoints.shape[0]), chunks)]
    done = []
    while pieces:
        idx, n = pieces.pop()
        if n <= 1 or idx.shape[0] <= 1:
            done.append(idx)
            continue
        pts = midpoints[idx]
        axis = int(np.argmax(np.ptp(pts, axis=0)))
        idx = idx[np.argsort(pts[:, axis], kind="stable")]
        half = idx.shape[0] * (n // 2) // n
        pieces.append((idx[half:], n - n // 2))
        pieces.append((idx[:half], n // 2))
    done = [d for d in done if d.shape[0]]
    starts = np.zeros(len(done) + 1, np.int32)
    starts[1:] = np.cumsum([d.shape[0] for d in done])
    return (np.concatenate(done) if done else np.zeros(0, np.int64)), starts


def sign_topology(triangles: np.ndarray, welded: np.ndarray, points: np.ndarray | None = None) -> SignTopology:
    """``points`` (V,3): positions that group the rim into chunks (any grouping is valid; without
    them, the edges' order)."""
    tri = np.asarray(triangles, np.int64).reshape(-1, 3)
    wt = welded[tri]
    unique, inverse = _unique(_edge_keys(wt, welded.shape[0]).reshape(-1), return_inverse=True)
    # Closed in the winding-number sense (integer winding number everywhere): every welded edge
    # is used as often in one direction as in the other. Collapsed edges count for neither.
    # bincount, not np.add.at (which holds the GIL); sums of +-1 are exact in float64.
    direction = np.sign(np.roll(wt, -1, axis=1) - wt).reshape(-1).astype(np.float64)
    balance = np.bincount(inverse, weights=direction, minlength=unique.shape[0])
    rim = np.flatnonzero(balance != 0)
    n_vertices = np.int64(welded.shape[0])
    ends = np.stack([unique[rim] // n_vertices, unique[rim] % n_vertices], axis=1) if n_vertices else \
        np.zeros((0, 2), np.int64)
    multiplicity = np.abs(balance[rim])
    if points is not None and rim.shape[0]:
        p = np.asarray(points, np.float64).reshape(-1, 3)
        order, starts = _rim_chunk_order(0.5 * (p[ends[:, 0]] + p[ends[:, 1]]), RIM_CHUNKS)
    else:
        order = np.arange(rim.shape[0])
        starts = np.linspace(0, rim.shape[0], min(RIM_CHUNKS, rim.shape[0]) + 1).astype(np.int32)
    return SignTopology(triangles=np.asarray(triangles, np.int32).reshape(-1, 3), welded=welded,
                        welded_corner=wt.reshape(-1).astype(np.int32), edge_of_corner=inverse.astype(np.int32),
                        n_edges=int(unique.shape[0]), balanced=rim.shape[0] == 0,
                        rim_ends=np.ascontiguousarray(ends[order], np.int32),
                        rim_multiplicity=np.ascontiguousarray(multiplicity[order], np.float32),
                        rim_start=starts.astype(np.int32))


# ---------------------------------------------------------------------------------------- sign data
# Computed by Warp kernels: one launch per pass releases the GIL for the whole pass, where the
# same work in numpy is ~40 array operations, each releasing and re-taking the GIL. In the node,
# where service threads hold the GIL in turns, every re-take waits up to a switch interval:
# measured on an 1800-triangle refit with 3 busy Python threads, 19 ms (numpy) against 6 ms.
# On the CPU the passes run serially, in triangle order, so the sums are deterministic.
STAT_AREA2, STAT_RADIUS2, STAT_SLIVERS = 0, 1, 2


@wp.func
def centre_point(i: int, raw: wp.array(dtype=wp.vec3), centre: wp.vec3d, points: wp.array(dtype=wp.vec3)):
    """points[i] = raw[i] - centre, evaluated in float64 and rounded once (as the geometry's build does)."""
    points[i] = wp.vec3(wp.vec3d(raw[i]) - centre)


@wp.func
def clear_sign_sums(
    i: int,
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
):
    if i < vertex_sum.shape[0]:
        vertex_sum[i] = wp.vec3d()
    if i < edge_sum.shape[0]:
        edge_sum[i] = wp.vec3d()
    if i == 0:
        for k in range(3):
            stats[k] = wp.float64(0.0)
            box[k] = wp.inf
            box[k + 3] = -wp.inf


@wp.func
def accumulate_face_normal(
    f: int,
    points: wp.array(dtype=wp.vec3),
    triangles: wp.array(dtype=wp.int32),
    welded_corner: wp.array(dtype=wp.int32),
    edge_of_corner: wp.array(dtype=wp.int32),
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
):
    """Triangle f, float64: its unit normal (zero if degenerate) added to the sums of its three
    welded edges, weighted by its corner angles to the sums of its welded vertices; twice its
    area, and whether it is a sliver (longest edge / height > SLIVER_ASPECT, not flat), to stats."""
    c0 = wp.vec3d(points[triangles[3 * f]])
    c1 = wp.vec3d(points[triangles[3 * f + 1]])
    c2 = wp.vec3d(points[triangles[3 * f + 2]])
    e0 = c1 - c0
    e1 = c2 - c1
    e2 = c0 - c2
    normal = wp.cross(e0, c2 - c0)
    area2 = wp.length(normal)
    unit = wp.vec3d()
    if area2 > wp.float64(0.0):
        unit = normal / area2
    # Corner angles as atan2(|cross|, dot), robust for thin triangles (|cross| of any two edges
    # of a triangle is twice its area).
    wp.atomic_add(vertex_sum, welded_corner[3 * f], unit * wp.atan2(area2, -wp.dot(e0, e2)))
    wp.atomic_add(vertex_sum, welded_corner[3 * f + 1], unit * wp.atan2(area2, -wp.dot(e1, e0)))
    wp.atomic_add(vertex_sum, welded_corner[3 * f + 2], unit * wp.atan2(area2, -wp.dot(e2, e1)))
    for k in range(3):
        wp.atomic_add(edge_sum, edge_of_corner[3 * f + k], unit)
    wp.atomic_add(stats, STAT_AREA2, area2)
    longest2 = wp.max(wp.max(wp.dot(e0, e0), wp.dot(e1, e1)), wp.dot(e2, e2))
    # height = area2 / longest, so aspect = longest^2 / area2
    if area2 > wp.float64(FLAT_RATIO) * longest2 and longest2 > wp.float64(SLIVER_ASPECT) * area2:
        wp.atomic_add(stats, STAT_SLIVERS, wp.float64(1.0))


@wp.func
def write_pseudo_normal(
    i: int,
    points: wp.array(dtype=wp.vec3),
    welded: wp.array(dtype=wp.int32),
    edge_of_corner: wp.array(dtype=wp.int32),
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
    out: wp.array(dtype=wp.vec3),
):
    """Row i < V + 3T of the sign data (unit pseudo-normal, zero where the sum is zero); for a
    vertex also its share of the bounding box and of the largest |vertex|^2."""
    n_vertices = points.shape[0]
    total = wp.vec3d()
    if i < n_vertices:
        total = vertex_sum[welded[i]]
        p = points[i]
        for k in range(3):
            wp.atomic_min(box, k, p[k])
            wp.atomic_max(box, k + 3, p[k])
        p64 = wp.vec3d(p)
        wp.atomic_max(stats, STAT_RADIUS2, wp.dot(p64, p64))
    else:
        total = edge_sum[edge_of_corner[i - n_vertices]]
    length = wp.length(total)
    unit = wp.vec3()
    if length > wp.float64(0.0):
        unit = wp.vec3(total / length)
    out[i] = unit


@wp.func
def write_rim_chunk(
    c: int,
    points: wp.array(dtype=wp.vec3),
    rim_ends: wp.array2d(dtype=wp.int32),
    rim_multiplicity: wp.array(dtype=wp.float32),
    rim_start: wp.array(dtype=wp.int32),
    first: int,
    out: wp.array(dtype=wp.vec3),
):
    """The three rows of rim chunk c at first + 3 c: its edges' box and their length times
    multiplicity (float64, rounded up to float32: the kernels' bound may only grow)."""
    lower = wp.vec3(wp.inf, wp.inf, wp.inf)
    upper = wp.vec3(-wp.inf, -wp.inf, -wp.inf)
    length = wp.float64(0.0)
    for i in range(rim_start[c], rim_start[c + 1]):
        a = points[rim_ends[i, 0]]
        b = points[rim_ends[i, 1]]
        lower = wp.min(lower, wp.min(a, b))
        upper = wp.max(upper, wp.max(a, b))
        length += wp.float64(rim_multiplicity[i]) * wp.length(wp.vec3d(b) - wp.vec3d(a))
    row = first + RIM_ROWS_PER_CHUNK * c
    out[row + RIM_LOWER] = lower
    out[row + RIM_UPPER] = upper
    out[row + RIM_LENGTH] = wp.vec3(wp.float32(length * wp.float64(1.000001)), 0.0, 0.0)


@wp.func
def write_sign_extras(
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
    first: int,
    winding_support: float,
    closed: float,
    method: float,
    rim_chunks: int,
    out: wp.array(dtype=wp.vec3),
    radii: wp.array(dtype=wp.float64),
):
    """The SIGN_DATA_EXTRA rows after the rim chunks (robot_sdf.kernels.sign_data), from ``first``;
    radii = (bounding radius, winding radius)."""
    area = wp.float64(0.5) * stats[STAT_AREA2]
    radius = wp.sqrt(stats[STAT_RADIUS2])
    # Beyond the winding radius (from the kernel-frame origin) the winding number is below 0.5.
    winding_radius = radius + wp.sqrt(area / wp.float64(2.0 * wp.pi)) * wp.float64(1.001) + wp.float64(1.0e-6)
    slivers = float(0.0)
    if stats[STAT_SLIVERS] > wp.float64(0.0):
        slivers = 1.0
    out[first + ROW_BOX_LOWER] = wp.vec3(box[0], box[1], box[2])
    out[first + ROW_BOX_UPPER] = wp.vec3(box[3], box[4], box[5])
    out[first + ROW_MARKER] = wp.vec3(SIGN_DATA_MAGIC, winding_support, method)
    out[first + ROW_BOUNDS] = wp.vec3(wp.float32(winding_radius), closed, slivers)
    # The solid flag (column 1) is set afterwards by whoever classified the mesh (world, adoption).
    out[first + ROW_AREA] = wp.vec3(wp.float32(area), 0.0, float(rim_chunks))
    radii[0] = radius
    radii[1] = winding_radius


# One kernel per pass (the passes need each other's sums complete): for CUDA.
@wp.kernel
def clear_sign_sums_kernel(
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
):
    clear_sign_sums(wp.tid(), vertex_sum, edge_sum, stats, box)


@wp.kernel
def accumulate_face_normals_kernel(
    points: wp.array(dtype=wp.vec3),
    triangles: wp.array(dtype=wp.int32),
    welded_corner: wp.array(dtype=wp.int32),
    edge_of_corner: wp.array(dtype=wp.int32),
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
):
    accumulate_face_normal(wp.tid(), points, triangles, welded_corner, edge_of_corner, vertex_sum, edge_sum, stats)


@wp.kernel
def write_pseudo_normals_kernel(
    points: wp.array(dtype=wp.vec3),
    welded: wp.array(dtype=wp.int32),
    edge_of_corner: wp.array(dtype=wp.int32),
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
    out: wp.array(dtype=wp.vec3),
):
    write_pseudo_normal(wp.tid(), points, welded, edge_of_corner, vertex_sum, edge_sum, stats, box, out)


@wp.kernel
def write_rim_chunks_kernel(
    points: wp.array(dtype=wp.vec3),
    rim_ends: wp.array2d(dtype=wp.int32),
    rim_multiplicity: wp.array(dtype=wp.float32),
    rim_start: wp.array(dtype=wp.int32),
    first: int,
    out: wp.array(dtype=wp.vec3),
):
    write_rim_chunk(wp.tid(), points, rim_ends, rim_multiplicity, rim_start, first, out)


@wp.kernel
def write_sign_extras_kernel(
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
    first: int,
    winding_support: float,
    closed: float,
    method: float,
    rim_chunks: int,
    out: wp.array(dtype=wp.vec3),
    radii: wp.array(dtype=wp.float64),
):
    write_sign_extras(stats, box, first, winding_support, closed, method, rim_chunks, out, radii)


@wp.kernel
def clear_rows_kernel(first: int, out: wp.array(dtype=wp.vec3)):
    out[first + wp.tid()] = wp.vec3(0.0, 0.0, 0.0)


@wp.kernel
def centre_points_kernel(raw: wp.array(dtype=wp.vec3), centre: wp.vec3d, points: wp.array(dtype=wp.vec3)):
    centre_point(wp.tid(), raw, centre, points)


@wp.kernel
def sign_data_serial_kernel(
    raw: wp.array(dtype=wp.vec3),
    centre: wp.vec3d,
    points: wp.array(dtype=wp.vec3),
    triangles: wp.array(dtype=wp.int32),
    welded: wp.array(dtype=wp.int32),
    welded_corner: wp.array(dtype=wp.int32),
    edge_of_corner: wp.array(dtype=wp.int32),
    rim_ends: wp.array2d(dtype=wp.int32),
    rim_multiplicity: wp.array(dtype=wp.float32),
    rim_start: wp.array(dtype=wp.int32),
    vertex_sum: wp.array(dtype=wp.vec3d),
    edge_sum: wp.array(dtype=wp.vec3d),
    stats: wp.array(dtype=wp.float64),
    box: wp.array(dtype=wp.float32),
    winding_support: float,
    closed: float,
    method: float,
    out: wp.array(dtype=wp.vec3),
    radii: wp.array(dtype=wp.float64),
):
    """points = raw - centre, then all passes, in one launch of one thread: for the CPU, where
    Warp runs a launch serially anyway and every launch is one more release and re-take of the GIL."""
    for i in range(points.shape[0]):
        centre_point(i, raw, centre, points)
    for i in range(wp.max(wp.max(vertex_sum.shape[0], edge_sum.shape[0]), 1)):
        clear_sign_sums(i, vertex_sum, edge_sum, stats, box)
    n_triangles = triangles.shape[0] // 3
    for f in range(n_triangles):
        accumulate_face_normal(f, points, triangles, welded_corner, edge_of_corner, vertex_sum, edge_sum, stats)
    normals = points.shape[0] + 3 * n_triangles
    for i in range(normals):
        write_pseudo_normal(i, points, welded, edge_of_corner, vertex_sum, edge_sum, stats, box, out)
    for f in range(n_triangles):
        out[normals + f] = wp.vec3(0.0, 0.0, 0.0)  # face rows: nothing settled (face_winding)
    first = normals + n_triangles
    rim_chunks = rim_start.shape[0] - 1
    for c in range(rim_chunks):
        write_rim_chunk(c, points, rim_ends, rim_multiplicity, rim_start, first, out)
    write_sign_extras(stats, box, first + RIM_ROWS_PER_CHUNK * rim_chunks, winding_support, closed, method,
                      rim_chunks, out, radii)


class SignDataWriter:
    """Writes a geometry's sign data on its device from its kernel-frame points, again and
    again for refits: the topology arrays and the scratch sums live on the device, made once.
    Not thread-safe (one scratch set): the owner serialises calls."""

    def __init__(self, topology: SignTopology, device, one_launch: bool | None = None) -> None:
        """``one_launch``: all passes in one single-threaded launch (default: on the CPU)."""
        self.topology = topology
        self.device = wp.get_device(device)
        self.one_launch = self.device.is_cpu if one_launch is None else bool(one_launch)
        n_vertices, n_triangles = topology.welded.shape[0], topology.triangles.shape[0]
        self.rows = topology.rows
        dev = self.device
        self._triangles = wp.array(topology.triangles.reshape(-1), dtype=wp.int32, device=dev)
        self._welded = wp.array(topology.welded.astype(np.int32), dtype=wp.int32, device=dev)
        self._welded_corner = wp.array(topology.welded_corner, dtype=wp.int32, device=dev)
        self._edge_of_corner = wp.array(topology.edge_of_corner, dtype=wp.int32, device=dev)
        self._rim_ends = wp.array(topology.rim_ends.reshape(-1, 2), dtype=wp.int32, device=dev)
        self._rim_multiplicity = wp.array(topology.rim_multiplicity, dtype=wp.float32, device=dev)
        self._rim_start = wp.array(topology.rim_start, dtype=wp.int32, device=dev)
        self._vertex_sum = wp.empty(n_vertices, dtype=wp.vec3d, device=dev)
        self._edge_sum = wp.empty(topology.n_edges, dtype=wp.vec3d, device=dev)
        self._stats = wp.empty(3, dtype=wp.float64, device=dev)
        self._box = wp.empty(6, dtype=wp.float32, device=dev)
        self._radii = wp.empty(2, dtype=wp.float64, device=dev)

    def write(self, raw: wp.array, centre, points: wp.array, out: wp.array, winding_number: bool,
              method: SignMethod) -> tuple[float, float]:
        """Kernel-frame points ``raw - centre`` into ``points`` (V,) vec3 and their sign data into
        ``out`` (V + 4T + 3K + 5,) vec3, all on the writer's device (``raw`` (V,) vec3 mesh-frame
        vertices, ``centre`` (3,) the geometry's centre [m]); returns (bounding radius, winding
        radius) [m] about the kernel-frame origin (read back: on CUDA this waits for Warp's
        stream, not the device)."""
        t, dev = self.topology, self.device
        n_vertices, n_triangles = t.welded.shape[0], t.triangles.shape[0]
        flags = [1.0 if winding_number else 0.0, 1.0 if t.balanced else 0.0, float(int(method))]
        centre = wp.vec3d(*(float(c) for c in centre))
        if self.one_launch:
            wp.launch(sign_data_serial_kernel, dim=1,
                      inputs=[raw, centre, points, self._triangles, self._welded, self._welded_corner, self._edge_of_corner,
                              self._rim_ends, self._rim_multiplicity, self._rim_start, self._vertex_sum, self._edge_sum, self._stats, self._box, *flags, out, self._radii],
                      device=dev)
        else:
            wp.launch(centre_points_kernel, dim=n_vertices, inputs=[raw, centre, points], device=dev)
            wp.launch(clear_sign_sums_kernel, dim=max(n_vertices, t.n_edges, 1),
                      inputs=[self._vertex_sum, self._edge_sum, self._stats, self._box], device=dev)
            wp.launch(accumulate_face_normals_kernel, dim=n_triangles,
                      inputs=[points, self._triangles, self._welded_corner, self._edge_of_corner, self._vertex_sum,
                              self._edge_sum, self._stats], device=dev)
            wp.launch(write_pseudo_normals_kernel, dim=n_vertices + 3 * n_triangles,
                      inputs=[points, self._welded, self._edge_of_corner, self._vertex_sum, self._edge_sum,
                              self._stats, self._box, out], device=dev)
            face_rows = n_vertices + 3 * n_triangles
            if n_triangles:
                wp.launch(clear_rows_kernel, dim=n_triangles, inputs=[face_rows, out], device=dev)
            first_rim = face_rows + n_triangles
            if t.rim_chunks:
                wp.launch(write_rim_chunks_kernel, dim=t.rim_chunks,
                          inputs=[points, self._rim_ends, self._rim_multiplicity, self._rim_start, first_rim, out],
                          device=dev)
            wp.launch(write_sign_extras_kernel, dim=1,
                      inputs=[self._stats, self._box, first_rim + RIM_ROWS_PER_CHUNK * t.rim_chunks, *flags,
                              t.rim_chunks, out, self._radii],
                      device=dev)
        radius, winding_radius = self._radii.numpy().tolist()
        return radius, winding_radius


def sign_data(vertices: np.ndarray, triangles: np.ndarray, winding_number: bool, method: SignMethod,
              welded: np.ndarray | None = None, topology: SignTopology | None = None) -> np.ndarray:
    """The (V + 4T + 3K + 5, 3) float32 array of robot_sdf.kernels.sign_data, for vertices given
    in the kernel frame (computed on the CPU). ``topology``: sign_topology(triangles, welded),
    when already known.

    Pseudo-normals, float64: a face's is its unit normal (zero if degenerate); a vertex's the
    sum of the normals of its triangles weighted by their angles at it, normalised, shared by
    welded vertices (so an unindexed soup gets the normals of the indexed mesh it came from);
    an edge's the normalised sum of the normals of every triangle on it."""
    if topology is None:
        topology = sign_topology(triangles, weld(vertices) if welded is None else welded, vertices)
    writer = SignDataWriter(topology, "cpu")
    points = np.array(vertices, np.float32, copy=True).reshape(-1, 3)  # written in place (raw = points)
    out = np.empty((writer.rows, 3), np.float32)
    same = host_array(points)
    writer.write(same, (0.0, 0.0, 0.0), same, host_array(out), winding_number, method)
    return out


def host_array(a: np.ndarray) -> wp.array:
    """A CPU Warp vec3 array over the memory of a C-contiguous float32 (N,3) numpy array (no
    copy: the caller keeps ``a`` alive while the Warp array is used)."""
    if a.dtype != np.float32 or not a.flags.c_contiguous or a.ndim != 2 or a.shape[1] != 3:
        raise ValueError(f"host_array needs a C-contiguous float32 (N, 3) array, got {a.dtype} {a.shape}")
    return wp.array(a, dtype=wp.vec3, device="cpu", copy=False)


# ---------------------------------------------------------------------------------------- auto
@dataclass
class MeshClass:
    """What ``auto`` found out about a geometry, and what it chose."""

    method: SignMethod
    reason: str
    closed: bool
    consistently_oriented: bool
    shells: int
    self_intersections: int
    degenerate_triangles: int
    volume: float
    seconds: float = 0.0
    details: dict = field(default_factory=dict)
    # The boundary of a solid (classify): the pseudo-normal sign is exact at any distance.
    solid: bool = False

    def as_dict(self) -> dict:
        return {"sign_method": self.method.name.lower(), "reason": self.reason, "closed": self.closed,
                "consistently_oriented": self.consistently_oriented, "shells": self.shells, "solid": self.solid,
                "self_intersections": self.self_intersections, "degenerate_triangles": self.degenerate_triangles,
                "volume": self.volume, "classify_seconds": self.seconds}


_GIL_CHUNK = 1 << 16


def _scatter_min(target: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """target[index] = min(target[index], values), repeated indices included (np.minimum.at in
    chunks: ufunc.at holds the GIL for its whole run, ~100 ms per million elements, while the
    Python loop between chunks lets the node's query threads in)."""
    for start in range(0, index.shape[0], _GIL_CHUNK):
        np.minimum.at(target, index[start:start + _GIL_CHUNK], values[start:start + _GIL_CHUNK])


def _components(n_vertices: int, edges: np.ndarray) -> np.ndarray:
    """Connected-component label per vertex (union-find by repeated min-label propagation with
    pointer jumping, vectorised)."""
    label = np.arange(n_vertices, dtype=np.int64)
    if edges.size == 0:
        return label
    u, v = edges[:, 0], edges[:, 1]
    while True:
        lu, lv = label[u], label[v]
        m = np.minimum(lu, lv)
        before = label.copy()
        _scatter_min(label, lu, m)
        _scatter_min(label, lv, m)
        # Pointer jumping: follow labels to their roots.
        while True:
            jumped = label[label]
            if np.array_equal(jumped, label):
                break
            label = jumped
        if np.array_equal(before, label):
            return label


@wp.func
def _segment_hits_triangle(p: wp.vec3, q: wp.vec3, a: wp.vec3, b: wp.vec3, c: wp.vec3) -> int:
    """1 if the closed segment pq crosses the triangle abc (not coplanar), else 0."""
    e1 = b - a
    e2 = c - a
    d = q - p
    h = wp.cross(d, e2)
    det = wp.dot(e1, h)
    scale = wp.length(e1) * wp.length(e2) * wp.length(d)
    if wp.abs(det) <= 1.0e-7 * scale:
        return 0
    inv = 1.0 / det
    s = p - a
    bu = inv * wp.dot(s, h)
    qv = wp.cross(s, e1)
    bv = inv * wp.dot(d, qv)
    t = inv * wp.dot(e2, qv)
    eps = float(1.0e-6)
    if bu < -eps or bv < -eps or bu + bv > 1.0 + eps or t < -eps or t > 1.0 + eps:
        return 0
    return 1


@wp.kernel
def self_intersection_kernel(
    mesh: wp.uint64,
    points: wp.array(dtype=wp.vec3),
    edges: wp.array2d(dtype=wp.int32),
    welded_triangles: wp.array2d(dtype=wp.int32),
    out_count: wp.array(dtype=wp.int32),
):
    """Count (edge, triangle) crossings, each edge a bounded segment queried against the BVH;
    triangles that share a (welded) vertex with the edge are adjacent, not intersecting."""
    i = wp.tid()
    u = edges[i, 0]
    v = edges[i, 1]
    wu = edges[i, 2]
    wv = edges[i, 3]
    p = points[u]
    q = points[v]
    pad = wp.vec3(1.0e-6, 1.0e-6, 1.0e-6)
    query = wp.mesh_query_aabb(mesh, wp.min(p, q) - pad, wp.max(p, q) + pad)
    face = int(0)
    hits = int(0)
    m = wp.mesh_get(mesh)
    while wp.mesh_query_aabb_next(query, face):
        w0 = welded_triangles[face, 0]
        w1 = welded_triangles[face, 1]
        w2 = welded_triangles[face, 2]
        if w0 == wu or w1 == wu or w2 == wu or w0 == wv or w1 == wv or w2 == wv:
            continue
        a = m.points[m.indices[face * 3 + 0]]
        b = m.points[m.indices[face * 3 + 1]]
        c = m.points[m.indices[face * 3 + 2]]
        hits += _segment_hits_triangle(p, q, a, b, c)
    if hits > 0:
        wp.atomic_add(out_count, 0, hits)


def count_self_intersections(mesh: wp.Mesh, vertices: np.ndarray, triangles: np.ndarray, welded: np.ndarray) -> int:
    """Edge-triangle crossings of a mesh with itself (0 for a clean surface); ``mesh`` is the
    Warp mesh of ``vertices``/``triangles``, on any device."""
    wt = welded[np.asarray(triangles, np.int64)]
    tri = np.asarray(triangles, np.int64)
    ok = (wt[:, 0] != wt[:, 1]) & (wt[:, 1] != wt[:, 2]) & (wt[:, 2] != wt[:, 0])
    keys = _edge_keys(wt[ok], welded.shape[0]).reshape(-1)
    ends = np.stack([tri[ok], np.roll(tri[ok], -1, axis=1)], axis=-1).reshape(-1, 2)
    _, first = _unique(keys, return_index=True)
    ends = ends[first]
    edges = np.concatenate([ends, welded[ends]], axis=1).astype(np.int32)
    if edges.shape[0] == 0:
        return 0
    dev = mesh.points.device
    count = wp.zeros(1, dtype=wp.int32, device=dev)
    wp.launch(self_intersection_kernel, dim=edges.shape[0],
              inputs=[mesh.id, mesh.points, wp.array(edges, dtype=wp.int32, device=dev),
                      wp.array(wt.astype(np.int32), dtype=wp.int32, device=dev)],
              outputs=[count], device=dev)
    return int(count.numpy()[0])


# Nesting of several shells is checked by winding numbers in numpy: at most this many shells,
# and this many (triangle, point) evaluations; beyond, the mesh keeps the winding-number sign.
MAX_SOLID_SHELLS = 2048
MAX_NESTING_EVALUATIONS = 20_000_000


def classify(vertices: np.ndarray, triangles: np.ndarray, welded: np.ndarray | None = None,
             mesh_factory=None, facts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[MeshClass, wp.Mesh | None]:
    """The ``auto`` decision: ``normal`` for one closed, consistently and outward oriented shell
    without self-intersections; ``winding_number`` for anything else (the design contract fixes it).

    ``solid`` in the result: the mesh is the boundary of a solid, i.e. closed, consistently
    oriented shells without self-intersections, each with the solid on its back side (one shell
    facing outward; or several: separate bodies facing outward, cavities facing inward, bodies
    in cavities: the winding number is 0 or 1 everywhere). For such a boundary the pseudo-normal
    sign is exact and equals the winding number's, and a ray from a point meets a front face
    first iff the point is outside: what the kernels' closed-shell paths rely on, so a solid of
    several shells (``winding_number`` by this rule) is evaluated by them too (the sign data's
    closed-shell flag).

    The topology checks run first (numpy); only a mesh that passes them needs a BVH for the
    self-intersection test: ``mesh_factory()`` builds the Warp mesh of vertices/triangles, and it
    is returned for reuse (None when no BVH was needed). ``facts``: surface_facts of the mesh,
    when already known.
    """
    import time

    t0 = time.perf_counter()
    v64 = np.asarray(vertices, np.float64)
    tri = np.asarray(triangles, np.int64)
    w = weld(vertices) if welded is None else welded
    wt = w[tri]
    flat, _ = surface_facts(v64, tri, wt) if facts is None else facts
    degenerate = int(np.count_nonzero(flat))
    good = wt[~flat]
    n = np.int64(v64.shape[0])
    directed = np.stack([good, np.roll(good, -1, axis=1)], axis=-1).reshape(-1, 2)
    forward = directed[:, 0] * n + directed[:, 1]
    backward = directed[:, 1] * n + directed[:, 0]
    _, directed_counts = _unique(forward, return_counts=True)
    undirected, undirected_counts = _unique(np.minimum(forward, backward), return_counts=True)
    # Closed: every edge has exactly two triangles; consistently oriented: they use it in
    # opposite directions (then no directed edge appears twice).
    closed = bool(undirected_counts.size and np.all(undirected_counts == 2))
    oriented = closed and bool(np.all(directed_counts == 1))
    used = _unique(good)
    labels = _components(int(n), np.stack([undirected // n, undirected % n], axis=1))
    shells = int(_unique(labels[used]).shape[0]) if used.size else 0
    a, b, c = v64[tri[:, 0]], v64[tri[:, 1]], v64[tri[:, 2]]
    centre = v64.mean(axis=0)
    volume = float(np.einsum("ij,ij->i", a - centre, np.cross(b - centre, c - centre)).sum() / 6.0)
    crossings = 0
    mesh = None
    solid = False
    if not closed:
        reason = "open surface (some edge has one triangle or more than two)"
    elif not oriented:
        reason = "triangles not consistently oriented"
    elif volume <= 0.0:
        reason = "inside out (negative volume)"
    elif shells > MAX_SOLID_SHELLS:
        reason = f"{shells} shells (more than {MAX_SOLID_SHELLS} to check for nesting)"
    else:
        # Several shells: nesting first (numpy, cheap), so that overlapping bodies, whose corners
        # lie in each other, are mostly told before a BVH is built; shells that cross each
        # other without that are caught by the self-intersection test.
        nesting = "" if shells == 1 else _shells_bound_one_solid(v64, tri[~flat], labels[good[:, 0]])
        if nesting is None:
            reason = f"{shells} shells (too many nested boxes to check for nesting)"
        elif nesting:
            reason = nesting
        else:
            mesh = mesh_factory() if mesh_factory is not None else wp.Mesh(
                points=wp.array(np.asarray(vertices, np.float32), dtype=wp.vec3),
                indices=wp.array(np.asarray(triangles, np.int32).reshape(-1), dtype=wp.int32))
            crossings = count_self_intersections(mesh, vertices, triangles, w)
            if crossings:
                reason = f"self-intersecting ({crossings} edge-triangle crossings)"
            elif shells == 1:
                reason = "one closed, consistently oriented shell without self-intersections"
                solid = True
            else:
                reason = (f"{shells} closed, consistently oriented shells without self-intersections "
                          "bounding one solid (winding number 0 or 1: evaluated by the pseudo-normal sign, "
                          "which equals it there)")
                solid = True
    method = SignMethod.NORMAL if solid and shells == 1 else SignMethod.WINDING_NUMBER
    return (MeshClass(method, reason, closed, oriented, shells, crossings, degenerate, volume,
                      time.perf_counter() - t0, solid=solid), mesh)


def _shells_bound_one_solid(v64: np.ndarray, tri: np.ndarray, shell_of: np.ndarray) -> str | None:
    """Of closed, consistently oriented shells (``tri`` (T,3) the non-flat triangles, ``shell_of``
    (T,) their shell labels): "" when, if they do not intersect, they bound one solid, else why
    not (nested, inside out, or crossing each other; None: too much work to tell).

    Across a shell the winding number steps by one, from the side its normals face to its back;
    a solid's boundary has 0 in front and 1 behind. Shell i's own step is +1 (faces outward,
    volume > 0) or -1 (faces inward: a cavity), so the winding number W_i of the other shells at
    a point of shell i (an integer: they are closed and do not touch it) must be 0 or 1 in turn;
    a value far from it, integer or not, rules the mesh out either way.
    Shell j contributes only at points inside its box."""
    labels, shell_idx = _unique(shell_of, return_inverse=True)
    count = labels.shape[0]
    corners = v64[tri]  # (T,3,3)
    centre = 0.5 * (v64.min(axis=0) + v64.max(axis=0))
    a, b, c = (corners[:, k] - centre for k in range(3))
    vol = np.bincount(shell_idx, weights=np.einsum("ij,ij->i", a, np.cross(b, c)) / 6.0, minlength=count)
    order = np.argsort(shell_idx, kind="stable")
    first = np.searchsorted(shell_idx[order], np.arange(count))
    sizes = np.diff(np.append(first, order.shape[0]))
    lo = np.minimum.reduceat(corners.min(axis=1)[order], first, axis=0)
    hi = np.maximum.reduceat(corners.max(axis=1)[order], first, axis=0)
    point = corners[order[first], 0]  # a corner of each shell
    # holds[i, j]: shell j's box holds shell i's point
    holds = np.all((lo[None] <= point[:, None]) & (point[:, None] <= hi[None]), axis=2)
    np.fill_diagonal(holds, False)
    pairs_i, pairs_j = np.nonzero(holds)
    if int(sizes[pairs_j].sum()) > MAX_NESTING_EVALUATIONS:
        return None
    winding = np.zeros(count)
    for j in _unique(pairs_j):
        held = pairs_i[pairs_j == j]
        shell_j = corners[order[first[j]:first[j] + sizes[j]]]
        step = max(1, _GIL_CHUNK // held.shape[0])
        for k in range(0, shell_j.shape[0], step):
            winding[held] += _winding_numbers(point[held], shell_j[k:k + step])
    expected = np.where(vol > 0.0, 0.0, 1.0)
    wrong = np.flatnonzero((np.abs(winding - expected) > 0.25) | (vol == 0.0))
    if wrong.size == 0:
        return ""
    i = int(wrong[0])
    return (f"{count} shells, not one solid's boundary (shell {i} of {count}: winding number "
            f"{winding[i]:.2f} of the others on it, volume {vol[i]:.3g}: nested, overlapping or inside-out bodies)")


# ---------------------------------------------------------------------------------------- meshes built elsewhere
@wp.kernel
def mesh_layout_kernel(ids: wp.array(dtype=wp.uint64), layout: wp.array2d(dtype=wp.int64)):
    """Per Warp mesh id: point count, index count, offset of robot_sdf's sign data (-1: none)."""
    i = wp.tid()
    m = wp.mesh_get(ids[i])
    layout[i, 0] = wp.int64(m.points.shape[0])
    layout[i, 1] = wp.int64(m.indices.shape[0])
    layout[i, 2] = wp.int64(sign_data_offset(ids[i]))


@wp.kernel
def copy_mesh_kernel(mesh: wp.uint64, points: wp.array(dtype=wp.vec3), indices: wp.array(dtype=wp.int32)):
    """The points and indices a Warp mesh was built from, read through its id."""
    i = wp.tid()
    m = wp.mesh_get(mesh)
    if i < points.shape[0]:
        points[i] = m.points[i]
    if i < indices.shape[0]:
        indices[i] = m.indices[i]


def read_meshes(ids: np.ndarray, device) -> list[tuple[np.ndarray, np.ndarray] | None]:
    """(points (V, 3) float32, flat indices (3T,) int32) of each Warp mesh id on ``device`` (a
    Warp device), or None for a mesh that carries robot_sdf's sign data (MeshWorld built it).
    The ids must be live meshes of that device: Warp reads whatever an id points at."""
    if len(ids) == 0:
        return []
    id_array = wp.array(np.asarray(ids, np.uint64), dtype=wp.uint64, device=device)
    layout = wp.zeros((len(ids), 3), dtype=wp.int64, device=device)
    wp.launch(mesh_layout_kernel, dim=len(ids), inputs=[id_array], outputs=[layout], device=device)
    out: list[tuple[np.ndarray, np.ndarray] | None] = []
    for mesh_id, (n_points, n_indices, data) in zip(ids, layout.numpy()):
        if data >= 0:
            out.append(None)
            continue
        points = wp.empty(int(n_points), dtype=wp.vec3, device=device)
        indices = wp.empty(int(n_indices), dtype=wp.int32, device=device)
        wp.launch(copy_mesh_kernel, dim=int(max(n_points, n_indices, 1)), inputs=[wp.uint64(int(mesh_id))],
                  outputs=[points, indices], device=device)
        out.append((points.numpy(), indices.numpy()))
    return out


# ---------------------------------------------------------------------------------------- orientation
@dataclass
class OrientationRepair:
    """What orient_components changed in a mesh's winding (reported by mesh_info "orientation")."""

    components: int              # edge-connected patches of non-flat triangles
    closed_components: int       # of which closed (every edge twice, consistently orientable)
    non_orientable: int          # patches whose triangles cannot all agree (left as they were)
    components_reversed: int     # closed patches turned outward as a whole (inside out before)
    faces_reversed: int          # triangles whose winding was reversed in total
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"components": self.components, "closed_components": self.closed_components,
                "non_orientable": self.non_orientable, "components_reversed": self.components_reversed,
                "faces_reversed": self.faces_reversed, "seconds": self.seconds}


def surface_facts(v64: np.ndarray, tri: np.ndarray, wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(flat (T,) bool, twice the areas (T,) float64) of the triangles ``tri`` (T,3) of the
    float64 vertices ``v64``, ``wt`` their welded corners. Flat triangles have no surface (a
    repeated welded corner, or collinear corners up to float32 rounding: height below
    FLAT_RATIO of the longest edge): they neither open nor close a mesh."""
    repeated = (wt[:, 0] == wt[:, 1]) | (wt[:, 1] == wt[:, 2]) | (wt[:, 2] == wt[:, 0])
    _, area2 = _face_normals(v64, tri)
    corners = v64[tri]
    longest2 = np.max(((corners - np.roll(corners, 1, axis=1)) ** 2).sum(axis=2), axis=1)
    return repeated | (area2 <= FLAT_RATIO * longest2), area2


def _winding_numbers(points: np.ndarray, corners: np.ndarray) -> np.ndarray:
    """Generalised winding number (P,) of the triangles ``corners`` (T,3,3) at ``points`` (P,3)
    (Van Oosterom & Strackee solid angles, float64)."""
    a = corners[None, :, 0, :] - points[:, None, :]
    b = corners[None, :, 1, :] - points[:, None, :]
    c = corners[None, :, 2, :] - points[:, None, :]
    la, lb, lc = (np.linalg.norm(x, axis=2) for x in (a, b, c))
    det = np.einsum("ptk,ptk->pt", a, np.cross(b, c))
    den = (la * lb * lc + np.einsum("ptk,ptk->pt", a, b) * lc + np.einsum("ptk,ptk->pt", b, c) * la
           + np.einsum("ptk,ptk->pt", c, a) * lb)
    return (2.0 * np.arctan2(det, den)).sum(axis=1) / (4.0 * np.pi)


def orient_components(vertices: np.ndarray, triangles: np.ndarray, welded: np.ndarray | None = None,
                      facts: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, OrientationRepair]:
    """Consistent winding per edge-connected patch, closed patches outward.

    ``vertices`` (V,3) m (any frame), ``triangles`` (T,3): returns the (T,3) int32 triangles
    with some rows reversed (a new array; ``triangles`` itself is not changed) and what changed.
    ``facts``: surface_facts of the mesh, when already known (they do not depend on winding).

    Patches: non-flat triangles joined across welded edges that exactly two triangles use. In a
    patch, orientation propagates across those edges (a two-colouring of the triangle graph,
    vectorised as connected components of the graph doubled into "kept"/"reversed" copies of
    each triangle); a patch whose two copies connect cannot be oriented (Moebius-like, or
    conflicting across non-manifold edges) and is left as it was. Then:
    - a closed patch (every edge of it used twice, in opposite directions once oriented) faces
      outward (positive volume), unless another closed patch, or the rest of the mesh as given
      (closed or not), encloses it (the six extreme vertices of its box inside): an enclosed
      patch is a cavity or a nested body, which its winding tells, and keeps the orientation
      of the majority (by area) of its triangles;
    - an open patch keeps the orientation of the majority (by area) of its triangles.
    Flat triangles are left as they are.
    """
    import time

    t0 = time.perf_counter()
    v64 = np.asarray(vertices, np.float64).reshape(-1, 3)
    tri = np.asarray(triangles, np.int64).reshape(-1, 3)
    w = weld(vertices) if welded is None else welded
    wt = w[tri]
    flat, area2_all = surface_facts(v64, tri, wt) if facts is None else facts
    good = np.flatnonzero(~flat)
    out = np.array(tri, np.int32, copy=True)
    n_good = good.shape[0]
    if n_good == 0:
        return out, OrientationRepair(0, 0, 0, 0, 0, time.perf_counter() - t0)
    gw = wt[good]
    keys = _edge_keys(gw, w.shape[0]).reshape(-1)  # incidence 3 g + k
    forward = (gw < np.roll(gw, -1, axis=1)).reshape(-1)
    perm = np.argsort(keys, kind="stable")
    sk = keys[perm]
    starts = np.empty(sk.shape[0], bool)
    starts[0] = True
    starts[1:] = sk[1:] != sk[:-1]
    begin = np.flatnonzero(starts)
    counts = np.diff(np.append(begin, sk.shape[0]))
    pair = begin[counts == 2]
    i1, i2 = perm[pair], perm[pair + 1]
    f1, f2 = i1 // 3, i2 // 3
    differ = forward[i1] == forward[i2]  # same direction: exactly one of the two must turn
    g = np.int64(n_good)
    links = np.concatenate([
        np.stack([f1, np.where(differ, f2 + g, f2)], axis=1),
        np.stack([f1 + g, np.where(differ, f2, f2 + g)], axis=1)])
    label = _components(2 * n_good, links)
    keep_label, turn_label = label[:n_good], label[n_good:]
    orientable = keep_label != turn_label
    patch = np.minimum(keep_label, turn_label)  # the same for both copies of a patch
    patch_ids, patch_of = _unique(patch, return_inverse=True)
    n_patches = patch_ids.shape[0]
    patch_ok = np.bincount(patch_of, weights=(~orientable).astype(np.float64), minlength=n_patches) == 0
    # Relative orientation: reversed against the patch's lowest copy.
    rel = keep_label != patch
    # Closed: every edge of the patch has exactly two triangles, which the patch links and, if
    # it is orientable, winds oppositely once oriented (an edge shared by more triangles opens it).
    edge_count = np.empty(sk.shape[0], np.int64)
    edge_count[perm] = np.repeat(counts, counts)
    bad_face = np.any((edge_count != 2).reshape(-1, 3), axis=1)
    patch_open = np.bincount(patch_of, weights=bad_face.astype(np.float64), minlength=n_patches) > 0
    closed = patch_ok & ~patch_open
    # Volume (relative orientation) and area per orientation, per patch.
    a, b, c = (v64[tri[good, k]] for k in range(3))
    centre = 0.5 * (v64.min(axis=0) + v64.max(axis=0))
    vol = np.einsum("ij,ij->i", a - centre, np.cross(b - centre, c - centre)) / 6.0
    area2 = area2_all[good]
    volume = np.bincount(patch_of, weights=np.where(rel, -vol, vol), minlength=n_patches)
    area_rel = np.bincount(patch_of, weights=np.where(rel, area2, 0.0), minlength=n_patches)
    area_all = np.bincount(patch_of, weights=area2, minlength=n_patches)
    majority_turn = area_rel > 0.5 * area_all  # most of the area is on the reversed side: keep that
    outward_turn = volume < 0.0
    turn_patch = majority_turn.copy()
    candidates = np.flatnonzero(closed & (outward_turn != majority_turn))
    if candidates.size:
        consistent = np.where(rel[:, None], tri[good][:, ::-1], tri[good])  # (G,3) each patch consistent
        by_patch = np.argsort(patch_of, kind="stable")
        first = np.searchsorted(patch_of[by_patch], np.arange(n_patches))
        corner_lo = v64[consistent].min(axis=1)[by_patch]
        corner_hi = v64[consistent].max(axis=1)[by_patch]
        box_lo = np.minimum.reduceat(corner_lo, first, axis=0)
        box_hi = np.maximum.reduceat(corner_hi, first, axis=0)
        for p in candidates:
            holders = np.flatnonzero(closed & np.all(box_lo <= box_lo[p], axis=1) & np.all(box_hi >= box_hi[p], axis=1))
            if not (_enclosed(p, holders[holders != p], patch_of, v64, consistent)
                    or _enclosed_by_the_rest(p, patch_of, v64, tri[good])):
                turn_patch[p] = outward_turn[p]
    flip = np.zeros(tri.shape[0], bool)
    flip[good] = np.where(patch_ok[patch_of], rel != turn_patch[patch_of], False)
    out[flip] = out[flip][:, ::-1]
    reversed_whole = int(np.count_nonzero(closed & (turn_patch != majority_turn)))
    return out, OrientationRepair(int(n_patches), int(np.count_nonzero(closed)), int(np.count_nonzero(~patch_ok)),
                                  reversed_whole, int(np.count_nonzero(flip)), time.perf_counter() - t0)


def _extreme_vertices(p: int, patch_of: np.ndarray, v64: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """The six extreme vertices (6,3) of patch ``p`` (on its convex hull): lowest and highest in x, y, z."""
    mine = v64[triangles[patch_of == p]].reshape(-1, 3)
    return mine[np.concatenate([mine.argmin(axis=0), mine.argmax(axis=0)])]


def _all_inside(points: np.ndarray, corners: np.ndarray) -> bool:
    """Whether the triangles ``corners`` (T,3,3) have |winding number| > 1/2 at every one of ``points``."""
    winding = sum(_winding_numbers(points, corners[i:i + _GIL_CHUNK]) for i in range(0, corners.shape[0], _GIL_CHUNK))
    return bool(np.all(np.abs(winding) > 0.5))


def _enclosed_by_the_rest(p: int, patch_of: np.ndarray, v64: np.ndarray, given: np.ndarray) -> bool:
    """Whether the rest of the mesh as given (every other patch, ``given`` (G,3) the non-flat
    triangles in their given winding), closed or not, encloses patch ``p``: its winding number is
    above 1/2 in magnitude at p's six extreme vertices. A cavity inside an outer surface that is
    not one closed patch (edges used four times, cracks: CAD exports) stays a cavity."""
    others = given[patch_of != p]
    if others.shape[0] == 0:
        return False
    return _all_inside(_extreme_vertices(p, patch_of, v64, given), v64[others])


def _enclosed(p: int, holders: np.ndarray, patch_of: np.ndarray, v64: np.ndarray, consistent: np.ndarray) -> bool:
    """Whether one of the closed patches ``holders`` (whose boxes hold p's box) encloses patch
    ``p``: the six extreme vertices of p (on p's convex hull) inside it (|winding number| > 0.5
    of its consistently wound triangles ``consistent`` (G,3), whatever their orientation)."""
    if holders.size == 0:
        return False
    extremes = _extreme_vertices(p, patch_of, v64, consistent)
    return any(_all_inside(extremes, v64[consistent[patch_of == q]]) for q in holders)
    mine = v64[consistent[patch_of == p]].reshape(-1, 3)
    extremes = mine[np.concatenate([mine.argmin(axis=0), mine.argmax(axis=0)])]
    for q in holders:
        corners = v64[consistent[patch_of == q]]
        winding = sum(_winding_numbers(extremes, corners[i:i + _GIL_CHUNK])
                      for i in range(0, corners.shape[0], _GIL_CHUNK))
        if np.all(np.abs(winding) > 0.5):
            return True
    return False
