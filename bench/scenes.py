"""Deterministic benchmark scenes: closed, well-shaped meshes and sphere sets near their surfaces.

Every generator takes explicit sizes and a seed, so two runs (or two machines) measure the same
geometry. Meshes are (vertices (V,3) float32 m, triangles (T,3) int32) with outward,
counter-clockwise winding, watertight, and without long sliver triangles (so that timings
reflect ordinary CAD/scan meshes rather than degenerate BVHs).

The standard scene: 8 meshes of about 5k triangles each (icosphere, ellipsoid, two tori, two
subdivided boxes, two capped cylinders), 40k triangles in all, at distinct rotated poses on a
4 x 2 grid with 1 m spacing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from robot_sdf.geometry import transform_points

STANDARD_SEED = 20240611
# Search and cost parameters of the standard benchmark (metres).
MAX_DIST = 0.2
ACTIVATION = 0.05
SPHERE_RADIUS = 0.05
SURFACE_OFFSET = 0.2


@dataclass(frozen=True)
class SceneMesh:
    """One obstacle: geometry in its own frame and its pose (7,) x,y,z,qw,qx,qy,qz in the world."""

    name: str
    vertices: np.ndarray
    triangles: np.ndarray
    pose: np.ndarray

    def world_vertices(self) -> np.ndarray:
        """(V,3) float32 vertices in the world frame."""
        return transform_points(self.pose, self.vertices.astype(np.float64)).astype(np.float32)


# ---------------------------------------------------------------------------------------- meshes
def _orient_outward(vertices: np.ndarray, triangles: np.ndarray) -> np.ndarray:
    """Flip triangles whose normal points towards the origin (valid for star-shaped meshes
    around the origin: the convex boxes, cylinders and spheres built here)."""
    tri = vertices[triangles].astype(np.float64)
    normal = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    inward = np.einsum("ij,ij->i", normal, tri.mean(axis=1)) < 0.0
    out = triangles.copy()
    out[inward] = out[inward][:, [0, 2, 1]]
    return out


def _weld(vertices: np.ndarray, triangles: np.ndarray, decimals: int = 6) -> tuple[np.ndarray, np.ndarray]:
    """Merge coincident vertices (seams between separately built patches) so the mesh is closed."""
    key = np.round(vertices.astype(np.float64), decimals)
    unique, inverse = np.unique(key, axis=0, return_inverse=True)
    return unique.astype(np.float32), inverse.reshape(-1)[triangles].astype(np.int32)


def _grid_quads(rows: int, cols: int, wrap_cols: bool = False, wrap_rows: bool = False) -> np.ndarray:
    """Triangles (2*quads, 3) of a rows x cols vertex grid indexed r * cols + c."""
    r_max = rows if wrap_rows else rows - 1
    c_max = cols if wrap_cols else cols - 1
    r, c = np.meshgrid(np.arange(r_max), np.arange(c_max), indexing="ij")
    r, c = r.reshape(-1), c.reshape(-1)
    a = r * cols + c
    b = r * cols + (c + 1) % cols
    d = ((r + 1) % rows) * cols + c
    e = ((r + 1) % rows) * cols + (c + 1) % cols
    return np.concatenate([np.stack([a, b, e], 1), np.stack([a, e, d], 1)]).astype(np.int32)


def icosphere(radius: float, subdivisions: int) -> tuple[np.ndarray, np.ndarray]:
    """Icosphere, 20 * 4**subdivisions triangles."""
    import trimesh

    m = trimesh.creation.icosphere(subdivisions=subdivisions, radius=radius)
    return np.asarray(m.vertices, np.float32), np.asarray(m.faces, np.int32)


def ellipsoid(axes: tuple[float, float, float], subdivisions: int) -> tuple[np.ndarray, np.ndarray]:
    """Icosphere scaled to semi-axes ``axes`` (aspect stays moderate for axes within ~2.5x)."""
    v, t = icosphere(1.0, subdivisions)
    return (v * np.asarray(axes, np.float32)).astype(np.float32), t


def torus(major: float, minor: float, n_major: int, n_minor: int) -> tuple[np.ndarray, np.ndarray]:
    """Torus about the z axis: 2 * n_major * n_minor triangles."""
    u = np.arange(n_major) * (2.0 * math.pi / n_major)
    w = np.arange(n_minor) * (2.0 * math.pi / n_minor)
    uu, ww = np.meshgrid(u, w, indexing="ij")
    ring = major + minor * np.cos(ww)
    v = np.stack([ring * np.cos(uu), ring * np.sin(uu), minor * np.sin(ww)], -1).reshape(-1, 3)
    t = _grid_quads(n_major, n_minor, wrap_cols=True, wrap_rows=True)
    # Orientation: the outward normal points away from the tube's centre line.
    tri = v[t]
    normal = np.cross(tri[:, 1] - tri[:, 0], tri[:, 2] - tri[:, 0])
    centroid = tri.mean(axis=1)
    axis_pt = centroid.copy()
    axis_pt[:, 2] = 0.0
    axis_pt *= (major / np.linalg.norm(axis_pt, axis=1))[:, None]
    flip = np.einsum("ij,ij->i", normal, centroid - axis_pt) < 0.0
    t[flip] = t[flip][:, [0, 2, 1]]
    return v.astype(np.float32), t


def torus_with_triangles(count: int, major: float = 0.3, minor: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    """Torus with about ``count`` triangles and near-square cells (n_major/n_minor = major/minor)."""
    n_minor = max(3, round(math.sqrt(count * minor / (2.0 * major))))
    n_major = max(3, round(count / (2.0 * n_minor)))
    return torus(major, minor, n_major, n_minor)


def box(size: tuple[float, float, float], cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Box of extents ``size`` centred at the origin, each face gridded with ~square cells of ``cell``."""
    half = np.asarray(size, np.float64) / 2.0
    counts = [max(1, round(s / cell)) for s in size]
    verts, tris, offset = [], [], 0
    for axis in range(3):
        a, b = [k for k in range(3) if k != axis]
        ga = np.linspace(-half[a], half[a], counts[a] + 1)
        gb = np.linspace(-half[b], half[b], counts[b] + 1)
        aa, bb = np.meshgrid(ga, gb, indexing="ij")
        for side in (-1.0, 1.0):
            p = np.zeros(aa.shape + (3,))
            p[..., a], p[..., b], p[..., axis] = aa, bb, side * half[axis]
            verts.append(p.reshape(-1, 3))
            tris.append(_grid_quads(counts[a] + 1, counts[b] + 1) + offset)
            offset += p.shape[0] * p.shape[1]
    v, t = _weld(np.concatenate(verts), np.concatenate(tris))
    return v, _orient_outward(v, t)


