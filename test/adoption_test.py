"""Meshes built outside robot_sdf, adopted explicitly (robot_sdf.adopt_meshes): each mesh is
classified as MeshWorld's auto classifies (patches oriented first); closed shells are evaluated
through a twin carrying robot_sdf's sign data (auto, normal), any other closed surface through a
winding-number twin under auto; the rest keeps its raw mesh. Judged against the numpy reference,
against the same tensors passed as they are (Warp's own query, searched to the full bound),
against MeshWorld, and on what is read and built when: only adopt_meshes reads meshes back."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp

import mesh_corpus
import reference as ref
from conftest import build_warp_env, supports_winding, warp_mesh
from robot_sdf import adopt_meshes, adoption, snapshot_lifetime
from robot_sdf.types import SignMethod, WorldSnapshot
from robot_sdf import launch
from robot_sdf.launch import warp_device
from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy

ETA = 0.02
MAX_DIST = 0.1


_SCALARS: dict = {}


def _scalars(device):
    """weight, eta, max_dist: the same tensors call after call (as a controller keeps them), so
    that calls go through the kept argument sets."""
    if device not in _SCALARS:
        _SCALARS[device] = (torch.ones(1, device=device), torch.full((1,), ETA, device=device),
                            torch.full((1,), MAX_DIST, device=device))
    return _SCALARS[device]


def _world(env) -> tuple:
    return env.mesh_idx, env.mesh_pose_inverse, env.mesh_enable, env.n_env_mesh


def _plain(spheres: np.ndarray, world: tuple, device: str, sign="auto", esdf=False):
    """(cost, gradient, Hessian-vector product with a fixed direction) of SdfMeshWarpPy; ``sign``
    a sign method, or the MeshWorld snapshot the world tensors come from."""
    snapshot = sign if isinstance(sign, WorldSnapshot) else None
    x = torch.tensor(spheres, dtype=torch.float32, device=device).requires_grad_(not esdf)
    b, h, n = x.shape[:3]
    one, eta, md = _scalars(device)
    outs = (torch.zeros((b, h, n), device=device), torch.zeros((b, h, n, 4), device=device),
            torch.zeros((b, h, n), dtype=torch.uint8, device=device))
    cost = SdfMeshWarpPy.apply(x, *outs, one, eta, *world, md, None, False, esdf,
                               "auto" if snapshot is not None else sign, None, snapshot)
    if esdf:
        return cost.detach().cpu().numpy(), None, None
    grad, = torch.autograd.grad(cost.sum(), x, create_graph=True)
    direction = torch.linspace(-1.0, 1.0, x.numel(), device=device).reshape(x.shape)
    hv, = torch.autograd.grad((grad * direction).sum(), x)
    return cost.detach().cpu().numpy(), grad.detach().cpu().numpy(), hv.cpu().numpy()


def _swept(traj: np.ndarray, world: tuple, device: str, sign="auto"):
    x = torch.tensor(traj, dtype=torch.float32, device=device).requires_grad_(True)
    b, h, n = x.shape[:3]
    one, eta, md = _scalars(device)
    outs = (torch.zeros((b, h, n), device=device), torch.zeros((b, h, n, 4), device=device),
            torch.zeros((b, h, n), dtype=torch.uint8, device=device))
    cost = SweptSdfMeshWarpPy.apply(x, *outs, one, eta, torch.full((1,), 0.1, device=device), *world, md, 4, False,
                                    None, False, sign)
    grad, = torch.autograd.grad(cost.sum(), x)
    return cost.detach().cpu().numpy(), grad.cpu().numpy()


def _adopted(env, sign="auto") -> tuple:
    """(the world tensors with the adopted ids, the per-slot sign codes, the AdoptedMeshes)."""
    adopted = adopt_meshes(env.mesh_idx, sign, mesh_enable=env.mesh_enable, n_env_mesh=env.n_env_mesh)
    return (adopted.mesh_idx, env.mesh_pose_inverse, env.mesh_enable, env.n_env_mesh), adopted.sign_methods, adopted


def _twin_mesh(adopted, mesh_id: int) -> wp.Mesh:
    return next(t.mesh for t in adopted.twins if t.twin_id == mesh_id)


_CLOSED_AFTER_ORIENTING = {
    "thin_ridge", "concave_vertex", "sliver_box", "degenerate_triangles", "icosphere_soup", "capsule", "arm_link",
    "arm_link_fine", "flipped_faces", "inside_out_box", "inside_out_icosphere", "inside_out_capsule",
    "inside_out_arm_link", "arm_link_flipped_5", "arm_link_flipped_10", "arm_link_flipped_30", "capsule_flipped_10",
    "mirrored_arm_link", "hollow_shell", "separate_bodies", "body_in_cavity"}


def test_closed_shell_verdicts_of_the_corpus():
    """The boundary of a solid (closed shells without self-intersections: one, separate bodies,
    a cavity, a body in a cavity) once its patches are oriented (inverted and partly flipped
    shells are), and nothing else: open, nested, touching, overlapping, self-intersecting and
    duplicated-face meshes are not; invalid triangle lists get no twin."""
    for case in mesh_corpus.CORPUS:
        v, t = case.build()
        twin = adoption.analyse(v.astype(np.float32), t.reshape(-1).astype(np.int32), "cpu")
        assert twin.closed_shell == (case.name in _CLOSED_AFTER_ORIENTING), case.name
    v, t = ref.box((0.2, 0.2, 0.2))
    assert adoption.analyse(v.astype(np.float32), np.array([0, 1], np.int32), "cpu") is None
    assert adoption.analyse(v.astype(np.float32), np.array([0, 1, 99], np.int32), "cpu") is None


def _mixed_world(device):
    """A closed capsule, a closed arm link, an open sheet (normal +z), an inverted box and two
    overlapping boxes in one mesh, raw."""
    rng = np.random.default_rng(3)
    cap_v, cap_t = mesh_corpus.capsule()
    arm_v, arm_t = mesh_corpus.arm_link()
    sheet_v, sheet_t = ref.sheet(0.6, 6)
    box_v, box_t = mesh_corpus.inside_out(ref.box((0.2, 0.15, 0.1)))
    meshes = [ref.RefMesh(cap_v, cap_t, np.concatenate([[0.0, 0.5, 0.0], ref.random_quaternion(rng)])),
              ref.RefMesh(arm_v, arm_t, np.concatenate([[0.6, 0.0, 0.1], ref.random_quaternion(rng)])),
              ref.RefMesh(sheet_v, sheet_t, np.array([0.0, -1.2, 0.0, 1.0, 0.0, 0.0, 0.0])),
              ref.RefMesh(box_v, box_t, np.concatenate([[-0.9, 0.0, 0.0], ref.random_quaternion(rng)])),
              ref.RefMesh(*mesh_corpus.overlapping_boxes(), np.concatenate([[0.0, 1.3, 0.4], ref.random_quaternion(rng)]))]
    return meshes, build_warp_env([meshes], device)


def _carries_sign_data(mesh_id: int, device: str) -> bool:
    return adoption.read_meshes(np.array([mesh_id], np.int64).astype(np.uint64),
                                warp_device(torch.device(device)))[0] is None


def _volume(vertices: np.ndarray, triangles: np.ndarray) -> float:
    a, b, c = (vertices[triangles[:, k]].astype(np.float64) for k in range(3))
    return float(np.einsum("ij,ij->i", a, np.cross(b, c)).sum() / 6.0)


def test_closed_surfaces_get_twins(device):
    """Each enabled slot's closed surface gets a twin on the same device, of the same points,
    carrying robot_sdf's sign data: the closed capsule and arm link as they are, the inverted box
    with its triangles turned outward (the same rows, reversed), the two overlapping boxes a
    winding-number twin (built only when a slot needs it), and so does the open sheet; disabled
    slots are not read."""
    meshes, env = _mixed_world(device)
    wdev = warp_device(torch.device(device))
    world, codes, adopted = _adopted(env)
    assert adopted.regimes.tolist() == [["solid", "solid", "winding", "solid", "winding"]]
    assert codes.cpu().numpy().tolist() == [[SignMethod.NORMAL, SignMethod.NORMAL, SignMethod.WINDING_NUMBER,
                                             SignMethod.NORMAL, SignMethod.WINDING_NUMBER]]
    assert codes.device == env.mesh_idx.device and adopted.mesh_idx.device == env.mesh_idx.device
    sheet = adoption.analyse(meshes[2].vertices.astype(np.float32), meshes[2].triangles.reshape(-1).astype(np.int32),
                             wdev)
    assert not sheet.closed_shell and not sheet.winding and sheet.mesh is None  # built when first used
    boxes = adoption.analyse(meshes[4].vertices.astype(np.float32), meshes[4].triangles.reshape(-1).astype(np.int32),
                             wdev)
    assert boxes.winding and boxes.mesh is None  # built when first used
    for slot, m in enumerate(meshes):
        twin_id = int(adopted.mesh_idx[0, slot])
        assert twin_id != int(env.mesh_idx[0, slot]) and _carries_sign_data(twin_id, device)
        twin = _twin_mesh(adopted, twin_id)
        assert str(twin.points.device) == str(wdev) and supports_winding(twin) == (slot in (2, 4))
        np.testing.assert_array_equal(twin.points.numpy(), m.vertices.astype(np.float32))
        triangles = twin.indices.numpy().reshape(-1, 3)
        if slot == 3:
            np.testing.assert_array_equal(triangles, m.triangles[:, ::-1])
            assert _volume(m.vertices, m.triangles) < 0 < _volume(m.vertices, triangles)
        else:
            np.testing.assert_array_equal(triangles, m.triangles)
    env.mesh_enable[0, 1] = 0
    _, _, again = _adopted(env)
    assert (again.regimes != "empty").tolist() == [[True, False, True, True, True]]
    assert int(again.mesh_idx[0, 1]) == int(env.mesh_idx[0, 1])  # not read: kept as given


def _shell_spheres(closed: list) -> tuple[np.ndarray, np.ndarray]:
    """Spheres around and inside the closed meshes: (1, 1, N, 4) and the reference sd (N,)."""
    rng = np.random.default_rng(4)
    centres = []
    for m in closed:
        local = mesh_corpus.sample_points(m.vertices, 300, seed=5)
        middle = 0.5 * (m.vertices.min(0) + m.vertices.max(0))
        # The box grown by 20 %, and by 150 % (out to free space beyond r + eta).
        local = np.concatenate([local, middle + 2.5 * (local - middle)])
        centres.append(ref.transform_points(m.pose, local))
    pts = np.concatenate(centres)
    sd = np.stack([m.signed_distance_world(pts)[0] for m in closed]).min(0)
    keep = np.abs(sd) > 2e-3
    pts, sd = pts[keep], sd[keep]
    assert np.sum(sd < -0.05) >= 20 and np.sum(sd > 0.06) >= 100  # deep, and beyond r + eta
    return np.concatenate([pts, rng.uniform(0.005, 0.03, (len(pts), 1))], 1).reshape(1, 1, -1, 4), sd


def test_closed_shells_give_the_reference(device):
    """Deep centres, centres near and far from the two closed shells: plain costs, gradients,
    esdf and swept costs of the reference, for every sign method the shells' short paths serve.
    Through the twins (auto, normal) the sign is exact on medial axes too, where the full search
    of the raw meshes (Warp's normal sign without pseudo-normals) may call deep centres outside;
    off them, the twins give the full search's values. winding_number keeps the raw meshes: bit
    for bit the results of the tensors passed as they are."""
    meshes, env = _mixed_world(device)
    closed = meshes[:2]
    spheres, sd = _shell_spheres(closed)
    c_ref, g_ref = ref.sphere_cost(spheres, [closed], ETA, 1.0, MAX_DIST)
    e_ref, _ = ref.sphere_cost(spheres, [closed], ETA, 1.0, MAX_DIST, compute_esdf=True)
    traj = spheres.reshape(1, -1, 1, 4)
    s_ref, _ = ref.swept_sphere_cost(traj, [closed], ETA, 1.0, MAX_DIST, 4)
    # Off medial axes: there near-tied closest triangles differ in direction.
    mask = ref.world_gradient_ambiguity(spheres[..., :3].reshape(-1, 3), closed, 2e-6) <= 1e-4
    assert np.sum(mask & (c_ref.reshape(-1) > 0)) >= 300 and np.sum(mask & (sd < -0.05)) >= 20
    assert np.sum(~mask & (sd < -0.05)) >= 10  # deep centres on a medial axis (the capsule's)
    raw = _world(env)
    for sign in ("auto", "normal", "winding_number"):
        twins = sign != "winding_number"
        world, codes, adopted = _adopted(env, sign)
        assert (adopted.regimes[0, :2] == "solid").all() == twins
        cost, grad, hv = _plain(spheres, world, device, codes)
        everywhere = np.ones_like(mask) if twins else mask
        np.testing.assert_allclose(cost.reshape(-1)[everywhere], c_ref.reshape(-1)[everywhere], atol=1e-4,
                                   rtol=1e-4, err_msg=sign)
        np.testing.assert_allclose(grad[..., :3].reshape(-1, 3)[mask], g_ref.reshape(-1, 3)[mask], atol=3e-4,
                                   err_msg=sign)
        assert np.sum(cost > 0) >= 100
        esdf, _, _ = _plain(spheres, world, device, codes, esdf=True)
        np.testing.assert_allclose(esdf.reshape(-1)[everywhere], e_ref.reshape(-1)[everywhere], atol=1e-4,
                                   err_msg=sign)
        swept, swept_grad = _swept(traj, world, device, codes)
        np.testing.assert_allclose(swept.reshape(-1), s_ref.reshape(-1), atol=2e-4, rtol=1e-4, err_msg=sign)
        cost_f, grad_f, hv_f = _plain(spheres, raw, device, sign)
        esdf_f, _, _ = _plain(spheres, raw, device, sign, esdf=True)
        swept_f, swept_grad_f = _swept(traj, raw, device, sign)
        if not twins:
            for got, want in ((cost, cost_f), (grad, grad_f), (hv, hv_f), (esdf, esdf_f), (swept, swept_f),
                              (swept_grad, swept_grad_f)):
                np.testing.assert_array_equal(got, want, err_msg=sign)
            continue
        # The twin has the raw mesh's points and triangles: off medial axes the same closest
        # triangles, distances and directions (it differs from the raw mesh in the sign test and,
        # for the swept cost, in sharing one traversal between a step's samples).
        np.testing.assert_allclose(cost.reshape(-1)[mask], cost_f.reshape(-1)[mask], atol=1e-6, err_msg=sign)
        np.testing.assert_allclose(grad.reshape(-1, 4)[mask], grad_f.reshape(-1, 4)[mask], atol=1e-5, err_msg=sign)
        np.testing.assert_allclose(hv.reshape(-1, 4)[mask], hv_f.reshape(-1, 4)[mask], atol=1e-4, rtol=1e-4,
                                   err_msg=sign)
        np.testing.assert_allclose(esdf.reshape(-1)[mask], esdf_f.reshape(-1)[mask], atol=1e-6, err_msg=sign)


def _auto_world(device):
    """Closed surfaces that are no single closed shell as given: two overlapping boxes in one mesh,
    nested boxes, two touching boxes, an inside-out box; then two open surfaces: a cup and a sheet
    (normal +z); raw, posed 0.9 m apart. Returns (the meshes, the closed ones as auto evaluates
    them: the inside-out box turned outward, the world)."""
    rng = np.random.default_rng(12)
    given = [mesh_corpus.overlapping_boxes(), mesh_corpus.nested_shells(), mesh_corpus.touching_boxes(),
             mesh_corpus.inside_out(ref.box((0.25, 0.15, 0.1))), mesh_corpus.open_cup(), ref.sheet(0.5, 4)]
    places = ([0.0, 0.0, 0.0], [0.9, 0.0, 0.0], [0.0, 0.9, 0.0], [0.9, 0.9, 0.0], [1.8, 0.0, 0.0], [1.8, 0.9, 0.0])
    meshes = [ref.RefMesh(v, t, np.concatenate([p, ref.random_quaternion(rng)])) for (v, t), p in zip(given, places)]
    oriented = meshes[:3] + [ref.RefMesh(meshes[3].vertices, meshes[3].triangles[:, ::-1], meshes[3].pose)]
    return meshes, oriented, build_warp_env([meshes], device)


def _spheres_around(meshes: list, count: int, seed: int) -> np.ndarray:
    """Spheres in each mesh's box grown by 20 % and by 80 %: (1, 1, N, 4)."""
    rng = np.random.default_rng(seed)
    pts = []
    for i, m in enumerate(meshes):
        local = mesh_corpus.sample_points(m.vertices, count, seed=seed + i)
        middle = 0.5 * (m.vertices.min(0) + m.vertices.max(0))
        pts.append(ref.transform_points(m.pose, np.concatenate([local, middle + 1.5 * (local - middle)])))
    pts = np.concatenate(pts)
    return np.concatenate([pts, rng.uniform(0.005, 0.03, (len(pts), 1))], 1).reshape(1, 1, -1, 4)


def test_auto_evaluates_closed_surfaces_as_meshworld_does(device):
    """Under auto a closed surface that is no single closed shell is a winding-number mesh, as
    MeshWorld's auto makes it, through its twin: overlapping, nested and touching bodies and an
    inside-out box (turned outward; the full search's normal sign calls its inside outside) give
    the reference's costs, gradients, esdf and swept costs, and MeshWorld's values for the same
    meshes and poses. Open surfaces get winding-number twins too: MeshWorld's values, where the
    tensors passed as they are (Warp's normal sign) call their back sides inside within the
    search."""
    from robot_sdf import MeshWorld

    meshes, oriented, env = _auto_world(device)
    world, codes, adopted = _adopted(env)
    assert adopted.regimes.tolist() == [["winding"] * 3 + ["solid"] + ["winding"] * 2]  # the box turned outward
    raw = _world(env)
    spheres = _spheres_around(meshes[:4], 150, 20)
    pts = spheres[..., :3].reshape(-1, 3)
    sd = np.stack([m.signed_distance_world(pts)[0] for m in oriented]).min(0)
    keep = np.abs(sd) > 2e-3  # off the surface: float32 may round either way there
    spheres = spheres[:, :, keep]
    pts, sd = pts[keep], sd[keep]
    mask = ref.world_gradient_ambiguity(pts, oriented, 2e-6) <= 1e-4
    c_ref, g_ref = ref.sphere_cost(spheres, [oriented], ETA, 1.0, MAX_DIST)
    e_ref, _ = ref.sphere_cost(spheres, [oriented], ETA, 1.0, MAX_DIST, compute_esdf=True)
    assert np.sum(sd < -0.02) >= 50 and np.sum(mask & (c_ref.reshape(-1) > 0)) >= 300
    cost, grad, _ = _plain(spheres, world, device, codes)
    esdf, _, _ = _plain(spheres, world, device, codes, esdf=True)
    np.testing.assert_allclose(cost.reshape(-1), c_ref.reshape(-1), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(grad[..., :3].reshape(-1, 3)[mask], g_ref.reshape(-1, 3)[mask], atol=3e-4)
    np.testing.assert_allclose(esdf.reshape(-1), e_ref.reshape(-1), atol=1e-4)
    traj = spheres.reshape(1, -1, 1, 4)[:, :600]
    s_ref, _ = ref.swept_sphere_cost(traj, [oriented], ETA, 1.0, MAX_DIST, 4)
    swept, _ = _swept(traj, world, device, codes)
    np.testing.assert_allclose(swept.reshape(-1), s_ref.reshape(-1), atol=2e-4, rtol=1e-4)
    open_spheres = _spheres_around(meshes[4:], 150, 30)
    open_cost, open_grad, _ = _plain(open_spheres, world, device, codes)
    esdf_f, _, _ = _plain(spheres, raw, device, esdf=True)
    open_cost_f, open_grad_f, _ = _plain(open_spheres, raw, device)
    assert np.sum(np.abs(esdf_f - esdf) > 1e-3) >= 20  # the full search is wrong in the inside-out box
    assert np.sum(open_cost > 0) >= 50
    assert np.sum(np.abs(open_cost_f - open_cost) > 1e-3) >= 20  # back sides inside under Warp's sign
    mw = MeshWorld(device=device, max_distance=MAX_DIST)
    for i, m in enumerate(meshes):
        mw.add_mesh(f"m{i}", m.vertices, m.triangles, pose=m.pose)
    with mw.reading() as snap:
        mw_world = (snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh)
        mw_esdf, _, _ = _plain(spheres, mw_world, device, snap, esdf=True)
        mw_open, mw_open_grad, _ = _plain(open_spheres, mw_world, device, snap)
    np.testing.assert_allclose(esdf, mw_esdf, atol=2e-5)
    np.testing.assert_allclose(open_cost, mw_open, atol=2e-5)
    np.testing.assert_allclose(open_grad, mw_open_grad, atol=2e-4)


def _solid_of_shells():
    """A 1 m box with a 0.8 m cavity (inward-wound) holding a loose 0.2 m box: three shells, one
    solid; the cavity is outside."""
    inner_v, inner_t = ref.box((0.8, 0.8, 0.8))
    loose_v, loose_t = ref.box((0.2, 0.2, 0.2))
    outer_v, outer_t = ref.box((1.0, 1.0, 1.0))
    v = np.concatenate([outer_v, inner_v, loose_v + np.array([0.15, 0.0, 0.0])])
    t = np.concatenate([outer_t, inner_t[:, ::-1] + len(outer_v), loose_t + len(outer_v) + len(inner_v)])
    return v, t


def test_solids_of_several_shells_take_the_closed_shell_paths(device):
    """Separate bodies in one mesh, and a hollow box with a loose body in its cavity, are solids
    bounded by several shells: their twins are closed shells (pseudo-normal sign, rays for deep
    and far points, shared swept traversal), as MeshWorld flags them (auto: winding_number), and
    give the reference's costs, gradients, esdf and swept costs, with centres in the cavity
    farther from every wall than the search (outside), deep in the loose body and the walls,
    and between the bodies."""
    from robot_sdf import MeshWorld

    rng = np.random.default_rng(21)
    given = [mesh_corpus.separate_bodies(), _solid_of_shells()]
    meshes = [ref.RefMesh(v, t, np.concatenate([p, ref.random_quaternion(rng)]))
              for (v, t), p in zip(given, ([0.0, 0.0, 0.0], [1.5, 0.0, 0.0]))]
    env = build_warp_env([meshes], device)
    assert _adopted(env)[2].regimes.tolist() == [["solid", "solid"]]
    cavity = rng.uniform(-0.38, 0.38, (400, 3))
    cavity = cavity[np.abs(cavity - [0.15, 0.0, 0.0]).max(1) > 0.12]
    loose = rng.uniform(-0.045, 0.045, (100, 3)) + [0.15, 0.0, 0.0]
    spheres = _spheres_around(meshes, 200, 40)
    centres = np.concatenate([spheres[..., :3].reshape(-1, 3), ref.transform_points(meshes[1].pose, cavity),
                              ref.transform_points(meshes[1].pose, loose)])
    radii = rng.uniform(0.005, 0.03, (len(centres), 1))
    sd = np.stack([m.signed_distance_world(centres)[0] for m in meshes]).min(0)
    in_cavity = np.zeros(len(centres), bool)
    in_cavity[len(centres) - len(cavity) - len(loose):len(centres) - len(loose)] = True
    keep = np.abs(sd) > 2e-3
    spheres = np.concatenate([centres, radii], 1)[keep].reshape(1, 1, -1, 4)
    pts, sd, in_cavity = centres[keep], sd[keep], in_cavity[keep]
    # beyond every search in the cavity (max_dist + r + eta), and deep
    assert np.sum(in_cavity & (sd > MAX_DIST + 0.05)) >= 20 and np.sum(sd < -0.05) >= 20
    mask = ref.world_gradient_ambiguity(pts, meshes, 2e-6) <= 1e-4
    c_ref, g_ref = ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST)
    e_ref, _ = ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST, compute_esdf=True)
    traj = spheres.reshape(1, -1, 1, 4)[:, :800]
    s_ref, _ = ref.swept_sphere_cost(traj, [meshes], ETA, 1.0, MAX_DIST, 4)
    assert np.sum(mask & (c_ref.reshape(-1) > 0)) >= 200
    for sign in ("auto", "normal"):
        world, codes, _ = _adopted(env, sign)
        cost, grad, _ = _plain(spheres, world, device, codes)
        esdf, _, _ = _plain(spheres, world, device, codes, esdf=True)
        np.testing.assert_allclose(cost.reshape(-1), c_ref.reshape(-1), atol=1e-4, rtol=1e-4, err_msg=sign)
        np.testing.assert_allclose(grad[..., :3].reshape(-1, 3)[mask], g_ref.reshape(-1, 3)[mask], atol=3e-4,
                                   err_msg=sign)
        np.testing.assert_allclose(esdf.reshape(-1), e_ref.reshape(-1), atol=1e-4, err_msg=sign)
        swept, _ = _swept(traj, world, device, codes)
        np.testing.assert_allclose(swept.reshape(-1), s_ref.reshape(-1), atol=2e-4, rtol=1e-4, err_msg=sign)
    mw = MeshWorld(device=device, max_distance=MAX_DIST)
    for i, m in enumerate(meshes):
        mw.add_mesh(f"m{i}", m.vertices, m.triangles, pose=m.pose)
        info = mw.mesh_info(f"m{i}")
        # auto chooses winding_number for several shells (docs/design.md); the kernels decide
        # its sign by the pseudo-normal, equal for a solid's boundary
        assert info["sign_method"] == "winding_number" and info["auto"]["solid"] and info["closed_shell"], info
    with mw.reading() as snap:
        mw_esdf, _, _ = _plain(spheres, (snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh),
                               device, snap, esdf=True)
    np.testing.assert_allclose(mw_esdf.reshape(-1), e_ref.reshape(-1), atol=1e-4)


