"""Inside/outside on hard meshes: every sign method against the exact winding number of
test/reference.py, the `auto` choice, deep centres for any max_dist, per-slot methods, sliver
accuracy and re-centred world-frame meshes (robot_sdf.kernels, robot_sdf.mesh_analysis,
robot_sdf.world)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh

import mesh_corpus as corpus
import reference as ref
from robot_sdf import MeshWorld, SignMethod
from robot_sdf.io import sphere_mesh
from robot_sdf.warp_primitives import SdfMeshWarpPy

MAX_DISTANCES = (1e-3, 1e-2, 0.1, 1.0)


def world_sd(vertices, triangles, points, method, device="cpu", max_distance=0.05, pose=None):
    world = MeshWorld(device=device, max_distance=max_distance, sign_method=method)
    world.add_mesh("m", vertices, triangles, pose=pose)
    d, g = world.signed_distance(torch.tensor(np.asarray(points), dtype=torch.float32))
    return d.cpu().numpy().astype(np.float64), g.cpu().numpy().astype(np.float64), world


def sphere_costs(world, centres, radius, eta, max_distance):
    s = np.concatenate([centres, np.full((len(centres), 1), radius)], axis=1)
    c, _ = world.evaluate_sphere_cost(torch.tensor(s[None, None], dtype=torch.float32), eta,
                                      max_distance=max_distance)
    return c.reshape(-1).cpu().numpy().astype(np.float64)


# ------------------------------------------------------------------------------------- the corpus
@pytest.mark.parametrize("case", corpus.CORPUS, ids=lambda c: c.name)
def test_auto_chooses_as_expected(case):
    v, t = case.build()
    world = MeshWorld(device="cpu")
    world.add_mesh("m", v, t)
    info = world.mesh_info("m")
    assert info["requested_sign_method"] == "auto"
    assert info["sign_method"] == case.auto, info["auto"]["reason"]
    assert world.mesh_sign_method("m") == SignMethod[case.auto.upper()]
    assert int(world.snapshot().sign_methods[0, 0]) == int(SignMethod[case.auto.upper()])
    # The boundary of a solid (one shell under normal, or several) is flagged for the closed-shell
    # paths: the pseudo-normal sign, exact there, for winding_number too.
    assert info["auto"]["solid"] == info["closed_shell"] == (case.auto == "normal" or case.solid_boundary), info
    if case.name == "self_intersecting_shell":
        auto = info["auto"]
        assert auto["closed"] and auto["consistently_oriented"] and auto["shells"] == 1
        assert auto["self_intersections"] > 0


@pytest.mark.parametrize("case", corpus.CORPUS, ids=lambda c: c.name)
def test_exact_methods_match_the_winding_number(case, device):
    """Each method listed as exact for a mesh gives the reference's inside/outside and distance
    at every point 1 mm or more from the surface (and away from w = 0.5), and so does auto."""
    v, t = case.build()
    pts = corpus.sample_points(v, 300)
    sd_ref, _, _, clear = corpus.reference_labels(pts, *case.truth())
    max_d = 0.05
    expected = np.where((sd_ref < 0) | (sd_ref < max_d), sd_ref, max_d)
    for method in case.exact + ("auto",):
        d, _, _ = world_sd(v, t, pts, method, device, max_d)
        wrong = clear & ((d < 0) != (sd_ref < 0))
        assert not wrong.any(), f"{method}: {int(wrong.sum())} points on the wrong side, e.g. {pts[wrong][:3]}"
        assert np.allclose(d[clear], expected[clear], atol=2e-5), method


@pytest.mark.parametrize("case", [c for c in corpus.CORPUS if c.name in
                                  ("overlapping_boxes", "nested_shells", "open_cup", "touching_boxes",
                                   "flipped_faces", "thin_ridge", "concave_vertex", "self_intersecting_shell",
                                   "inside_out_box", "arm_link_flipped_30", "overlapping_one_inside_out")],
                         ids=lambda c: c.name)
def test_deep_centres_pay_for_any_max_dist(case):
    """No sphere whose centre is inside costs 0, whatever max_dist, and its cost is the
    reference's (overlapping bodies, nested shells, open and inconsistent meshes)."""
    v, t = case.build()
    pts = corpus.sample_points(v, 400, seed=3)
    sd_ref, _, _, clear = corpus.reference_labels(pts, *case.truth())
    inside = clear & (sd_ref < 0)
    assert inside.sum() >= 10
    radius, eta = 0.005, 0.01
    ref_cost, _ = ref.cost_of_penetration(radius + eta - sd_ref[inside], eta)
    for method in ("auto",) + case.exact:
        world = MeshWorld(device="cpu", sign_method=method)
        world.add_mesh("m", v, t)
        for max_d in MAX_DISTANCES:
            got = sphere_costs(world, pts[inside], radius, eta, max_d)
            assert np.all(got > 0), (method, max_d)
            assert np.allclose(got, ref_cost, atol=3e-5), (method, max_d)