def _stitch_rings(inner: np.ndarray, outer: np.ndarray) -> list[tuple[int, int, int]]:
    """Triangles joining two closed concentric rings of vertex ids whose angles start at 0 and
    are evenly spaced; advances along whichever ring's next vertex comes first by angle."""
    na, nb = len(inner), len(outer)
    i = j = 0
    out = []
    while i < na or j < nb:
        next_a = (i + 1) / na
        next_b = (j + 1) / nb
        if i < na and (j >= nb or next_a <= next_b):
            out.append((inner[i % na], inner[(i + 1) % na], outer[j % nb]))
            i += 1
        else:
            out.append((inner[i % na], outer[(j + 1) % nb], outer[j % nb]))
            j += 1
    return out


def cylinder(radius: float, length: float, sections: int) -> tuple[np.ndarray, np.ndarray]:
    """Capped cylinder along z: side gridded with ~square cells, caps as concentric rings whose
    vertex count grows with the radius (no fan of slivers around the cap centre)."""
    cell = 2.0 * math.pi * radius / sections
    n_z = max(1, round(length / cell))
    ang = np.arange(sections) * (2.0 * math.pi / sections)
    z = np.linspace(-length / 2.0, length / 2.0, n_z + 1)
    zz, aa = np.meshgrid(z, ang, indexing="ij")
    side = np.stack([radius * np.cos(aa), radius * np.sin(aa), zz], -1).reshape(-1, 3)
    verts = [side]
    tris = [_grid_quads(n_z + 1, sections, wrap_cols=True)]
    offset = side.shape[0]
    n_rings = max(1, round(radius / cell))
    for zc in (-length / 2.0, length / 2.0):
        offset_centre = offset
        ring_ids = [np.array([offset])]
        pts = [np.array([[0.0, 0.0, zc]])]
        offset += 1
        for k in range(1, n_rings + 1):
            n_k = sections if k == n_rings else max(6, round(sections * k / n_rings))
            a = np.arange(n_k) * (2.0 * math.pi / n_k)
            r = radius * k / n_rings
            pts.append(np.stack([r * np.cos(a), r * np.sin(a), np.full(n_k, zc)], -1))
            ring_ids.append(np.arange(offset, offset + n_k))
            offset += n_k
        first = ring_ids[1]
        cap = [(offset_centre, first[(k + 1) % len(first)], first[k]) for k in range(len(first))]
        for k in range(1, n_rings):
            cap += _stitch_rings(ring_ids[k], ring_ids[k + 1])
        verts.append(np.concatenate(pts))
        tris.append(np.asarray(cap, np.int32))
    v, t = _weld(np.concatenate(verts), np.concatenate(tris))
    return v, _orient_outward(v, t)


