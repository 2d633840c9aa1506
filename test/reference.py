"""Independent brute-force numpy reference for the robot_sdf tests.

Nothing here imports Warp or robot_sdf: every value the core computes is re-derived from first
principles (Ericson's closest point on a triangle, the generalized winding number, the cost
formula of docs/design.md "Cost definition", the swept rule and the CHOMP speed metric), in float64.

Conventions: quaternions are (w, x, y, z); a pose is (x, y, z, qw, qx, qy, qz) and maps mesh
coordinates into the world: p_world = R(q) p_mesh + t. Distances are in metres.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# Bound on the (points x triangles) working set of one vectorised chunk, in elements.
_CHUNK_ELEMENTS = 1_500_000


# --------------------------------------------------------------------------------------------
# quaternions and poses
# --------------------------------------------------------------------------------------------


def quat_to_matrix(q: np.ndarray) -> np.ndarray:
    """Rotation matrix of a quaternion.

    q: (..., 4) w,x,y,z (normalised here). Returns (..., 3, 3).
    """
    q = np.asarray(q, dtype=np.float64)
    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
    w, x, y, z = q[..., 0], q[..., 1], q[..., 2], q[..., 3]
    m = np.empty(q.shape[:-1] + (3, 3))
    m[..., 0, 0] = 1 - 2 * (y * y + z * z)
    m[..., 0, 1] = 2 * (x * y - w * z)
    m[..., 0, 2] = 2 * (x * z + w * y)
    m[..., 1, 0] = 2 * (x * y + w * z)
    m[..., 1, 1] = 1 - 2 * (x * x + z * z)
    m[..., 1, 2] = 2 * (y * z - w * x)
    m[..., 2, 0] = 2 * (x * z - w * y)
    m[..., 2, 1] = 2 * (y * z + w * x)
    m[..., 2, 2] = 1 - 2 * (x * x + y * y)
    return m


def quat_multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamilton product a*b of (..., 4) w,x,y,z quaternions."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    aw, ax, ay, az = np.moveaxis(a, -1, 0)
    bw, bx, by, bz = np.moveaxis(b, -1, 0)
    return np.stack(
        [
            aw * bw - ax * bx - ay * by - az * bz,
            aw * bx + ax * bw + ay * bz - az * by,
            aw * by - ax * bz + ay * bw + az * bx,
            aw * bz + ax * by - ay * bx + az * bw,
        ],
        axis=-1,
    )


def quat_conjugate(q: np.ndarray) -> np.ndarray:
    """Conjugate (= inverse for unit quaternions) of (..., 4) w,x,y,z."""
    q = np.array(q, dtype=np.float64)
    q[..., 1:] *= -1.0
    return q


def random_quaternion(rng: np.random.Generator, n: int | None = None) -> np.ndarray:
    """Uniformly random unit quaternion(s), w >= 0. Returns (4,) or (n, 4)."""
    q = rng.normal(size=(4,) if n is None else (n, 4))
    q /= np.linalg.norm(q, axis=-1, keepdims=True)
    return q * np.where(q[..., :1] < 0, -1.0, 1.0)


def random_pose(rng: np.random.Generator, translation_scale: float = 0.3) -> np.ndarray:
    """A random pose (7,) x,y,z,qw,qx,qy,qz with translation in [-scale, scale]^3."""
    t = rng.uniform(-translation_scale, translation_scale, size=3)
    return np.concatenate([t, random_quaternion(rng)])


IDENTITY_POSE = np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])


def pose_inverse(pose: np.ndarray) -> np.ndarray:
    """World->mesh transform of a mesh whose frame sits at `pose` in the world.

    pose: (7,) x,y,z,qw,qx,qy,qz (mesh in world). Returns (7,) such that
    p_mesh = R(q_inv) p_world + t_inv.
    """
    pose = np.asarray(pose, dtype=np.float64)
    q = pose[3:] / np.linalg.norm(pose[3:])
    q_inv = quat_conjugate(q)
    t_inv = -quat_to_matrix(q_inv) @ pose[:3]
    return np.concatenate([t_inv, q_inv])


def transform_points(pose: np.ndarray, points: np.ndarray) -> np.ndarray:
    """Apply pose (7,) to points (N, 3): R p + t."""
    pose = np.asarray(pose, dtype=np.float64)
    return np.asarray(points, dtype=np.float64) @ quat_to_matrix(pose[3:]).T + pose[:3]


# --------------------------------------------------------------------------------------------
# mesh generators (CCW seen from outside)
# --------------------------------------------------------------------------------------------


def box(size=(1.0, 1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Axis-aligned box centred at the origin. Returns vertices (8,3) float64, triangles (12,3) int64."""
    hx, hy, hz = 0.5 * np.asarray(size, dtype=np.float64)
    v = np.array(
        [[sx * hx, sy * hy, sz * hz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)]
    )
    # index = 4*ix + 2*iy + iz with i = 0 for -, 1 for +
    quads = [
        (0, 1, 3, 2),  # x = -hx, CCW seen from -x
        (4, 6, 7, 5),  # x = +hx
        (0, 4, 5, 1),  # y = -hy
        (2, 3, 7, 6),  # y = +hy
        (0, 2, 6, 4),  # z = -hz
        (1, 5, 7, 3),  # z = +hz
    ]
    tris = []
    for a, b, c, d in quads:
        tris += [(a, b, c), (a, c, d)]
    return v, np.array(tris, dtype=np.int64)


