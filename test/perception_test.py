"""robot_sdf.perception: depth frames of a simulated camera (ray-cast meshes, RealSense-like error:
sigma = 1 mm + 2 mm z^2, 1 % of pixels dropped) fused into a MeshWorld, judged against exact
signed distances to the true meshes (test/reference.py), never against the map itself."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.perception import DepthFusion, TsdfVolume
from robot_sdf.perception.simulated_camera import SimulatedDepthCamera, look_at, merge_meshes

LOWER, UPPER = (-0.6, -0.6, -0.5), (0.6, 0.6, 0.7)
REPO_CONFIG = Path(__file__).resolve().parents[1] / "config"


def _scene():
    """A box and a sphere in free space (nothing under them: views from every side see every face)."""
    bv, bt = ref.box((0.4, 0.3, 0.2))
    sv, st = ref.icosphere(0.1, 3)
    return [(bv + [0.0, 0.0, 0.1], bt), (sv + [0.3, 0.25, 0.1], st)]


def _views(count: int = 30):
    """Poses around the scene: a circle of radius 1.2 m, elevations from -58 to +58 degrees."""
    for i in range(count):
        a = 2.0 * np.pi * i / count
        elevation = 0.8 * np.pi / 2 * np.sin(3 * a)
        eye = [1.2 * np.cos(a) * np.cos(elevation), 1.2 * np.sin(a) * np.cos(elevation), 0.1 + 1.2 * np.sin(elevation)]
        yield look_at(eye, [0.0, 0.0, 0.1])


def _true_sd(points, parts):
    return np.min(np.stack([ref.signed_distance(points, v, t)[0] for v, t in parts]), axis=0)


@pytest.fixture(scope="module")
def fused():
    parts = _scene()
    vertices, triangles = merge_meshes(parts)
    camera = SimulatedDepthCamera(320, 240, 300.0, 300.0)
    world = MeshWorld(device="cpu", max_distance=0.5)
    fusion = DepthFusion(world, LOWER, UPPER, voxel_size=0.02)
    rng = np.random.default_rng(0)
    for pose in _views():
        fusion.integrate(camera.render(vertices, triangles, pose, rng), camera.intrinsics, pose)
    fusion.update_world()
    points = np.random.default_rng(1).uniform([-0.5, -0.5, -0.15], [0.5, 0.5, 0.35], size=(20_000, 3))
    sd, grad = world.signed_distance(torch.tensor(points, dtype=torch.float32), 0, 0.5)
    return world, fusion, parts, points, _true_sd(points, parts), sd.numpy().astype(np.float64), grad.numpy()


def test_distances_near_the_surfaces(fused):
    """Points within 5 cm of a true surface: signed-distance error median <= 10 mm, p95 <= 20 mm
    (2 cm voxels, 30 noisy views)."""
    _, fusion, _, _, truth, sd, _ = fused
    near = np.abs(truth) < 0.05
    assert near.sum() > 2000 and fusion.triangles > 1000
    error = np.abs(sd - truth)[near]
    assert np.median(error) <= 0.010 and np.percentile(error, 95) <= 0.020, (np.median(error), np.percentile(error, 95))


def test_inside_and_free_space(fused):
    """>= 95 % of the points at least 3 cm inside read inside; free space 1-5 cm from every surface
    reads free at >= 95 %, and beyond 5 cm at >= 99.9 %."""
    _, _, _, _, truth, sd, _ = fused
    deep, near_free, far = truth <= -0.03, (truth > 0.01) & (truth < 0.05), truth >= 0.05
    assert deep.sum() > 300
    assert (sd[deep] < 0).mean() >= 0.95
    assert (sd[near_free] > 0).mean() >= 0.95
    assert (sd[far] <= 0).mean() <= 0.001


def test_a_sphere_touching_a_perceived_object_is_costed_along_its_normal(fused):
    """Spheres just touching the box's top and side and the sphere's top: cost > 0, gradient within
    15 degrees of the true outward normal (the gradient points into the obstacle: -normal)."""
    world, _, _, _, _, _, _ = fused
    r, eta = 0.05, 0.02
    cases = [((0.0, 0.0, 0.2 + r), (0.0, 0.0, 1.0)), ((0.2 + r, 0.0, 0.1), (1.0, 0.0, 0.0)),
             ((0.3, 0.25, 0.2 + r), (0.0, 0.0, 1.0))]
    spheres = torch.tensor([[[[*c, r] for c, _ in cases]]], dtype=torch.float32)
    cost, grad = world.evaluate_sphere_cost(spheres, eta, 1.0)
    for k, (_, normal) in enumerate(cases):
        assert float(cost[0, 0, k]) > 0.0
        g = -grad[0, 0, k].numpy()
        angle = np.degrees(np.arccos(np.clip(np.dot(g / np.linalg.norm(g), normal), -1.0, 1.0)))
        assert angle <= 15.0, (k, angle)


def test_pixel_centres_and_range_on_a_slanted_plane():
    """A plane at 40 degrees, seen head-on-ish by views of one side: the reconstructed zero
    crossing lies within 1 mm of the true plane (median): the pixel-centre convention and the
    depth scale are right (half a pixel off moves it by millimetres at this slant)."""
    normal = np.array([np.sin(np.radians(40.0)), 0.0, np.cos(np.radians(40.0))])
    u = np.cross(normal, [0.0, 1.0, 0.0])
    u /= np.linalg.norm(u)
    w = np.cross(normal, u)
    corners = np.array([c1 * 0.5 * u + c2 * 0.5 * w for c1, c2 in ((-1, -1), (1, -1), (1, 1), (-1, 1))])
    triangles = np.array([[0, 1, 2], [0, 2, 3]])
    camera = SimulatedDepthCamera(320, 240, 300.0, 300.0)
    volume = TsdfVolume((-0.4, -0.4, -0.4), (0.4, 0.4, 0.4), voxel_size=0.02)
    for i in range(10):
        eye = normal * 1.0 + u * 0.2 * np.cos(i) + w * 0.2 * np.sin(i)
        pose = look_at(eye, [0.0, 0.0, 0.0])
        volume.integrate(camera.render(corners, triangles, pose), camera.intrinsics, pose)
    vertices, _ = volume.surface()
    front = np.abs(vertices @ u) < 0.3
    front &= np.abs(vertices @ w) < 0.3
    offsets = vertices[front] @ normal
    front_side = offsets > -0.02  # the seen side (the band's far side is the other zero crossing)
    assert front_side.sum() > 100
    assert abs(np.median(offsets[front_side])) <= 0.001


def test_an_obstacle_that_leaves_is_carved():
    """A box seen for 20 frames, then gone: the frames that see through where it was clear it;
    counted here and bounded by max_weight (20: about half of it). The point watched lies 3 cm
    behind the face the camera sees (inside the band it can observe)."""
    bv, bt = ref.box((0.2, 0.2, 0.2))
    wall_v, wall_t = ref.box((0.05, 1.0, 1.0))
    wall_v = wall_v + [-0.45, 0.0, 0.0]
    with_box = merge_meshes([(bv, bt), (wall_v, wall_t)])
    camera = SimulatedDepthCamera(160, 120, 150.0, 150.0)
    world = MeshWorld(device="cpu", max_distance=0.5)
    fusion = DepthFusion(world, (-0.5, -0.5, -0.5), (0.5, 0.5, 0.5), voxel_size=0.02, max_weight=20.0)
    pose = look_at([1.2, 0.1, 0.2], [0.0, 0.0, 0.0])
    centre = torch.tensor([[0.07, 0.0, 0.0]])
    for _ in range(20):
        fusion.add_depth(camera.render(*with_box, pose), camera.intrinsics, pose)
    assert float(world.signed_distance(centre, 0, 0.5)[0][0]) < 0.0
    for frames in range(1, 41):
        fusion.add_depth(camera.render(wall_v, wall_t, pose), camera.intrinsics, pose)
        if float(world.signed_distance(centre, 0, 0.5)[0][0]) > 0.05:
            break
    assert frames <= 12, frames


@pytest.mark.parametrize("bad, message", [
    (np.zeros((0, 4), np.float32), "non-empty 2-D"),
    (np.zeros((4, 4, 2), np.float32), "2-D"),
])
def test_bad_frames_are_refused_and_change_nothing(bad, message):
    volume = TsdfVolume((-0.2, -0.2, -0.2), (0.2, 0.2, 0.2), voxel_size=0.02)
    before = volume.values.numpy().copy()
    with pytest.raises(ValueError, match=message):
        volume.integrate(bad, (100.0, 100.0, 2.0, 2.0), [0, 0, -1, 1, 0, 0, 0])
    with pytest.raises(ValueError, match="intrinsics"):
        volume.integrate(np.ones((4, 4), np.float32), (0.0, 100.0, 2.0, 2.0), [0, 0, -1, 1, 0, 0, 0])
    np.testing.assert_array_equal(volume.values.numpy(), before)


def test_nan_inf_and_negative_depths_are_no_returns():
    """A frame of NaN, inf, negative and zero depths fuses nothing; valid pixels beside them do."""
    volume = TsdfVolume((-0.2, -0.2, 0.3), (0.2, 0.2, 0.7), voxel_size=0.02)
    image = np.full((40, 40), 0.5, np.float32)
    image[:10] = np.nan
    image[10:20] = np.inf
    image[20:30] = -1.0
    image[30:, :20] = 0.0
    volume.integrate(image, (40.0, 40.0, 19.3, 19.3), [0, 0, 0, 1, 0, 0, 0])
    weights = volume.weights.numpy()
    assert weights.sum() > 0 and np.isfinite(volume.values.numpy()).all()
    # Only nodes projecting into the valid corner (rows 30-39, columns 20-39) were fused.
    i, j, k = np.nonzero(weights)
    p = np.asarray(volume.lower) + np.stack([i, j, k], 1) * volume.voxel_size
    u = np.round(40.0 * p[:, 0] / p[:, 2] + 19.3)
    v = np.round(40.0 * p[:, 1] / p[:, 2] + 19.3)
    assert (v >= 30).all() and (u >= 20).all()


def test_the_robot_is_not_its_own_obstacle(tmp_path):
    """A Franka Panda (rtb-data's collision meshes, posed by robot_sdf.robot.RobotModel) filling
    about a third of the image, above a table: with the robot's fitted spheres (config/
    panda_spheres.yaml, padded 4 cm: they leave parts of the collision meshes up to 5.5 cm
    outside them, 3.2 cm at the 99th percentile of the vertices) excluded from each frame, its
    own spheres cost nothing while the table is still perceived; without the exclusion they do
    cost (the premise)."""
    from robot_sdf.examples.panda import LOCKED_JOINTS, READY, panda_urdf
    from robot_sdf.robot import RobotModel, link_geometry

    robot = RobotModel(panda_urdf(tmp_path / "panda.urdf"), REPO_CONFIG / "panda_spheres.yaml",
                       locked_joints=LOCKED_JOINTS, dtype=torch.float64)
    q = torch.tensor(READY, dtype=torch.float64)
    names = [n for n in robot.chain.get_link_names() if link_geometry(robot.urdf, robot.urdf_path, n) is not None]
    frames = robot.link_transforms(q, names).numpy()
    parts = []
    for name, m in zip(names, frames):
        v, t = link_geometry(robot.urdf, robot.urdf_path, name)
        parts.append((v.astype(np.float64) @ m[:3, :3].T + m[:3, 3], t))
    table_v, table_t = ref.box((1.2, 1.2, 0.05))
    parts.append((table_v + [0.2, 0.0, -0.125], table_t))  # 10 cm below the base
    vertices, triangles = merge_meshes(parts)
    spheres = robot.spheres(q).numpy()
    camera = SimulatedDepthCamera(160, 120, 170.0, 170.0)
    pose = look_at([0.55, 0.2, 0.55], [0.05, 0.0, 0.25])
    depth = camera.render(vertices, triangles, pose, np.random.default_rng(3))
    robot_pixels = camera.render(*merge_meshes(parts[:-1]), pose) > 0
    assert 0.25 < robot_pixels.mean() < 0.5
    # A point of the table top that the camera sees: where the ray of a table pixel of the row
    # near the bottom meets the table's top plane (z = -0.1).
    fx, fy, cx, cy = camera.intrinsics
    row = camera.height - 6
    column = int(np.flatnonzero((depth[row] > 0) & ~robot_pixels[row])[0])
    ray = ref.quat_to_matrix(pose[3:]) @ np.array([(column - cx) / fx, (row - cy) / fy, 1.0])
    table_point = pose[:3] + ray * ((-0.1 - pose[2]) / ray[2])
    costs = {}
    for exclude in (False, True):
        world = MeshWorld(device="cpu", max_distance=0.5)
        fusion = DepthFusion(world, (-0.5, -0.7, -0.3), (0.9, 0.7, 1.2), voxel_size=0.02)
        for _ in range(5):
            fusion.add_depth(depth, camera.intrinsics, pose, spheres if exclude else None, 0.04)
        s = torch.tensor(spheres[None, None], dtype=torch.float32)
        costs[exclude] = world.sphere_cost(s, 0.02, 1.0).numpy().ravel()
        above = torch.tensor([table_point + [0.0, 0.0, 0.05]], dtype=torch.float32)
        assert 0.035 < float(world.signed_distance(above, 0, 0.5)[0][0]) < 0.065  # the table is perceived
    assert (costs[False] > 0).mean() > 0.3
    assert (costs[True] == 0).all(), costs[True][costs[True] > 0]


def test_a_lidar_scan_carves_and_marks_along_its_rays():
    """Returns of a ranging sensor (30 scans of up to 30,000 points from the views around the
    scene, noisy): near-surface error median <= 10 mm and p95 <= 30 mm (rays sample the field
    along their length, a little coarser than the projective camera update), deep inside
    >= 95 %, free 1-5 cm >= 90 %, nothing beyond 5 cm occupied. NaN rows are no returns."""
    parts = _scene()
    vertices, triangles = merge_meshes(parts)
    camera = SimulatedDepthCamera(320, 240, 300.0, 300.0)
    world = MeshWorld(device="cpu", max_distance=0.5)
    fusion = DepthFusion(world, LOWER, UPPER, voxel_size=0.02)
    rng = np.random.default_rng(0)
    for pose in _views():
        cloud = camera.points(camera.render(vertices, triangles, pose, rng), pose)
        cloud = cloud[rng.choice(len(cloud), min(30_000, len(cloud)), replace=False)]
        cloud[::100] = np.nan
        fusion.volume.integrate_points(cloud, pose[:3])
    fusion.update_world()
    points = np.random.default_rng(1).uniform([-0.5, -0.5, -0.15], [0.5, 0.5, 0.35], size=(20_000, 3))
    truth = _true_sd(points, parts)
    sd = world.signed_distance(torch.tensor(points, dtype=torch.float32), 0, 0.5)[0].numpy()
    error = np.abs(sd - truth)[np.abs(truth) < 0.05]
    assert np.median(error) <= 0.010 and np.percentile(error, 95) <= 0.030, (np.median(error),
                                                                             np.percentile(error, 95))
    assert (sd[truth <= -0.03] < 0).mean() >= 0.95
    assert (sd[(truth > 0.01) & (truth < 0.05)] > 0).mean() >= 0.90
    assert (sd[truth >= 0.05] <= 0).mean() <= 0.001


def _field_volume(field_of, unobserved: str = "free") -> TsdfVolume:
    """A TsdfVolume over (-0.2, 0.2)^3 at 2 cm whose every node was seen with the value
    field_of(points (N, 3) m) -> (N,), clamped to [-1, 1]: a field of known shape to mesh."""
    volume = TsdfVolume((-0.2,) * 3, (0.2,) * 3, voxel_size=0.02, unobserved=unobserved)
    axes = [volume.lower[a] + volume.voxel_size * np.arange(volume.shape[a]) for a in range(3)]
    nodes = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
    volume.values.assign(np.clip(field_of(nodes), -1.0, 1.0).reshape(volume.shape).astype(np.float32))
    volume.weights.assign(np.ones(volume.shape, np.float32))
    return volume


@pytest.mark.parametrize("unobserved", ["free", "occupied"])
def test_the_surface_is_closed_wound_outward_and_on_the_field_zero(unobserved):
    """What DepthFusion vouches for when it adds the surface as an oriented mesh: every edge
    used once in each direction (closed, consistently wound), winding number 1 inside and 0
    outside (outward; brute-force reference), vertices on the field's zero level, for two
    bodies (a sphere and a box) and the box's faces closing the surface (unobserved
    'occupied': the seen free space is a body of its own)."""
    truncation = 0.08
    sphere_centre, radius = np.array([-0.07, 0.0, 0.0]), 0.08
    box_centre, half = np.array([0.1, 0.0, 0.0]), np.array([0.05, 0.1, 0.06])

    def sphere(p):
        return np.linalg.norm(p - sphere_centre, axis=1) - radius

    def box(p):
        q = np.abs(p - box_centre) - half
        return np.linalg.norm(np.maximum(q, 0.0), axis=1) + np.minimum(q.max(axis=1), 0.0)

    volume = _field_volume(lambda p: np.minimum(sphere(p), box(p)) / truncation, unobserved)
    vertices, triangles = volume.surface()
    assert triangles.shape[0] > 500 and vertices.dtype == np.float32 and triangles.dtype == np.int32
    directed = np.stack([triangles, np.roll(triangles, -1, axis=1)], -1).reshape(-1, 2).astype(np.int64)
    keys = directed[:, 0] * len(vertices) + directed[:, 1]
    twins = directed[:, 1] * len(vertices) + directed[:, 0]
    assert np.unique(keys).size == keys.size and np.array_equal(np.sort(keys), np.sort(twins))
    # On the zero level: within the linear interpolation's error of the sphere's curve (2 cm cells);
    # apart from the box's faces, where 'occupied' closes the free space within the last cell.
    bodies = vertices[np.abs(vertices).max(axis=1) < 0.17].astype(np.float64)
    assert len(bodies) > 250
    assert np.abs(np.minimum(sphere(bodies), box(bodies))).max() < 2e-3
    rng = np.random.default_rng(3)
    inside = np.concatenate([sphere_centre + rng.uniform(-0.04, 0.04, (50, 3)),
                             box_centre + rng.uniform(-0.6, 0.6, (50, 3)) * half])
    outside = rng.uniform(-0.18, 0.18, (400, 3))
    outside = outside[np.minimum(sphere(outside), box(outside)) > 0.02]
    # 'free': the bodies are enclosed (winding 1 in them, 0 around); 'occupied': the seen free
    # space is, wound towards it (-1 there, 0 in the bodies, which its boundary surrounds too).
    offset = 0.0 if unobserved == "free" else -1.0
    np.testing.assert_allclose(ref.winding_number(inside, vertices, triangles), 1.0 + offset, atol=1e-6)
    np.testing.assert_allclose(ref.winding_number(outside, vertices, triangles), offset, atol=1e-6)
    # The world signs it as it is given (an oriented mesh): inside the bodies negative, around
    # them positive, for both (the winding repair turned the 'occupied' surface inside out).
    world = MeshWorld(device="cpu", max_distance=0.5)
    world.add_mesh("perceived", vertices, triangles, oriented=True)
    points = np.concatenate([inside, outside])
    sd = world.signed_distance(torch.tensor(points, dtype=torch.float32), 0, 0.5)[0].numpy()
    assert np.all(sd[:len(inside)] < 0.0) and np.all(sd[len(inside):] > 0.0)


def test_an_empty_field_has_no_surface():
    vertices, triangles = _field_volume(lambda p: np.ones(len(p))).surface()
    assert vertices.shape == (0, 3) and triangles.shape == (0, 3)
