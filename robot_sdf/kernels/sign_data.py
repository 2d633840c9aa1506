"""The sign data: per-mesh rows robot_sdf keeps in each Warp mesh's ``velocities`` array.

The one home of the layout. robot_sdf.mesh_analysis writes the rows (at build, again on a refit
that keeps the topology); the kernels read them through the accessors below and nowhere else, so
a row's meaning is stated once. Warp reads ``velocities`` only in ``mesh_eval_velocity``, which
robot_sdf never calls, so a kernel holding nothing but the mesh id can reach the data.

Layout (vec3 rows, kernel frame) for V vertices, T triangles and K rim chunks (K <= RIM_CHUNKS),
with B = V + 4T + 3K the row of the mesh's box (``data`` in the accessors, from sign_data_offset)::

    [0, V)              angle-weighted pseudo-normal of each vertex (unit; zero if unused)
    [V, V + 3T)         pseudo-normal of edge k of triangle f at V + 3 f + k; edge k joins corners
                        k and (k + 1) % 3 (normalised sum of the normals of the triangles on it)
    [V + 3T, V + 4T)    face row of triangle f at V + 3T + f: (winding number on its outer side,
                        distance from its centroid to its farthest corner (FACE_OPEN: plus the
                        offset of the point it was evaluated at), FACE_SETTLED where the sign may
                        be taken from any closest feature on it, FACE_INTERIOR_SETTLED where only
                        from a point inside the face (a closest point in its interior, a ray's
                        hit clear of its edges), FACE_OPEN where from such a point of an open
                        surface as far as the rim allows, 0 where from none)
                        (robot_sdf.face_winding; all 0, nothing settled, until the owner writes
                        them, and again after a refit)
    V + 4T + 3c + RIM_LOWER   lower corner of the box of rim chunk c, c < K
    V + 4T + 3c + RIM_UPPER   upper corner
    V + 4T + 3c + RIM_LENGTH  (length of the chunk's rim edges, each times its multiplicity, 0, 0)
    B + ROW_BOX_LOWER   lower corner of the mesh's axis-aligned bounding box
    B + ROW_BOX_UPPER   upper corner
    B + ROW_MARKER      (SIGN_DATA_MAGIC, winding-number support 0/1, the mesh's own SignMethod)
    B + ROW_BOUNDS      (winding radius, 1 if the box bounds every inside point (a closed
                        surface), 1 if the mesh has slivers: closest points are searched with
                        thin triangles in float64)
    B + ROW_AREA        (total area A, 1 if the classification (auto, or normal asked for) found
                        the mesh the boundary of a solid: closed, consistently oriented shells
                        without self-intersections, one or several (not set on a refit), K)

The rim, the winding radius and the inside tests they allow are explained in
robot_sdf.mesh_analysis's docstring and docs/design.md ("Sign-data layout").

A mesh carries sign data when its ``velocities`` array has exactly V + 4T + 3K + SIGN_DATA_EXTRA
rows (K read from row B + ROW_AREA) and row B + ROW_MARKER starts with SIGN_DATA_MAGIC; any other
mesh was built elsewhere (sign_data_offset returns -1) and gets Warp's own sign queries.
"""
from __future__ import annotations

import warp as wp

wp.set_module_options({"enable_backward": False})

# Sign method codes: robot_sdf.types.SignMethod's values, as row B + ROW_MARKER records a mesh's
# own and the kernels take a call's (test/sign_data_test.py checks they agree).
SIGN_NORMAL = wp.constant(0)
SIGN_DEFAULT = wp.constant(1)
SIGN_WINDING_NUMBER = wp.constant(2)
SIGN_PARITY = wp.constant(3)
# Scalar sign_method values that defer to the meshes: AUTO = each mesh's own method as recorded
# in its sign data (what `auto` chose, or the method it was built for); PER_SLOT = read the
# (E, M) uint8 slot_sign array.
SIGN_AUTO = wp.constant(4)
SIGN_PER_SLOT = wp.constant(-1)

