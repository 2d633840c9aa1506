"""Build-time sign data of a mesh: pseudo-normals for the ``normal`` sign, the rim and the bounds
of the winding number, written into the rows the kernels read.

Everything here runs once per geometry when it is added, and again on a refit (same topology,
new vertex positions), never per query. The other build-time analyses have modules of their
own: the facts every one of them uses (weld, edges, flat triangles: mesh_topology), the
``auto`` choice (mesh_classification) and the winding repair (mesh_orientation).

The Warp module named after this one holds every build-time kernel: those here, the
self-intersection test of mesh_classification and the mesh reading of adoption (their kernels
name it). It compiles as one unit and robot_sdf.launch.warp_device loads it once per device,
under a lock (Warp's module loading is not thread-safe).

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
bounding box), so a point farther than sqrt(A / (2 pi)) from the box is outside. Outside the box
the rim bounds w as well: along the ray straight away from the box (which meets no surface) the
gradient bound integrates to at most (1 / 4 pi) sum over chunks of length x (4 / (g_c + g) - 1 / g_c),
g_c the chunk box's distance and g the mesh box's (kernels.winding.rim_escape_bound).

Pseudo-normals follow Baerentzen & Aanaes (2005): for a closed, consistently oriented,
non-self-intersecting surface, the sign of dot(p - c, n) with c the closest surface point and n
the pseudo-normal of the feature (face, edge or vertex) that contains c is the exact inside test,
whichever of several equally close features is picked.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import warp as wp

from robot_sdf.kernels.sign_data import (RIM_CHUNKS, RIM_LENGTH, RIM_LOWER, RIM_ROWS_PER_CHUNK, RIM_UPPER,
                                         ROW_AREA, ROW_BOUNDS, ROW_BOX_LOWER, ROW_BOX_UPPER, ROW_MARKER,
                                         SIGN_DATA_EXTRA, SIGN_DATA_MAGIC, row_count)
from robot_sdf.mesh_topology import FLAT_RATIO, edge_keys, sorted_unique, weld
from robot_sdf.types import SignMethod

# Build-time analysis differentiates nothing: no adjoint kernels (half the compile). These are the
# options of every build-time kernel's Warp module (module docstring).
wp.set_module_options({"enable_backward": False})

# Longest edge / height above which a triangle is a sliver: Warp's float32 closest-point search
# may then pick a farther triangle than the closest one, so a mesh with one is flagged and its
# searches measure thin triangles in float64 (kernels.native.THIN_ASPECT).
SLIVER_ASPECT = 20.0


# ---------------------------------------------------------------------------------------- sign topology
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
    unique, inverse = sorted_unique(edge_keys(wt, welded.shape[0]).reshape(-1), return_inverse=True)
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
