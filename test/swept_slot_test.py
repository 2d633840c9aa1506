"""robot_sdf.kernels.swept_slot: one mesh's share of a swept step (swept_slot_cost, and
open_swept_slot_cost for moving steps on surfaces whose sign is not a closed one's), called
directly on single steps, against the swept rule of test/reference.py (every sample evaluated, no
skipping): the step's cost and its partial derivatives towards the step and both neighbours, in
each sign regime (pseudo-normal of a solid, with slivers; winding number of closed and open
surfaces; Warp's own queries on a mesh built elsewhere), for 2 and 9 samples a side (more than one shared traversal takes), steps with
one side, and stationary steps; and the two functions agree where both apply."""
from __future__ import annotations

import numpy as np
import pytest
import warp as wp

import mesh_corpus as corpus
import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.kernels import swept_slot
from robot_sdf.kernels.sign_data import SIGN_AUTO, SIGN_DEFAULT, SIGN_NORMAL
from robot_sdf.kernels.signed_distance import REACH_MARGIN, REACH_SLACK

ETA, MAX_DIST = 0.03, 0.15


@wp.kernel
def _step_kernel(mesh: wp.uint64, cull_radius: float, method: int, steps: wp.array(dtype=wp.vec4, ndim=2),
                 sweep_steps: int, open_variant: int, cost: wp.array(dtype=float), own: wp.array(dtype=wp.vec3),
                 to_prev: wp.array(dtype=wp.vec3), to_next: wp.array(dtype=wp.vec3), serves: wp.array(dtype=wp.int32)):
    """Step i: steps[i] = (previous, this, next) step's sphere (x, y, z, r), mesh frame; r < 0 off."""
    i = wp.tid()
    s = steps[i, 1]
    p = wp.vec3(s[0], s[1], s[2])
    sp = steps[i, 0]
    sn = steps[i, 2]
    has_prev = wp.where(sp[3] >= 0.0, 1, 0)
    has_next = wp.where(sn[3] >= 0.0, 1, 0)
    seg_prev = (wp.vec3(sp[0], sp[1], sp[2]) - p) * float(has_prev)
    seg_next = (wp.vec3(sn[0], sn[1], sn[2]) - p) * float(has_next)
    n_sides = has_prev + has_next
    # The swept kernel's search bound for p: half way to the farther neighbour (its clearance frees
    # nothing beyond), max_dist where the step is stationary or isolated.
    reach0 = 0.5 * wp.max(wp.length(seg_prev), wp.length(seg_next))
    bound0 = float(MAX_DIST)
    if reach0 > 0.0:
        bound0 = wp.min(float(MAX_DIST), reach0 * REACH_MARGIN + REACH_SLACK)
    serves[i] = wp.where(swept_slot.open_swept_sign(mesh, method), 1, 0)
    share = swept_slot.SweptSlotResult()
    if open_variant != 0:
        share = swept_slot.open_swept_slot_cost(
            mesh, cull_radius, method, p, seg_prev, seg_next, has_prev, has_next, s[3], float(ETA), float(MAX_DIST),
            sweep_steps, n_sides)
    else:
        share = swept_slot.swept_slot_cost(
            mesh, cull_radius, method, p, seg_prev, seg_next, has_prev, has_next, s[3], float(ETA), float(MAX_DIST),
            bound0, sweep_steps, n_sides)
    # As the swept kernel assembles a step from its meshes' shares (one mesh here).
    if n_sides > 0:
        cost[i] = wp.max(share.centre_cost + share.sample_delta, 0.0)
        own[i] = share.own + share.centre_grad * (1.0 / (2.0 * float(sweep_steps)))
    else:
        cost[i] = share.centre_cost
        own[i] = share.centre_grad
    to_prev[i] = share.to_prev
    to_next[i] = share.to_next


def _steps(rng: np.random.Generator, v: np.ndarray, n: int) -> np.ndarray:
    """(n, 3, 4) steps (previous, this, next) around a mesh: centres near its surface or inside (a
    quarter farther out), neighbours up to 8 cm away; an eighth without a previous step, an eighth without a next one,
    an eighth stationary."""
    lo, hi = v.min(0), v.max(0)
    size = float(np.ptp(v, 0).max())
    corners = v[rng.integers(len(v), size=n)]
    centre = np.where(rng.random((n, 1)) < 0.5, corners, rng.uniform(lo, hi, size=(n, 3)))
    centre += rng.normal(scale=0.05 * size, size=(n, 3))
    far = rng.random(n) < 0.25  # a quarter farther out, mostly free of the surface
    centre[far] += rng.normal(scale=0.3 * size, size=(far.sum(), 3))
    prev = centre + rng.normal(scale=0.04, size=(n, 3))
    nxt = centre + rng.normal(scale=0.04, size=(n, 3))
    kind = rng.integers(0, 8, size=n)
    prev[kind == 2] = nxt[kind == 2] = centre[kind == 2]
    radius = rng.uniform(0.0, 0.03, size=(n, 1))
    steps = np.stack([np.concatenate([x, radius], 1) for x in (prev, centre, nxt)], 1)
    steps[kind == 0, 0, 3] = -1.0
    steps[kind == 1, 2, 3] = -1.0
    return steps.astype(np.float32)


def _evaluate(mesh_id: int, cull: float, method: int, steps: np.ndarray, shift: np.ndarray, sweep_steps: int,
              open_variant: bool):
    local = steps.copy()
    local[..., :3] += shift.astype(np.float32)
    n = len(steps)
    outs = [wp.zeros(n, dtype=float, device="cpu")] + [wp.zeros(n, dtype=wp.vec3, device="cpu") for _ in range(3)] \
        + [wp.zeros(n, dtype=wp.int32, device="cpu")]
    wp.launch(_step_kernel, n, [wp.uint64(mesh_id), float(cull), int(method),
                                wp.array(local, dtype=wp.vec4, device="cpu"), int(sweep_steps), int(open_variant),
                                *outs], device="cpu")
    return [o.numpy() for o in outs]