def test_dropped_twins_wait_for_release(device, monkeypatch):
    """The CUDA rule (followed on the CPU here): a twin whose last reference goes is not freed
    until release_retired (a device synchronisation); its mesh stays readable until then."""
    import gc

    monkeypatch.setattr(adoption, "DEFER_FREE_ON_CPU", True)
    box_v, box_t = ref.box((0.3, 0.2, 0.1))
    wdev = warp_device(torch.device(device))
    two_v, two_t = mesh_corpus.overlapping_boxes()
    shell = adoption.analyse(box_v.astype(np.float32), box_t.reshape(-1).astype(np.int32), wdev)
    two = adoption.analyse(two_v.astype(np.float32), two_t.reshape(-1).astype(np.int32), wdev)
    unused = adoption.analyse(two_v.astype(np.float32) * 2, two_t.reshape(-1).astype(np.int32), wdev)
    twin_ids = {shell.twin_id, two.twin_id}
    adoption.release_retired()
    del shell, two, unused  # the unused one never built a twin: nothing to retire
    gc.collect()
    # The wp.Mesh objects themselves are held (Warp frees one only when that object goes).
    assert len(adoption._retired) == 2 and {entry[1].id for entry in adoption._retired} == twin_ids
    assert adoption.release_retired() == 2 and not adoption._retired


