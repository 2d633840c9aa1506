"""Cached launch arguments follow the tensors they wrap.

warp_primitives keeps the validated descriptors of tensors a caller passes call after call (a
snapshot's world tensors, scalar tensors, per-slot sign tensors). Here each of those tensors is
replaced between calls -- set_() onto new storage, a new tensor of the same shape, its storage
freed and reallocated (often at the same address), written in place when the descriptor wraps a
converted copy, re-shaped -- and the cost must follow, checked against the brute-force numpy
reference (test/reference.py), for SdfMeshWarpPy, SweptSdfMeshWarpPy and MeshWorld's API.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import warp as wp

import reference as ref
from conftest import build_warp_env, scalar
from robot_sdf import MeshWorld
from robot_sdf.types import SignMethod
from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy
from robot_sdf.world_args import register_mesh, unregister_mesh

ETA = 0.05
MAX_DIST = 0.5
ATOL = 2e-4

BOX_V, BOX_T = ref.box((0.3, 0.3, 0.3))
BIG_V, BIG_T = ref.box((0.5, 0.4, 0.4))
SPH_V, SPH_T = ref.icosphere(0.15, 2)
POSE_A = np.array([0.2, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0])
POSE_B = np.array([-0.05, 0.05, 0.0, np.cos(0.3), 0.0, np.sin(0.3), 0.0])
POSE_S = np.array([-0.25, 0.0, 0.05, 1.0, 0.0, 0.0, 0.0])


def probe_spheres(shape: tuple, seed: int = 0, min_abs_sd: float = 3e-3) -> np.ndarray:
    """Spheres (shape + (4,)) over the test region, centres at least min_abs_sd from every surface
    the tests use (on a surface the sign is a coin toss for any implementation)."""
    rng = np.random.default_rng(seed)
    surfaces = [ref.RefMesh(v, t, p) for v, t, p in
                ((BOX_V, BOX_T, POSE_A), (BOX_V, BOX_T, POSE_B), (BIG_V, BIG_T, POSE_A), (SPH_V, SPH_T, POSE_S))]
    n = int(np.prod(shape))
    kept = np.empty((0, 3))
    while len(kept) < n:
        p = rng.uniform([-0.5, -0.3, -0.3], [0.5, 0.3, 0.3], size=(2 * n, 3))
        ok = np.ones(len(p), bool)
        for m in surfaces:
            ok &= np.abs(m.signed_distance_world(p)[0]) > min_abs_sd
        kept = np.concatenate([kept, p[ok]])
    r = rng.uniform(0.0, 0.08, size=(n, 1))
    return np.concatenate([kept[:n], r], axis=1).reshape(shape + (4,))


SPHERES = probe_spheres((2, 1, 20))
TRAJECTORIES = probe_spheres((1, 4, 6), seed=1)

# World A, and for each kept argument a world B differing in that argument only:
# (meshes per slot, slots counted, eta, weight).
WORLD_A = ([(BOX_V, BOX_T, POSE_A, True), (SPH_V, SPH_T, POSE_S, True)], 2, ETA, 1.0)
WORLD_B = {
    "mesh_idx": ([(BIG_V, BIG_T, POSE_A, True), (SPH_V, SPH_T, POSE_S, True)], 2, ETA, 1.0),
    "mesh_pose_inverse": ([(BOX_V, BOX_T, POSE_B, True), (SPH_V, SPH_T, POSE_S, True)], 2, ETA, 1.0),
    "mesh_enable": ([(BOX_V, BOX_T, POSE_A, False), (SPH_V, SPH_T, POSE_S, True)], 2, ETA, 1.0),
    "n_env_mesh": ([(BOX_V, BOX_T, POSE_A, True), (SPH_V, SPH_T, POSE_S, True)], 1, ETA, 1.0),
    "activation_distance": ([(BOX_V, BOX_T, POSE_A, True), (SPH_V, SPH_T, POSE_S, True)], 2, 0.12, 1.0),
    "weight": ([(BOX_V, BOX_T, POSE_A, True), (SPH_V, SPH_T, POSE_S, True)], 2, ETA, 2.5),
}
WORLD_FIELDS = ("mesh_idx", "mesh_pose_inverse", "mesh_enable", "n_env_mesh")


def ref_meshes(world) -> list[ref.RefMesh]:
    """The reference meshes the kernel must see: the counted, enabled slots."""
    slots, counted = world[0], world[1]
    return [ref.RefMesh(v, t, p, enabled) for v, t, p, enabled in slots[:counted]]


def kernel_args(world, device: str, keep: list) -> dict:
    """The kept arguments of the primitives for ``world`` (fresh tensors)."""
    slots, counted, eta, weight = world
    wenv = build_warp_env([[ref.RefMesh(v, t, p, e) for v, t, p, e in slots]], device)
    keep.append(wenv.meshes)  # the Warp meshes must outlive the calls
    wenv.mesh_enable[0, :len(slots)] = torch.tensor([int(e) for *_, e in slots], dtype=torch.uint8)
    wenv.n_env_mesh.fill_(counted)
    return {"mesh_idx": wenv.mesh_idx, "mesh_pose_inverse": wenv.mesh_pose_inverse,
            "mesh_enable": wenv.mesh_enable, "n_env_mesh": wenv.n_env_mesh,
            "activation_distance": scalar(eta, device), "weight": scalar(weight, device)}


def sdf_cost(args: dict, device: str, sign_method=SignMethod.AUTO):
    """SdfMeshWarpPy cost (b,h,n) and the spheres' gradient after backward of the summed cost."""
    qs = torch.tensor(SPHERES, dtype=torch.float32, device=device).requires_grad_()
    b, h, n = qs.shape[:3]
    out_cost = torch.full((b, h, n), float("nan"), device=device)
    out_grad = torch.full((b, h, n, 4), 1e9, device=device)
    sparsity = torch.zeros((b, h, n), dtype=torch.uint8, device=device)
    cost = SdfMeshWarpPy.apply(qs, out_cost, out_grad, sparsity, args["weight"], args["activation_distance"],
                               args["mesh_idx"], args["mesh_pose_inverse"], args["mesh_enable"], args["n_env_mesh"],
                               args["max_dist"], None, False, False, sign_method)
    cost.sum().backward()
    return cost.detach().cpu().double().numpy(), qs.grad[..., :3].cpu().double().numpy()