def test_big_mesh_auto_and_signs():
    """204,800 triangles: auto classifies it (closed torus -> normal) in one pass, and signed
    distances match the analytic torus (the polygon is within 2e-5 m of it)."""
    v, t = corpus.big_torus()
    rng = np.random.default_rng(4)
    pts = rng.uniform([-0.45, -0.45, -0.15], [0.45, 0.45, 0.15], size=(400, 3))
    tube = np.sqrt((np.hypot(pts[:, 0], pts[:, 1]) - 0.3) ** 2 + pts[:, 2] ** 2) - 0.1
    d, _, world = world_sd(v, t, pts, "auto", max_distance=0.02)
    info = world.mesh_info("m")
    assert info["sign_method"] == "normal" and info["auto"]["self_intersections"] == 0
    clear = np.abs(tube) > 1e-3
    assert np.all(np.sign(d[clear]) == np.sign(tube[clear]))
    expected = np.minimum(tube, 0.02)
    assert np.max(np.abs(d - expected)) < 3e-5


# -------------------------------------------------------------------------- ties on primitives
def test_symmetric_primitive_centres_are_inside(device):
    ico = trimesh.creation.icosphere(2, 0.1)
    for method in ("auto", "normal"):
        d, _, _ = world_sd(ico.vertices, ico.faces, [[0.0, 0.0, 0.0]], method, device, max_distance=0.01)
        sd_ref = ref.signed_distance(np.zeros((1, 3)), ico.vertices, ico.faces)[0]
        assert d[0] < 0 and abs(d[0] - sd_ref[0]) < 1e-6
        v, t = sphere_mesh(0.2)
        pose = (0.3, -1.2, 0.8, 1.0, 0.0, 0.0, 0.0)
        d, _, _ = world_sd(v, t, [pose[:3]], method, device, max_distance=0.01, pose=pose)
        sd_ref = ref.signed_distance(np.zeros((1, 3)), v, t)[0]
        assert abs(d[0] - sd_ref[0]) < 1e-6 and d[0] < -0.19


def test_capsule_axis_is_inside_and_its_centre_pays(device):
    capsule = trimesh.creation.capsule(height=0.4, radius=0.1)
    v, t = np.asarray(capsule.vertices), np.asarray(capsule.faces)
    z = np.linspace(-0.29, 0.29, 97)
    axis = np.stack([np.zeros_like(z), np.zeros_like(z), z], 1)
    sd_ref = ref.signed_distance(axis, v, t)[0]
    for method in ("auto", "normal"):
        d, _, world = world_sd(v, t, axis, method, device, max_distance=0.01)
        assert np.all(d < 0)
        assert np.allclose(d, sd_ref, atol=1e-6)
        centre = np.zeros((1, 3))
        want, _ = ref.cost_of_penetration(0.05 + 0.05 - ref.signed_distance(centre, v, t)[0], 0.05)
        got = sphere_costs(world, centre, 0.05, 0.05, 0.01)
        assert got[0] == pytest.approx(want[0], abs=1e-5) and got[0] > 0.17