def test_per_slot_methods_choose_twin_or_raw_per_slot(device):
    """A per-slot sign tensor: the capsule under auto goes through its twin (exact on its axis),
    the arm link under winding_number keeps its raw mesh (its own winding number), the open
    sheet (normal) and the inverted box (default) keep Warp's signs, the overlapping boxes under
    auto go through their winding-number twin; each slot's costs are the reference's."""
    meshes, env = _mixed_world(device)
    closed = meshes[:2]
    spheres, _ = _shell_spheres(closed)
    pts = spheres[..., :3].reshape(-1, 3)
    c_ref, g_ref = ref.sphere_cost(spheres, [closed], ETA, 1.0, MAX_DIST)
    requested = torch.tensor([[SignMethod.AUTO, SignMethod.WINDING_NUMBER, SignMethod.NORMAL, SignMethod.DEFAULT,
                               SignMethod.AUTO]], dtype=torch.uint8, device=device)
    world, codes, adopted = _adopted(env, requested)
    cost, grad, _ = _plain(spheres, world, device, codes)
    mask = ref.world_gradient_ambiguity(pts, closed, 2e-6) <= 1e-4
    capsule_axis = ~mask & (closed[0].signed_distance_world(pts)[0] < closed[1].signed_distance_world(pts)[0])
    assert capsule_axis.sum() >= 10
    checked = mask | capsule_axis
    np.testing.assert_allclose(cost.reshape(-1)[checked], c_ref.reshape(-1)[checked], atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(grad[..., :3].reshape(-1, 3)[mask], g_ref.reshape(-1, 3)[mask], atol=3e-4)
    substituted = adopted.mesh_idx.cpu().numpy()[0]
    given = env.mesh_idx.cpu().numpy()[0]
    assert substituted[0] != given[0] and substituted[4] != given[4]
    assert supports_winding(_twin_mesh(adopted, int(substituted[4])))
    # winding_number, normal on an open sheet, default: raw
    assert substituted[1:4].tolist() == given[1:4].tolist()
    assert adopted.regimes.tolist() == [["solid", "passthrough", "passthrough", "passthrough", "winding"]]
    assert codes.cpu().numpy()[0].tolist() == [int(SignMethod.NORMAL), int(SignMethod.WINDING_NUMBER),
                                               int(SignMethod.NORMAL), int(SignMethod.DEFAULT),
                                               int(SignMethod.WINDING_NUMBER)]


def test_concurrent_adoptions_agree(device):
    """adopt_meshes from several threads at once on the same world: each gets twins of its own
    and the same results."""
    import threading

    meshes, env = _mixed_world(device)
    spheres, _ = _shell_spheres(meshes[:2])
    results, errors = [None] * 4, []
    start = threading.Barrier(4)

    def run(i):
        try:
            start.wait(timeout=60)
            world, codes, adopted = _adopted(env)
            results[i] = (_plain(spheres, world, device, codes)[0], adopted)
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and all(r is not None for r in results)
    for r in results[1:]:
        np.testing.assert_array_equal(r[0], results[0][0])
    assert len({int(r[1].mesh_idx[0, 0]) for r in results}) == 4


def test_twins_live_as_long_as_the_adopted_meshes(device):
    """The twins stay alive while the AdoptedMeshes does (results do not change across
    collections) and go with it once the launch caches let go."""
    import gc
    import weakref

    from robot_sdf import world_args

    meshes, env = _mixed_world(device)
    # Few spheres: on the CPU one launch in this thread (worker threads keep their own records).
    spheres = _shell_spheres(meshes[:2])[0][:, :, ::20]
    world, codes, adopted = _adopted(env)
    first, _, _ = _plain(spheres, world, device, codes)
    assert np.sum(first > 0) >= 5
    shells = [weakref.ref(t.mesh) for t in adopted.twins]
    assert len(shells) == 5
    for _ in range(3):
        gc.collect()
        assert all(s() is not None for s in shells)
        again, _, _ = _plain(spheres, world, device, codes)
        np.testing.assert_array_equal(again, first)
    del world, codes, adopted
    world_args._last = None  # (not monkeypatch: it would keep the old value to restore)
    world_args._constant_sets.clear()
    world_args._checks.clear()
    launch._launches.by_kernel.clear()  # this thread's recorded launches hold their last arguments
    gc.collect()
    # On CUDA dropped twins wait until the kernels queued before have run (adoption.retire).
    if device != "cpu":
        torch.cuda.synchronize()
        snapshot_lifetime.graveyard.purge()
    adoption.release_retired()
    gc.collect()
    assert all(s() is None for s in shells)


def test_slots_filled_later_are_adopted_by_adopting_again(device):
    """A world whose slots are all off at adoption, filled in place later (as cuRobo's cache is):
    nothing was read for them; adopting again finds the closed shells (exact sign on the
    capsule's axis)."""
    meshes, env = _mixed_world(device)
    spheres, _ = _shell_spheres(meshes[:2])
    e_ref, _ = ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST, compute_esdf=True)
    enabled = env.mesh_enable.clone()
    env.mesh_enable.zero_()
    world, codes, adopted = _adopted(env, "normal")
    assert (adopted.regimes == "empty").all() and not adopted.twins
    empty, _, _ = _plain(spheres, world, device, codes, esdf=True)
    assert np.all(empty == -MAX_DIST)
    env.mesh_enable.copy_(enabled)
    world, codes, adopted = _adopted(env, "normal")
    esdf, _, _ = _plain(spheres, world, device, codes, esdf=True)
    np.testing.assert_allclose(esdf.reshape(-1), e_ref.reshape(-1), atol=1e-4)


