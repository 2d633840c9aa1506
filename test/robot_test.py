"""robot_sdf.robot against an independent numpy forward kinematics and finite differences, and
fit_spheres against brute-force geometry (test/reference.py)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import reference as ref

URDF = """<?xml version="1.0"?>
<robot name="toy">
  <link name="base"/>
  <link name="upper">
    <collision><origin xyz="0 0 0.2" rpy="0 0 0"/><geometry><cylinder radius="0.05" length="0.4"/></geometry></collision>
  </link>
  <link name="slider">
    <collision><origin xyz="0.1 0 0" rpy="0 0 0.3"/><geometry><mesh filename="package://toy_pkg/meshes/block.stl" scale="2 1 1"/></geometry></collision>
  </link>
  <link name="tip"/>
  <joint name="j1" type="revolute">
    <parent link="base"/><child link="upper"/>
    <origin xyz="0 0 0.1" rpy="0 0 0"/><axis xyz="0 0 1"/>
    <limit lower="-2" upper="2" velocity="1.5" effort="1"/>
  </joint>
  <joint name="j2" type="revolute">
    <parent link="upper"/><child link="slider"/>
    <origin xyz="0 0 0.4" rpy="1.5707963 0 0"/><axis xyz="0 1 0"/>
    <limit lower="-1" upper="1" velocity="1" effort="1"/>
  </joint>
  <joint name="j3" type="prismatic">
    <parent link="slider"/><child link="tip"/>
    <origin xyz="0.2 0 0" rpy="0 0 0"/><axis xyz="1 0 0"/>
    <limit lower="0" upper="0.1" velocity="0.2" effort="1"/>
  </joint>
</robot>
"""

SPHERES = {"spheres": {"upper": [{"centre": [0.0, 0.01, 0.2], "radius": 0.05}],
                       "slider": [[0.1, 0.02, -0.03, 0.04], [0.15, 0.0, 0.0, 0.03]],
                       "tip": [{"centre": [0.01, 0.0, 0.0], "radius": 0.02}]}}


@pytest.fixture(scope="module")
def toy(tmp_path_factory) -> Path:
    """The toy URDF inside a package directory tree (package:// URIs resolve from its ancestors)."""
    import trimesh

    root = tmp_path_factory.mktemp("robots") / "toy_pkg"
    (root / "meshes").mkdir(parents=True)
    (root / "urdf").mkdir()
    v, t = ref.box((0.1, 0.06, 0.04))
    trimesh.Trimesh(v, t, process=False).export(root / "meshes" / "block.stl")
    path = root / "urdf" / "toy.urdf"
    path.write_text(URDF)
    return path


def _rot(axis, angle) -> np.ndarray:
    axis = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    return ref.quat_to_matrix(np.concatenate([[math.cos(angle / 2)], math.sin(angle / 2) * axis]))


def _hom(rot=np.eye(3), xyz=(0, 0, 0)) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3], m[:3, 3] = rot, xyz
    return m


def _rpy(r, p, y) -> np.ndarray:
    return _rot([0, 0, 1], y) @ _rot([0, 1, 0], p) @ _rot([1, 0, 0], r)


