"""robot_sdf.scene: YAML scenes with mesh files and primitives; bad entries are named."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.scene import apply_scene, load_scene

Q_Z90 = [np.cos(np.pi / 4), 0.0, 0.0, np.sin(np.pi / 4)]


def write_scene(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "scene.yaml"
    path.write_text(textwrap.dedent(body))
    return path


@pytest.fixture
def mesh_file(tmp_path) -> Path:
    """meshes/wall.stl next to the scene: a 0.05 x 1.0 x 0.5 box."""
    (tmp_path / "meshes").mkdir()
    path = tmp_path / "meshes" / "wall.stl"
    trimesh.Trimesh(*ref.box((0.05, 1.0, 0.5)), process=False).export(str(path))
    return path


def good_scene(tmp_path: Path) -> Path:
    return write_scene(tmp_path, f"""
        frame: world
        obstacles:
          - id: wall
            mesh: meshes/wall.stl
            scale: 2.0
            pose: [0.5, 0.0, 0.25, {Q_Z90[0]}, 0.0, 0.0, {Q_Z90[3]}]
            pose_topic: /wall_pose
          - id: crate
            primitive: {{type: box, size: [0.2, 0.3, 0.4]}}
            pose: [-0.4, 0.1, 0.0, 1.0, 0.0, 0.0, 0.0]
            env: 1
          - id: ball
            primitive: {{type: sphere, radius: 0.15}}
            enabled: false
          - id: post
            primitive: {{type: cylinder, radius: 0.05, length: 0.8}}
            pose: [0.0, -0.5, 0.4, 1, 0, 0, 0]
    """)


def test_load_scene(tmp_path, mesh_file):
    specs = load_scene(good_scene(tmp_path))
    by_id = {s.id: s for s in specs}
    assert [s.id for s in specs] == ["wall", "crate", "ball", "post"]
    wall = by_id["wall"]
    np.testing.assert_allclose(np.ptp(wall.vertices, axis=0), [0.1, 2.0, 1.0], atol=1e-6)  # scale 2
    np.testing.assert_allclose(wall.pose, [0.5, 0.0, 0.25, *Q_Z90], atol=1e-9)
    assert wall.pose_topic == "/wall_pose" and wall.env == 0 and wall.enabled
    crate = by_id["crate"]
    np.testing.assert_allclose(np.ptp(crate.vertices, axis=0), [0.2, 0.3, 0.4], atol=1e-6)
    assert crate.env == 1 and crate.pose_topic is None
    np.testing.assert_allclose(crate.pose, [-0.4, 0.1, 0.0, 1, 0, 0, 0])
    ball = by_id["ball"]
    np.testing.assert_allclose(np.linalg.norm(ball.vertices, axis=1), 0.15, atol=1e-6)
    assert ball.enabled is False or ball.enabled == 0
    np.testing.assert_allclose(ball.pose, ref.IDENTITY_POSE)
    post = by_id["post"]
    np.testing.assert_allclose([post.vertices[:, 2].min(), post.vertices[:, 2].max()], [-0.4, 0.4], atol=1e-6)
    assert np.linalg.norm(post.vertices[:, :2], axis=1).max() == pytest.approx(0.05, abs=1e-6)


def test_apply_scene_and_evaluate(tmp_path, mesh_file):
    specs = load_scene(good_scene(tmp_path))
    world = MeshWorld(device="cpu", num_envs=2, max_distance=0.5)
    apply_scene(world, specs)
    assert sorted(world.mesh_names(0)) == ["ball", "post", "wall"] and world.mesh_names(1) == ["crate"]
    assert world.revision == 4
    # env 0 against the reference built from the file contents as the test knows them
    wv, wt = ref.box((0.1, 2.0, 1.0))
    pv, pt = specs[3].vertices, specs[3].triangles
    env0 = [ref.RefMesh(wv, wt, np.array([0.5, 0.0, 0.25, *Q_Z90])),
            ref.RefMesh(pv, pt, np.array([0.0, -0.5, 0.4, 1, 0, 0, 0]))]
    rng = np.random.default_rng(5)
    pts = rng.uniform([-1.2, -1.2, -0.3], [1.2, 1.2, 0.9], size=(300, 3))
    ok = np.all([np.abs(m.signed_distance_world(pts)[0]) > 2e-3 for m in env0], axis=0)
    pts = pts[ok]
    s = np.concatenate([pts, np.full((len(pts), 1), 0.05)], axis=1)[None, None]
    c_ref, _ = ref.sphere_cost(s, [env0], 0.05, 1.0, 0.5)
    assert np.sum(c_ref > 0) > 10
    cost, _ = world.evaluate_sphere_cost(torch.tensor(s, dtype=torch.float32), 0.05)
    np.testing.assert_allclose(cost.numpy(), c_ref, atol=1e-4, rtol=1e-4)


def test_empty_scene(tmp_path):
    assert load_scene(write_scene(tmp_path, "frame: world\nobstacles: []\n")) == []


BAD_ENTRIES = {
    "missing id": ("primitive: {type: box, size: [1, 1, 1]}", "'id'"),
    "mesh and primitive": ("id: both\n    mesh: meshes/wall.stl\n    primitive: {type: sphere, radius: 1}", "both"),
    "no geometry": ("id: nothing", "nothing"),
    "unknown primitive": ("id: cone1\n    primitive: {type: cone, radius: 1}", "cone1"),
    "negative box size": ("id: negbox\n    primitive: {type: box, size: [1, -1, 1]}", "negbox"),
    "missing mesh file": ("id: ghost\n    mesh: meshes/nope.stl", "ghost"),
    "non-unit quaternion": ("id: badq\n    primitive: {type: sphere, radius: 1}\n    pose: [0, 0, 0, 2, 0, 0, 0]", "badq"),
    "short pose": ("id: shortpose\n    primitive: {type: sphere, radius: 1}\n    pose: [0, 0, 0]", "shortpose"),
    "negative env": ("id: negenv\n    primitive: {type: sphere, radius: 1}\n    env: -1", "negenv"),
    "unknown key": ("id: typo\n    primitive: {type: sphere, radius: 1}\n    colour: red", "typo"),
    "duplicate id": ("id: ok\n    primitive: {type: sphere, radius: 1}", "ok"),
    "bad scale": ("id: scaled\n    mesh: meshes/wall.stl\n    scale: 0", "scaled"),
    "unknown sign method": ("id: signed\n    primitive: {type: sphere, radius: 1}\n    sign_method: vote", "signed"),
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_bad_entries_named(tmp_path, mesh_file, case):
    body, name = BAD_ENTRIES[case]
    path = write_scene(tmp_path, "obstacles:\n  - id: ok\n    primitive: {type: box, size: [1, 1, 1]}\n  - "
                       + body + "\n")
    with pytest.raises(ValueError) as info:
        load_scene(path)
    # the entry is named by its id or by its position in the list (#1: the second obstacle)
    assert name in str(info.value) or "#1" in str(info.value), str(info.value)


def test_bad_scene_files(tmp_path):
    with pytest.raises(ValueError):
        load_scene(tmp_path / "missing.yaml")
    with pytest.raises(ValueError):
        load_scene(write_scene(tmp_path, "obstacles: [unclosed\n"))
    with pytest.raises(ValueError):
        load_scene(write_scene(tmp_path, "obstacles: {id: not_a_list}\n"))
    with pytest.raises(ValueError):
        load_scene(write_scene(tmp_path, "- just\n- a list\n"))


def test_apply_scene_rejects_bad_env_without_changes(tmp_path):
    path = write_scene(tmp_path, """
        obstacles:
          - id: a
            primitive: {type: box, size: [1, 1, 1]}
          - id: b
            primitive: {type: box, size: [1, 1, 1]}
            env: 3
    """)
    specs = load_scene(path)
    world = MeshWorld(device="cpu", num_envs=2)
    with pytest.raises(ValueError) as info:
        apply_scene(world, specs)
    assert "b" in str(info.value)
    assert world.revision == 0 and world.mesh_names(0) == [] and world.mesh_names(1) == []


# ---------------------------------------------------------------- regressions found in review
def test_apply_scene_with_a_bad_second_obstacle_changes_nothing(tmp_path):
    specs = load_scene(write_scene(tmp_path, """
        obstacles:
          - id: a
            primitive: {type: box, size: [0.2, 0.2, 0.2]}
          - id: b
            primitive: {type: box, size: [0.2, 0.2, 0.2]}
    """))
    specs[1].vertices = np.zeros_like(specs[1].vertices)  # all triangles degenerate
    world = MeshWorld(device="cpu")
    with pytest.raises(ValueError, match="'b'"):
        apply_scene(world, specs)
    assert world.revision == 0 and world.mesh_names() == []


@pytest.mark.parametrize("primitive", ["{type: sphere, radius: [1]}", "{type: sphere, subdivisions: null}",
                                       "{type: box, size: x}"])
def test_malformed_values_raise_value_error(tmp_path, primitive):
    path = write_scene(tmp_path, f"""
        obstacles:
          - id: odd
            primitive: {primitive}
    """)
    with pytest.raises(ValueError, match="odd"):
        load_scene(path)


def test_malformed_scale_raises_value_error(tmp_path, mesh_file):
    path = write_scene(tmp_path, """
        obstacles:
          - id: scaled
            mesh: meshes/wall.stl
            scale: [1, 2]
    """)
    with pytest.raises(ValueError, match="scaled"):
        load_scene(path)


def test_per_obstacle_sign_method(tmp_path, mesh_file):
    """An obstacle's sign_method overrides the world's; without one, the world's auto classifies
    (an open cup -> winding_number, whose inside the cup's centre is)."""
    cup = tmp_path / "meshes" / "cup.stl"
    trimesh.Trimesh(*ref.open_box((0.2, 0.2, 0.2)), process=False).export(str(cup))
    path = write_scene(tmp_path, """
        obstacles:
          - id: wall
            mesh: meshes/wall.stl
            sign_method: parity
          - id: cup
            mesh: meshes/cup.stl
            pose: [2.0, 0.0, 0.0, 1, 0, 0, 0]
    """)
    specs = load_scene(path)
    assert [s.sign_method for s in specs] == ["parity", None]
    world = MeshWorld(device="cpu", max_distance=0.01)
    apply_scene(world, specs)
    assert world.mesh_info("wall")["sign_method"] == "parity"
    assert world.mesh_info("cup")["sign_method"] == "winding_number"
    d, _ = world.signed_distance(torch.tensor([[2.0, 0.0, -0.02]]))
    want = ref.signed_distance(np.array([[0.0, 0.0, -0.02]]), *ref.open_box((0.2, 0.2, 0.2)))[0]
    assert d[0].item() == pytest.approx(want[0], abs=1e-6) and want[0] < -0.07