def test_tensors_not_adopted_are_passed_as_they_are(device, monkeypatch):
    """Without adoption the kernels get the caller's own mesh_idx memory, no twins and no flags,
    and nothing is read back through the ids, call after call: Warp's own query on the raw
    meshes (the inside-out box's inside reads outside, as Warp's normal sign says)."""
    from robot_sdf import world_args

    meshes, env = _mixed_world(device)
    spheres, _ = _shell_spheres(meshes[:2])
    reads = []
    read = adoption.read_meshes
    monkeypatch.setattr(adoption, "read_meshes", lambda ids, dev: reads.append(len(ids)) or read(ids, dev))
    args = world_args.constant_arguments(_scalars(device), *_world(env), "auto", torch.device(device))
    assert args[3].mesh_idx.data == env.mesh_idx.data_ptr() and args[3].sign_method == int(SignMethod.AUTO)
    for _ in range(2):
        _plain(spheres, _world(env), device, esdf=True)
        _swept(spheres.reshape(1, -1, 1, 4)[:, :100], _world(env), device)
    assert reads == []
    _adopted(env)
    assert reads == [5]


def test_open_sheet_keeps_its_back_side_within_the_search(device):
    """An open sheet is no closed shell: passed as it is, or adopted (its raw mesh kept), Warp's
    normal sign calls its back side inside wherever the search reaches (max_dist + r + eta), as
    before; beyond it, outside."""
    meshes, env = _mixed_world(device)
    sheet = meshes[2]
    depth = np.array([0.005, 0.03, 0.06, 0.09, 0.12, 0.2])
    radius = 0.01
    pts = sheet.pose[:3] + np.stack([np.full_like(depth, 0.03), np.full_like(depth, -0.02), -depth], 1)
    spheres = np.concatenate([pts, np.full((len(depth), 1), radius)], 1).reshape(1, 1, -1, 4)
    world, codes, _ = _adopted(env, "normal")
    for tensors, sign in ((_world(env), "normal"), (world, codes)):
        cost, grad, _ = _plain(spheres, tensors, device, sign)
        within = depth < MAX_DIST + radius + ETA
        expected, _ = ref.cost_of_penetration(np.where(within, radius + ETA + depth, 0.0), ETA)
        np.testing.assert_allclose(cost.reshape(-1), expected, atol=1e-5)
        assert np.all(cost.reshape(-1)[within] > 0.02)
        # Pushed up, out of the sheet's back side.
        np.testing.assert_allclose(grad.reshape(-1, 4)[within, :3],
                                   np.tile([0.0, 0.0, -1.0], (int(within.sum()), 1))
                                   * ref.cost_of_penetration(radius + ETA + depth[within], ETA)[1][:, None], atol=1e-5)