def swept_cost(args: dict, device: str) -> np.ndarray:
    qs = torch.tensor(TRAJECTORIES, dtype=torch.float32, device=device)
    b, h, n = qs.shape[:3]
    out_cost = torch.full((b, h, n), float("nan"), device=device)
    out_grad = torch.zeros((b, h, n, 4), device=device)
    sparsity = torch.zeros((b, h, n), dtype=torch.uint8, device=device)
    SweptSdfMeshWarpPy.apply(qs, out_cost, out_grad, sparsity, args["weight"], args["activation_distance"],
                             args["speed_dt"], args["mesh_idx"], args["mesh_pose_inverse"], args["mesh_enable"],
                             args["n_env_mesh"], args["max_dist"], 2, False, None, False)
    return out_cost.cpu().double().numpy()


def check_sdf(args: dict, world, device: str) -> None:
    cost, grad = sdf_cost(args, device)
    want_cost, want_grad = ref.sphere_cost(SPHERES, [ref_meshes(world)], world[2], world[3], MAX_DIST)
    np.testing.assert_allclose(cost, want_cost, atol=ATOL, rtol=1e-4)
    np.testing.assert_allclose(grad, want_grad, atol=5e-4, rtol=1e-3)


def check_swept(args: dict, world, device: str) -> None:
    want = ref.swept_sphere_cost(TRAJECTORIES, [ref_meshes(world)], world[2], world[3], MAX_DIST, 2)[0]
    np.testing.assert_allclose(swept_cost(args, device), want, atol=ATOL, rtol=1e-4)


def replace(args: dict, field: str, new: torch.Tensor, how: str) -> None:
    """Give ``args[field]`` the values of ``new`` the way a caller might."""
    if how == "set_":  # the same tensor object, moved onto other storage
        args[field].set_(new.clone())
    elif how == "new":  # a new tensor of the same shape; the old one is dropped
        args[field] = new.clone()
    elif how == "freed":
        # The tensor's storage is freed, a same-sized one allocated (the allocator tends to hand
        # the freed block back: the same address) and the same tensor object pointed at it.
        t = args[field]
        t.set_(torch.empty(0, dtype=t.dtype, device=t.device))
        fresh = torch.empty_like(new)
        fresh.copy_(new)
        t.set_(fresh)
    elif how == "copy_":  # written in place
        args[field].copy_(new)
    else:  # pragma: no cover
        raise AssertionError(how)