# An exact float32 that no velocity array of an ordinary mesh holds there.
SIGN_DATA_MAGIC = wp.constant(7.0e5)
# Rows after the vertex and edge normals and the rim chunks.
SIGN_DATA_EXTRA = wp.constant(5)
# At most this many rim chunks: boxes whose distances bound the winding number's gradient.
RIM_CHUNKS = 16
RIM_ROWS_PER_CHUNK = wp.constant(3)

# Rows of the extras, relative to B.
ROW_BOX_LOWER = wp.constant(0)
ROW_BOX_UPPER = wp.constant(1)
ROW_MARKER = wp.constant(2)
ROW_BOUNDS = wp.constant(3)
ROW_AREA = wp.constant(4)


def extra_row(row: int) -> int:
    """Index of extra ``row`` (ROW_*) counted from the end of a host (rows, 3) sign-data array."""
    return int(row) - int(SIGN_DATA_EXTRA)


def face_rows_start(n_vertices: int, n_triangles: int) -> int:
    """Row of triangle 0's face row (V + 3T)."""
    return int(n_vertices) + 3 * int(n_triangles)


def row_count(n_vertices: int, n_triangles: int, rim_chunks: int) -> int:
    """Rows of the sign data: V + 4T + 3K + SIGN_DATA_EXTRA."""
    return face_rows_start(n_vertices, n_triangles) + int(n_triangles) + int(RIM_ROWS_PER_CHUNK) * int(rim_chunks) \
        + int(SIGN_DATA_EXTRA)


# Rows of a rim chunk, relative to its first row.
RIM_LOWER = wp.constant(0)
RIM_UPPER = wp.constant(1)
RIM_LENGTH = wp.constant(2)


@wp.func
def sign_data_offset(mesh: wp.uint64) -> int:
    """B, the row of the mesh's box in its sign data, or -1 for a mesh built elsewhere (then Warp's
    own sign queries are used)."""
    m = wp.mesh_get(mesh)
    base = m.velocities.shape[0] - SIGN_DATA_EXTRA
    # Vertex, edge and face rows: V + 3T + T (indices holds 3T entries).
    per_element = m.points.shape[0] + m.indices.shape[0] + m.indices.shape[0] / 3
    if base < per_element:
        return -1
    if m.velocities[base + ROW_MARKER][0] != SIGN_DATA_MAGIC:
        return -1
    if base != per_element + RIM_ROWS_PER_CHUNK * int(m.velocities[base + ROW_AREA][2]):
        return -1
    return base


# The accessors below take ``data`` = sign_data_offset(mesh) >= 0.


@wp.func
def box_lower(mesh: wp.uint64, data: int) -> wp.vec3:
    """Lower corner of the mesh's axis-aligned bounding box (kernel frame, m)."""
    return wp.mesh_get(mesh).velocities[data + ROW_BOX_LOWER]


@wp.func
def box_upper(mesh: wp.uint64, data: int) -> wp.vec3:
    """Upper corner of the mesh's axis-aligned bounding box (kernel frame, m)."""
    return wp.mesh_get(mesh).velocities[data + ROW_BOX_UPPER]


@wp.func
def supports_winding(mesh: wp.uint64, data: int) -> bool:
    """Whether the mesh was built with winding-number support."""
    return wp.mesh_get(mesh).velocities[data + ROW_MARKER][1] != 0.0


@wp.func
def recorded_method(mesh: wp.uint64, data: int) -> int:
    """The mesh's own SignMethod code: what ``auto`` chose, or the method it was built for."""
    return int(wp.mesh_get(mesh).velocities[data + ROW_MARKER][2])


@wp.func
def winding_radius(mesh: wp.uint64, data: int) -> float:
    """Radius (m, about the kernel-frame origin) beyond which the winding number is below 1/2."""
    return wp.mesh_get(mesh).velocities[data + ROW_BOUNDS][0]


@wp.func
def is_closed(mesh: wp.uint64, data: int) -> bool:
    """Whether the surface is closed (every edge used as often in each direction): its winding
    number is an integer, 0 outside its box, and its sign changes only where it is crossed."""
    return wp.mesh_get(mesh).velocities[data + ROW_BOUNDS][1] != 0.0