def _numpy_frames(q) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Independent FK of the toy URDF, written from its joint list: upper, slider, tip (4x4)."""
    t_upper = _hom(xyz=(0, 0, 0.1)) @ _hom(_rot([0, 0, 1], q[0]))
    t_slider = t_upper @ _hom(_rpy(1.5707963, 0, 0), (0, 0, 0.4)) @ _hom(_rot([0, 1, 0], q[1]))
    t_tip = t_slider @ _hom(xyz=(0.2, 0, 0)) @ _hom(xyz=(q[2], 0, 0))
    return t_upper, t_slider, t_tip


def _numpy_spheres(q, base_pose=None) -> np.ndarray:
    t_upper, t_slider, t_tip = _numpy_frames(q)
    out = []
    for frame, link in ((t_upper, "upper"), (t_slider, "slider"), (t_tip, "tip")):
        for e in SPHERES["spheres"][link]:
            c, r = (e["centre"], e["radius"]) if isinstance(e, dict) else (e[:3], e[3])
            out.append([*(frame[:3, :3] @ c + frame[:3, 3]), r])
    out = np.asarray(out)
    if base_pose is not None:
        out[:, :3] = ref.transform_points(base_pose, out[:, :3])
    return out


def test_spheres_match_independent_kinematics(toy):
    from robot_sdf.robot import RobotModel

    robot = RobotModel(toy, SPHERES, dtype=torch.float64)
    assert robot.dof == 3 and [j.name for j in robot.joints] == ["j1", "j2", "j3"]
    assert robot.link_of_sphere == ["upper", "slider", "slider", "tip"]
    np.testing.assert_allclose(robot.lower.numpy(), [-2, -1, 0])
    np.testing.assert_allclose(robot.velocity.numpy(), [1.5, 1, 0.2])
    rng = np.random.default_rng(3)
    qs = rng.uniform([-2, -1, 0], [2, 1, 0.1], size=(2, 5, 3))
    base = ref.random_pose(rng, 0.5)
    got = robot.spheres(torch.tensor(qs), torch.tensor(base)).numpy()
    assert got.shape == (2, 5, 4, 4)
    for i in range(2):
        for k in range(5):
            np.testing.assert_allclose(got[i, k], _numpy_spheres(qs[i, k], base), rtol=0, atol=1e-6)  # pytorch_kinematics parses rpy in float32
    np.testing.assert_allclose(robot.spheres(torch.tensor(qs[0, 0])).numpy(), _numpy_spheres(qs[0, 0]), rtol=0, atol=1e-6)  # pytorch_kinematics parses rpy in float32
    frames = robot.link_transforms(torch.tensor(qs), ["tip", "upper"]).numpy()
    assert frames.shape == (2, 5, 2, 4, 4)
    np.testing.assert_allclose(frames[1, 2, 0], _numpy_frames(qs[1, 2])[2], rtol=0, atol=1e-6)
    np.testing.assert_allclose(frames[1, 2, 1], _numpy_frames(qs[1, 2])[0], rtol=0, atol=1e-6)


def test_gradients_match_finite_differences(toy):
    from robot_sdf.robot import RobotModel

    robot = RobotModel(toy, SPHERES, dtype=torch.float64)
    rng = np.random.default_rng(4)
    q = torch.tensor(rng.uniform([-2, -1, 0], [2, 1, 0.1], size=(3, 3)), requires_grad=True)
    base = torch.tensor(ref.random_pose(rng, 0.5), requires_grad=True)
    w = torch.tensor(rng.normal(size=(3, 4, 3)))

    def f(q_, base_):
        return (robot.spheres(q_, base_)[..., :3] * w).sum()

    f(q, base).backward()
    eps = 1e-6
    for x, grad in ((q, q.grad), (base, base.grad)):
        fd = torch.zeros_like(x)
        flat = fd.reshape(-1)
        for i in range(flat.numel()):
            d = torch.zeros_like(x).reshape(-1)
            d[i] = eps
            d = d.reshape(x.shape)
            with torch.no_grad():
                plus = f(q + d, base) if x is q else f(q, base + d)
                minus = f(q - d, base) if x is q else f(q, base - d)
            flat[i] = (plus - minus) / (2 * eps)
        np.testing.assert_allclose(grad.numpy(), fd.numpy(), atol=1e-6)


def _mimic_urdf(tmp_path) -> Path:
    """The toy URDF with j3 a mimic of j1 (0.1 j1 + 0.01)."""
    mimic = tmp_path / "toy_pkg" / "mimic.urdf"
    mimic.parent.mkdir()
    mimic.write_text(URDF.replace('<limit lower="0" upper="0.1" velocity="0.2" effort="1"/>',
                                  '<limit lower="0" upper="0.1" velocity="0.2" effort="1"/>'
                                  '<mimic joint="j1" multiplier="0.1" offset="0.01"/>'))
    return mimic


def test_locked_joints_and_mimic(toy, tmp_path):
    from robot_sdf.robot import RobotModel

    robot = RobotModel(toy, SPHERES, dtype=torch.float64, locked_joints={"j3": 0.05})
    assert robot.dof == 2
    q = np.array([0.3, -0.4])
    np.testing.assert_allclose(robot.spheres(torch.tensor(q)).numpy(), _numpy_spheres([0.3, -0.4, 0.05]), rtol=0, atol=1e-6)  # pytorch_kinematics parses rpy in float32
    robot = RobotModel(_mimic_urdf(tmp_path), SPHERES, dtype=torch.float64)
    assert robot.dof == 2
    np.testing.assert_allclose(robot.spheres(torch.tensor(q)).numpy(), _numpy_spheres([0.3, -0.4, 0.04]), rtol=0, atol=1e-6)  # pytorch_kinematics parses rpy in float32


@pytest.mark.parametrize("bad, message", [
    ({"spheres": {"upper": [{"centre": [0, 0], "radius": 0.1}]}}, "three finite numbers"),
    ({"spheres": {"upper": [{"centre": [0, 0, 0], "radius": -0.1}]}}, "positive"),
    ({"spheres": {"upper": [{"centre": [0, 0, 0], "radius": 0.1, "colour": 1}]}}, "unknown keys"),
    ({"spheres": {"nolink": [[0, 0, 0, 0.1]]}}, "not links"),
    ({"links": {}}, "spheres:"),
])
def test_bad_sphere_files_are_named(toy, bad, message):
    from robot_sdf.robot import RobotModel

    with pytest.raises(ValueError, match=message):
        RobotModel(toy, bad)


def test_sphere_file_round_trip(tmp_path):
    from robot_sdf.robot import dump_spheres, load_spheres

    spheres = {"a": np.array([[0.1, -0.2, 0.3, 0.05]]), "b": np.zeros((0, 4))}
    path = tmp_path / "s.yaml"
    path.write_text(dump_spheres(spheres, "header line", {"fit": {"a": {"coverage_m": 0.01}}}))
    loaded = load_spheres(path)
    np.testing.assert_allclose(loaded["a"], spheres["a"])
    assert loaded["b"].shape == (0, 4)
    assert path.read_text().startswith("# header line")


def _link_meshes(toy):
    """The toy's collision geometry in the link frames, built here from the URDF's numbers."""
    import trimesh

    v, t = ref.box((0.1, 0.06, 0.04))
    v = v * [2.0, 1.0, 1.0]  # <mesh scale="2 1 1">
    v = v @ _rpy(0, 0, 0.3).T + [0.1, 0, 0]
    cyl = trimesh.creation.cylinder(radius=0.05, height=0.4, sections=32)
    return {"slider": (v, t), "upper": (np.asarray(cyl.vertices) + [0, 0, 0.2], np.asarray(cyl.faces))}


@pytest.mark.parametrize("mode, overshoot", [(["--tolerance", "0.015"], 0.008), (["--spheres", "3"], 0.004)])
def test_fit_spheres_against_brute_force(toy, tmp_path, mode, overshoot):
    from robot_sdf.robot import load_spheres
    from robot_sdf.tools.fit_spheres import main

    out = tmp_path / "spheres.yaml"
    assert main([str(toy), "--output", str(out), "--overshoot", str(overshoot), *mode]) == 0
    fitted = load_spheres(out)
    report = yaml.safe_load(out.read_text())["fit"]
    assert set(fitted) == {"upper", "slider"}
    rng = np.random.default_rng(7)
    for link, (v, t) in _link_meshes(toy).items():
        s = fitted[link]
        if mode[0] == "--spheres":
            assert 1 <= len(s) <= 3
        # Centres inside the mesh; each sphere reaches at most the allowance past the surface.
        sd, _, _ = ref.signed_distance(s[:, :3], v, t)
        assert np.all(sd < 0)
        assert np.all(s[:, 3] + sd <= overshoot + 1e-4)
        # Coverage: largest distance from the surface (independent samples) to the union of spheres.
        a, b, c = (v[t[:, k]] for k in range(3))
        area = 0.5 * np.linalg.norm(np.cross(b - a, c - a), axis=1)
        tri = rng.choice(len(t), 40_000, p=area / area.sum())
        u, w = rng.random((2, len(tri)))
        flip = u + w > 1
        u[flip], w[flip] = 1 - u[flip], 1 - w[flip]
        pts = a[tri] + u[:, None] * (b[tri] - a[tri]) + w[:, None] * (c[tri] - a[tri])
        gap = np.maximum((np.linalg.norm(pts[:, None] - s[None, :, :3], axis=2) - s[None, :, 3]).min(axis=1), 0)
        assert report[link]["coverage_m"] == pytest.approx(gap.max(), abs=1.5e-3)
        if mode[0] == "--tolerance":
            assert len(s) < 24 and gap.max() <= 0.015 + 1.5e-3
        # Overshoot: largest exact signed distance of points on the sphere surfaces.
        dirs = rng.normal(size=(400, 3))
        dirs /= np.linalg.norm(dirs, axis=1, keepdims=True)
        shell = (s[:, None, :3] + s[:, None, 3:] * dirs[None]).reshape(-1, 3)
        reach = max(ref.signed_distance(shell, v, t)[0].max(), 0.0)
        assert report[link]["overshoot_m"] == pytest.approx(reach, abs=1e-3)
        assert reach <= overshoot + 1e-4


def test_fit_spheres_rejects_bad_input(tmp_path, capsys):
    from robot_sdf.tools.fit_spheres import main

    assert main([str(tmp_path / "missing.urdf"), "--output", str(tmp_path / "s.yaml")]) == 2
    assert "URDF file not found" in capsys.readouterr().err
    assert not (tmp_path / "s.yaml").exists()


def test_self_collision_pairs_and_cost(toy):
    from robot_sdf.robot import RobotModel, self_collision_cost

    robot = RobotModel(toy, SPHERES, dtype=torch.float64)
    assert robot.movable_joints_between("upper", "slider") == 1
    assert robot.movable_joints_between("upper", "tip") == 2
    assert robot.movable_joints_between("tip", "tip") == 0
    # Only upper (sphere 0) and tip (sphere 3) are two moving joints apart; they never overlap
    # structurally, so that is the one pair.
    pairs = robot.self_collision_pairs(samples=200)
    assert pairs.tolist() == [[0, 3]]
    # The cost against the penetration formula of docs/design.md "Cost definition", in numpy, for touching and apart spheres.
    rng = np.random.default_rng(5)
    s = torch.tensor(rng.uniform(-0.05, 0.05, size=(6, 4, 4)), requires_grad=True)
    with torch.no_grad():
        s[..., 3] = torch.tensor(rng.uniform(0.01, 0.04, size=(6, 4)))
    all_pairs = torch.tensor([[0, 1], [0, 3], [1, 2]])
    got = self_collision_cost(s, all_pairs, 0.02)
    x = s.detach().numpy()
    want, grad = np.zeros(6), np.zeros((6, 4, 3))
    for a, b in all_pairs.tolist():
        diff = x[:, a, :3] - x[:, b, :3]
        dist = np.linalg.norm(diff, axis=1)
        cost, dcost = ref.cost_of_penetration(x[:, a, 3] + x[:, b, 3] + 0.02 - dist, 0.02)
        want += cost
        grad[:, a] -= dcost[:, None] * diff / dist[:, None]
        grad[:, b] += dcost[:, None] * diff / dist[:, None]
    assert want.max() > 0
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-12)
    got.sum().backward()
    np.testing.assert_allclose(s.grad[..., :3].numpy(), grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("scale", [(2.0, 1.0, 1.0), (-1.0, 1.0, 1.0), (-1.0, -2.0, 0.5), 0.5])
def test_urdf_mesh_scale_keeps_the_surface_outward(tmp_path, scale):
    import trimesh

    from robot_sdf.robot import load_scaled_mesh

    v, t = ref.box((0.1, 0.06, 0.04))
    v = v + [0.02, 0.0, 0.01]
    trimesh.Trimesh(v, t, process=False).export(tmp_path / "b.stl")
    got_v, got_t = load_scaled_mesh(tmp_path / "b.stl", scale)
    s = np.broadcast_to(np.asarray(scale, dtype=np.float64), (3,))
    # STL stores corners per triangle: compare the distinct corners.
    np.testing.assert_allclose(np.unique(np.round(got_v, 6), axis=0), np.unique(np.round(v * s, 6), axis=0), atol=1e-6)
    # Signed volume (divergence theorem) stays positive: triangles wound counter-clockwise outside.
    a, b, c = (got_v[got_t[:, k]].astype(np.float64) for k in range(3))
    volume = np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6
    assert volume == pytest.approx(abs(np.prod(s)) * 0.1 * 0.06 * 0.04, rel=1e-5)
    with pytest.raises(ValueError, match="non-zero"):
        load_scaled_mesh(tmp_path / "b.stl", (1.0, 0.0, 1.0))


def test_fit_spheres_check_measures_a_hand_edited_file(toy, tmp_path, capsys):
    from robot_sdf.robot import load_spheres
    from robot_sdf.tools.fit_spheres import main

    fitted = tmp_path / "spheres.yaml"
    assert main([str(toy), "--output", str(fitted), "--spheres", "3"]) == 0
    # Hand edit: drop the slider's first sphere.
    spheres = load_spheres(fitted)
    edited = tmp_path / "edited.yaml"
    edited.write_text(yaml.safe_dump({"spheres": {
        "upper": [{"centre": r[:3].tolist(), "radius": float(r[3])} for r in spheres["upper"]],
        "slider": [{"centre": r[:3].tolist(), "radius": float(r[3])} for r in spheres["slider"][1:]]}}))
    checked = tmp_path / "checked.yaml"
    png = tmp_path / "spheres.png"
    capsys.readouterr()
    assert main([str(toy), "--check", str(edited), "--output", str(checked), "--plot", str(png)]) == 0
    assert "checking" in capsys.readouterr().out
    assert png.read_bytes().startswith(b"\x89PNG") and png.stat().st_size > 10_000
    report = yaml.safe_load(checked.read_text())["fit"]
    rng = np.random.default_rng(11)
    for link, (v, t) in _link_meshes(toy).items():
        s = load_spheres(edited)[link]
        np.testing.assert_allclose(load_spheres(checked)[link], s, atol=1e-4)  # measured, not refitted
        pts = ref.closest_point_mesh(rng.uniform(v.min(0) - 0.05, v.max(0) + 0.05, size=(30_000, 3)), v, t)[0]
        gap = np.maximum((np.linalg.norm(pts[:, None] - s[None, :, :3], axis=2) - s[None, :, 3]).min(axis=1), 0)
        assert report[link]["coverage_m"] == pytest.approx(gap.max(), abs=1.5e-3)
    original = yaml.safe_load(fitted.read_text())["fit"]
    assert report["slider"]["coverage_m"] > original["slider"]["coverage_m"] + 1e-3
    # A file naming a link the URDF lacks is refused.
    edited.write_text("spheres:\n  nolink: [[0, 0, 0, 0.1]]\n")
    assert main([str(toy), "--check", str(edited)]) == 2
    assert "does not have" in capsys.readouterr().err


def test_forward_kinematics_builds_no_tensor_from_host_data(toy, tmp_path, monkeypatch):
    """RobotModel.spheres makes no tensor out of Python data per call (on CUDA each would be a
    host-to-device copy in the MPC's inner loop): torch.tensor and torch.as_tensor are refused
    after construction, mimic joints included; the spheres still match the numpy reference."""
    from robot_sdf.robot import RobotModel

    robot = RobotModel(_mimic_urdf(tmp_path), SPHERES, dtype=torch.float64)
    q = torch.tensor([0.3, -0.4])

    def refuse(*_args, **_kwargs):
        raise AssertionError("a tensor built from host data on the forward-kinematics path")

    monkeypatch.setattr(torch, "tensor", refuse)
    monkeypatch.setattr(torch, "as_tensor", refuse)
    spheres = robot.spheres(q)
    monkeypatch.undo()
    np.testing.assert_allclose(spheres.numpy(), _numpy_spheres([0.3, -0.4, 0.04]), rtol=0, atol=1e-6)