REPLACEMENTS = ("set_", "new", "freed", "copy_")


@pytest.mark.parametrize("how", REPLACEMENTS)
@pytest.mark.parametrize("field", list(WORLD_B))
@pytest.mark.parametrize("function", ["sdf", "swept"])
def test_cost_follows_a_replaced_tensor(device, function, field, how):
    keep = []
    args = kernel_args(WORLD_A, device, keep)
    args["max_dist"], args["speed_dt"] = scalar(MAX_DIST, device), scalar(0.1, device)
    check = check_sdf if function == "sdf" else check_swept
    check(args, WORLD_A, device)
    check(args, WORLD_A, device)  # served from the caches now
    replace(args, field, kernel_args(WORLD_B[field], device, keep)[field], how)
    check(args, WORLD_B[field], device)
    check(args, WORLD_B[field], device)


@pytest.mark.parametrize("how", ["set_", "freed", "copy_"])
@pytest.mark.parametrize("function", ["sdf", "swept"])
def test_inference_tensors_are_followed(device, function, how):
    """Inference tensors have no version counter: their entries are checked by layout, and what
    depends on their values (converted copies) is not kept."""
    keep = []
    with torch.inference_mode():
        args = kernel_args(WORLD_A, device, keep)
        args["max_dist"], args["speed_dt"] = scalar(MAX_DIST, device), scalar(0.1, device)
        args["mesh_pose_inverse"] = args["mesh_pose_inverse"].double()  # a converted copy per call
    check = check_sdf if function == "sdf" else check_swept
    for field in ("mesh_pose_inverse", "mesh_enable", "weight"):
        world_b = WORLD_B[field]
        check(args, WORLD_A, device)
        check(args, WORLD_A, device)
        with torch.inference_mode():
            saved = args[field].clone()
            replace(args, field, kernel_args(world_b, device, keep)[field].to(saved.dtype), how)
        check(args, world_b, device)
        with torch.inference_mode():
            replace(args, field, saved, how)
    check(args, WORLD_A, device)


@pytest.mark.parametrize("function", ["sdf", "swept"])
def test_converted_copy_follows_in_place_writes(device, function):
    """A float64 pose tensor is converted once and the copy kept: writing the original in place
    must reach the kernel."""
    keep = []
    args = kernel_args(WORLD_A, device, keep)
    args["max_dist"], args["speed_dt"] = scalar(MAX_DIST, device), scalar(0.1, device)
    args["mesh_pose_inverse"] = args["mesh_pose_inverse"].double()
    check = check_sdf if function == "sdf" else check_swept
    check(args, WORLD_A, device)
    check(args, WORLD_A, device)
    moved = kernel_args(WORLD_B["mesh_pose_inverse"], device, keep)["mesh_pose_inverse"]
    args["mesh_pose_inverse"].copy_(moved)
    check(args, WORLD_B["mesh_pose_inverse"], device)


@pytest.mark.parametrize("function", ["sdf", "swept"])
def test_reshaped_world_is_followed_and_a_bad_shape_refused(device, function):
    """Every world tensor set_() onto a world of another capacity (shapes and strides baked into
    the descriptors change); then one of them alone onto a wrong shape: refused, nothing stale."""
    keep = []
    args = kernel_args(WORLD_A, device, keep)
    args["max_dist"], args["speed_dt"] = scalar(MAX_DIST, device), scalar(0.1, device)
    check = check_sdf if function == "sdf" else check_swept
    check(args, WORLD_A, device)
    check(args, WORLD_A, device)
    wider = ([*WORLD_B["mesh_pose_inverse"][0], (SPH_V, SPH_T, POSE_A, False)], 3, ETA, 1.0)
    new = kernel_args(wider, device, keep)
    for field in WORLD_FIELDS:
        args[field].set_(new[field].clone())
    check(args, wider, device)
    check(args, wider, device)
    args["mesh_pose_inverse"].set_(torch.zeros((1, 5, 8), device=device))
    with pytest.raises(ValueError, match="mesh_pose_inverse"):
        check(args, wider, device)