def open_box(size=(1.0, 1.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    """Box without its +z face (not watertight: a cup open at the top)."""
    v, t = box(size)
    return v, t[:10].copy()


def thin_wall(thickness: float = 0.01, width: float = 1.0, height: float = 1.0):
    """A thin box: thickness along x, centred at the origin."""
    return box((thickness, width, height))


def icosphere(radius: float = 1.0, subdivisions: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Subdivided icosahedron with vertices on the sphere of `radius` (inscribed polyhedron)."""
    g = (1.0 + np.sqrt(5.0)) / 2.0
    v = [
        (-1, g, 0), (1, g, 0), (-1, -g, 0), (1, -g, 0),
        (0, -1, g), (0, 1, g), (0, -1, -g), (0, 1, -g),
        (g, 0, -1), (g, 0, 1), (-g, 0, -1), (-g, 0, 1),
    ]
    f = [
        (0, 11, 5), (0, 5, 1), (0, 1, 7), (0, 7, 10), (0, 10, 11),
        (1, 5, 9), (5, 11, 4), (11, 10, 2), (10, 7, 6), (7, 1, 8),
        (3, 9, 4), (3, 4, 2), (3, 2, 6), (3, 6, 8), (3, 8, 9),
        (4, 9, 5), (2, 4, 11), (6, 2, 10), (8, 6, 7), (9, 8, 1),
    ]
    verts = [np.array(p, dtype=np.float64) / np.linalg.norm(p) for p in v]
    faces = list(f)
    for _ in range(subdivisions):
        cache: dict[tuple[int, int], int] = {}

        def mid(i: int, j: int) -> int:
            key = (min(i, j), max(i, j))
            if key not in cache:
                m = verts[i] + verts[j]
                verts.append(m / np.linalg.norm(m))
                cache[key] = len(verts) - 1
            return cache[key]

        new = []
        for a, b, c in faces:
            ab, bc, ca = mid(a, b), mid(b, c), mid(c, a)
            new += [(a, ab, ca), (b, bc, ab), (c, ca, bc), (ab, bc, ca)]
        faces = new
    return np.array(verts) * radius, np.array(faces, dtype=np.int64)


def sheet(size: float = 1.0, n: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Open square sheet in the z = 0 plane, normal +z, n x n quads, centred at the origin."""
    xs = np.linspace(-size / 2, size / 2, n + 1)
    gx, gy = np.meshgrid(xs, xs, indexing="ij")
    v = np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)], axis=1)
    tris = []
    for i in range(n):
        for j in range(n):
            a = i * (n + 1) + j
            b = (i + 1) * (n + 1) + j
            c = (i + 1) * (n + 1) + j + 1
            d = i * (n + 1) + j + 1
            tris += [(a, b, c), (a, c, d)]
    return v, np.array(tris, dtype=np.int64)


# --------------------------------------------------------------------------------------------
# closest points, winding number, signed distance
# --------------------------------------------------------------------------------------------


def _dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.einsum("...k,...k->...", a, b)