def test_a_slot_given_another_mesh_is_seen_at_once_raw_and_after_adopting_again(device):
    """A slot written in place with another mesh: the raw tensors evaluate the new mesh at the
    next call (nothing cached per id); adopted tensors keep the twin of the mesh read until
    adopt_meshes is called again."""
    box_v, box_t = ref.box((0.2, 0.2, 0.2))
    sheet_v, sheet_t = ref.sheet(0.4, 2)
    sheet_v = sheet_v + np.array([0.0, 0.0, -0.1])  # the box's bottom face, open, normal +z
    env = build_warp_env([[ref.RefMesh(box_v, box_t)]], device)
    # 5 cm below the box's bottom face (z = -0.1), r = 1 cm: outside, no cost; on the back side
    # of a sheet in that face's plane, within the search: inside under normal (Warp's sign).
    spheres = np.array([[[[0.0, 0.0, -0.15, 0.01]]]])
    world, codes, adopted = _adopted(env, "normal")
    assert adopted.regimes.tolist() == [["solid"]]
    for tensors, sign in ((_world(env), "normal"), (world, codes)):
        cost, _, _ = _plain(spheres, tensors, device, sign)
        assert cost.item() == 0.0
    sheet = warp_mesh(sheet_v, sheet_t, device)
    env.mesh_idx[0, 0] = int(np.uint64(sheet.id).astype(np.int64))
    expected, _ = ref.cost_of_penetration(0.01 + ETA + 0.05, ETA)
    cost, _, _ = _plain(spheres, _world(env), device, "normal")
    np.testing.assert_allclose(cost.item(), expected, atol=1e-5)
    cost, _, _ = _plain(spheres, world, device, codes)
    assert cost.item() == 0.0  # still the box's twin
    world, codes, adopted = _adopted(env, "normal")
    assert adopted.regimes.tolist() == [["passthrough"]]
    cost, _, _ = _plain(spheres, world, device, codes)
    np.testing.assert_allclose(cost.item(), expected, atol=1e-5)