def test_thin_ridge_near_the_knife_edge(device):
    """Points just above the 2-degree ridge are outside, points just below it inside, for every
    method exact on closed shells (the two sides tie there)."""
    v, t = corpus.thin_ridge()
    apex = 0.2
    offsets = np.array([1e-3, 3e-3, 1e-2, 3e-2])
    ys = np.array([-0.1, 0.0, 0.07])
    above = np.array([[0.0, y, apex + o] for o in offsets for y in ys])
    below = np.array([[0.0, y, apex - o * 3] for o in offsets for y in ys])
    pts = np.concatenate([above, below])
    sd_ref = ref.signed_distance(pts, v, t)[0]
    assert np.all(sd_ref[: len(above)] > 0) and np.all(sd_ref[len(above):] < 0)
    for method in ("auto", "normal", "winding_number", "default"):
        d, _, _ = world_sd(v, t, pts, method, device, max_distance=0.1)
        assert np.all(np.sign(d) == np.sign(sd_ref)), method
        assert np.allclose(d, sd_ref, atol=2e-6), method


def test_sharp_concave_vertex(device):
    """Outside points in the notch in front of a concave vertex, and inside points behind it."""
    v, t = corpus.concave_vertex()
    tip = v[7]
    direction = np.ones(3) / np.sqrt(3.0)
    dists = np.array([1e-3, 5e-3, 2e-2])
    pts = np.concatenate([tip + dists[:, None] * direction, tip - dists[:, None] * direction])
    sd_ref = ref.signed_distance(pts, v, t)[0]
    assert np.all(sd_ref[:3] > 0) and np.all(sd_ref[3:] < 0)
    for method in ("auto", "normal"):
        d, _, _ = world_sd(v, t, pts, method, device, max_distance=0.1)
        assert np.allclose(d, sd_ref, atol=2e-6), method


# ------------------------------------------------------------------------------ per-slot methods
def test_per_slot_methods_and_refused_winding_number(device):
    cup_v, cup_t = corpus.open_cup()
    box_v, box_t = ref.box((0.2, 0.2, 0.2))
    world = MeshWorld(device=device, sign_method="normal", max_distance=0.01)
    world.add_mesh("box", box_v, box_t, pose=(0.5, 0, 0, 1, 0, 0, 0))
    world.add_mesh("cup", cup_v, cup_t, sign_method="winding_number")
    snap = world.snapshot()
    assert snap.sign_methods[0, :2].tolist() == [int(SignMethod.NORMAL), int(SignMethod.WINDING_NUMBER)]
    # The cup's centre is inside by its winding number (5/6), far from every wall.
    pts = np.array([[0.0, 0.0, -0.02], [0.5, 0.0, 0.0], [0.0, 0.0, 0.3]])
    d, _ = world.signed_distance(torch.tensor(pts, dtype=torch.float32))
    cup_ref = ref.signed_distance(pts[:1], cup_v, cup_t)[0]
    assert d[0].item() == pytest.approx(cup_ref[0], abs=1e-6) and d[0] < 0
    assert d[1].item() == pytest.approx(-0.1, abs=1e-6)
    assert d[2].item() == pytest.approx(0.01)
    # A call-wide winding_number would read winding-number data the box does not have.
    s = torch.tensor([[[[0.5, 0.0, 0.0, 0.01]]]], device=device)
    outs = (torch.empty((1, 1, 1), device=device), torch.empty((1, 1, 1, 4), device=device),
            torch.empty((1, 1, 1), dtype=torch.uint8, device=device))
    one = torch.ones(1, device=device)
    args = (s, *outs, one, one * 0.01, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh,
            one, None, False, False)
    with pytest.raises(ValueError, match="winding-number support"):
        SdfMeshWarpPy.apply(*args, "winding_number")
    # So would a per-slot tensor that asks winding_number of the box's slot (checked once per tensor).
    forged = snap.sign_methods.clone()
    forged[0, 0] = int(SignMethod.WINDING_NUMBER)
    for _ in range(2):
        with pytest.raises(ValueError, match="winding-number support"):
            SdfMeshWarpPy.apply(*args, forged)
    # The per-slot tensor, a scalar "auto" (each mesh's own method) and "normal" all work.
    for sign in (snap.sign_methods, "auto", "normal"):
        c = SdfMeshWarpPy.apply(*args, sign)
        assert float(c) == pytest.approx(0.01 + 0.01 + 0.1 - 0.005, abs=1e-5)
    with pytest.raises(ValueError, match="sign_method tensor"):
        SdfMeshWarpPy.apply(*args, snap.sign_methods[:, :1])


