"""MeshWorld: mutations, validation (reject and change nothing), revisions, snapshots, threads.

Expected results come from the numpy reference applied to the state the test itself tracks,
never from the world's own bookkeeping.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import torch

import reference as ref
from conftest import scalar
from robot_sdf import MeshWorld
from robot_sdf.warp_primitives import SdfMeshWarpPy

ETA = 0.05
MAX_DIST = 0.5
ATOL = 1e-4

BOX_V, BOX_T = ref.box((0.3, 0.3, 0.3))
SPH_V, SPH_T = ref.icosphere(0.15, 2)
POSE_A = np.array([0.2, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
POSE_B = np.array([-0.2, 0.05, 0.0, np.cos(0.3), 0.0, np.sin(0.3), 0.0])


def probe_spheres(seed: int = 0, n: int = 150) -> np.ndarray:
    """(1,1,n,4) spheres spread over the region the test meshes live in."""
    rng = np.random.default_rng(seed)
    p = rng.uniform([-0.5, -0.3, -0.3], [0.5, 0.3, 0.3], size=(n, 3))
    r = rng.uniform(0.0, 0.08, size=(n, 1))
    return np.concatenate([p, r], axis=1)[None, None]


SPHERES = probe_spheres()


def world_cost(world: MeshWorld, spheres: np.ndarray = SPHERES, env: int = 0) -> np.ndarray:
    s = torch.tensor(spheres, dtype=torch.float32)
    env_index = None if env == 0 else [env] * s.shape[0]
    cost, _ = world.evaluate_sphere_cost(s, ETA, 1.0, env_index=env_index, max_distance=MAX_DIST)
    return cost.cpu().double().numpy()


def ref_cost(meshes: list[ref.RefMesh], spheres: np.ndarray = SPHERES) -> np.ndarray:
    return ref.sphere_cost(spheres, [meshes], ETA, 1.0, MAX_DIST)[0]


@pytest.fixture
def world(device) -> MeshWorld:
    return MeshWorld(device=device, num_envs=2, mesh_capacity=2, max_distance=MAX_DIST)


def test_add_remove_and_queries(world):
    assert world.revision == 0 and world.mesh_names() == []
    np.testing.assert_array_equal(world_cost(world), 0.0)
    r1 = world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    assert r1 == 1 == world.revision
    r2 = world.add_mesh("b", SPH_V, SPH_T, POSE_B)
    assert r2 == 2
    assert world.has_mesh("a") and world.has_mesh("b") and not world.has_mesh("a", env=1)
    assert sorted(world.mesh_names()) == ["a", "b"] and world.mesh_names(1) == []
    expected = ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A), ref.RefMesh(SPH_V, SPH_T, POSE_B)])
    assert np.sum(expected > 0) > 10
    np.testing.assert_allclose(world_cost(world), expected, atol=ATOL, rtol=1e-4)
    v, t, pose, enabled = world.mesh_geometry("b")
    np.testing.assert_allclose(v, SPH_V, atol=1e-7)
    np.testing.assert_array_equal(t, SPH_T)
    np.testing.assert_allclose(pose, POSE_B, atol=1e-12)
    assert enabled is True or enabled == 1
    assert world.remove_mesh("a") == 3
    assert not world.has_mesh("a") and world.mesh_names() == ["b"]
    np.testing.assert_allclose(world_cost(world), ref_cost([ref.RefMesh(SPH_V, SPH_T, POSE_B)]), atol=ATOL, rtol=1e-4)
    # env 1 is independent
    np.testing.assert_array_equal(world_cost(world, env=1), 0.0)


def test_replace_geometry_under_same_id(world):
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    before = world_cost(world)
    big_v, big_t = ref.box((0.5, 0.2, 0.4))
    rev = world.add_mesh("a", big_v, big_t, POSE_B)
    assert rev == 2 and world.mesh_names() == ["a"]
    after = world_cost(world)
    expected = ref_cost([ref.RefMesh(big_v, big_t, POSE_B)])
    assert not np.allclose(before, expected, atol=1e-3)
    np.testing.assert_allclose(after, expected, atol=ATOL, rtol=1e-4)
    v, t, pose, _ = world.mesh_geometry("a")
    assert v.shape == (8, 3) and np.allclose(np.ptp(v, axis=0), [0.5, 0.2, 0.4], atol=1e-6)
    np.testing.assert_allclose(pose, POSE_B, atol=1e-12)
    # replacing with a different topology (sphere) works too
    world.add_mesh("a", SPH_V, SPH_T, POSE_A)
    np.testing.assert_allclose(world_cost(world), ref_cost([ref.RefMesh(SPH_V, SPH_T, POSE_A)]), atol=ATOL, rtol=1e-4)


def test_set_pose_moves_only_the_pose(world):
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    world.add_mesh("b", SPH_V, SPH_T, POSE_B)
    snap0 = world.snapshot()
    rng = np.random.default_rng(1)
    new_pose = np.concatenate([[0.0, -0.1, 0.05], ref.random_quaternion(rng)])
    assert world.set_pose("a", new_pose) == 3
    snap1 = world.snapshot()
    assert torch.equal(snap0.mesh_idx, snap1.mesh_idx)  # same Warp meshes: nothing rebuilt
    assert not torch.equal(snap0.mesh_pose_inverse, snap1.mesh_pose_inverse)
    v, t, pose, _ = world.mesh_geometry("a")
    np.testing.assert_allclose(v, BOX_V, atol=1e-7)
    np.testing.assert_allclose(pose, new_pose, atol=1e-9)
    expected = ref_cost([ref.RefMesh(BOX_V, BOX_T, new_pose), ref.RefMesh(SPH_V, SPH_T, POSE_B)])
    np.testing.assert_allclose(world_cost(world), expected, atol=ATOL, rtol=1e-4)
    # the stored inverse pose is the world->mesh transform of docs/design.md "Tensor layouts"
    np.testing.assert_allclose(snap1.mesh_pose_inverse[0, 0, :7].cpu().numpy(), ref.pose_inverse(new_pose), atol=1e-6)


def test_enable_disable(world):
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    world.add_mesh("b", SPH_V, SPH_T, POSE_B, enabled=False)
    np.testing.assert_allclose(world_cost(world), ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A)]), atol=ATOL, rtol=1e-4)
    assert world.mesh_geometry("b")[3] is False or world.mesh_geometry("b")[3] == 0
    assert world.set_enabled("b", True) == 3
    both = ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A), ref.RefMesh(SPH_V, SPH_T, POSE_B)])
    np.testing.assert_allclose(world_cost(world), both, atol=ATOL, rtol=1e-4)
    assert world.set_enabled("a", False) == 4
    np.testing.assert_allclose(world_cost(world), ref_cost([ref.RefMesh(SPH_V, SPH_T, POSE_B)]), atol=ATOL, rtol=1e-4)
    snap = world.snapshot()
    assert snap.mesh_enable[0, :2].tolist() == [0, 1]


def test_update_vertices_refits(world):
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    world.add_mesh("b", SPH_V, SPH_T, POSE_B)
    assert world.mesh_info("a")["closed_shell"] is True
    new_v = BOX_V * np.array([1.6, 0.7, 1.2]) + np.array([0.02, 0.0, -0.01])
    assert world.update_vertices("a", new_v) == 3
    # The refit's sign data has no classification flag: the full search again.
    assert world.mesh_info("a")["closed_shell"] is False
    expected = ref_cost([ref.RefMesh(new_v, BOX_T, POSE_A), ref.RefMesh(SPH_V, SPH_T, POSE_B)])
    old = ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A), ref.RefMesh(SPH_V, SPH_T, POSE_B)])
    assert not np.allclose(expected, old, atol=1e-3)
    np.testing.assert_allclose(world_cost(world), expected, atol=ATOL, rtol=1e-4)
    v, t, pose, _ = world.mesh_geometry("a")
    np.testing.assert_allclose(v, new_v, atol=1e-6)
    np.testing.assert_allclose(pose, POSE_A)
    # two ids sharing identical geometry: updating one leaves the other alone
    world.add_mesh("c", SPH_V, SPH_T, POSE_A)
    shrunk = SPH_V * 0.5
    world.update_vertices("c", shrunk)
    expected = ref_cost([ref.RefMesh(new_v, BOX_T, POSE_A), ref.RefMesh(SPH_V, SPH_T, POSE_B),
                         ref.RefMesh(shrunk, SPH_T, POSE_A)])
    np.testing.assert_allclose(world_cost(world), expected, atol=ATOL, rtol=1e-4)
    np.testing.assert_allclose(world.mesh_geometry("b")[0], SPH_V, atol=1e-7)


def test_capacity_growth_keeps_old_snapshot_valid(device):
    world = MeshWorld(device=device, num_envs=1, mesh_capacity=1, max_distance=MAX_DIST)
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    old = world.snapshot()
    old_expected = ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A)])
    rng = np.random.default_rng(2)
    state = [ref.RefMesh(BOX_V, BOX_T, POSE_A)]
    for i in range(5):
        pose = np.concatenate([rng.uniform(-0.3, 0.3, 3), ref.random_quaternion(rng)])
        world.add_mesh(f"s{i}", SPH_V, SPH_T, pose)
        state.append(ref.RefMesh(SPH_V, SPH_T, pose))
    world.remove_mesh("a")  # the old snapshot still references this mesh
    state.pop(0)
    snap = world.snapshot()
    assert snap.mesh_idx.shape[1] >= 5 and int(snap.n_env_mesh[0]) == 5
    assert old.mesh_idx.shape[1] == 1 and old.revision == 1
    np.testing.assert_allclose(world_cost(world), ref_cost(state), atol=ATOL, rtol=1e-4)
    # evaluate directly against the old snapshot: the one-box world
    s = torch.tensor(SPHERES, dtype=torch.float32, device=device)
    out = (torch.empty(s.shape[:-1], device=device), torch.empty(s.shape[:-1] + (4,), device=device),
           torch.empty(s.shape[:-1], dtype=torch.uint8, device=device))
    cost = SdfMeshWarpPy.apply(s, *out, scalar(1.0, device), scalar(ETA, device), old.mesh_idx,
                               old.mesh_pose_inverse, old.mesh_enable, old.n_env_mesh, scalar(MAX_DIST, device),
                               None, False, False, old.sign_method)
    np.testing.assert_allclose(cost.cpu().double().numpy(), old_expected, atol=ATOL, rtol=1e-4)


def test_revision_counts_applied_changes_only(world):
    revs = [world.revision]
    revs.append(world.add_mesh("a", BOX_V, BOX_T))
    revs.append(world.set_pose("a", POSE_A))
    revs.append(world.set_enabled("a", False))
    revs.append(world.set_enabled("a", True))
    revs.append(world.update_vertices("a", BOX_V * 1.1))
    revs.append(world.add_mesh("a", SPH_V, SPH_T))
    revs.append(world.add_mesh("a", SPH_V, SPH_T, env=1))
    revs.append(world.remove_mesh("a"))
    assert revs == list(range(9)) and world.revision == 8
    with pytest.raises(KeyError):
        world.remove_mesh("a")
    with pytest.raises(ValueError):
        world.set_pose("a", [0, 0, 0, 2, 0, 0, 0], env=1)
    assert world.revision == 8 and world.snapshot().revision == 8


def _bad_add_cases():
    v, t = BOX_V, BOX_T
    nan_v = v.copy()
    nan_v[3, 1] = np.nan
    inf_v = v.copy()
    inf_v[0, 0] = np.inf
    oob = t.copy()
    oob[5, 2] = len(v)
    neg = t.copy()
    neg[0, 0] = -1
    return {
        "empty vertices": (np.zeros((0, 3)), t, None, 0),
        "empty triangles": (v, np.zeros((0, 3), dtype=np.int64), None, 0),
        "nan vertex": (nan_v, t, None, 0),
        "inf vertex": (inf_v, t, None, 0),
        "index out of range": (v, oob, None, 0),
        "negative index": (v, neg, None, 0),
        "triangles (T,4)": (v, np.concatenate([t, t[:, :1]], axis=1), None, 0),
        "triangles (T,2)": (v, t[:, :2], None, 0),
        "vertices (V,2)": (v[:, :2], t, None, 0),
        "vertices (V,4)": (np.concatenate([v, v[:, :1]], axis=1), t, None, 0),
        "vertices 3d array": (v[None], t, None, 0),
        "non-unit quaternion": (v, t, [0, 0, 0, 2.0, 0, 0, 0], 0),
        "zero quaternion": (v, t, [0, 0, 0, 0, 0, 0, 0], 0),
        "nan quaternion": (v, t, [0, 0, 0, np.nan, 0, 0, 1], 0),
        "nan position": (v, t, [np.nan, 0, 0, 1, 0, 0, 0], 0),
        "pose of 6 values": (v, t, [0, 0, 0, 1, 0, 0], 0),
        "env out of range": (v, t, None, 2),
        "negative env": (v, t, None, -1),
    }


BAD_ADD = _bad_add_cases()


def _state(world: MeshWorld):
    return (world.revision, {e: sorted(world.mesh_names(e)) for e in range(world.num_envs)},
            world_cost(world), world.mesh_geometry("a")[2].copy())


def _assert_unchanged(world: MeshWorld, before) -> None:
    after = _state(world)
    assert after[0] == before[0] and after[1] == before[1]
    np.testing.assert_array_equal(after[2], before[2])
    np.testing.assert_array_equal(after[3], before[3])


@pytest.mark.parametrize("case", sorted(BAD_ADD))
def test_bad_add_rejected_and_world_unchanged(world, case):
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    before = _state(world)
    v, t, pose, env = BAD_ADD[case]
    for name in ("a", "new"):  # replacing an existing id and adding a new one
        with pytest.raises(ValueError):
            world.add_mesh(name, v, t, pose, env=env)
        _assert_unchanged(world, before)
    np.testing.assert_allclose(before[2], ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A)]), atol=ATOL, rtol=1e-4)


def test_bad_mutations_rejected_and_world_unchanged(world):
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    world.add_mesh("b", SPH_V, SPH_T, POSE_B)
    before = _state(world)
    nan_v = BOX_V.copy()
    nan_v[0, 0] = np.nan
    bad_calls = [
        (KeyError, lambda: world.remove_mesh("missing")),
        (KeyError, lambda: world.set_pose("missing", POSE_A)),
        (KeyError, lambda: world.set_enabled("missing", False)),
        (KeyError, lambda: world.update_vertices("missing", BOX_V)),
        (KeyError, lambda: world.mesh_geometry("missing")),
        (KeyError, lambda: world.remove_mesh("a", env=1)),  # exists in env 0 only
        (ValueError, lambda: world.set_pose("a", [0, 0, 0, 1, 1, 0, 0])),
        (ValueError, lambda: world.set_pose("a", [0, 0, 0, 0, 0, 0, 0])),
        (ValueError, lambda: world.set_pose("a", [0, 0, np.inf, 1, 0, 0, 0])),
        (ValueError, lambda: world.set_pose("a", POSE_A, env=5)),
        (ValueError, lambda: world.set_enabled("a", False, env=-1)),
        (ValueError, lambda: world.remove_mesh("a", env=2)),
        (ValueError, lambda: world.update_vertices("a", nan_v)),
        (ValueError, lambda: world.update_vertices("a", BOX_V[:7])),  # vertex count changes
        (ValueError, lambda: world.update_vertices("a", BOX_V[:, :2])),
        (ValueError, lambda: world.add_mesh("", BOX_V, BOX_T)),
    ]
    for exc, call in bad_calls:
        with pytest.raises(exc):
            call()
        _assert_unchanged(world, before)


def test_world_constructor_validation():
    with pytest.raises(ValueError):
        MeshWorld(device="cpu", num_envs=0)
    with pytest.raises(ValueError):
        MeshWorld(device="cpu", mesh_capacity=0)
    with pytest.raises(ValueError):
        MeshWorld(device="cpu", max_distance=-1.0)
    with pytest.raises(ValueError):
        MeshWorld(device="cpu", sign_method="bogus")
    with pytest.raises(ValueError):
        MeshWorld(device="tpu")
    w = MeshWorld(device="auto")
    assert w.device.type in ("cpu", "cuda") and w.num_envs == 1


@pytest.mark.parametrize("method", ["default", "normal", "winding_number", "parity"])
def test_sign_methods_in_world(device, method):
    world = MeshWorld(device=device, num_envs=1, sign_method=method, max_distance=MAX_DIST)
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    world.add_mesh("b", SPH_V, SPH_T, POSE_B)
    meshes = [ref.RefMesh(BOX_V, BOX_T, POSE_A), ref.RefMesh(SPH_V, SPH_T, POSE_B)]
    keep = np.ones(SPHERES.shape[2], dtype=bool)
    for m in meshes:  # drop centres that sit on a surface (their sign is a coin toss)
        keep &= np.abs(m.signed_distance_world(SPHERES[0, 0, :, :3])[0]) > 1e-3
    s = SPHERES[:, :, keep]
    np.testing.assert_allclose(world_cost(world, s), ref_cost(meshes, s), atol=ATOL, rtol=1e-4)


def test_winding_number_world_open_mesh(device):
    world = MeshWorld(device=device, sign_method="winding_number", max_distance=MAX_DIST)
    cv, ct = ref.open_box((0.4, 0.4, 0.4))
    world.add_mesh("cup", cv, ct)
    pts = np.array([[0.0, 0.0, -0.1], [0.05, 0.02, 0.0], [0.0, 0.0, 0.5], [0.3, 0.0, 0.0]])
    dist, grad = world.signed_distance(torch.tensor(pts, dtype=torch.float32))
    sd, _, _ = ref.signed_distance(pts, cv, ct)
    assert sd[0] < 0 and sd[1] < 0 and sd[2] > 0 and sd[3] > 0
    np.testing.assert_allclose(dist.cpu().numpy(), sd, atol=ATOL)


def test_concurrent_readers_see_consistent_worlds(device):
    """Readers evaluating while a writer adds, moves, refits, disables and removes meshes: every
    result equals the reference cost of the world state at the revision it reports."""
    world = MeshWorld(device=device, num_envs=1, mesh_capacity=1, max_distance=MAX_DIST)
    rng = np.random.default_rng(3)
    state: dict[str, ref.RefMesh] = {}
    ops = []

    def op(fn, update):
        ops.append((fn, update))

    def add(name, v, t, pose):
        op(lambda: world.add_mesh(name, v, t, pose), lambda s: s.__setitem__(name, ref.RefMesh(v, t, pose)))

    def move(name, pose):
        op(lambda: world.set_pose(name, pose), lambda s: setattr(s[name], "pose", pose))

    def enable(name, flag):
        op(lambda: world.set_enabled(name, flag), lambda s: setattr(s[name], "enabled", flag))

    def refit(name, v):
        op(lambda: world.update_vertices(name, v), lambda s: setattr(s[name], "vertices", v))

    def remove(name):
        op(lambda: world.remove_mesh(name), lambda s: s.pop(name))

    def pose():
        return np.concatenate([rng.uniform(-0.3, 0.3, 3), ref.random_quaternion(rng)])

    for cycle in range(2):
        add("a", BOX_V, BOX_T, pose())
        add("b", SPH_V, SPH_T, pose())
        move("a", pose())
        add("c", *ref.box((0.1, 0.5, 0.1)), pose())
        enable("b", False)
        refit("a", BOX_V * rng.uniform(0.6, 1.4, 3))
        add("a", SPH_V * 1.3, SPH_T, pose())  # replaced geometry
        remove("c")
        enable("b", True)
        move("b", pose())
        remove("a")
        remove("b")

    # expected cost at every revision, from the reference
    expected = {world.revision: ref_cost([])}
    for i, (_, update) in enumerate(ops):
        update(state)
        expected[i + 1] = ref_cost(list(state.values()))
    distinct = {tuple(np.round(c.ravel(), 6)) for c in expected.values()}
    assert len(distinct) > len(expected) // 2  # the states really differ

    # distinct (revision, cost) pairs: identical repeats need no second comparison
    results: dict[tuple[int, bytes], tuple[int, np.ndarray]] = {}
    errors: list[BaseException] = []
    done = threading.Event()
    # Evaluations completed per reader; after each change the writer waits until both readers
    # have finished two more (so one that began after the change: every revision is observed).
    progress = threading.Condition()
    finished = [0, 0]
    # Readers give up after a (generous) while, so that a starved writer fails the waits below
    # instead of hanging the test.
    deadline = time.monotonic() + 120.0

    def running() -> bool:
        return not done.is_set() and time.monotonic() < deadline

    def count(k: int) -> None:
        with progress:
            finished[k] += 1
            progress.notify_all()

    s = torch.tensor(SPHERES, dtype=torch.float32, device=device)

    def reader_eval():
        try:
            while running():
                cost, _, rev = world.evaluate_sphere_cost(s, ETA, 1.0, max_distance=MAX_DIST, return_revision=True)
                c = cost.cpu().double().numpy()
                results[(rev, c.tobytes())] = (rev, c)
                count(0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def reader_snapshot():
        try:
            while running():
                with world.reading() as snap:
                    out = (torch.empty(s.shape[:-1], device=device), torch.empty(s.shape[:-1] + (4,), device=device),
                           torch.empty(s.shape[:-1], dtype=torch.uint8, device=device))
                    cost = SdfMeshWarpPy.apply(s, *out, scalar(1.0, device), scalar(ETA, device), snap.mesh_idx,
                                               snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh,
                                               scalar(MAX_DIST, device), None, False, False, snap.sign_method)
                    c = cost.cpu().double().numpy()
                    results[(snap.revision, c.tobytes())] = (snap.revision, c)
                count(1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def readers_moved_on(timeout: float = 60.0) -> bool:
        with progress:
            target = [n + 2 for n in finished]
            return progress.wait_for(lambda: all(n >= t for n, t in zip(finished, target)) or errors, timeout)

    threads = [threading.Thread(target=reader_eval), threading.Thread(target=reader_snapshot)]
    for th in threads:
        th.start()
    try:
        assert readers_moved_on(), "the readers did not start"
        for i, (fn, _) in enumerate(ops):
            # liveness: a writer waits for at most the evaluations already running, never for a
            # stream of readers that keep overlapping each other (the readers never pause here)
            fn()
            assert readers_moved_on(), f"readers stalled (or gave up on a starved writer) after change {i + 1}"
    finally:
        done.set()
        for th in threads:
            th.join(timeout=60)
    assert not errors, errors
    seen = {rev for rev, _ in results.values()}
    assert seen >= set(range(1, len(ops) + 1)), f"readers missed states: {sorted(set(range(1, len(ops) + 1)) - seen)}"
    for rev, cost in results.values():
        np.testing.assert_allclose(cost, expected[rev], atol=ATOL, rtol=1e-4, err_msg=f"revision {rev}")


# ---------------------------------------------------------------- regressions found in review
def test_update_vertices_keeps_a_private_read_only_copy():
    world = MeshWorld(device="cpu", max_distance=MAX_DIST)
    world.add_mesh("box", BOX_V, BOX_T, POSE_A)
    grown = np.ascontiguousarray(BOX_V * 1.5, dtype=np.float32)
    world.update_vertices("box", grown)
    grown[:] = 0.0  # the caller reuses its buffer
    stored, _, _, _ = world.mesh_geometry("box")
    np.testing.assert_allclose(stored, BOX_V * 1.5, rtol=1e-6)
    assert not stored.flags.writeable
    np.testing.assert_allclose(world_cost(world), ref_cost([ref.RefMesh(BOX_V * 1.5, BOX_T, POSE_A)]), atol=ATOL)


def test_refit_that_grows_a_mesh_updates_the_cull_radius():
    # A point deep inside the grown box but outside the old bounding sphere must get its cost.
    world = MeshWorld(device="cpu", max_distance=0.05)
    v, t = ref.box((2.0, 2.0, 2.0))
    world.add_mesh("box", v, t)
    world.update_vertices("box", v * 3.0)
    spheres = np.array([[[[0.0, 0.0, 2.5, 0.05]]]])
    cost, _ = world.evaluate_sphere_cost(torch.tensor(spheres, dtype=torch.float32), ETA, 1.0, max_distance=0.05)
    expected = ref.sphere_cost(spheres, [[ref.RefMesh(v * 3.0, t, np.array([0, 0, 0, 1, 0, 0, 0.]))]], ETA, 1.0, 0.05)[0]
    assert expected.ravel()[0] > 0.5
    np.testing.assert_allclose(cost.numpy().ravel(), expected.ravel(), atol=ATOL)


def test_nested_reading_does_not_deadlock_with_a_waiting_refit():
    world = MeshWorld(device="cpu", max_distance=MAX_DIST)
    world.add_mesh("box", BOX_V, BOX_T, POSE_A)
    spheres = torch.tensor(SPHERES, dtype=torch.float32)
    entered, refit_done = threading.Event(), threading.Event()

    def refit():
        entered.wait(60.0)
        world.update_vertices("box", BOX_V * 1.1)
        refit_done.set()

    writer = threading.Thread(target=refit, daemon=True)
    writer.start()
    finished = threading.Event()
    lock = world._refit_lock
    writer_waited = []

    def reader():
        with world.reading():
            entered.set()
            deadline = time.monotonic() + 60.0
            while not lock._writers_waiting and time.monotonic() < deadline:  # until the writer waits
                time.sleep(0.005)
            writer_waited.append(bool(lock._writers_waiting))
            world.sphere_cost(spheres, ETA)  # re-enters the read lock
        finished.set()

    threading.Thread(target=reader, daemon=True).start()
    assert finished.wait(120.0), "nested reading() deadlocked behind a waiting refit"
    assert writer_waited == [True], "the refit never waited for the reader"
    assert refit_done.wait(60.0)


def test_repeated_pose_or_enable_is_not_a_new_revision():
    world = MeshWorld(device="cpu", max_distance=MAX_DIST)
    world.add_mesh("a", BOX_V, BOX_T, POSE_A)
    assert world.set_pose("a", POSE_B) == 2
    assert world.set_pose("a", POSE_B) == 2  # a re-sent pose message
    assert world.set_enabled("a", True) == 2
    assert world.set_enabled("a", False) == 3
    assert world.set_enabled("a", False) == 3
    np.testing.assert_array_equal(world_cost(world), 0.0)


def _snapshot_arrays(snap) -> dict:
    return {name: getattr(snap, name).detach().cpu().numpy().copy()
            for name in ("mesh_idx", "mesh_pose_inverse", "mesh_enable", "n_env_mesh", "sign_methods")}


def test_incremental_snapshots_equal_a_rebuild_and_never_change(device):
    """Random add/remove/set_pose/set_enabled/update_vertices across environments: after every
    change the incrementally published snapshot equals a from-scratch rebuild, and the poses,
    enable flags and counts equal what this test tracks itself; snapshots taken earlier keep
    exactly the values they had when taken (copy-on-write)."""
    rng = np.random.default_rng(9)
    num_envs = 3
    world = MeshWorld(device=device, num_envs=num_envs, mesh_capacity=2, max_distance=MAX_DIST,
                      sign_method="normal")
    shapes = [ref.box((0.2, 0.3, 0.1)), ref.box((0.1, 0.1, 0.4)), (SPH_V, SPH_T)]
    tracked: list[dict] = [{} for _ in range(num_envs)]  # env -> name -> [pose, enabled, vertices]
    taken = []
    for step in range(120):
        env = int(rng.integers(num_envs))
        names = list(tracked[env])
        op = rng.choice(["add", "add", "remove", "pose", "pose", "pose", "enable", "vertices"])
        pose = np.concatenate([rng.uniform(-0.5, 0.5, 3), ref.random_quaternion(rng)])
        if op == "add" or not names:
            name = f"m{int(rng.integers(6))}"
            v, t = shapes[int(rng.integers(len(shapes)))]
            v = v + rng.uniform(-0.3, 0.3, 3)  # world-coordinate-like vertices: a non-zero centre
            enabled = bool(rng.integers(2))
            world.add_mesh(name, v, t, pose, env=env, enabled=enabled)
            tracked[env][name] = [pose, enabled, v]
        else:
            name = names[int(rng.integers(len(names)))]
            if op == "remove":
                world.remove_mesh(name, env)
                del tracked[env][name]
            elif op == "pose":
                world.set_pose(name, pose, env)
                tracked[env][name][0] = pose
            elif op == "enable":
                flag = not tracked[env][name][1]
                world.set_enabled(name, flag, env)
                tracked[env][name][1] = flag
            else:
                v = tracked[env][name][2] * rng.uniform(0.8, 1.2)
                world.update_vertices(name, v, env, pose=pose)
                tracked[env][name][0] = pose
                tracked[env][name][2] = v
        snap = world.snapshot()
        got = _snapshot_arrays(snap)
        want = _snapshot_arrays(world._build_snapshot())
        for key in got:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"step {step} {op}: {key}")
        for e in range(num_envs):
            names = world.mesh_names(e)
            assert sorted(names) == sorted(tracked[e]) and got["n_env_mesh"][e] == len(names)
            for i, name in enumerate(names):
                pose_e, enabled_e, _ = tracked[e][name]
                centre = np.array(world.mesh_info(name, e)["bounding_centre"])
                inverse = ref.pose_inverse(pose_e)
                np.testing.assert_allclose(got["mesh_pose_inverse"][e, i, :3], inverse[:3] - centre, atol=2e-6)
                np.testing.assert_allclose(got["mesh_pose_inverse"][e, i, 3:7], inverse[3:7], atol=1e-6)
                assert got["mesh_enable"][e, i] == int(enabled_e)
        if step % 7 == 0:
            taken.append((snap, got))
    assert len({id(s.mesh_pose_inverse) for s, _ in taken}) == len(taken)
    for snap, values in taken:
        now = _snapshot_arrays(snap)
        for key in values:
            np.testing.assert_array_equal(now[key], values[key], err_msg=f"revision {snap.revision}: {key}")


def test_pose_update_does_not_alias_earlier_snapshot_tensors(device):
    world = MeshWorld(device=device, num_envs=4, mesh_capacity=2, max_distance=MAX_DIST, sign_method="normal")
    world.add_mesh("a", BOX_V, BOX_T, POSE_A, env=2)
    before = world.snapshot()
    kept = before.mesh_pose_inverse.clone()
    world.set_pose("a", POSE_B, env=2)
    world.set_enabled("a", False, env=2)
    after = world.snapshot()
    assert torch.equal(before.mesh_pose_inverse, kept)
    assert before.mesh_enable[2, 0] == 1 and after.mesh_enable[2, 0] == 0
    assert after.mesh_pose_inverse.data_ptr() != before.mesh_pose_inverse.data_ptr()
    np.testing.assert_allclose(after.mesh_pose_inverse[2, 0, 3:7].cpu().numpy(), ref.pose_inverse(POSE_B)[3:7],
                               atol=1e-6)


def test_converted_arguments_stay_valid_through_the_launch(device):
    """Python-number scalars, an int64 env index and strided spheres are converted per call; the
    converted copies must live until the kernel has read them (a descriptor holds only an address)."""
    world = MeshWorld(device=device, num_envs=2, mesh_capacity=2, max_distance=MAX_DIST, sign_method="normal")
    world.add_mesh("a", BOX_V, BOX_T, POSE_A, env=1)
    snap = world.snapshot()
    wide = torch.zeros((1, 1, SPHERES.shape[2], 8), dtype=torch.float32, device=device)
    wide[..., ::2] = torch.tensor(SPHERES, dtype=torch.float32, device=device)
    s = wide[..., ::2]  # not contiguous
    assert not s.is_contiguous()
    expected = ref_cost([ref.RefMesh(BOX_V, BOX_T, POSE_A)]) * 2.0
    for _ in range(3):
        outs = (torch.empty(s.shape[:-1], device=device), torch.empty(s.shape[:-1] + (4,), device=device),
                torch.empty(s.shape[:-1], dtype=torch.uint8, device=device))
        cost = SdfMeshWarpPy.apply(s, *outs, 2.0, ETA, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                                   snap.n_env_mesh, MAX_DIST, torch.ones(1, dtype=torch.int64, device=device),
                                   False, False, snap.sign_methods.to(torch.int64))
        np.testing.assert_allclose(cost.cpu().double().numpy(), expected, atol=2 * ATOL, rtol=1e-4)