def _random_quaternion(rng: np.random.Generator) -> np.ndarray:
    q = rng.normal(size=4)
    q /= np.linalg.norm(q)
    return q * (1.0 if q[0] >= 0 else -1.0)


def standard_meshes(seed: int = STANDARD_SEED) -> list[SceneMesh]:
    """The standard scene: 8 closed meshes of ~5k triangles at rotated poses on a 4 x 2 grid."""
    shapes = [
        ("icosphere", icosphere(0.25, 4)),
        ("ellipsoid", ellipsoid((0.35, 0.2, 0.15), 4)),
        ("torus_thin", torus(0.3, 0.08, 96, 26)),
        ("torus_fat", torus(0.25, 0.1, 64, 40)),
        ("box", box((0.5, 0.4, 0.3), 0.02)),
        ("plate", box((0.8, 0.5, 0.06), 0.02)),
        ("cylinder_long", cylinder(0.15, 0.6, 56)),
        ("cylinder_wide", cylinder(0.25, 0.2, 92)),
    ]
    rng = np.random.default_rng(seed)
    meshes = []
    for k, (name, (v, t)) in enumerate(shapes):
        x, y = 1.0 * (k % 4) - 1.5, 1.0 * (k // 4) - 0.5
        position = np.array([x, y, 0.5]) + rng.uniform(-0.05, 0.05, size=3)
        meshes.append(SceneMesh(name, v, t, np.concatenate([position, _random_quaternion(rng)])))
    return meshes


def robot_like_meshes(seed: int = STANDARD_SEED + 5) -> list[SceneMesh]:
    """8 closed link-like meshes of 15-20k triangles each (~129k in all, the density of a real
    robot's link meshes): four capped cylinders, two finely gridded boxes, an ellipsoid and a
    torus, at rotated poses on a 4 x 2 grid with 0.35 m spacing (neighbours 5-15 cm apart)."""
    shapes = [
        ("base", cylinder(0.11, 0.16, 141)),
        ("shoulder", cylinder(0.07, 0.3, 96)),
        ("upper_arm", cylinder(0.06, 0.45, 76)),
        ("forearm", cylinder(0.05, 0.4, 73)),
        ("elbow", ellipsoid((0.1, 0.07, 0.06), 5)),
        ("wrist", torus_with_triangles(15500, 0.09, 0.04)),
        ("hand", box((0.14, 0.1, 0.08), 0.0029)),
        ("gripper", box((0.1, 0.05, 0.12), 0.0024)),
    ]
    rng = np.random.default_rng(seed)
    meshes = []
    for k, (name, (v, t)) in enumerate(shapes):
        x, y = 0.35 * (k % 4) - 0.525, 0.35 * (k // 4) - 0.175
        position = np.array([x, y, 0.5]) + rng.uniform(-0.02, 0.02, size=3)
        meshes.append(SceneMesh(name, v, t, np.concatenate([position, _random_quaternion(rng)])))
    return meshes


def _links_with_part(seed: int, place) -> list[SceneMesh]:
    """robot_like_meshes with a 0.3-scale copy of each link added to the same mesh, moved by
    ``place(link vertices, copy vertices)`` -> (3,) float32 offset."""
    out = []
    for m in robot_like_meshes(seed):
        part = m.vertices * np.float32(0.3)
        part = part + place(m.vertices, part)
        out.append(SceneMesh(m.name, np.concatenate([m.vertices, part]).astype(np.float32),
                             np.concatenate([m.triangles, m.triangles + len(m.vertices)]), m.pose))
    return out


def two_part_meshes(seed: int = STANDARD_SEED + 5) -> list[SceneMesh]:
    """robot_like_meshes with a second, smaller copy of each link in the same mesh beside it,
    overlapping it (a link exported with a part bolted on, as one file): closed surfaces of two
    crossing shells, which ``auto`` evaluates by winding number."""
    return _links_with_part(seed, lambda link, part: (
        (link.max(0) - link.min(0)) * np.array([0.0, 0.0, 0.6])).astype(np.float32))


def two_body_meshes(seed: int = STANDARD_SEED + 5) -> list[SceneMesh]:
    """robot_like_meshes with a second, 0.3-scale copy of each link in the same mesh, 2 cm clear of
    it (a link exported together with a separate part, as one file): two closed shells bounding
    one solid, which ``auto`` calls winding_number and the kernels evaluate by pseudo-normals."""
    return _links_with_part(seed, lambda link, part: np.array(
        [0.0, 0.0, link[:, 2].max() + 0.02 - part[:, 2].min()], np.float32))


# --------------------------------------------------------------------------------------- spheres
def surface_samples(meshes: list[SceneMesh], count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Area-uniform points on the union of the meshes' surfaces and their outward unit normals,
    both (count, 3) float64 in the world frame."""
    tris, normals = [], []
    for m in meshes:
        w = m.world_vertices().astype(np.float64)[m.triangles]
        tris.append(w)
        n = np.cross(w[:, 1] - w[:, 0], w[:, 2] - w[:, 0])
        normals.append(n)
    tri = np.concatenate(tris)
    nrm = np.concatenate(normals)
    area = np.linalg.norm(nrm, axis=1)
    pick = rng.choice(tri.shape[0], size=count, p=area / area.sum())
    r1 = np.sqrt(rng.uniform(size=count))
    r2 = rng.uniform(size=count)
    t = tri[pick]
    points = (1 - r1)[:, None] * t[:, 0] + (r1 * (1 - r2))[:, None] * t[:, 1] + (r1 * r2)[:, None] * t[:, 2]
    return points, nrm[pick] / area[pick, None]


def near_surface_spheres(meshes: list[SceneMesh], count: int, seed: int = STANDARD_SEED + 1,
                         radius: float = SPHERE_RADIUS, offset: float = SURFACE_OFFSET) -> np.ndarray:
    """(count, 4) float32 spheres x,y,z,r: surface points moved along the normal by U[-offset, offset]."""
    rng = np.random.default_rng(seed)
    points, normals = surface_samples(meshes, count, rng)
    centres = points + normals * rng.uniform(-offset, offset, size=(count, 1))
    return np.concatenate([centres, np.full((count, 1), radius)], axis=1).astype(np.float32)


def trajectories(meshes: list[SceneMesh], batch: int, horizon: int, spheres: int,
                 step: tuple[float, float] = (0.01, 0.02), seed: int = STANDARD_SEED + 2,
                 radius: float = SPHERE_RADIUS) -> np.ndarray:
    """(batch, horizon, spheres, 4) float32: each (batch, sphere) is a random walk of ``horizon``
    steps of length U[step] in random directions, starting near the surfaces, like the spheres of
    MPC rollouts (consecutive steps close together)."""
    rng = np.random.default_rng(seed)
    start = near_surface_spheres(meshes, batch * spheres, seed=seed + 1, radius=radius)[:, :3]
    d = rng.normal(size=(horizon - 1, batch * spheres, 3))
    d *= (rng.uniform(*step, size=d.shape[:2]) / np.linalg.norm(d, axis=-1))[..., None]
    walk = np.concatenate([start[None], start[None] + np.cumsum(d, axis=0)])  # (h, b*n, 3)
    walk = walk.reshape(horizon, batch, spheres, 3).transpose(1, 0, 2, 3)
    out = np.empty((batch, horizon, spheres, 4), np.float32)
    out[..., :3] = walk
    out[..., 3] = radius
    return out


STANDARD_WORKSPACE = ((-2.5, -1.5, -0.5), (2.5, 1.5, 1.5))  # m, around the standard scene


def mpc_rollouts(batch: int, horizon: int, spheres: int, seed: int = STANDARD_SEED + 3,
                 radius: float = SPHERE_RADIUS, dt: float = 0.1, workspace=STANDARD_WORKSPACE) -> np.ndarray:
    """(batch, horizon, spheres, 4) float32: MPC-like rollouts through a workspace box (lo, hi)
    (default: the standard scene's, [-2.5, 2.5] x [-1.5, 1.5] x [-0.5, 1.5] m), mostly in free
    space. Each batch row is a rigid body of ``spheres`` spheres (random offsets within a 0.4 m
    cube) whose centre starts anywhere in the box and drives at 0.1-0.3 m/s with a smoothly
    varying (AR(1)) velocity, ``dt`` s per step: consecutive steps 1-3 cm apart, as in the demo's
    MPPI. How many spheres come within the activation distance of a surface is measured where used."""
    rng = np.random.default_rng(seed)
    start = rng.uniform(workspace[0], workspace[1], size=(batch, 1, 1, 3))
    offsets = rng.uniform(-0.2, 0.2, size=(batch, 1, spheres, 3))
    direction = rng.normal(size=(batch, 3))
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    velocity = np.empty((batch, horizon, 3))
    velocity[:, 0] = direction * rng.uniform(0.1, 0.3, size=(batch, 1))
    for t in range(1, horizon):
        velocity[:, t] = 0.9 * velocity[:, t - 1] + rng.normal(scale=0.03, size=(batch, 3))
    path = np.concatenate([np.zeros((batch, 1, 3)), np.cumsum(velocity[:, 1:] * dt, axis=1)], axis=1)
    centres = start + offsets + path[:, :, None, :]
    out = np.empty((batch, horizon, spheres, 4), np.float32)
    out[..., :3] = centres
    out[..., 3] = radius
    return out
# ---------------------------------------------------------------------------- perception scene
def perception_mesh(rows: int = 150, cols: int = 200, seed: int = STANDARD_SEED + 3) -> SceneMesh:
    """A depth-camera-like scan of a table top with objects: an open height field of
    2 * (rows-1) * (cols-1) triangles over 1.2 x 0.9 m, given in world coordinates (identity
    pose, table at x in [0.4, 1.6], z about 0.7), as a perception pipeline publishes it."""
    rng = np.random.default_rng(seed)
    xs = np.linspace(0.4, 1.6, cols)
    ys = np.linspace(-0.45, 0.45, rows)
    gx, gy = np.meshgrid(xs, ys)
    height = np.full(gx.shape, 0.7)
    for _ in range(6):  # boxes and bumps standing on the table
        cx, cy = rng.uniform(0.5, 1.5), rng.uniform(-0.35, 0.35)
        sx, sy, h = rng.uniform(0.05, 0.15), rng.uniform(0.05, 0.15), rng.uniform(0.05, 0.3)
        inside = (np.abs(gx - cx) < sx) & (np.abs(gy - cy) < sy)
        height = np.where(inside, np.maximum(height, 0.7 + h), height)
        height += 0.1 * h * np.exp(-((gx - cx) ** 2 + (gy - cy) ** 2) / (2 * 0.05 ** 2))
    height += rng.normal(scale=0.002, size=height.shape)  # sensor noise
    v = np.stack([gx, gy, height], -1).reshape(-1, 3).astype(np.float32)
    t = _grid_quads(rows, cols)
    return SceneMesh("scan", v, t, np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))


def workspace_points(count: int, seed: int = STANDARD_SEED + 4) -> np.ndarray:
    """(count, 3) float64 points uniform in a robot's workspace around the perception scan."""
    rng = np.random.default_rng(seed)
    return rng.uniform([-0.2, -0.9, 0.0], [1.8, 0.9, 1.5], size=(count, 3))


# ------------------------------------------------------------------------- far obstacles scene
def near_obstacles(count: int = 16, seed: int = STANDARD_SEED + 5) -> list[SceneMesh]:
    """``count`` obstacles (boxes and icospheres of 0.15-0.3 m, a few hundred triangles each) at
    rotated poses on a 4-wide grid with 0.5 m spacing around the origin: a robot's near set."""
    rng = np.random.default_rng(seed)
    shapes = [box((0.3, 0.2, 0.15), 0.05), icosphere(0.12, 3), box((0.15, 0.15, 0.3), 0.05)]
    out = []
    for i in range(count):
        v, t = shapes[i % len(shapes)]
        pose = np.concatenate([[0.5 * (i % 4) - 0.75, 0.5 * (i // 4 % 4) - 0.75, 0.5 * (i // 16)],
                               _random_quaternion(rng)])
        out.append(SceneMesh(f"near{i}", v, t, pose))
    return out


def far_obstacles(count: int) -> list[SceneMesh]:
    """``count`` 0.1 m blocks (one shared geometry) on a 0.25 m grid that starts 2 m beyond the
    near set (x >= 3 m): all farther than max_dist + radius + activation from every sphere near
    the near set, like the blocks of a perception map of the rest of a room."""
    v, t = box((0.1, 0.1, 0.1), 0.1)
    side = max(1, math.ceil(count ** (1.0 / 3.0)))
    out = []
    for i in range(count):
        x, y, z = i % side, i // side % side, i // (side * side)
        pose = np.array([3.0 + 0.25 * x, -2.0 + 0.25 * y, 0.25 * z, 1.0, 0.0, 0.0, 0.0])
        out.append(SceneMesh(f"far{i}", v, t, pose))
    return out


# ------------------------------------------------------------------------ real robot meshes
REAL_GAP = 0.1  # m between the bounding spheres of neighbouring real meshes
# Shares of the real-mesh sphere mix, and the bands that define its classes (signed distance sd
# to the union of the meshes, by Warp's winding-number sign: negative inside).
SPHERE_MIX = (("near outside", 0.35), ("shallow inside", 0.25), ("deep inside", 0.25), ("anywhere", 0.15))
NEAR_OUTSIDE = MAX_DIST  # near outside: 0 < sd <= this
SHALLOW_DEPTH = 0.01  # shallow inside: -this <= sd < 0; deep inside: sd < -this
ANYWHERE_MARGIN = 0.3  # anywhere: uniform in the scene's bounding box grown by this


def real_robot_meshes(names: tuple[str, ...] | None = None, seed: int = STANDARD_SEED + 7) -> list[SceneMesh]:
    """Manufacturers' meshes of bench.real_meshes (default: its BENCH_SCENE), as the files are, at
    random rotations, the centres of their bounding boxes on a 4-wide grid whose spacing keeps
    neighbouring bounding spheres REAL_GAP apart (row after row along +y, the scene at z = 0.5 m)."""
    from bench import real_meshes

    rng = np.random.default_rng(seed)
    out: list[SceneMesh] = []
    names = real_meshes.BENCH_SCENE if names is None else names
    loaded = [(name, *real_meshes.load(name)) for name in names]
    radii = [0.5 * float(np.linalg.norm(np.ptp(v.astype(np.float64), axis=0))) for _, v, _ in loaded]
    y = 0.0
    for row in range(0, len(loaded), 4):
        cells = range(row, min(row + 4, len(loaded)))
        if row:
            y += max(radii[row - 4:row]) + REAL_GAP + max(radii[k] for k in cells)
        x = 0.0
        for k in cells:
            if k > row:
                x += radii[k - 1] + REAL_GAP + radii[k]
            name, v, t = loaded[k]
            v64 = v.astype(np.float64)
            centre = 0.5 * (v64.min(axis=0) + v64.max(axis=0))
            q = _random_quaternion(rng)
            rotated_centre = transform_points(np.concatenate([[0.0, 0.0, 0.0], q]), centre[None])[0]
            pose = np.concatenate([np.array([x, y, 0.5]) - rotated_centre, q])
            out.append(SceneMesh(name, v, t, pose))
    return out


def scene_box(meshes: list[SceneMesh], margin: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) (3,) float64: the world-frame bounding box of the meshes, grown by ``margin``."""
    pts = np.concatenate([m.world_vertices() for m in meshes]).astype(np.float64)
    return pts.min(axis=0) - margin, pts.max(axis=0) + margin


def _winding_signed_distance_kernel_def():
    import warp as wp

    @wp.kernel
    def winding_signed_distance(mesh: wp.uint64, points: wp.array(dtype=wp.vec3), out: wp.array(dtype=float)):
        """Distance to the closest surface point, negative where Warp's winding number is above 0.5."""
        i = wp.tid()
        p = points[i]
        q = wp.mesh_query_point_sign_winding_number(mesh, p, 1.0e6, 2.0, 0.5)
        d = float(1.0e6)
        if q.result:
            d = wp.length(p - wp.mesh_eval_position(mesh, q.face, q.u, q.v)) * q.sign
        out[i] = d

    return winding_signed_distance


_KERNELS: dict = {}


class UnionDistance:
    """Signed distance (Warp's winding-number sign, float32) to the union of scene meshes, on the
    CPU, where it is below ``reach`` (farther points get a positive value above it): an
    independent labeller for generated spheres (Warp's own queries, no robot_sdf kernel). A mesh
    is queried only at points within ``reach`` of its bounding sphere."""

    def __init__(self, meshes: list[SceneMesh], reach: float = 0.5):
        import warp as wp

        from robot_sdf.geometry import pose_inverse

        if "wsd" not in _KERNELS:
            _KERNELS["wsd"] = _winding_signed_distance_kernel_def()
        self.kernel = _KERNELS["wsd"]
        self.reach = reach
        self.inverse = [pose_inverse(m.pose) for m in meshes]
        self.spheres = []
        for m in meshes:
            v = m.vertices.astype(np.float64)
            centre = 0.5 * (v.min(axis=0) + v.max(axis=0))
            self.spheres.append((centre, float(np.linalg.norm(v - centre, axis=1).max())))
        self.meshes = [wp.Mesh(points=wp.array(m.vertices, dtype=wp.vec3, device="cpu"),
                               indices=wp.array(m.triangles.reshape(-1), dtype=wp.int32, device="cpu"),
                               support_winding_number=True) for m in meshes]

    def __call__(self, points: np.ndarray) -> np.ndarray:
        """(N,) float64 min over the meshes of their signed distances at world points (N,3)."""
        import warp as wp

        best = np.full(points.shape[0], np.inf)
        for inverse, (centre, radius), mesh in zip(self.inverse, self.spheres, self.meshes):
            local = transform_points(inverse, points)
            near = np.flatnonzero(np.linalg.norm(local - centre, axis=1) <= radius + self.reach)
            if near.size == 0:
                continue
            out = wp.zeros(near.shape[0], dtype=float, device="cpu")
            wp.launch(self.kernel, dim=near.shape[0], device="cpu", outputs=[out],
                      inputs=[mesh.id, wp.array(local[near].astype(np.float32), dtype=wp.vec3, device="cpu")])
            best[near] = np.minimum(best[near], out.numpy().astype(np.float64))
        return best


def mixed_spheres(meshes: list[SceneMesh], count: int, seed: int = STANDARD_SEED + 8,
                  radius: float = SPHERE_RADIUS) -> tuple[np.ndarray, dict[str, int]]:
    """(count, 4) float32 spheres x,y,z,r in the SPHERE_MIX shares: near outside (0 < sd <=
    NEAR_OUTSIDE), shallow inside (-SHALLOW_DEPTH <= sd < 0), deep inside (sd < -SHALLOW_DEPTH),
    anywhere (uniform in the scene box grown by ANYWHERE_MARGIN), sd by UnionDistance; shuffled.
    Candidates: surface points moved along the face normal by U[-2 cm, NEAR_OUTSIDE] (near,
    shallow) and points uniform in each mesh's own bounding box (deep). Also returns the count
    of each class (a class the meshes cannot fill, e.g. deep inside thin parts, is topped up
    from near outside)."""
    rng = np.random.default_rng(seed)
    label = UnionDistance(meshes)
    want = {name: int(round(share * count)) for name, share in SPHERE_MIX}
    want["near outside"] += count - sum(want.values())
    got: dict[str, list[np.ndarray]] = {name: [] for name in want}

    def have(name: str) -> int:
        return sum(len(x) for x in got[name])

    lo, hi = scene_box(meshes, ANYWHERE_MARGIN)
    got["anywhere"].append(rng.uniform(lo, hi, size=(want["anywhere"], 3)))
    bands = {"near outside": lambda sd: (sd > 0) & (sd <= NEAR_OUTSIDE),
             "shallow inside": lambda sd: (sd < 0) & (sd >= -SHALLOW_DEPTH),
             "deep inside": lambda sd: sd < -SHALLOW_DEPTH}
    for _ in range(30):
        short = {name: want[name] - have(name) for name in bands if have(name) < want[name]}
        if not short:
            break
        batch = 4 * max(short.values()) + 64
        points, normals = surface_samples(meshes, batch, rng)
        near = points + normals * rng.uniform(-0.02, NEAR_OUTSIDE, size=(batch, 1))
        boxes = []
        for m in meshes:
            v = m.vertices.astype(np.float64)
            local = rng.uniform(v.min(axis=0), v.max(axis=0), size=(batch // len(meshes) + 1, 3))
            boxes.append(transform_points(m.pose, local))
        candidates = np.concatenate([near, np.concatenate(boxes)])
        sd = label(candidates)
        for name in short:
            pick = candidates[bands[name](sd)][: want[name] - have(name)]
            got[name].append(pick)
    counts = {name: have(name) for name in want}
    missing = count - sum(counts.values())
    if missing > 0:  # top up from near outside
        extra = []
        while sum(len(x) for x in extra) < missing:
            points, normals = surface_samples(meshes, 4 * missing, rng)
            c = points + normals * rng.uniform(0.0, NEAR_OUTSIDE, size=(4 * missing, 1))
            extra.append(c[bands["near outside"](label(c))])
        got["near outside"].append(np.concatenate(extra)[:missing])
        counts["near outside"] += missing
    centres = np.concatenate([np.concatenate(x) for x in got.values() if x])[:count]
    centres = centres[rng.permutation(centres.shape[0])]
    return np.concatenate([centres, np.full((count, 1), radius)], axis=1).astype(np.float32), counts