def _reference(steps: np.ndarray, meshes, sweep_steps: int):
    """(cost, own, to_prev, to_next) of the middle step of each 3-step trajectory, and the mask of
    steps whose samples all lie off the surface, off w = 1/2 and off medial axes."""
    s = steps[None].astype(np.float64).transpose(0, 2, 1, 3)  # (1, 3 steps, n spheres, 4)
    samples: list = []
    cost, own, to_prev, to_next = ref.swept_sphere_partials(s, [meshes], ETA, 1.0, MAX_DIST, sweep_steps,
                                                            samples_out=samples)
    n = steps.shape[0]
    owners = np.array([k[2] for k, _ in samples if k[1] == 1])
    pts = np.concatenate([steps[:, 1, :3].astype(np.float64), np.array([q for k, q in samples if k[1] == 1])])
    owners = np.concatenate([np.arange(n), owners])
    m = meshes[0]
    d = ref.unsigned_distance(pts, m.vertices, m.triangles)
    w = ref.winding_number(pts, m.vertices, m.triangles)
    bad_pts = (d < 1e-3) | (np.abs(w - 0.5) < 0.05)
    ambiguous = ref.gradient_ambiguity(pts, m.vertices, m.triangles, 2e-6) > 1e-4
    bad = np.zeros(n, bool)
    bad[owners[bad_pts]] = True
    rough = bad.copy()
    rough[owners[ambiguous]] = True
    return cost[0, 1], own[0, 1], to_prev[0, 1], to_next[0, 1], ~bad, ~rough


# (case, how the mesh is given, the call's sign method)
REGIMES = [
    ("capsule", "auto", SIGN_AUTO),  # a solid: p and the samples in shared traversals, pseudo-normal
    ("arm_link", "auto", SIGN_AUTO),  # a solid with slivers
    ("nested_shells", "auto", SIGN_AUTO),  # the winding number of a closed surface, shared traversals
    ("open_cup", "auto", SIGN_AUTO),  # the winding number of an open surface: open_swept_slot_cost too
    ("capsule", "raw", SIGN_NORMAL),  # built elsewhere, Warp's normal sign: open_swept_slot_cost too
    ("capsule", "raw", SIGN_DEFAULT),  # built elsewhere, Warp's ray vote: sample after sample
]


@pytest.mark.parametrize("sweep_steps", [2, 9])
@pytest.mark.parametrize("name, given, method", REGIMES, ids=[f"{c}-{g}-{m}" for c, g, m in REGIMES])
def test_a_steps_share_is_the_swept_rules(name, given, method, sweep_steps):
    case = next(c for c in corpus.CORPUS if c.name == name)
    v, t = case.build()
    v = np.asarray(v, np.float64)
    if given == "raw":
        keep = wp.Mesh(points=wp.array(v.astype(np.float32), dtype=wp.vec3, device="cpu"),
                       indices=wp.array(np.asarray(t, np.int32).ravel(), dtype=wp.int32, device="cpu"),
                       support_winding_number=True)
        mesh_id, shift, cull = keep.id, np.zeros(3), 0.0
    else:
        keep = MeshWorld(device="cpu", mesh_capacity=1)
        keep.add_mesh("m", v, t)
        snap = keep.snapshot()
        pose_inv = snap.mesh_pose_inverse[0, 0].numpy().astype(np.float64)
        assert np.allclose(pose_inv[3:7], [1, 0, 0, 0])
        mesh_id, shift, cull = int(snap.mesh_idx[0, 0]), pose_inv[:3], float(pose_inv[7])
    rng = np.random.default_rng(sweep_steps + 13 * len(name))
    steps = _steps(rng, v, 250)
    c_ref, own_ref, prev_ref, next_ref, clear, smooth = _reference(steps, [ref.RefMesh(v, np.asarray(t))], sweep_steps)
    assert clear.mean() > 0.5 and (c_ref[clear] > 0).sum() > 30 and (c_ref[clear] == 0).sum() > 15
    moving = (np.linalg.norm(steps[:, 0, :3] - steps[:, 1, :3], axis=1) > 0) & (steps[:, 0, 3] >= 0) \
        | (np.linalg.norm(steps[:, 2, :3] - steps[:, 1, :3], axis=1) > 0) & (steps[:, 2, 3] >= 0)
    results = {False: _evaluate(mesh_id, cull, method, steps, shift, sweep_steps, False)}
    serves = results[False][4].astype(bool)
    assert serves.all() == (name == "open_cup" or method == SIGN_NORMAL) and (serves.any() == serves.all())
    if serves.all():
        results[True] = _evaluate(mesh_id, cull, method, steps, shift, sweep_steps, True)
    for open_variant, (cost, own, to_prev, to_next, _) in results.items():
        rows = clear & moving if open_variant else clear
        np.testing.assert_allclose(cost[rows], c_ref[rows], atol=5e-5, err_msg=f"open variant {open_variant}")
        rows = rows & smooth
        for got, want in ((own, own_ref), (to_prev, prev_ref), (to_next, next_ref)):
            np.testing.assert_allclose(got[rows], want[rows], atol=2e-4, err_msg=f"open variant {open_variant}")
        # A side that does not exist receives nothing.
        assert np.all(to_prev[steps[:, 0, 3] < 0] == 0) and np.all(to_next[steps[:, 2, 3] < 0] == 0)