def test_auto_classification_is_cached_with_the_geometry():
    v, t = corpus.overlapping_boxes()
    world = MeshWorld(device="cpu")
    world.add_mesh("a", v, t)
    world.add_mesh("b", v, t, pose=(1, 0, 0, 1, 0, 0, 0))
    snap = world.snapshot()
    assert int(snap.mesh_idx[0, 0]) == int(snap.mesh_idx[0, 1])  # one geometry, classified once
    assert world.mesh_info("b")["auto"]["shells"] == 2
    world.add_mesh("c", v, t, sign_method="parity")
    assert world.mesh_info("c")["sign_method"] == "parity" and "auto" not in world.mesh_info("c")
    with pytest.raises(ValueError, match="unknown sign_method"):
        world.add_mesh("d", v, t, sign_method="majority")
    assert not world.has_mesh("d")


def test_refit_updates_pseudo_normals_and_keeps_signs():
    v, t = ref.icosphere(0.1, 2)
    world = MeshWorld(device="cpu", max_distance=0.01)
    world.add_mesh("s", v, t)
    world.update_vertices("s", v * 2.0 + np.array([0.05, 0.0, 0.0]))
    pts = np.array([[0.05, 0, 0], [0.2, 0, 0], [0.26, 0, 0], [0.05, 0.15, 0.0]])
    d, _ = world.signed_distance(torch.tensor(pts, dtype=torch.float32))
    want = ref.signed_distance(pts, v * 2.0 + np.array([0.05, 0.0, 0.0]), t)[0]
    want = np.where(want < 0.01, want, 0.01)
    assert np.allclose(d.numpy(), want, atol=1e-6)


# ------------------------------------------------------------------------------------ accuracy
def _surface_samples(v, t, count, rng):
    tri = v[t]
    face = rng.integers(0, len(t), count)
    r1, r2 = rng.uniform(size=(2, count))
    s = np.sqrt(r1)
    bary = np.stack([1 - s, s * (1 - r2), s * r2], 1)
    return np.einsum("ni,nij->nj", bary, tri[face])


@pytest.mark.parametrize("name", ["open_cup", "self_intersecting_shell", "nested_shells",
                                  "capsule"])
def test_forced_normal_costs_by_the_pseudo_normal_at_every_distance(name, device):
    """Sign method ``normal`` given for any mesh: a sphere costs by the pseudo-normal sign of its
    centre's closest feature wherever that is within max_dist, also beyond r + eta, where the
    plain cost may search a mesh only within r + eta first: on a mesh that is not one closed,
    consistently oriented shell (open, nested, self-intersecting), the ray that would then decide
    inside or outside follows another rule than the pseudo-normal. The closed capsule takes the
    short search; the others must not."""
    v, t = next(c for c in corpus.CORPUS if c.name == name).build()
    v, t = np.asarray(v, np.float64), np.asarray(t, np.int64)
    radius, eta, max_d = 0.01, 0.02, 0.2
    rng = np.random.default_rng(11)
    lo, hi = v.min(0) - 0.15, v.max(0) + 0.15
    pts = np.concatenate([rng.uniform(lo, hi, (4000, 3)),
                          v[rng.integers(0, len(v), 2000)] + rng.normal(0.0, 0.06, (2000, 3))])
    sign, dist, cos = ref.pseudo_normal_sign(pts, v, t)
    clear = (dist > 1e-3) & (dist < max_d - 0.01) & (cos > 1e-3) \
        & (ref.gradient_ambiguity(pts, v, t, delta=1e-5) < 1e-6)
    pts, sd = pts[clear], (sign * dist)[clear]
    world = MeshWorld(device=device, max_distance=max_d, sign_method="normal")
    world.add_mesh("m", v, t)
    assert world.mesh_info("m")["closed_shell"] == (name == "capsule")
    got = sphere_costs(world, pts, radius, eta, max_d)
    want, _ = ref.cost_of_penetration(radius + eta - sd, eta)
    beyond = np.abs(sd) > radius + eta
    assert (beyond & (sd < 0)).sum() >= 50  # inside beyond r + eta: where a short search differs
    np.testing.assert_allclose(got, want, atol=2e-5)