@wp.func
def has_slivers(mesh: wp.uint64, data: int) -> bool:
    """Whether the mesh has slivers: Warp's float32 search may pick a farther triangle than the
    closest one (by millimetres near a 2000:1 sliver), so closest points are searched with thin
    triangles measured in float64 (native.mesh_closest_face, mesh_closest_points' exact_thin).
    False without sign data (``data`` < 0)."""
    if data < 0:
        return False
    return wp.mesh_get(mesh).velocities[data + ROW_BOUNDS][2] != 0.0


@wp.func
def surface_area(mesh: wp.uint64, data: int) -> float:
    """Total area of the triangles (m^2)."""
    return wp.mesh_get(mesh).velocities[data + ROW_AREA][0]


@wp.func
def is_solid(mesh: wp.uint64, data: int) -> bool:
    """Whether the classification found the mesh the boundary of a solid (closed, consistently
    oriented shells without self-intersections): its pseudo-normal sign is exact at any distance
    and equals the winding number's."""
    return wp.mesh_get(mesh).velocities[data + ROW_AREA][1] != 0.0


@wp.func
def rim_chunk_count(mesh: wp.uint64, data: int) -> int:
    """K, the number of rim chunks (0 for a closed surface)."""
    return int(wp.mesh_get(mesh).velocities[data + ROW_AREA][2])


@wp.func
def rim_chunk_row(mesh: wp.uint64, data: int, chunk: int) -> int:
    """First row of rim chunk ``chunk`` (< rim_chunk_count)."""
    return data - RIM_ROWS_PER_CHUNK * (rim_chunk_count(mesh, data) - chunk)


@wp.func
def rim_chunk_lower(mesh: wp.uint64, row: int) -> wp.vec3:
    """Lower corner of the box of the rim chunk at ``row`` (rim_chunk_row)."""
    return wp.mesh_get(mesh).velocities[row + RIM_LOWER]


@wp.func
def rim_chunk_upper(mesh: wp.uint64, row: int) -> wp.vec3:
    """Upper corner of the box of the rim chunk at ``row`` (rim_chunk_row)."""
    return wp.mesh_get(mesh).velocities[row + RIM_UPPER]


@wp.func
def rim_chunk_length(mesh: wp.uint64, row: int) -> float:
    """Length (m) of the rim edges of the chunk at ``row``, each times its multiplicity."""
    return wp.mesh_get(mesh).velocities[row + RIM_LENGTH][0]


@wp.func
def vertex_normal(mesh: wp.uint64, vertex: int) -> wp.vec3:
    """Angle-weighted pseudo-normal of a vertex (unit)."""
    return wp.mesh_get(mesh).velocities[vertex]


# The face row's third column (robot_sdf.face_winding writes it): the face's winding numbers hold
# for a point whose closest feature is any feature of the face (its corners' fans are clean), or
# only for a point whose closest point or ray hit lies inside the face.
FACE_SETTLED = wp.constant(1.0)
FACE_INTERIOR_SETTLED = wp.constant(2.0)
# A face of an open surface: its first column is the winding number just off its outer side,
# which holds for a point whose closest point or ray hit lies inside the face only as far as the
# rim lets the winding number change on the way there (kernels.winding.settled_winding_inside).
FACE_OPEN = wp.constant(3.0)


@wp.func
def face_winding(mesh: wp.uint64, face: int) -> wp.vec3:
    """Face row of triangle ``face``: (winding number on its outer side, distance (m) from its
    centroid to its farthest corner (FACE_OPEN: plus the offset of its evaluation point),
    FACE_SETTLED, FACE_INTERIOR_SETTLED, FACE_OPEN or 0: from which points the sign may be taken
    from the row (robot_sdf.face_winding))."""
    m = wp.mesh_get(mesh)
    return m.velocities[m.points.shape[0] + m.indices.shape[0] + face]


@wp.func
def edge_normal(mesh: wp.uint64, face: int, edge: int) -> wp.vec3:
    """Pseudo-normal of edge ``edge`` (0..2, joining corners edge and (edge + 1) % 3) of triangle
    ``face`` (unit)."""
    m = wp.mesh_get(mesh)
    return m.velocities[m.points.shape[0] + face * 3 + edge]