def test_per_slot_sign_tensor_written_in_place_is_checked_again(device):
    """Per-slot sign methods are checked against the meshes' winding-number support once and the
    result kept: writing winding_number into a slot whose mesh lacks that support must be refused
    on the next call (the kernel would read memory the mesh does not have)."""
    keep = []
    args = kernel_args(WORLD_A, device, keep)
    args["max_dist"] = scalar(MAX_DIST, device)
    plain = wp.Mesh(points=wp.array(BOX_V.astype(np.float32), dtype=wp.vec3, device=device),
                    indices=wp.array(BOX_T.astype(np.int32).reshape(-1), dtype=wp.int32, device=device),
                    support_winding_number=False)
    register_mesh(plain.id, False)
    try:
        args["mesh_idx"][0, 0] = int(np.uint64(plain.id).astype(np.int64))
        signs = torch.full((1, 2), int(SignMethod.NORMAL), dtype=torch.uint8, device=device)
        for _ in range(2):
            cost, _ = sdf_cost(args, device, signs)
            np.testing.assert_allclose(cost, ref.sphere_cost(SPHERES, [ref_meshes(WORLD_A)], ETA, 1.0, MAX_DIST)[0],
                                       atol=ATOL, rtol=1e-4)
        signs[0, 0] = int(SignMethod.WINDING_NUMBER)
        with pytest.raises(ValueError, match="winding"):
            sdf_cost(args, device, signs)
        signs[0, 0] = int(SignMethod.NORMAL)
        sdf_cost(args, device, signs)
        # the other way round: winding_number everywhere, then that mesh written into a slot
        signs.fill_(int(SignMethod.WINDING_NUMBER))
        args["mesh_idx"][0, 0] = int(keep[0][0].id)  # the box of world A, with winding-number support
        for _ in range(2):
            cost, _ = sdf_cost(args, device, signs)
            np.testing.assert_allclose(cost, ref.sphere_cost(SPHERES, [ref_meshes(WORLD_A)], ETA, 1.0, MAX_DIST)[0],
                                       atol=ATOL, rtol=1e-4)
        args["mesh_idx"][0, 0] = int(np.uint64(plain.id).astype(np.int64))
        with pytest.raises(ValueError, match="winding"):
            sdf_cost(args, device, signs)
    finally:
        unregister_mesh(plain.id)


def test_mesh_world_api_follows_every_publish(device):
    """MeshWorld publishes fresh tensors on every change and drops the old ones: through more
    changes than the caches hold entries (ids and addresses get reused), every evaluation method
    must match the reference of the state this test tracks."""
    world = MeshWorld(device=device, mesh_capacity=2, max_distance=MAX_DIST)
    state = {"box": [BOX_V, BOX_T, POSE_A, True], "ball": [SPH_V, SPH_T, POSE_S, True]}
    for name, (v, t, p, _) in state.items():
        world.add_mesh(name, v, t, pose=p)
    rng = np.random.default_rng(3)
    spheres = torch.tensor(SPHERES, dtype=torch.float32, device=device)
    points = spheres[..., :3].reshape(-1, 3)
    for step in range(72):
        kind = step % 4
        if kind == 0:
            state["box"][2] = np.concatenate([rng.uniform(-0.1, 0.25, 3), ref.random_quaternion(rng)])
            world.set_pose("box", state["box"][2])
        elif kind == 1:
            state["ball"][3] = not state["ball"][3]
            world.set_enabled("ball", state["ball"][3])
        elif kind == 2:
            world.remove_mesh("box")
            state["box"] = state.pop("box")  # re-added last: the slots move
            world.add_mesh("box", *state["box"][:3], enabled=state["box"][3])
        else:
            state["box"][2] = POSE_A if step % 8 == 3 else POSE_B
            world.set_pose("box", state["box"][2])
        meshes = [ref.RefMesh(v, t, p, e) for v, t, p, e in state.values()]
        want_cost, want_grad = ref.sphere_cost(SPHERES, [meshes], ETA, 1.0, MAX_DIST)
        cost, grad = world.evaluate_sphere_cost(spheres, ETA, 1.0)
        np.testing.assert_allclose(cost.cpu().double().numpy(), want_cost, atol=ATOL, rtol=1e-4)
        np.testing.assert_allclose(grad.cpu().double().numpy(), want_grad, atol=5e-4, rtol=1e-3)
        q = spheres.clone().requires_grad_()
        world.sphere_cost(q, ETA, 1.0).sum().backward()
        np.testing.assert_allclose(q.grad[..., :3].cpu().double().numpy(), want_grad, atol=5e-4, rtol=1e-3)
        if step % 6 == 0:
            dist, _ = world.signed_distance(points)
            want = [m.signed_distance_world(points.cpu().double().numpy())[0] for m in meshes if m.enabled]
            want = np.minimum(np.min(want, axis=0), MAX_DIST) if want else np.full(len(points), MAX_DIST)
            np.testing.assert_allclose(dist.cpu().double().numpy(), want, atol=ATOL)
            swept = world.swept_sphere_cost(torch.tensor(TRAJECTORIES, dtype=torch.float32, device=device),
                                            ETA, 1.0, sweep_steps=2)
            want_swept = ref.swept_sphere_cost(TRAJECTORIES, [meshes], ETA, 1.0, MAX_DIST, 2)[0]
            np.testing.assert_allclose(swept.detach().cpu().double().numpy(), want_swept, atol=ATOL, rtol=1e-4)