def test_a_refit_is_seen_after_adopting_again(device):
    """A raw closed shell refitted in place (points written, wp.Mesh.refit): its twin keeps the
    content it was built from until adopt_meshes is called again; then the new geometry is
    evaluated."""
    box_v, box_t = ref.box((0.2, 0.2, 0.2))
    mesh = wp.Mesh(points=wp.array(box_v.astype(np.float32), dtype=wp.vec3, device=device),
                   indices=wp.array(box_t.reshape(-1).astype(np.int32), dtype=wp.int32, device=device))
    raw = (torch.tensor([[int(np.uint64(mesh.id).astype(np.int64))]], device=device),
           torch.tensor([[[0.0, 0, 0, 1, 0, 0, 0, 0]]], device=device),
           torch.ones((1, 1), dtype=torch.uint8, device=device), torch.ones(1, dtype=torch.int32, device=device))
    spheres = np.array([[[[0.13, 0.0, 0.0, 0.01], [0.0, 0.0, 0.0, 0.01]]]])
    adopted = adopt_meshes(raw[0])
    before, _, _ = _plain(spheres, (adopted.mesh_idx,) + raw[1:], device, adopted.sign_methods)
    grown = box_v * 1.5
    want, _ = ref.sphere_cost(spheres, [[ref.RefMesh(grown, box_t)]], ETA, 1.0, MAX_DIST)
    mesh.points.assign(wp.array(grown.astype(np.float32), dtype=wp.vec3, device=device))
    mesh.refit()
    stale, _, _ = _plain(spheres, (adopted.mesh_idx,) + raw[1:], device, adopted.sign_methods)
    np.testing.assert_array_equal(stale, before)
    adopted = adopt_meshes(raw[0])
    after, _, _ = _plain(spheres, (adopted.mesh_idx,) + raw[1:], device, adopted.sign_methods)
    np.testing.assert_allclose(after, want, atol=1e-5)
    assert np.abs(after - before).max() > 0.03