@pytest.mark.parametrize("pose", [None, (1.5, -0.7, 0.9, 0.9238795, 0.0, 0.3826834, 0.0)])
def test_sliver_accuracy(pose, device):
    """Distance within 1e-6 m and direction within 0.5 degrees at 0.1 mm and more from a mesh of
    300:1 slivers, outside (up to 1 cm) and inside (any depth), also with a world pose."""
    v, t = corpus.sliver_box()
    rng = np.random.default_rng(5)
    base = _surface_samples(v, t, 300, rng)
    direction = rng.normal(size=base.shape)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    offsets = np.repeat([1e-4, 3e-4, 1e-3, 1e-2], len(base) // 4)[:, None]
    deep = rng.uniform([-0.29, -0.09, -0.045], [0.29, 0.09, 0.045], size=(100, 3))  # inside, up to 5 cm deep
    pts = np.concatenate([base + direction * offsets, deep])
    sd_ref, g_ref, _ = ref.signed_distance(pts, v, t)
    keep = np.abs(sd_ref) >= 1e-4
    world_pts = ref.transform_points(np.asarray(pose), pts) if pose is not None else pts
    d, g, _ = world_sd(v, t, world_pts, "auto", device, max_distance=0.05, pose=pose)
    if pose is not None:
        g = g @ ref.quat_to_matrix(np.asarray(pose[3:]))  # back to the mesh frame
    assert np.max(np.abs(d[keep] - sd_ref[keep])) <= 1e-6
    cos = np.clip(np.einsum("ij,ij->i", g[keep], g_ref[keep]) / np.linalg.norm(g[keep], axis=1), -1, 1)
    assert np.degrees(np.max(np.arccos(cos))) <= 0.5


@pytest.mark.parametrize("name", ["sliver_box", "arm_link_fine"])
def test_sliver_accuracy_at_every_distance(name, device):
    """Distance within 1e-6 m and direction within 0.5 degrees from 0.1 mm out to max_dist (and
    inside), on sliver-heavy real-size meshes (their searches measure thin triangles in float64).
    Points near a tie of distinct features (a jump of the gradient
    itself: reference.gradient_ambiguity) are left out."""
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    v = np.asarray(v, np.float32).astype(np.float64)
    rng = np.random.default_rng(7)
    dists = np.array([1e-4, 1e-3, 1e-2, 0.03, 0.1, 0.2, 0.3, 0.45])
    base = _surface_samples(v, t, 80 * len(dists), rng)
    direction = rng.normal(size=base.shape)
    direction /= np.linalg.norm(direction, axis=1, keepdims=True)
    deep = rng.uniform(v.min(0), v.max(0), size=(150, 3))
    pts = np.concatenate([base + direction * np.repeat(dists, 80)[:, None], deep])
    if name == "arm_link_fine":
        # Off the tube, near the edges between its slivers (where Warp's float32 search may pick
        # the neighbour), 2 cm to 45 cm out.
        n, sector = 1500, 2 * np.pi / 512
        angle = rng.integers(0, 512, n) * sector + rng.uniform(-0.5, 0.5, n) * sector
        out = 0.075 + np.exp(rng.uniform(np.log(0.02), np.log(0.45), n))
        pts = np.concatenate([pts, np.stack([rng.uniform(-0.28, 0.28, n), out * np.cos(angle),
                                             out * np.sin(angle)], 1)])
    max_d = 0.5
    sd_ref, g_ref, _ = ref.signed_distance(pts, v, t)
    keep = (np.abs(sd_ref) >= 1e-4) & (sd_ref <= max_d) & (ref.gradient_ambiguity(pts, v, t, delta=2e-6) < 5e-3)
    assert keep.sum() > 0.5 * len(pts) and (sd_ref[keep] > 0.2).sum() > 60
    d, g, _ = world_sd(case.build()[0], case.build()[1], pts, "auto", device, max_distance=max_d)
    assert np.max(np.abs(d[keep] - sd_ref[keep])) <= 1e-6
    cos = np.clip(np.einsum("ij,ij->i", g[keep], g_ref[keep]) / np.linalg.norm(g[keep], axis=1), -1, 1)
    assert np.degrees(np.max(np.arccos(cos))) <= 0.5


def test_world_frame_mesh_is_recentred(device):
    """A mesh given in world coordinates far from the origin keeps float32-level accuracy and a
    tight bounding sphere (the world re-centres it)."""
    v, t = ref.icosphere(0.2, 3)
    v = v + np.array([25.0, -13.0, 4.0])
    world = MeshWorld(device=device, max_distance=0.05)
    world.add_mesh("scan", v, t)
    info = world.mesh_info("scan")
    assert np.allclose(info["bounding_centre"], [25.0, -13.0, 4.0], atol=1e-5)
    assert info["bounding_radius"] == pytest.approx(0.2, abs=1e-4)
    assert float(world.snapshot().mesh_pose_inverse[0, 0, 7]) == pytest.approx(0.2, abs=1e-4)
    vv, tt, _, _ = world.mesh_geometry("scan")
    assert np.array_equal(vv, v.astype(np.float32))
    rng = np.random.default_rng(2)
    pts = np.array([25.0, -13.0, 4.0]) + rng.normal(size=(200, 3)) * 0.15
    d, _, _ = world_sd(v, t, pts, "auto", device, max_distance=0.05)
    want = ref.signed_distance(pts, v.astype(np.float32), t)[0]
    want = np.where(want < 0.05, want, 0.05)
    assert np.max(np.abs(d - want)) < 1e-5


# ------------------------------------------------------------------- winding repaired at add
def test_inside_out_sphere_is_solid_for_auto(device):
    """An icosphere with every triangle reversed (an inside-out export) reads as the solid sphere
    (centre sd = -0.196 m, not +0.196), and mesh_info says what was repaired."""
    v, t = sphere_mesh(0.2)
    flipped = np.ascontiguousarray(t[:, ::-1])
    given = flipped.copy()
    d, _, world = world_sd(v, flipped, [[0.0, 0.0, 0.0], [0.1, 0.0, 0.0]], "auto", device, max_distance=0.5)
    want = ref.signed_distance(np.array([[0.0, 0.0, 0.0], [0.1, 0.0, 0.0]]), v, t)[0]
    assert np.all(d < 0) and np.allclose(d, want, atol=1e-6)
    info = world.mesh_info("m")
    assert info["sign_method"] == "normal"
    assert info["orientation"]["components_reversed"] == 1 and info["orientation"]["faces_reversed"] == len(t)
    assert np.array_equal(flipped, given)  # the caller's array is not touched
    _, stored, _, _ = world.mesh_geometry("m")
    assert np.array_equal(stored, t)
    # a refit keeps the repaired winding
    world.update_vertices("m", v * 1.5)
    d, _ = world.signed_distance(torch.zeros(1, 3, device=world.device))
    assert float(d[0]) == pytest.approx(float(ref.signed_distance(np.zeros((1, 3)), v * 1.5, t)[0][0]), abs=1e-6)


@pytest.mark.parametrize("name, reversed_components, faces", [
    ("arm_link_flipped_5", 0, None), ("arm_link_flipped_30", 0, None), ("inside_out_arm_link", 1, None),
    ("overlapping_one_inside_out", 1, 12), ("open_cup_flipped", 0, 3), ("hollow_shell", 0, 0),
    ("nested_shells", 0, 0), ("arm_link", 0, 0)])
def test_orientation_report(name, reversed_components, faces):
    """mesh_info "orientation" counts the triangles reversed: exactly those that differ from the
    original solid's winding; a hollow's inward cavity and a nested shell stay as they were."""
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    tv, tt = case.truth()
    world = MeshWorld(device="cpu")
    world.add_mesh("m", v, t)
    info = world.mesh_info("m")["orientation"]
    differ = int(np.count_nonzero(np.any(np.asarray(t) != np.asarray(tt), axis=1))) if faces is None else faces
    assert info["faces_reversed"] == differ
    assert info["components_reversed"] == reversed_components
    if name != "open_cup_flipped":
        assert info["closed_components"] == info["components"]
    _, stored, _, _ = world.mesh_geometry("m")
    if name != "overlapping_one_inside_out":
        assert np.array_equal(stored, np.asarray(tt)) or name in ("hollow_shell", "nested_shells")


def test_non_orientable_patch_is_left_as_given():
    """A Moebius band cannot be oriented: reported, its triangles kept, winding_number chosen."""
    n = 24
    u = np.linspace(0, 2 * np.pi, n, endpoint=False)
    ring = []
    for s in (-0.05, 0.05):
        r = 0.3 + s * np.cos(u / 2)
        ring.append(np.stack([r * np.cos(u), r * np.sin(u), s * np.sin(u / 2)], 1))
    v = np.concatenate(ring)
    t = []
    for i in range(n):
        j = (i + 1) % n
        a, b = i, n + i
        c, d = (j, n + j) if j else (n + j, j)  # the half twist joins the last column crossed
        t += [(a, c, b), (b, c, d)]
    t = np.array(t)
    world = MeshWorld(device="cpu")
    world.add_mesh("m", v, t)
    info = world.mesh_info("m")
    assert info["orientation"]["non_orientable"] == 1 and info["orientation"]["faces_reversed"] == 0
    assert info["sign_method"] == "winding_number"
    assert np.array_equal(world.mesh_geometry("m")[1], t)


def test_mirrored_collada_is_the_mirrored_solid(tmp_path, device):
    """A COLLADA node with a mirroring matrix, loaded by robot_sdf.io and added with every sign
    method: the signed distance of the mirrored part (reference: mirrored vertices, reversed
    triangles) at points in and around it."""
    from io_test import _collada

    from robot_sdf.io import load_mesh

    v0, t0 = corpus.arm_link()
    mirror = np.diag([1.0, -1.0, 1.0, 1.0])
    mirror[:3, 3] = (0.1, 0.2, 0.0)
    path = tmp_path / "mirrored_link.dae"
    path.write_text(_collada({"link": (v0, t0)}, [("link", mirror)]))
    v, t = load_mesh(path)
    want_v, want_t = v0 @ mirror[:3, :3].T + mirror[:3, 3], t0[:, ::-1]
    pts = corpus.sample_points(want_v, 300)
    sd_ref, _, _, clear = corpus.reference_labels(pts, want_v, want_t)
    for method in ("auto",) + corpus.ALL:
        d, _, _ = world_sd(v, t, pts, method, device, max_distance=0.05)
        assert np.array_equal(d[clear] < 0, sd_ref[clear] < 0), method
        assert np.allclose(d[clear], np.minimum(sd_ref[clear], 0.05), atol=2e-5), method
    # the same part given with a mirroring <mesh scale> and the winding the file has
    obj = tmp_path / "link.obj"
    trimesh.Trimesh(v0, t0, process=False).export(str(obj))
    sv, st = load_mesh(obj, scale=(1.0, -1.0, 1.0))
    d, _, world = world_sd(sv, st, pts - mirror[:3, 3], "auto", device, max_distance=0.05)
    assert world.mesh_info("m")["orientation"]["faces_reversed"] == 0  # the loader already re-wound it
    assert np.array_equal(d[clear] < 0, sd_ref[clear] < 0)


def test_repaired_mesh_keeps_its_given_triangles_for_refits():
    """A re-sent inside-out mesh with the triangles it was added with is recognised as the same
    topology (the ROS ADD path then refits); a shared geometry split by update_vertices starts
    from the triangles as given and repairs them again."""
    v, t = sphere_mesh(0.2)
    flipped = np.ascontiguousarray(t[:, ::-1])
    world = MeshWorld(device="cpu", max_distance=0.5)
    world.add_mesh("a", v, flipped)
    world.add_mesh("b", v, flipped, pose=(1.0, 0, 0, 1, 0, 0, 0))
    assert world.same_triangles("a", flipped) and world.same_triangles("a", flipped.reshape(-1).astype(np.uint32))
    assert not world.same_triangles("a", t) and not world.same_triangles("a", flipped[:-1])
    world.update_vertices("b", v * 2.0)  # shared geometry: b gets its own, built from the given triangles
    assert world.same_triangles("b", flipped)
    assert world.mesh_info("b")["orientation"]["faces_reversed"] == len(t)
    d, _ = world.signed_distance(torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    want_a = ref.signed_distance(np.zeros((1, 3)), v, t)[0][0]
    want_b = ref.signed_distance(np.zeros((1, 3)), v * 2.0, t)[0][0]
    assert float(d[0]) == pytest.approx(min(want_a, ref.signed_distance(np.array([[-1.0, 0, 0]]), v * 2.0, t)[0][0]),
                                        abs=1e-6)
    assert float(d[1]) == pytest.approx(min(want_b, ref.signed_distance(np.array([[1.0, 0, 0]]), v, t)[0][0]),
                                        abs=1e-6)