class _HostReads:
    """Counts what reads tensor data back to the host (on CUDA each is a device sync):
    Tensor.cpu, .numpy, .item and .tolist, wrapped for the duration of a block."""

    NAMES = ("cpu", "numpy", "item", "tolist")

    def __init__(self, monkeypatch):
        self.count = 0
        self.where: list[str] = []
        for name in self.NAMES:
            original = getattr(torch.Tensor, name)

            def counted(t, *args, _original=original, _name=name, **kwargs):
                self.count += 1
                self.where.append(_name)
                return _original(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)


def _eight_obstacles_world(device, sign_method):
    world = MeshWorld(device=device, sign_method=sign_method, max_distance=MAX_DIST)
    for i in range(8):
        pose = np.array([0.4 * (i % 4) - 0.6, 0.4 * (i // 4) - 0.2, 0.0, 1.0, 0.0, 0.0, 0.0])
        world.add_mesh(f"m{i}", SPH_V if i % 2 else BOX_V, SPH_T if i % 2 else BOX_T, pose)
    return world


@pytest.mark.parametrize("sign_method", ["auto", "winding_number"])
def test_repeated_calls_read_nothing_back(device, monkeypatch, sign_method):
    """After a first call, evaluations of an unchanged world read no tensor back to the host: a
    world changed under inference_mode (8 obstacles: slot BVHs), MeshWorld's plain cost with
    backward, its swept cost, and SdfMeshWarpPy on the snapshot's tensors with its per-slot sign
    methods and with one call-wide sign method. Every call's cost is checked against the first
    (the reference checks of these paths are above and in warp_primitives_test)."""
    with torch.inference_mode():
        world = _eight_obstacles_world(device, sign_method)
    spheres = torch.from_numpy(probe_spheres((2, 3, 16), seed=5).astype(np.float32)).to(device)
    snap = world.snapshot()
    b, h, n, _ = spheres.shape
    outs = (torch.empty(b, h, n, device=device), torch.empty(b, h, n, 4, device=device),
            torch.zeros(b, h, n, dtype=torch.uint8, device=device))
    w, eta, max_d = scalar(1.0, device), scalar(ETA, device), scalar(MAX_DIST, device)
    call_wide = SignMethod.parse(sign_method)

    def evaluate():
        s = spheres.clone().requires_grad_(True)
        plain = world.sphere_cost(s, ETA, 1.0)
        plain.sum().backward()
        swept = world.swept_sphere_cost(spheres, ETA, 1.0, sweep_steps=2)
        per_slot = SdfMeshWarpPy.apply(spheres, *outs, w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                                       snap.n_env_mesh, max_d, None, False, False, snap.sign_methods).clone()
        wide = SdfMeshWarpPy.apply(spheres, *outs, w, eta, snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable,
                                   snap.n_env_mesh, max_d, None, False, False, call_wide).clone()
        return [t.detach() for t in (plain, s.grad, swept, per_slot, wide)]

    first = evaluate()
    assert float(first[0].sum()) > 0.0
    reads = _HostReads(monkeypatch)
    again = [evaluate() for _ in range(2)]
    monkeypatch.undo()
    assert reads.count == 0, f"host reads on repeated calls: {reads.where}"
    for results in again:
        for got, want in zip(results, first):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