def test_inference_tensors_and_bad_input(device):
    """World tensors made under inference_mode are adopted like any others (the same results);
    a per-slot sign tensor holding a value that is no SignMethod, or of the wrong shape, and a
    mesh_idx that is no (n_env, m) tensor are refused with a clear error."""
    meshes, env = _mixed_world(device)
    rng = np.random.default_rng(8)
    pts = ref.transform_points(meshes[0].pose, mesh_corpus.sample_points(meshes[0].vertices, 200, seed=9))
    spheres = np.concatenate([pts, rng.uniform(0.005, 0.03, (len(pts), 1))], 1).reshape(1, 1, -1, 4)
    world, codes, _ = _adopted(env)
    cost, _, _ = _plain(spheres, world, device, codes, esdf=True)
    with torch.inference_mode():
        frozen = tuple(t.clone() for t in _world(env))
        adopted = adopt_meshes(frozen[0], mesh_enable=frozen[2], n_env_mesh=frozen[3])
    cost_inf, _, _ = _plain(spheres, (adopted.mesh_idx,) + frozen[1:], device, adopted.sign_methods, esdf=True)
    e_ref, _ = ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST, compute_esdf=True)
    np.testing.assert_allclose(cost.reshape(-1), e_ref.reshape(-1), atol=1e-4)
    np.testing.assert_array_equal(cost_inf, cost)
    bad = torch.full(tuple(env.mesh_idx.shape), 20, dtype=torch.uint8, device=device)
    with pytest.raises(ValueError, match="SignMethod"):
        _plain(spheres, _world(env), device, bad)
    with pytest.raises(ValueError, match="SignMethod"):
        adopt_meshes(env.mesh_idx, bad)
    with pytest.raises(ValueError, match="like mesh_idx"):
        adopt_meshes(env.mesh_idx, bad[:, :2])
    with pytest.raises(ValueError, match="n_env, m"):
        adopt_meshes(env.mesh_idx[0])