def closest_point_triangles(p: np.ndarray, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Closest point on triangles (a,b,c) to points p (Ericson, Real-Time Collision Detection 5.1.5).

    p: (P,1,3) or broadcastable; a, b, c: (1,T,3). Returns (P,T,3).
    All Voronoi regions are evaluated with guarded divisions and the first matching region wins,
    in the same order as the scalar algorithm.
    """
    ab = b - a
    ac = c - a
    ap = p - a
    d1 = _dot(ab, ap)
    d2 = _dot(ac, ap)
    bp = p - b
    d3 = _dot(ab, bp)
    d4 = _dot(ac, bp)
    cp = p - c
    d5 = _dot(ab, cp)
    d6 = _dot(ac, cp)
    vc = d1 * d4 - d3 * d2
    vb = d5 * d2 - d1 * d6
    va = d3 * d6 - d5 * d4

    def safe_div(n: np.ndarray, d: np.ndarray) -> np.ndarray:
        return n / np.where(np.abs(d) > 1e-300, d, 1.0)

    in_a = (d1 <= 0) & (d2 <= 0)
    in_b = (d3 >= 0) & (d4 <= d3)
    in_ab = (vc <= 0) & (d1 >= 0) & (d3 <= 0)
    in_c = (d6 >= 0) & (d5 <= d6)
    in_ac = (vb <= 0) & (d2 >= 0) & (d6 <= 0)
    in_bc = (va <= 0) & ((d4 - d3) >= 0) & ((d5 - d6) >= 0)

    shape = np.broadcast_shapes(p.shape, a.shape)
    pa = np.broadcast_to(a, shape)
    pb = np.broadcast_to(b, shape)
    pc = np.broadcast_to(c, shape)
    v_ab = safe_div(d1, d1 - d3)[..., None]
    w_ac = safe_div(d2, d2 - d6)[..., None]
    w_bc = safe_div(d4 - d3, (d4 - d3) + (d5 - d6))[..., None]
    denom = va + vb + vc
    v_f = safe_div(vb, denom)[..., None]
    w_f = safe_div(vc, denom)[..., None]
    cand = [
        pa,
        pb,
        a + v_ab * ab,
        pc,
        a + w_ac * ac,
        b + w_bc * (c - b),
        a + ab * v_f + ac * w_f,
    ]
    conds = [in_a, in_b, in_ab, in_c, in_ac, in_bc]
    out = cand[-1].copy()
    # apply in reverse so the first matching region overrides later ones
    for cond, val in zip(reversed(conds), reversed(cand[:-1])):
        out = np.where(cond[..., None], val, out)
    return out


def _candidate_pairs(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray, slack: float = 0.0):
    """Exact closest points on every triangle that can be within `slack` of the nearest one.

    A triangle is skipped only when a bounding-sphere lower bound proves it farther than
    (an upper bound of the minimum distance) + slack, so the result is the same as checking all
    triangles. Returns point index (K,), triangle index (K,), closest point (K,3), distance (K,).
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    v = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(triangles, dtype=np.int64)
    a, b, c = v[t[:, 0]], v[t[:, 1]], v[t[:, 2]]
    centre = (a + b + c) / 3.0
    rad = np.max(np.stack([np.linalg.norm(x - centre, axis=1) for x in (a, b, c)]), axis=0)
    out_p, out_t = [], []
    step = max(1, _CHUNK_ELEMENTS // max(1, len(t)))
    for s in range(0, points.shape[0], step):
        dc = np.linalg.norm(points[s : s + step, None, :] - centre[None], axis=-1)
        upper = (dc + rad[None]).min(axis=1)
        pi, ti = np.nonzero(dc - rad[None] <= upper[:, None] + slack + 1e-12)
        out_p.append(pi + s)
        out_t.append(ti)
    pi = np.concatenate(out_p)
    ti = np.concatenate(out_t)
    cp = closest_point_triangles(points[pi], a[ti], b[ti], c[ti])
    d = np.linalg.norm(points[pi] - cp, axis=-1)
    return pi, ti, cp, d


def closest_point_mesh(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray):
    """Closest point on a mesh (min over all triangles).

    points (N,3), vertices (V,3), triangles (T,3). Returns closest (N,3), distance (N,), tri (N,) int.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    pi, ti, cp, d = _candidate_pairs(points, vertices, triangles)
    order = np.lexsort((d, pi))
    first = order[np.r_[True, pi[order][1:] != pi[order][:-1]]]
    n = points.shape[0]
    assert np.array_equal(pi[first], np.arange(n))
    return cp[first], d[first], ti[first]


def unsigned_distance(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Unsigned distance (N,) from points (N,3) to the mesh surface."""
    return closest_point_mesh(points, vertices, triangles)[1]


def winding_number(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Generalized winding number (N,) of a triangle soup at points (N,3).

    Sum of signed solid angles (Van Oosterom & Strackee) over 4 pi: 1 inside a closed CCW-outward
    mesh, 0 outside; fractional values for open meshes.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    v = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(triangles, dtype=np.int64)
    tri = [v[t[:, k]].T[:, None, :] for k in range(3)]  # 3 x (3, 1, T): coordinates first
    out = np.empty(points.shape[0])
    step = max(1, _CHUNK_ELEMENTS // max(1, len(t)))
    for s in range(0, points.shape[0], step):
        p = points[s : s + step].T[:, :, None]  # (3, P, 1)
        a, b, c = (x - p for x in tri)  # (3, P, T)
        la = np.sqrt(a[0] ** 2 + a[1] ** 2 + a[2] ** 2)
        lb = np.sqrt(b[0] ** 2 + b[1] ** 2 + b[2] ** 2)
        lc = np.sqrt(c[0] ** 2 + c[1] ** 2 + c[2] ** 2)
        det = (a[0] * (b[1] * c[2] - b[2] * c[1]) + a[1] * (b[2] * c[0] - b[0] * c[2])
               + a[2] * (b[0] * c[1] - b[1] * c[0]))
        ab = a[0] * b[0] + a[1] * b[1] + a[2] * b[2]
        bc = b[0] * c[0] + b[1] * c[1] + b[2] * c[2]
        ca = c[0] * a[0] + c[1] * a[1] + c[2] * a[2]
        den = la * lb * lc + ab * lc + bc * la + ca * lb
        out[s : s + step] = np.sum(np.arctan2(det, den), axis=1) / (2.0 * np.pi)
    return out


def position_groups(v):
    """Index of the first vertex at each vertex's exact float32 position (a dict, not weld)."""
    first = {}
    return np.array([first.setdefault(tuple(p), i) for i, p in enumerate(np.asarray(v, np.float32).tolist())])


def loop_rim(v, t, group):
    """The rim of a mesh by plain loops: (a, b, multiplicity) for every edge between grouped
    vertices a < b whose uses in one direction and the other do not cancel (the independent
    reference for the rim rows of sign_data)."""
    net = {}
    for f in np.asarray(t).tolist():
        for k in range(3):
            a, b = int(group[f[k]]), int(group[f[(k + 1) % 3]])
            if a != b:
                key = (min(a, b), max(a, b))
                net[key] = net.get(key, 0) + (1 if a < b else -1)
    return [(a, b, abs(n)) for (a, b), n in sorted(net.items()) if n != 0]


def loop_pseudo_normals(v, t, group):
    """Angle-weighted vertex normals (V,3) and edge normals (T,3,3) by plain loops, vertices
    grouped by ``group`` (Baerentzen & Aanaes): the independent reference for sign_data."""
    v = np.asarray(v, np.float64)
    vert_sum, edge_sum = {}, {}

    def unit(x):
        length = np.linalg.norm(x)
        return x / length if length > 0 else np.zeros(3)

    for a, b, c in t:
        n = unit(np.cross(v[b] - v[a], v[c] - v[a]))
        corners = (a, b, c)
        for k in range(3):
            p, q, r = corners[k], corners[(k + 1) % 3], corners[(k + 2) % 3]
            e1, e2 = v[q] - v[p], v[r] - v[p]
            angle = np.arctan2(np.linalg.norm(np.cross(e1, e2)), np.dot(e1, e2))
            vert_sum[group[p]] = vert_sum.get(group[p], np.zeros(3)) + angle * n
            edge = frozenset((group[p], group[q]))
            edge_sum[edge] = edge_sum.get(edge, np.zeros(3)) + n
    vn = np.array([unit(vert_sum.get(group[i], np.zeros(3))) for i in range(len(v))])
    en = np.array([[unit(edge_sum[frozenset((group[tri[k]], group[tri[(k + 1) % 3]]))]) for k in range(3)]
                   for tri in t])
    return vn, en


def pseudo_normal_sign(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray,
                       feature_eps: float = 1e-9):
    """Sign of the angle-weighted pseudo-normal of each point's closest feature (face, edge or
    vertex; Baerentzen & Aanaes): -1 behind it (inside), +1 in front, and the distance to it.
    The rule of sign method ``normal`` at any distance, for any mesh (open, nested, self-
    intersecting: there it is a rule, not the solid). Vertices grouped by exact position.

    points (N,3). Returns sign (N,), distance (N,), |cos| of the angle between p - c and that
    normal (N,) (near 0: the sign is not robust)."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    v = np.asarray(vertices, dtype=np.float64)
    t = np.asarray(triangles, dtype=np.int64)
    c, d, tri = closest_point_mesh(points, v, t)
    vn, en = loop_pseudo_normals(v, t, position_groups(v))
    a, b, cc = v[t[tri, 0]], v[t[tri, 1]], v[t[tri, 2]]
    face = np.cross(b - a, cc - a)
    area2 = np.einsum("ij,ij->i", face, face)
    # barycentric coordinates of the closest point in its triangle
    wb = np.einsum("ij,ij->i", np.cross(c - a, cc - a), face) / area2
    wc = np.einsum("ij,ij->i", np.cross(b - a, c - a), face) / area2
    w = np.stack([1.0 - wb - wc, wb, wc], axis=1)
    normal = face / np.sqrt(area2)[:, None]
    on_edge = w < feature_eps  # weight of the corner opposite the edge is ~0
    rows = np.arange(len(points))
    for k in range(3):  # edge (k+1, k+2) lies opposite corner k; en[tri, j] is edge (j, j+1)
        sel = on_edge[:, k]
        normal[sel] = en[tri[sel], (k + 1) % 3]
    for k in range(3):  # a vertex: the other two weights vanish
        sel = (w[:, k] > 1.0 - feature_eps)
        normal[sel] = vn[t[tri[sel], k]]
    diff = points - c
    dot = np.einsum("ij,ij->i", diff, normal)
    cos = np.abs(dot) / np.maximum(d * np.linalg.norm(normal, axis=1), 1e-300)
    return np.where(dot < 0.0, -1.0, 1.0), d, cos


def signed_distance(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray):
    """Signed distance in the mesh frame: |p - c| * (-1 inside, +1 outside), inside = winding > 0.5.

    points (N,3). Returns sd (N,), grad (N,3) = (p - c)/|p - c| * sign (unit, d sd / d p),
    closest (N,3).
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    c, d, _ = closest_point_mesh(points, vertices, triangles)
    sign = np.where(winding_number(points, vertices, triangles) > 0.5, -1.0, 1.0)
    diff = points - c
    grad = diff / np.maximum(d, 1e-300)[:, None] * sign[:, None]
    return d * sign, grad, c


@dataclass
class RefMesh:
    """A mesh instance of the reference world: geometry in its own frame, pose in the world."""

    vertices: np.ndarray
    triangles: np.ndarray
    pose: np.ndarray = field(default_factory=lambda: IDENTITY_POSE.copy())
    enabled: bool = True

    def signed_distance_world(self, points: np.ndarray):
        """World-frame signed distance. points (N,3) world. Returns sd (N,), grad (N,3) world frame."""
        inv = pose_inverse(self.pose)
        local = transform_points(inv, points)
        sd, g_local, _ = signed_distance(local, self.vertices, self.triangles)
        # d sd / d p_world = R_inv^T g_local = R(q_pose) g_local
        return sd, g_local @ quat_to_matrix(self.pose[3:]).T


# --------------------------------------------------------------------------------------------
# cost (docs/design.md "Cost definition")
# --------------------------------------------------------------------------------------------


def cost_of_penetration(d: np.ndarray, eta: float):
    """Piecewise cost of penetration d and its derivative d cost / d d. Both shaped like d."""
    d = np.asarray(d, dtype=np.float64)
    quad = (d > 0) & (d <= eta)
    lin = d > eta
    eta_safe = eta if eta > 0 else 1.0
    cost = np.where(lin, d - 0.5 * eta, np.where(quad, d * d / (2.0 * eta_safe), 0.0))
    dcost = np.where(lin, 1.0, np.where(quad, d / eta_safe, 0.0))
    return cost, dcost


def _env_sd(points: np.ndarray, meshes: list[RefMesh]):
    """sd (M,N) and grad (M,N,3) of every enabled mesh at world points (N,3)."""
    sds, grads = [], []
    for m in meshes:
        if not m.enabled:
            continue
        sd, g = m.signed_distance_world(points)
        sds.append(sd)
        grads.append(g)
    n = points.shape[0]
    if not sds:
        return np.zeros((0, n)), np.zeros((0, n, 3))
    return np.stack(sds), np.stack(grads)


def point_cost(points: np.ndarray, radius: np.ndarray, meshes: list[RefMesh], eta: float,
               weight: float, max_dist: float):
    """Cost of spheres (N) at world points (N,3) with radii (N,) against one environment.

    Returns cost (N,), grad (N,3) (world frame, d cost / d p). Spheres with radius < 0 cost 0.
    Spheres farther than max_dist + r + eta from every surface cost 0 (the search bound).
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    radius = np.asarray(radius, dtype=np.float64).reshape(-1)
    sd, g = _env_sd(points, meshes)
    on = radius >= 0
    d = radius[None] + eta - sd
    ci, dci = cost_of_penetration(d, eta)
    found = sd <= max_dist + radius[None] + eta
    ci = np.where(found, ci, 0.0)
    dci = np.where(found, dci, 0.0)
    cost = weight * ci.sum(axis=0)
    grad = weight * np.sum(-dci[..., None] * g, axis=0)
    return np.where(on, cost, 0.0), np.where(on[:, None], grad, 0.0)


def point_esdf(points: np.ndarray, meshes: list[RefMesh], weight: float, max_dist: float):
    """compute_esdf mode: weight * max_i(-sd_i), -max_dist when nothing is within max_dist.

    Returns value (N,), grad (N,3) (gradient of value w.r.t. p; zero where clamped).
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    sd, g = _env_sd(points, meshes)
    n = points.shape[0]
    if sd.shape[0] == 0:
        return np.full(n, -weight * max_dist), np.zeros((n, 3))
    k = np.argmax(-sd, axis=0)
    best = -sd[k, np.arange(n)]
    gbest = -g[k, np.arange(n)]
    found = best > -max_dist
    val = np.where(found, best, -max_dist) * weight
    grad = np.where(found[:, None], gbest, 0.0) * weight
    return val, grad


def clearance(points: np.ndarray, radius: np.ndarray, meshes: list[RefMesh], eta: float,
              max_dist: float) -> np.ndarray:
    """Sphere-tracing step length (N,): max(min_i sd_i - r - eta, 0), max_dist when no surface is
    within max_dist + r + eta (equivalently: clipped to [0, max_dist])."""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    radius = np.asarray(radius, dtype=np.float64).reshape(-1)
    sd, _ = _env_sd(points, meshes)
    if sd.shape[0] == 0:
        return np.full(points.shape[0], float(max_dist))
    m = sd.min(axis=0)
    far = m > max_dist + radius + eta
    return np.where(far, max_dist, np.maximum(m - radius - eta, 0.0))


def _env_list(envs, b: int, env_index) -> list[list[RefMesh]]:
    if env_index is None:
        return [envs[0]] * b
    return [envs[int(e)] for e in np.asarray(env_index).reshape(-1)]


def sphere_cost(spheres: np.ndarray, envs: list[list[RefMesh]], eta: float, weight: float = 1.0,
                max_dist: float = 0.5, env_index=None, compute_esdf: bool = False):
    """Reference of SdfMeshWarpPy.

    spheres (b,h,n,4) x,y,z,r; envs: meshes per environment; env_index (b,) or None (env 0).
    Returns cost (b,h,n), grad (b,h,n,3).
    """
    s = np.asarray(spheres, dtype=np.float64)
    b = s.shape[0]
    cost = np.zeros(s.shape[:-1])
    grad = np.zeros(s.shape[:-1] + (3,))
    for i, meshes in enumerate(_env_list(envs, b, env_index)):
        pts = s[i, ..., :3].reshape(-1, 3)
        if compute_esdf:
            c, g = point_esdf(pts, meshes, weight, max_dist)
        else:
            c, g = point_cost(pts, s[i, ..., 3].reshape(-1), meshes, eta, weight, max_dist)
        cost[i] = c.reshape(s.shape[1:-1])
        grad[i] = g.reshape(s.shape[1:-1] + (3,))
    return cost, grad


def swept_weights(sweep_steps: int, n_sides: int) -> tuple[float, np.ndarray, np.ndarray]:
    """Quadrature of one slot: (weight of p[t], fractions s_k (K,), weight of each side's sample k (K,)).

    The slot average is the mean over the existing sides (each is half of the time of an inner
    step) of the trapezoid-rule average of the cost over that side's half segment, on the nodes
    s_j = j / (2K), j = 0..K (node 0 = p[t]). With no side (K = 0 or no neighbour) p[t] weighs 1.
    """
    if sweep_steps <= 0 or n_sides == 0:
        return 1.0, np.zeros(0), np.zeros(0)
    k = np.arange(1, sweep_steps + 1)
    s = k / (2.0 * sweep_steps)
    trapezoid = np.where(k == sweep_steps, 0.5, 1.0) / sweep_steps  # nodes 1..K of [0, 1/2]
    # node 0 (p[t]) of every side: 1 / (2K) in each side's trapezoid, averaged over the sides
    w_p = sum(0.5 / sweep_steps for _ in range(n_sides)) / n_sides
    return w_p, s, trapezoid / n_sides


def swept_sphere_partials(spheres: np.ndarray, envs: list[list[RefMesh]], eta: float,
                          weight: float = 1.0, max_dist: float = 0.5, sweep_steps: int = 1,
                          speed_dt: float = 0.1, enable_speed_metric: bool = False, env_index=None,
                          samples_out: list | None = None):
    """Reference of the swept cost of docs/design.md "Swept cost" and its exact partial derivatives.

    Every sample is evaluated (no sphere-tracing skips: a correct kernel skips only samples whose
    cost is 0, so it must agree). spheres (b,h,n,4). Returns cost (b,h,n) and the partials
    own = d cost_t / d p[t], to_prev = d cost_t / d p[t-1], to_next = d cost_t / d p[t+1]
    (each (b,h,n,3)). With the speed metric, a step where it applies gets CHOMP's gradient of
    its slot-translation gradient (own + to_prev + to_next) in own, and zero neighbour partials.
    When samples_out is a list, every sample q (3,) is appended as ((b, t, k), q) for each sphere
    whose summed-cost gradient depends on it (the step's own sphere and the neighbour).
    """
    s = np.asarray(spheres, dtype=np.float64)
    b, h, n, _ = s.shape
    cost = np.zeros((b, h, n))
    own = np.zeros((b, h, n, 3))
    partial = {-1: np.zeros((b, h, n, 3)), 1: np.zeros((b, h, n, 3))}
    for bi, meshes in enumerate(_env_list(envs, b, env_index)):
        # one row of samples: (t, k, neighbour step or -1, fraction s, weight, point)
        rows_t, rows_k, rows_nb, rows_s, rows_w, rows_q = [], [], [], [], [], []
        for t in range(h):
            for k in range(n):
                if s[bi, t, k, 3] < 0:
                    continue
                p = s[bi, t, k, :3]
                sides = [nb for nb in (t - 1, t + 1) if 0 <= nb < h and s[bi, nb, k, 3] >= 0]
                w_p, frac, w_side = swept_weights(sweep_steps, len(sides))
                rows_t.append(t), rows_k.append(k), rows_nb.append(-1), rows_s.append(0.0)
                rows_w.append(w_p), rows_q.append(p)
                if sweep_steps <= 0:
                    continue
                for nb in sides:
                    pn = s[bi, nb, k, :3]
                    for fk, wk in zip(frac, w_side):
                        q = (1.0 - fk) * p + fk * pn
                        rows_t.append(t), rows_k.append(k), rows_nb.append(nb), rows_s.append(fk)
                        rows_w.append(wk), rows_q.append(q)
                        if samples_out is not None:
                            samples_out.append(((bi, t, k), q))
                            samples_out.append(((bi, nb, k), q))
        if not rows_t:
            continue
        t_i, k_i, nb_i = np.array(rows_t), np.array(rows_k), np.array(rows_nb)
        f_i, w_i, q_i = np.array(rows_s), np.array(rows_w), np.array(rows_q)
        c_i, g_i = point_cost(q_i, s[bi, t_i, k_i, 3], meshes, eta, weight, max_dist)
        np.add.at(cost[bi], (t_i, k_i), w_i * c_i)
        np.add.at(own[bi], (t_i, k_i), (w_i * (1.0 - f_i))[:, None] * g_i)
        for side in (-1, 1):
            sel = (nb_i >= 0) & (nb_i - t_i == side)
            np.add.at(partial[side][bi], (t_i[sel], k_i[sel]), (w_i[sel] * f_i[sel])[:, None] * g_i[sel])
    to_prev, to_next = partial[-1], partial[1]
    if enable_speed_metric:
        slot_grad = own + to_prev + to_next
        new_cost, new_grad, applied = speed_metric(cost, slot_grad, s[..., :3], speed_dt, return_mask=True)
        cost = new_cost
        own = np.where(applied[..., None], new_grad, own)
        to_prev = np.where(applied[..., None], 0.0, to_prev)
        to_next = np.where(applied[..., None], 0.0, to_next)
    return cost, own, to_prev, to_next


def swept_chain_rule(own: np.ndarray, to_prev: np.ndarray, to_next: np.ndarray,
                     grad_output: np.ndarray | None = None) -> np.ndarray:
    """Gradient (b,h,n,3) of sum_t g[t] cost_t w.r.t. every p[t] from the partials; g (b,h,n)
    (None = ones: the gradient of the summed cost)."""
    g = np.ones(own.shape[:-1]) if grad_output is None else np.asarray(grad_output, dtype=np.float64)
    out = g[..., None] * own
    out[:, 1:] += g[:, :-1, :, None] * to_next[:, :-1]
    out[:, :-1] += g[:, 1:, :, None] * to_prev[:, 1:]
    return out


def swept_sphere_cost(spheres: np.ndarray, envs: list[list[RefMesh]], eta: float,
                      weight: float = 1.0, max_dist: float = 0.5, sweep_steps: int = 1,
                      speed_dt: float = 0.1, enable_speed_metric: bool = False, env_index=None,
                      samples_out: list | None = None):
    """Reference of SweptSdfMeshWarpPy: cost (b,h,n) and out_grad[..., :3] (b,h,n,3), the
    gradient of the summed cost w.r.t. every sphere. See swept_sphere_partials."""
    cost, own, to_prev, to_next = swept_sphere_partials(spheres, envs, eta, weight, max_dist, sweep_steps,
                                                        speed_dt, enable_speed_metric, env_index, samples_out)
    return cost, swept_chain_rule(own, to_prev, to_next)


def speed_metric(cost: np.ndarray, grad: np.ndarray, positions: np.ndarray, dt: float,
                 return_mask: bool = False):
    """CHOMP speed metric of docs/design.md "Swept cost", applied for 0 < t < h-1 where cost > 0.

    cost (b,h,n), grad (b,h,n,3), positions (b,h,n,3), dt seconds. Returns new (cost, grad);
    the first and last steps are returned unchanged. With return_mask, a third element (b,h,n)
    bool says where the metric was applied.
    """
    cost = np.array(cost, dtype=np.float64)
    grad = np.array(grad, dtype=np.float64)
    p = np.asarray(positions, dtype=np.float64)
    h = p.shape[1]
    if h < 3:
        return (cost, grad, np.zeros(cost.shape, dtype=bool)) if return_mask else (cost, grad)
    pm, p0, pp = p[:, :-2], p[:, 1:-1], p[:, 2:]
    v = (pp - pm) / (2.0 * dt)
    speed = np.linalg.norm(v, axis=-1)
    acc = (pm + pp - 2.0 * p0) / (dt * dt)
    vhat = v / np.maximum(speed, 1e-300)[..., None]
    c0 = cost[:, 1:-1]
    g0 = grad[:, 1:-1]
    kappa = acc / np.where(speed > 1e-3, speed, 1.0)[..., None] ** 2

    def proj(x: np.ndarray) -> np.ndarray:
        return x - vhat * _dot(vhat, x)[..., None]

    new_g = speed[..., None] * (proj(g0) - c0[..., None] * proj(kappa))
    new_c = speed * c0
    apply = (c0 > 0) & (speed > 1e-3)
    cost[:, 1:-1] = np.where(apply, new_c, c0)
    grad[:, 1:-1] = np.where(apply[..., None], new_g, g0)
    if return_mask:
        mask = np.zeros(cost.shape, dtype=bool)
        mask[:, 1:-1] = apply
        return cost, grad, mask
    return cost, grad


def gradient_ambiguity(points: np.ndarray, vertices: np.ndarray, triangles: np.ndarray,
                       delta: float = 1e-4) -> np.ndarray:
    """How much the distance gradient could change if the closest point were picked among near
    ties, per point (N,): max |g_j - g_best| over triangles j whose distance is within `delta` of
    the minimum, g = (p - c)/|p - c| (unsigned). Large on medial axes (where the gradient jumps),
    0 where the closest point is clear-cut or shared by neighbouring triangles.
    """
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    pi, _, cp, d = _candidate_pairs(points, vertices, triangles, slack=delta)
    g = (points[pi] - cp) / np.maximum(d, 1e-300)[:, None]
    n = points.shape[0]
    best = np.full(n, np.inf)
    np.minimum.at(best, pi, d)
    order = np.lexsort((d, pi))
    first = order[np.r_[True, pi[order][1:] != pi[order][:-1]]]
    g_best = np.empty((n, 3))
    g_best[pi[first]] = g[first]
    near = d <= best[pi] + delta
    jump = np.where(near, np.linalg.norm(g - g_best[pi], axis=1), 0.0)
    out = np.zeros(n)
    np.maximum.at(out, pi, jump)
    return out


def world_gradient_ambiguity(points: np.ndarray, meshes: list[RefMesh], delta: float = 1e-4) -> np.ndarray:
    """max over the enabled meshes of gradient_ambiguity, evaluated in each mesh frame. (N,)"""
    points = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    out = np.zeros(points.shape[0])
    for m in meshes:
        if m.enabled:
            local = transform_points(pose_inverse(m.pose), points)
            out = np.maximum(out, gradient_ambiguity(local, m.vertices, m.triangles, delta))
    return out