def test_the_capsule_case_readme_gives():
    """README's measured case of what meshes passed as they are get wrong: a sphere of r = 0.2 m
    at the centre of a capsule (r 0.1 m, 0.4 m long, mesh_corpus.capsule, 1,024 triangles), eta
    0.1: Warp's sign calls the centre outside (on the axis every face is equally near), so the
    cost is that of a sphere 0.1 m outside, 0.150; adopted, the reference's 0.350."""
    v, t = mesh_corpus.capsule()
    mesh = wp.Mesh(points=wp.array(v.astype(np.float32), dtype=wp.vec3, device="cpu"),
                   indices=wp.array(t.astype(np.int32).ravel(), dtype=wp.int32, device="cpu"),
                   support_winding_number=True)
    ids = torch.tensor([[np.uint64(mesh.id).astype(np.int64)]])
    pose = torch.tensor([[[0, 0, 0, 1, 0, 0, 0, 0.0]]], dtype=torch.float32)
    enable, counts = torch.ones(1, 1, dtype=torch.uint8), torch.tensor([1], dtype=torch.int32)
    sphere = torch.tensor([[[[0.0, 0.0, 0.0, 0.2]]]])

    def cost(mesh_idx, *sign):
        out = (torch.zeros(1, 1, 1), torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, dtype=torch.uint8))
        return float(SdfMeshWarpPy.apply(sphere, *out, torch.tensor([1.0]), torch.tensor([0.1]), mesh_idx, pose,
                                         enable, counts, torch.tensor([0.5]), None, False, False, *sign))

    expected = ref.point_cost(np.zeros((1, 3)), np.array([0.2]), [ref.RefMesh(v, t)], 0.1, 1.0, 0.5)[0][0]
    assert abs(expected - 0.35) < 2e-3
    assert abs(cost(ids) - 0.150) < 1e-3
    adopted = adopt_meshes(ids)
    assert abs(cost(adopted.mesh_idx, adopted.sign_methods) - expected) < 1e-5
