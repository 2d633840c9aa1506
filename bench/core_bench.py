"""Core benchmarks: the Warp cost kernels against a bare traversal floor and Open3D, and scaling.

Everything runs in this process on ``device`` ("cpu" or "cuda[:N]"). Tables:

1. standard scene (bench.scenes: 8 meshes, ~40k triangles, 100k spheres of r = 0.05 m within
   0.2 m of the surfaces, max_dist 0.2 m, activation 0.05 m, sign method "normal"): SdfMeshWarpPy
   forward and forward+backward, SweptSdfMeshWarpPy (sweep_steps 4, 64 x 30 x 52 random-walk
   trajectories), the traversal floor (a bare Warp kernel: per-mesh world->mesh transform and
   wp.mesh_query_point_no_sign, nothing else) with the cost's bound and with max_dist only, on the
   cost's threading and on one thread, and Open3D RaycastingScene.compute_signed_distance;
2. sphere-count scaling (fwd+bwd), 3. triangle-count scaling (BVH build, refit, world.add_mesh,
   fwd+bwd), 4. the MPPI batch 400 x 30 x 52, 5. the four sign methods (fwd), 6. the swept cost
   per sphere against the plain cost on the same trajectories (MPC-like rollouts mostly in free
   space, and the contact-heavy standard trajectories), with the number of cost evaluations per
   sphere, side by side with the old summed-samples rule (bench/legacy_swept.py), 7. free-space
   spheres around a world-frame perception scan (open height field, auto -> winding_number)
   against the floor, 8. meshes built outside robot_sdf: cuRobo-built wp.Mesh tensors
   with the bounding radius pad 0 against the same tensors with it filled and against MeshWorld,
   plain and swept fwd+bwd on one thread, 1k and 100k spheres, robot-like scene (~130k triangles).
"""
from __future__ import annotations

import contextlib
import os
import statistics
import time
from types import SimpleNamespace
from typing import Callable, Iterator

import numpy as np
import torch
import warp as wp

from bench import Stats, emit, fmt_ms, fmt_rate, load_average, measure, section, table  # noqa: F401
from bench import scenes
from bench.curobo_style import CuroboStyleRunner
from bench.legacy_swept import legacy_swept_sphere_cost_kernel
from robot_sdf import MeshWorld, SignMethod, adopt_meshes, kernels
from robot_sdf.launch import descriptor as _as_warp, launch_kernel as _launch, warp_device
from robot_sdf.warp_primitives import Query, SdfMeshWarpPy, SweptSdfMeshWarpPy
from robot_sdf.world_args import constant_arguments

wp.set_module_options({"enable_backward": False})

SIGN = SignMethod.NORMAL
SWEEP_STEPS = 4
CUROBO_STYLE = "cuRobo-style kernels"
SPEED_DT = 0.1


@wp.kernel
def traversal_floor_kernel(
    spheres: wp.array(dtype=wp.vec4),
    mesh_idx: wp.array2d(dtype=wp.int64),
    pose_inv: wp.array3d(dtype=wp.float32),
    n_mesh: int,
    max_dist: float,
    eta: float,
    add_radius: int,
    start: int,
    total: int,
    out_dist: wp.array(dtype=wp.float32),
):
    """Unsigned distance to the nearest of env 0's meshes: the same world->mesh transform and
    search bound as the cost (max_dist + r + eta, or max_dist alone), only the BVH traversal."""
    tid = wp.tid() + start
    if tid >= total:
        return
    s = spheres[tid]
    p = wp.vec3(s[0], s[1], s[2])
    bound = max_dist
    if add_radius != 0:
        bound = max_dist + s[3] + eta
    best = bound
    for i in range(n_mesh):
        t, q = kernels.slot_pose(pose_inv, 0, i)
        pm = wp.quat_rotate(q, p) + t
        mesh = wp.uint64(mesh_idx[0, i])
        face = int(0)
        u = float(0.0)
        v = float(0.0)
        if wp.mesh_query_point_no_sign(mesh, pm, bound, face, u, v):
            best = wp.min(best, wp.length(pm - wp.mesh_eval_position(mesh, face, u, v)))
    out_dist[tid] = best


@contextlib.contextmanager
def cpu_threads(n: int) -> Iterator[None]:
    """Run robot_sdf's CPU launches on ``n`` threads inside the block (ROBOT_SDF_CPU_THREADS)."""
    old = os.environ.get("ROBOT_SDF_CPU_THREADS")
    os.environ["ROBOT_SDF_CPU_THREADS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            del os.environ["ROBOT_SDF_CPU_THREADS"]
        else:
            os.environ["ROBOT_SDF_CPU_THREADS"] = old


def build_world(meshes: list[scenes.SceneMesh], device: str, sign_method=SIGN) -> MeshWorld:
    world = MeshWorld(device=device, mesh_capacity=max(1, len(meshes)), sign_method=sign_method,
                      max_distance=scenes.MAX_DIST)
    for m in meshes:
        world.add_mesh(m.name, m.vertices, m.triangles, pose=m.pose)
    return world


class CostRunner:
    """Preallocated buffers and calls of SdfMeshWarpPy / SweptSdfMeshWarpPy, as an MPC would hold
    them (cuRobo style): spheres (b,h,n,4), outputs written in place on every call."""

    def __init__(self, world: MeshWorld, spheres: np.ndarray):
        dev = world.device
        s = torch.from_numpy(np.ascontiguousarray(spheres, np.float32)).to(dev)
        self.world = world
        self.spheres = s if s.dim() == 4 else s.reshape(1, 1, -1, 4)
        self.spheres_grad = self.spheres.clone().requires_grad_(True)
        b, h, n, _ = self.spheres.shape
        self.count = b * h * n
        self.cost = torch.empty((b, h, n), dtype=torch.float32, device=dev)
        self.grad = torch.empty((b, h, n, 4), dtype=torch.float32, device=dev)
        self.sparsity = torch.zeros((b, h, n), dtype=torch.uint8, device=dev)
        self.weight = torch.ones(1, device=dev)
        self.eta = torch.full((1,), scenes.ACTIVATION, device=dev)
        self.max_dist = torch.full((1,), scenes.MAX_DIST, device=dev)
        self.speed_dt = torch.full((1,), SPEED_DT, device=dev)
        self.snap = world.snapshot()

    def _world_args(self) -> tuple:
        s = self.snap
        return (s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable, s.n_env_mesh, self.max_dist)

    def forward(self) -> torch.Tensor:
        return SdfMeshWarpPy.apply(self.spheres, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                   *self._world_args(), None, False, False, self.snap.sign_method)

    def forward_backward(self) -> torch.Tensor:
        self.spheres_grad.grad = None
        c = SdfMeshWarpPy.apply(self.spheres_grad, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                *self._world_args(), None, False, False, self.snap.sign_method)
        c.sum().backward()
        return self.spheres_grad.grad

    def swept_forward(self) -> torch.Tensor:
        s = self.snap
        return SweptSdfMeshWarpPy.apply(self.spheres, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                        self.speed_dt, s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable, s.n_env_mesh,
                                        self.max_dist, SWEEP_STEPS, False, None, False, s.sign_method)

    def swept_forward_backward(self, sweep_steps: int = SWEEP_STEPS) -> torch.Tensor:
        s = self.snap
        self.spheres_grad.grad = None
        c = SweptSdfMeshWarpPy.apply(self.spheres_grad, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                     self.speed_dt, s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable, s.n_env_mesh,
                                     self.max_dist, sweep_steps, False, None, False, s.sign_method)
        c.sum().backward()
        return self.spheres_grad.grad


class TensorWorld:
    """World tensors built outside MeshWorld, as a cuRobo user holds them, in CostRunner's shape:
    ``wp.Mesh(points, indices, support_winding_number=True)`` per mesh (vertices in the mesh
    frame), mesh_pose_inverse[..., 7] = ``pad`` (cuRobo never writes it: 0) or each mesh's
    bounding radius about its origin (``pad=None``), sign method auto (Warp's normal sign for such
    meshes); with ``adopt``, passed through robot_sdf.adopt_meshes (its ids and per-slot signs)."""

    def __init__(self, meshes: list[scenes.SceneMesh], device: str, pad: float | None = 0.0, adopt: bool = False):
        from robot_sdf.geometry import pose_inverse

        self.device = torch.device(device)
        wdev = warp_device(self.device)
        self.meshes = [wp.Mesh(points=wp.array(m.vertices, dtype=wp.vec3, device=wdev),
                               indices=wp.array(m.triangles.reshape(-1), dtype=wp.int32, device=wdev),
                               support_winding_number=True) for m in meshes]
        pose_inv = np.zeros((1, len(meshes), 8), np.float32)
        for i, m in enumerate(meshes):
            pose_inv[0, i, :7] = pose_inverse(m.pose)
            pose_inv[0, i, 7] = float(np.linalg.norm(m.vertices, axis=1).max()) if pad is None else pad
        self.snap = SimpleNamespace(
            mesh_idx=torch.tensor([[int(np.uint64(x.id).astype(np.int64)) for x in self.meshes]], device=self.device),
            mesh_pose_inverse=torch.from_numpy(pose_inv).to(self.device),
            mesh_enable=torch.ones((1, len(meshes)), dtype=torch.uint8, device=self.device),
            n_env_mesh=torch.tensor([len(meshes)], dtype=torch.int32, device=self.device),
            sign_method=SignMethod.AUTO)
        if adopt:
            self.adopted = adopt_meshes(self.snap.mesh_idx)
            self.snap.mesh_idx, self.snap.sign_method = self.adopted.mesh_idx, self.adopted.sign_methods

    def snapshot(self) -> SimpleNamespace:
        return self.snap


class LegacySweptRunner:
    """The old summed-samples swept rule (bench/legacy_swept.py) on a CostRunner's trajectories:
    cost and gradient in one launch, as that rule computed them (its backward was one multiply)."""

    def __init__(self, runner: CostRunner, sweep_steps: int = SWEEP_STEPS):
        self.runner = runner
        self.sweep_steps = sweep_steps
        b, h, n, _ = runner.spheres.shape
        self.shape = (b, h, n)
        self.evaluations = torch.zeros((b, h, n), dtype=torch.int32, device=runner.world.device)

    def __call__(self) -> None:
        r, s = self.runner, self.runner.snap
        # The scalars and the World (every slot visited: no snapshot's slot BVHs).
        constants = constant_arguments(r.weight, r.eta, r.max_dist, s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable,
                                       s.n_env_mesh, s.sign_method, r.world.device)
        inputs = [_as_warp(r.spheres.view(-1, 4), dtype=wp.vec4), *constants, self.shape[1], self.shape[2],
                  self.sweep_steps]
        outputs = [_as_warp(r.cost.view(-1)), _as_warp(r.grad.view(-1, 4), dtype=wp.vec4),
                   _as_warp(self.evaluations.view(-1))]
        _launch(legacy_swept_sphere_cost_kernel, r.count, inputs, outputs, r.world.device)


def swept_evaluations(runner: CostRunner, sweep_steps: int = SWEEP_STEPS) -> np.ndarray:
    """Cost evaluations per sphere (b,h,n) of the current swept rule on the runner's trajectories."""
    s = runner.snap
    count = torch.zeros(runner.cost.shape, dtype=torch.int32, device=runner.world.device)
    Query(runner.weight, runner.eta, runner.max_dist, s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable, s.n_env_mesh,
          s.sign_method, speed_dt=runner.speed_dt, sweep_steps=sweep_steps, compute_grad=False,
          outputs=(runner.cost, runner.grad, runner.sparsity)).swept(runner.spheres, None, count)
    return count.cpu().numpy()


class FloorRunner:
    """The traversal floor on the same spheres and meshes; Warp arrays made once, outside timing."""

    def __init__(self, runner: CostRunner):
        self.device = runner.world.device
        self.wdev = warp_device(self.device)
        snap = runner.snap
        self.total = runner.count
        self.spheres = wp.from_torch(runner.spheres.reshape(-1, 4).contiguous(), dtype=wp.vec4)
        self.mesh_idx = wp.from_torch(snap.mesh_idx)
        self.pose_inv = wp.from_torch(snap.mesh_pose_inverse)
        self.n_mesh = int(snap.n_env_mesh[0])
        self.out_t = torch.empty(self.total, dtype=torch.float32, device=self.device)
        self.out = wp.from_torch(self.out_t)

    def _inputs(self, add_radius: bool) -> list:
        return [self.spheres, self.mesh_idx, self.pose_inv, self.n_mesh, scenes.MAX_DIST, scenes.ACTIVATION,
                int(add_radius)]

    def threaded(self, add_radius: bool = True) -> None:
        """The cost's thread pool (robot_sdf.launch.launch_kernel), one sphere per kernel thread (the
        cost kernels take runs of 16 on the CPU, which spares them Warp's per-thread argument copy)."""
        _launch(traversal_floor_kernel, self.total, self._inputs(add_radius), [self.out], self.device)

    def single_thread(self, add_radius: bool = True) -> None:
        wp.launch(traversal_floor_kernel, dim=self.total, inputs=[*self._inputs(add_radius), 0, self.total],
                  outputs=[self.out], device=self.wdev)


def open3d_module():
    """open3d, or None when it is not installed (the GPU image has none): its rows are skipped."""
    try:
        import open3d
    except ImportError:
        return None
    return open3d


def open3d_scene(meshes: list[scenes.SceneMesh]):
    """All meshes, transformed to the world frame, in one Open3D RaycastingScene (CPU)."""
    import open3d as o3d

    scene = o3d.t.geometry.RaycastingScene()
    for m in meshes:
        scene.add_triangles(o3d.core.Tensor(m.world_vertices()),
                            o3d.core.Tensor(np.ascontiguousarray(m.triangles, np.uint32)))
    return scene


class Bench:
    """Sizes of one run: ``quick`` shrinks every set to seconds (a smoke test of the code)."""

    def __init__(self, device: str, quick: bool):
        self.device = device
        self.quick = quick
        self.sync: Callable[[], None] | None = torch.cuda.synchronize if device.startswith("cuda") else None
        self.n_standard = 5_000 if quick else 100_000
        self.traj = (4, 30, 40) if quick else (64, 30, 52)
        self.reps = 3 if quick else 15
        # Seconds one table may take (rounds are cut to fit, but never below 5 in a full run).
        self.budget_s = 2.0 if quick else 60.0
        self.sphere_sizes = [1, 1_000, 5_000] if quick else [1, 1_000, 10_000, 100_000, 1_000_000]
        self.triangle_sizes = [1_000, 10_000] if quick else [1_000, 10_000, 100_000, 500_000]
        self.triangle_spheres = 5_000 if quick else 100_000
        self.mppi = (10, 30, 52) if quick else (400, 30, 52)
        self.meshes = scenes.standard_meshes()

    def timed(self, cases: dict[str, Callable[[], object]], reps: int | None = None,
              budget_s: float | None = None, shuffle: bool = False) -> dict[str, Stats]:
        return measure(cases, reps or self.reps, warmup=1, sync=self.sync,
                       budget_s=self.budget_s if budget_s is None else budget_s, min_reps=2 if self.quick else 5,
                       shuffle=shuffle)


def _row(name: str, stats: Stats, count: int, note: str = "") -> list[str]:
    return [name, f"{count:,}", stats.ms(), fmt_rate(count / stats.median), note]


def standard_table(b: Bench) -> None:
    section(f"Standard scene on {b.device}: cost vs. traversal floor vs. Open3D")
    world = build_world(b.meshes, b.device)
    spheres = scenes.near_surface_spheres(b.meshes, b.n_standard)
    cost = CostRunner(world, spheres)
    swept = CostRunner(world, scenes.trajectories(b.meshes, *b.traj))
    floor = FloorRunner(cost)
    o3d = open3d_module()
    if o3d is not None:
        o3d_scene = open3d_scene(b.meshes)
        o3d_points = o3d.core.Tensor(np.ascontiguousarray(spheres[:, :3]))
    n_tri = sum(len(m.triangles) for m in b.meshes)
    emit(f"{len(b.meshes)} meshes, {n_tri:,} triangles; {cost.count:,} spheres r = {scenes.SPHERE_RADIUS} m "
         f"within {scenes.SURFACE_OFFSET} m of the surfaces; max_dist {scenes.MAX_DIST} m, activation "
         f"{scenes.ACTIVATION} m, sign method {SIGN.name.lower()}; swept: {'x'.join(map(str, b.traj))} = "
         f"{swept.count:,} spheres (random walks, 1-2 cm per step), sweep_steps {SWEEP_STEPS}.")

    cases: dict[str, Callable[[], object]] = {
        "SdfMeshWarpPy fwd": cost.forward,
        "SdfMeshWarpPy fwd+bwd": cost.forward_backward,
        "SweptSdfMeshWarpPy fwd": swept.swept_forward,
        "SweptSdfMeshWarpPy fwd+bwd": swept.swept_forward_backward,
        "floor, bound max_dist+r+eta": floor.threaded,
        "floor, bound max_dist": lambda: floor.threaded(False),
    }
    if b.device == "cpu":
        def cost_one_thread() -> None:
            with cpu_threads(1):
                cost.forward_backward()

        cases["SdfMeshWarpPy fwd+bwd, 1 thread"] = cost_one_thread
        cases["floor, bound max_dist+r+eta, 1 thread"] = floor.single_thread
    if o3d is not None:
        cases["Open3D compute_signed_distance (CPU)"] = lambda: o3d_scene.compute_signed_distance(o3d_points)
    res = b.timed(cases)

    threads = "GPU" if b.device != "cpu" else f"{_threads_for(cost.count)} threads"
    notes = {
        "SdfMeshWarpPy fwd": threads, "SdfMeshWarpPy fwd+bwd": threads,
        "SweptSdfMeshWarpPy fwd": f"{threads}; {SWEEP_STEPS} sweep steps",
        "SweptSdfMeshWarpPy fwd+bwd": f"{threads}; {SWEEP_STEPS} sweep steps",
        "floor, bound max_dist+r+eta": f"{threads}, the cost's thread pool, one sphere per kernel thread",
        "floor, bound max_dist": threads,
        "Open3D compute_signed_distance (CPU)": f"all cores, unbounded search, {n_tri:,} triangles in one BVH",
    }
    rows = []
    for name, st in res.items():
        n = swept.count if name.startswith("Swept") else cost.count
        rows.append(_row(name, st, n, notes.get(name, "")))
    emit(table(["case", "spheres", "median ms (p25-p75)", "throughput", "note"], rows))
    if o3d is None:
        emit("\nOpen3D is not installed: its row, ratio and cross-check are skipped.")

    med = {k: st.median for k, st in res.items()}
    fb = med["SdfMeshWarpPy fwd+bwd"]
    ratios = [
        ["cost fwd+bwd / floor (bound max_dist+r+eta)", f"{fb / res['floor, bound max_dist+r+eta'].median:.2f}"],
        ["cost fwd+bwd / floor (bound max_dist)", f"{fb / res['floor, bound max_dist'].median:.2f}"],
        ["cost fwd+bwd / cost fwd", f"{fb / res['SdfMeshWarpPy fwd'].median:.2f}"],
        ["swept fwd+bwd / cost fwd+bwd (per sphere)",
         f"{(res['SweptSdfMeshWarpPy fwd+bwd'].median / swept.count) / (fb / cost.count):.2f}"],
    ]
    if o3d is not None:
        ratios.insert(2, ["cost fwd+bwd / Open3D signed distance",
                          f"{fb / res['Open3D compute_signed_distance (CPU)'].median:.2f}"])
    if b.device == "cpu":
        floor_1 = med["floor, bound max_dist+r+eta, 1 thread"]
        ratios.append(["cost fwd+bwd 1 thread / floor 1 thread",
                       f"{med['SdfMeshWarpPy fwd+bwd, 1 thread'] / floor_1:.2f}"])
        ratios.append(["floor 1 thread / floor threaded (parallel speed-up)",
                       f"{floor_1 / med['floor, bound max_dist+r+eta']:.2f}"])
    emit("")
    emit(table(["ratio (medians)", "value"], ratios))

    # Sanity: the three compute the same geometry. Floor and Open3D agree on the unsigned
    # distance within the bound; the cost's sign agrees with Open3D's.
    if o3d is None:
        return
    floor.threaded(True)
    d_floor = floor.out_t.cpu().numpy()
    sd_o3d = o3d_scene.compute_signed_distance(o3d_points).numpy()
    within = np.abs(sd_o3d) < scenes.MAX_DIST
    err = float(np.max(np.abs(d_floor[within] - np.abs(sd_o3d[within])))) if within.any() else float("nan")
    inside_o3d = sd_o3d < -1e-4
    with torch.no_grad():
        dist, _ = world.signed_distance(torch.from_numpy(spheres[:, :3]).to(world.device))
    inside_cost = dist.cpu().numpy() < -1e-4
    sure = np.abs(sd_o3d) > 1e-3
    agree = float(np.mean(inside_o3d[sure] == inside_cost[sure]))
    emit(f"\ncheck: max |floor - |Open3D sd|| over {int(within.sum()):,} points within max_dist = {err:.2e} m; "
         f"inside/outside agreement cost vs Open3D = {100 * agree:.3f} %")


def _threads_for(total: int) -> int:
    from robot_sdf.launch import _CPU_MIN_SPHERES_PER_POOL_THREAD, cpu_threads as n_threads

    return min(n_threads(), max(1, total // _CPU_MIN_SPHERES_PER_POOL_THREAD))


def sphere_scaling(b: Bench) -> None:
    section(f"Sphere-count scaling on {b.device} (standard scene, SdfMeshWarpPy fwd+bwd)")
    world = build_world(b.meshes, b.device)
    biggest = scenes.near_surface_spheres(b.meshes, max(b.sphere_sizes))
    runners = {n: CostRunner(world, biggest[:n]) for n in b.sphere_sizes}
    res = b.timed({f"{n}": r.forward_backward for n, r in runners.items()}, budget_s=2 * b.budget_s)
    rows = []
    for n, st in zip(b.sphere_sizes, res.values()):
        note = "per-call overhead" if n == 1 else ""
        rows.append([f"{n:,}", st.ms(), fmt_rate(n / st.median), f"{1e9 * st.median / n:,.0f}", note])
    emit(table(["spheres", "fwd+bwd median ms (p25-p75)", "throughput", "ns / sphere", "note"], rows))


def triangle_scaling(b: Bench) -> None:
    n_spheres = b.triangle_spheres
    section(f"Triangle-count scaling on {b.device} (one torus, {n_spheres:,} spheres near it, fwd+bwd)")
    wdev = warp_device(torch.device(b.device))
    rows = []
    worlds, runners = {}, {}
    for target in b.triangle_sizes:
        v, t = scenes.torus_with_triangles(target)
        points = wp.array(v, dtype=wp.vec3, device=wdev)
        indices = wp.array(t.reshape(-1), dtype=wp.int32, device=wdev)
        mesh = wp.Mesh(points=points, indices=indices)
        counter = [0]

        def build() -> None:
            wp.Mesh(points=points, indices=indices)

        def refit() -> None:
            mesh.refit()

        def add_mesh() -> None:
            # Fresh content each call: the world caches identical geometry and would skip the build.
            counter[0] += 1
            w = MeshWorld(device=b.device, sign_method=SIGN, max_distance=scenes.MAX_DIST)
            w.add_mesh("torus", v * np.float32(1.0 + 1e-6 * counter[0]), t)

        reps = 3 if target >= 100_000 else 10
        st = measure({"build": build, "refit": refit, "add_mesh": add_mesh}, reps if not b.quick else 2,
                     warmup=1, sync=b.sync)
        scene_mesh = scenes.SceneMesh("torus", v, t, np.array([0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]))
        worlds[target] = build_world([scene_mesh], b.device)
        runners[target] = CostRunner(worlds[target], scenes.near_surface_spheres([scene_mesh], n_spheres))
        rows.append([f"{len(t):,}", st["build"].ms(), st["refit"].ms(), st["add_mesh"].ms()])
    cases: dict[str, Callable[[], object]] = {}
    for k, r in runners.items():
        cases[f"cost {k}"] = r.forward_backward
        cases[f"floor {k}"] = FloorRunner(r).threaded
    res = b.timed(cases)
    for row, k in zip(rows, runners):
        cost, floor = res[f"cost {k}"], res[f"floor {k}"]
        row += [cost.ms(), fmt_rate(n_spheres / cost.median), fmt_ms(floor.median), f"{cost.median / floor.median:.2f}"]
    emit(table(["triangles", "wp.Mesh build ms", "refit ms", "world.add_mesh ms",
                f"fwd+bwd {n_spheres // 1000}k spheres ms", "throughput", "floor ms", "cost / floor"], rows))
    emit("\nwp.Mesh build = BVH construction from Warp arrays already on the device; world.add_mesh = "
         "validation, content hash, upload, build and snapshot publication (what a mesh ADD costs).")


def mppi_batch(b: Bench) -> None:
    bt, h, n = b.mppi
    section(f"MPPI batch {bt} x {h} x {n} on {b.device}" + (" (CPU: the <= 0.5 ms target is for an H100)"
                                                          if b.device == "cpu" else ""))
    world = build_world(b.meshes, b.device)
    runner = CostRunner(world, scenes.trajectories(b.meshes, bt, h, n))
    cases = {"SdfMeshWarpPy fwd+bwd": runner.forward_backward}
    if b.device != "cpu" or b.quick:
        # On the CPU a swept call of this size takes tens of seconds: measured on GPUs only (its
        # per-sphere cost relative to the plain cost is in the standard-scene table).
        cases["SweptSdfMeshWarpPy fwd+bwd (sweep 4)"] = runner.swept_forward_backward
    res = b.timed(cases, reps=5 if not b.quick else 2, budget_s=2 * b.budget_s)
    rows = [_row(k, st, runner.count, "target <= 0.5 ms on H100" if k.startswith("Sdf") else "")
            for k, st in res.items()]
    emit(table(["case", "spheres", "median ms (p25-p75)", "throughput", "note"], rows))


def sign_methods(b: Bench) -> None:
    section(f"Sign methods on {b.device} (standard scene, SdfMeshWarpPy fwd)")
    spheres = scenes.near_surface_spheres(b.meshes, b.n_standard)
    runners = {m: CostRunner(build_world(b.meshes, b.device, m), spheres) for m in SignMethod}
    res = b.timed({m.name.lower(): r.forward for m, r in runners.items()})
    base = res["normal"].median
    rows = [[k, st.ms(), fmt_rate(b.n_standard / st.median), f"{st.median / base:.2f}"] for k, st in res.items()]
    emit(table(["sign_method", "fwd median ms (p25-p75)", "throughput", "vs normal"], rows))
    # How often do the methods disagree on inside/outside for these (closed, well-shaped) meshes?
    signs = {}
    for m, r in runners.items():
        r.forward()
        signs[m] = r.cost.cpu().numpy() > 0
    ref = signs[SignMethod.NORMAL]
    emit("cost > 0 agreement with normal: " + ", ".join(
        f"{m.name.lower()} {100 * float(np.mean(s == ref)):.3f} %" for m, s in signs.items() if m != SignMethod.NORMAL))


def swept_table(b: Bench) -> None:
    section(f"Swept cost on {b.device}: per sphere against the plain cost on the same spheres")
    world = build_world(b.meshes, b.device)
    sets = {
        "MPC-like rollouts (free space)": scenes.mpc_rollouts(*b.traj),
        "standard trajectories (contact-heavy)": scenes.trajectories(b.meshes, *b.traj),
    }
    steps_list = (1, 4) if b.quick else (1, 2, 4)
    emit(f"{'x'.join(map(str, b.traj))} spheres per set, r = {scenes.SPHERE_RADIUS} m, activation "
         f"{scenes.ACTIVATION} m, max_dist {scenes.MAX_DIST} m; plain = SdfMeshWarpPy fwd+bwd, swept K = "
         "SweptSdfMeshWarpPy fwd+bwd with sweep_steps K (time-average, exact partials), the legacy rule's K = the old "
         "rule's kernel (bench/legacy_swept.py; cost and gradient in one launch). 'near' = spheres whose plain "
         "cost is > 0 (centre within r + activation of a surface). Evaluations = points of a sphere's slot "
         "whose cost took a search (p[t] and the samples not skipped for every mesh; at most 2 K + 1; since "
         f"a mesh's samples share one traversal). Threads: {_threads_for(b.traj[0] * b.traj[1] * b.traj[2]) if b.device == 'cpu' else 'GPU'}.")
    rows = []
    for name, traj in sets.items():
        runner = CostRunner(world, traj)
        with torch.no_grad():
            runner.forward()
        near = float((runner.cost > 0).float().mean())
        cases: dict[str, Callable[[], object]] = {"plain": runner.forward_backward}
        evals: dict[str, np.ndarray | None] = {"plain": None}
        for k in steps_list:
            legacy = LegacySweptRunner(runner, k)
            legacy()
            evals[f"swept {k}"] = swept_evaluations(runner, k)
            evals[f"legacy rule, {k}"] = legacy.evaluations.cpu().numpy()
            cases[f"swept {k}"] = lambda k=k: runner.swept_forward_backward(k)
            cases[f"legacy rule, {k}"] = legacy
        res = b.timed(cases)
        plain = res["plain"].median
        for case, st in res.items():
            ev = evals[case]
            first = case == "plain"
            rows.append([name if first else "", f"{100 * near:.1f} %" if first else "", case, st.ms(),
                         f"{1e9 * st.median / runner.count:,.0f}", f"{st.median / plain:.2f}",
                         "1" if ev is None else f"{ev.mean():.2f} (max {ev.max()})"])
    emit(table(["trajectories", "near", "case", "median ms (p25-p75)", "ns / sphere", "/ plain",
                "evaluations / sphere"], rows))


def perception_free_space(b: Bench) -> None:
    """Spheres in free space around a scan given in world coordinates: most are far from it
    (no surface within the bound), many inside its bounding sphere and box. They must not pay
    an unbounded inside test each."""
    section(f"Free-space spheres around a world-frame perception scan on {b.device} (fwd+bwd)")
    scan = scenes.perception_mesh()
    world = build_world([scan], b.device, SignMethod.AUTO)
    method = world.mesh_info("scan")["sign_method"]
    n = 5_000 if b.quick else 100_000
    pts = scenes.workspace_points(4 * n)
    spheres = np.concatenate([pts, np.full((len(pts), 1), scenes.SPHERE_RADIUS)], 1).astype(np.float32)
    # Keep free-space spheres: no surface within r + eta (floor kernel) and not under the scan.
    probe = FloorRunner(CostRunner(world, spheres))
    probe.threaded(False)
    clear = probe.out_t.cpu().numpy() >= scenes.SPHERE_RADIUS + scenes.ACTIVATION
    over = (pts[:, 0] > 0.4) & (pts[:, 0] < 1.6) & (np.abs(pts[:, 1]) < 0.45) & (pts[:, 2] < 1.0)
    spheres = spheres[clear & ~over][:n]
    runner = CostRunner(world, spheres)
    floor = FloorRunner(runner)
    res = b.timed({"SdfMeshWarpPy fwd+bwd": runner.forward_backward, "floor, bound max_dist+r+eta": floor.threaded})
    centre = np.asarray(world.mesh_info("scan")["bounding_centre"])
    radius = world.mesh_info("scan")["bounding_radius"]
    in_sphere = float(np.mean(np.linalg.norm(spheres[:, :3] - centre, axis=1) < radius + scenes.MAX_DIST))
    emit(f"{len(scan.triangles):,} triangles (open height field in world coordinates, sign method auto -> {method}); "
         f"{len(spheres):,} spheres r = {scenes.SPHERE_RADIUS} m with no surface within r + eta; "
         f"{100 * in_sphere:.0f} % of them within max_dist of its bounding sphere.")
    rows = [_row(k, st, len(spheres)) for k, st in res.items()]
    emit(table(["case", "spheres", "median ms (p25-p75)", "throughput", "note"], rows))
    runner.forward()
    emit(f"cost fwd+bwd / floor: {res['SdfMeshWarpPy fwd+bwd'].median / res['floor, bound max_dist+r+eta'].median:.2f}"
         f"; spheres with cost > 0: {int((runner.cost > 0).sum())}")


def raw_mesh_table(b: Bench) -> None:
    """Meshes built outside robot_sdf: cuRobo's tensors (wp.Mesh with winding-number
    support, bounding radius pad 0) against the same tensors with the radius filled and against
    MeshWorld's own meshes, plain and swept fwd+bwd on one thread, on the robot-like scene."""
    meshes = scenes.robot_like_meshes()
    n_tri = sum(len(m.triangles) for m in meshes)
    section(f"Meshes built outside robot_sdf on {b.device}: raw wp.Mesh tensors vs. radius filled vs. MeshWorld")
    unclassified = "raw wp.Mesh, pad 0, not adopted"
    worlds = {"raw wp.Mesh, pad 0": TensorWorld(meshes, b.device, 0.0, adopt=True),
              "raw wp.Mesh, radius filled": TensorWorld(meshes, b.device, None, adopt=True),
              unclassified: TensorWorld(meshes, b.device, 0.0),
              "MeshWorld (sign method normal)": build_world(meshes, b.device)}
    sizes = {"1k": (1, 20, 50), "100k": (4, 30, 52) if b.quick else (64, 30, 52)}
    emit(f"{len(meshes)} robot-like meshes (scenes.robot_like_meshes), {n_tri:,} triangles; plain: spheres r = "
         f"{scenes.SPHERE_RADIUS} m within {scenes.SURFACE_OFFSET} m of the surfaces; swept: random-walk "
         f"trajectories (1-2 cm steps, contact-heavy), sweep_steps {SWEEP_STEPS}; max_dist {scenes.MAX_DIST} m, "
         f"activation {scenes.ACTIVATION} m; fwd+bwd, " + ("one thread." if b.device == "cpu" else "GPU."))
    rows = []
    for label, (bt, h, n) in sizes.items():
        plain_spheres = scenes.near_surface_spheres(meshes, bt * h * n)
        traj = scenes.trajectories(meshes, bt, h, n)
        res = _time_worlds(b, worlds, plain_spheres, traj, unclassified, plain_on_swept=True,
                           reference="raw wp.Mesh, pad 0")
        for kind in ("plain", "swept"):
            base = res[f"{kind}, raw wp.Mesh, radius filled"].median
            curobo = res[f"{kind}, {CUROBO_STYLE}"].median
            for name in [*worlds, CUROBO_STYLE]:
                st = res[f"{kind}, {name}"]
                count = bt * h * n
                same = res[f"plain on the swept spheres, {name}"].median
                rows.append([label, kind, name, st.ms(), f"{1e9 * st.median / count:,.0f}", f"{st.median / base:.2f}",
                             f"{st.median / curobo:.2f}", f"{st.median / same:.2f}" if kind == "swept" else ""])
    emit(table(["spheres", "cost", "world tensors", "median ms (p25-p75)", "ns / sphere", "/ radius filled",
                "/ cuRobo-style", "swept / plain on the same spheres"], rows))
    emit(f"'{CUROBO_STYLE}': bench/curobo_style.py, cuRobo's mesh-collision algorithm (Warp's mesh_query_point "
         "with its ray-vote sign per mesh and sample, cuRobo's sample schedule) written here as a timing reference, "
         "on the pad-0 tensors: cuRobo v0.7.8 itself cannot be installed here.")
    emit(f"'{unclassified}': the same tensors passed as they are, not adopted (every mesh built elsewhere "
         "searched to max_dist + r + eta with Warp's sign); the other raw rows are adopted (robot_sdf.adopt_meshes).")
    _adoption_cost(b, meshes)
    _other_surfaces_table(b)


def _other_surfaces_table(b: Bench, only: tuple[str, ...] = ()) -> None:
    """Raw meshes that are no single closed shell: two-shell solids (pseudo-normal twins), closed
    surfaces of overlapping shells (winding-number twins under auto) and an open table scan (kept
    raw), against the full search of the same tensors and MeshWorld's auto on the same meshes
    (and, for the solids, MeshWorld's winding-number path that auto took for them before);
    fwd+bwd on one thread. ``only``: the scenes to run (all when empty)."""
    builders = {"two-body links": scenes.two_body_meshes, "two-part links": scenes.two_part_meshes,
                "table scan": lambda: [scenes.perception_mesh()]}
    scenes_ = {name: build() for name, build in builders.items() if not only or name in only}
    section(f"Raw meshes that are no single closed shell on {b.device}: twins, full search, MeshWorld auto")
    emit("two-body links: the 8 robot-like links with a 0.3-scale copy of each in the same mesh, 2 cm clear of it "
         "(two shells bounding one solid: pseudo-normal sign; MeshWorld auto: winding_number, flagged solid); "
         "two-part links: the same with the copy overlapping the link (closed, self-intersecting; auto: winding "
         "number); table scan: scenes.perception_mesh, an open height field of 59,202 triangles (raw: kept, Warp's "
         "sign; MeshWorld auto: winding number). Spheres and trajectories as above.")
    full = "raw wp.Mesh, pad 0, not adopted"
    rows = []
    for scene, meshes in scenes_.items():
        worlds = {"raw wp.Mesh, pad 0": TensorWorld(meshes, b.device, 0.0, adopt=True),
                  full: TensorWorld(meshes, b.device, 0.0),
                  "MeshWorld auto": build_world(meshes, b.device, SignMethod.AUTO)}
        if scene == "two-body links":
            worlds["MeshWorld winding_number (auto's path before)"] = build_world(meshes, b.device,
                                                                                SignMethod.WINDING_NUMBER)
        sizes = {"1k": (1, 20, 50), "100k": (4, 30, 52) if b.quick else (64, 30, 52)}
        for label, (bt, h, n) in sizes.items():
            plain_spheres = scenes.near_surface_spheres(meshes, bt * h * n)
            traj = scenes.trajectories(meshes, bt, h, n)
            res = _time_worlds(b, worlds, plain_spheres, traj, full, reference="raw wp.Mesh, pad 0")
            for kind in ("plain", "swept"):
                base = res[f"{kind}, {full}"].median
                curobo = res[f"{kind}, {CUROBO_STYLE}"].median
                for name in [*worlds, CUROBO_STYLE]:
                    st = res[f"{kind}, {name}"]
                    rows.append([scene, label, kind, name, st.ms(), f"{1e9 * st.median / (bt * h * n):,.0f}",
                                 f"{st.median / base:.2f}", f"{st.median / curobo:.2f}"])
    emit(table(["scene", "spheres", "cost", "world tensors", "median ms (p25-p75)", "ns / sphere", "/ full search",
                "/ cuRobo-style"], rows))


def _time_worlds(b: Bench, worlds: dict, plain_spheres: np.ndarray, traj: np.ndarray, full_search: str,
                 plain_on_swept: bool = False, reference: str | None = None) -> dict[str, Stats]:
    """Plain and swept fwd+bwd ("plain, NAME", "swept, NAME"; with ``plain_on_swept`` also "plain on
    the swept spheres, NAME") for each named world (``full_search`` names the world passed as it
    is, not adopted), and bench/curobo_style.py's kernels on the tensors of the world named
    ``reference`` (NAME = CUROBO_STYLE), one thread on the CPU, in a new order every round (the raw
    worlds share twins: bench.measure's shuffle)."""
    cases: dict[str, Callable[[], object]] = {}
    for name, world in worlds.items():
        plain, swept = CostRunner(world, plain_spheres), CostRunner(world, traj)
        runs = {f"plain, {name}": plain.forward_backward, f"swept, {name}": swept.swept_forward_backward}
        if plain_on_swept:
            runs[f"plain on the swept spheres, {name}"] = swept.forward_backward
        cases.update(runs)
        if name == reference:
            plain_ref, swept_ref = CuroboStyleRunner(plain), CuroboStyleRunner(swept)
            cases[f"plain, {CUROBO_STYLE}"] = plain_ref.forward_backward
            cases[f"swept, {CUROBO_STYLE}"] = lambda f=swept_ref.forward_backward: f(SWEEP_STEPS)
            if plain_on_swept:
                cases[f"plain on the swept spheres, {CUROBO_STYLE}"] = swept_ref.forward_backward
    return timed_side_by_side(b, cases)


def _adoption_cost(b: Bench, meshes: list) -> None:
    """What adoption costs: robot_sdf.adopt_meshes on raw tensors (ids read back, meshes
    classified, twins built) against one 1k-sphere plain fwd+bwd call on the adopted tensors."""
    adopting, steady = [], []
    spheres = scenes.near_surface_spheres(meshes, 1000)
    raw = TensorWorld(meshes, b.device, 0.0)
    for _ in range(3):
        with cpu_threads(1):
            start = time.perf_counter()
            adopted = adopt_meshes(raw.snap.mesh_idx)
            adopting.append(time.perf_counter() - start)
            world = TensorWorld(meshes, b.device, 0.0)
            world.snap.mesh_idx, world.snap.sign_method = adopted.mesh_idx, adopted.sign_methods
            runner = CostRunner(world, spheres)
            runner.forward_backward()
            start = time.perf_counter()
            runner.forward_backward()
            steady.append(time.perf_counter() - start)
    emit(f"adopt_meshes on these tensors {1e3 * statistics.median(adopting):.0f} ms, once per world change, "
         f"against {1e3 * statistics.median(steady):.0f} ms per 1k-sphere call (one thread, medians of 3).")


def _one_thread(fn: Callable[[], object]) -> None:
    with cpu_threads(1):
        fn()


def timed_side_by_side(b: Bench, cases: dict) -> dict:
    """b.timed of ``cases`` for ratios read side by side: each case on one thread on the CPU,
    interleaved in a new order every round, 11 repetitions (3 with --quick)."""
    if b.device == "cpu":
        cases = {k: (lambda f=f: _one_thread(f)) for k, f in cases.items()}
    return b.timed(cases, reps=3 if b.quick else 11, shuffle=True)


def world_updates(b: Bench) -> None:
    """Pose and enable updates: O(1) Python per change (host mirrors) against the
    from-scratch snapshot rebuild every change paid before (MeshWorld._build_snapshot)."""
    section(f"World updates on {b.device}: pose / enable change vs. the former full rebuild")
    box_v, box_t = scenes.box((0.2, 0.2, 0.2), 0.1)
    rows = []
    for envs in ((1, 64) if b.quick else (1, 1024)):
        world = MeshWorld(device=b.device, num_envs=envs, mesh_capacity=8, sign_method=SIGN,
                          max_distance=scenes.MAX_DIST)
        for env in range(envs):
            for i in range(8):
                world.add_mesh(f"m{i}", box_v, box_t, pose=(0.3 * i, 0, 0, 1, 0, 0, 0), env=env)
        poses = [(0.1, 0.2, 0.0, 1, 0, 0, 0), (0.1, 0.25, 0.0, 1, 0, 0, 0)]
        state = {"k": 0}
        target_env = envs // 2

        def set_pose() -> None:
            state["k"] ^= 1
            world.set_pose("m3", poses[state["k"]], env=target_env)

        def toggle() -> None:
            state["k"] ^= 1
            world.set_enabled("m5", bool(state["k"]), env=target_env)

        res = b.timed({"set_pose": set_pose, "set_enabled": toggle,
                       "full rebuild of the snapshot per change": world._build_snapshot},
                      reps=50 if b.quick else 400, budget_s=b.budget_s / 2)
        for name, st in res.items():
            rows.append([f"{envs} env x 8 meshes", name, f"{1e6 * st.median:.1f} ({1e6 * st.p25:.1f}-{1e6 * st.p75:.1f})"])
        rows.append([f"{envs} env x 8 meshes", "rebuild / set_pose",
                     f"{res['full rebuild of the snapshot per change'].median / res['set_pose'].median:.1f}x"])
    emit(table(["world", "case", "median us (p25-p75)"], rows))
    emit("set_pose/set_enabled: validation, one slot written into the host mirrors, one new tensor "
         "for the changed array (copy-on-write; a memcpy on the CPU, one host-to-device copy on CUDA).")


def _slot_loop_args(world: MeshWorld) -> tuple:
    """SdfMeshWarpPy's world arguments of ``world``'s snapshot with its per-slot sign methods as
    trailing argument instead of the snapshot itself: the per-slot loop, no slot BVH."""
    s = world.snapshot()
    return (s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable, s.n_env_mesh), s.sign_methods


def far_obstacles(b: Bench) -> None:
    """Many obstacles: the same 16 near obstacles plus up to 4080 far ones (blocks beyond max_dist of
    every sphere), 4096 spheres fwd+bwd near the near set, through MeshWorld's slot BVHs and
    through the per-slot loop; then the cost of world updates at 4096 meshes."""
    section(f"Far obstacles on {b.device}: 16 near meshes + far blocks, 4096 spheres fwd+bwd")
    near = scenes.near_obstacles(16)
    spheres = torch.from_numpy(scenes.near_surface_spheres(near, 4096)).reshape(1, 1, -1, 4).to(b.device)
    totals = (16, 64, 1024) if b.quick else (16, 64, 1024, 4096)
    cases, diffs, worlds = {}, {}, {}
    for total in totals:
        world = MeshWorld(device=b.device, mesh_capacity=total, sign_method=SIGN, max_distance=scenes.MAX_DIST)
        for m in near + scenes.far_obstacles(total - len(near)):
            world.add_mesh(m.name, m.vertices, m.triangles, pose=m.pose)
        worlds[total] = world
        s = spheres.clone().requires_grad_(True)
        loop_world, loop_sign = _slot_loop_args(world)
        dev = world.device
        one, eta, md = (torch.ones(1, device=dev), torch.full((1,), scenes.ACTIVATION, device=dev),
                        torch.full((1,), scenes.MAX_DIST, device=dev))
        out = (torch.empty(spheres.shape[:3], device=dev), torch.empty(spheres.shape, device=dev),
               torch.zeros(spheres.shape[:3], dtype=torch.uint8, device=dev))

        def tree(s=s, world=world) -> torch.Tensor:
            s.grad = None
            world.sphere_cost(s, scenes.ACTIVATION, 1.0).sum().backward()
            return s.grad

        def loop(s=s, out=out, one=one, eta=eta, md=md, loop_world=loop_world, loop_sign=loop_sign) -> torch.Tensor:
            s.grad = None
            SdfMeshWarpPy.apply(s, *out, one, eta, *loop_world, md, None, False, False, loop_sign).sum().backward()
            return s.grad

        cost_tree = world.sphere_cost(spheres, scenes.ACTIVATION, 1.0).detach().clone()
        grad_tree = tree().clone()
        grad_loop = loop().clone()
        diffs[total] = (float((cost_tree - out[0]).abs().max()), float((grad_tree - grad_loop).abs().max()))
        cases[(total, "slot BVH")] = tree
        cases[(total, "per-slot loop")] = loop
    # Every case of every size in one interleaved measurement, so that the ratios across sizes
    # (not only between the two paths of one size) see the same load.
    res = b.timed(cases, budget_s=b.budget_s)
    rows = []
    for (total, name), st in res.items():
        base = res[(totals[0], name)].median
        rows.append([f"{total:,}", name, st.ms(), f"{1e9 * st.median / spheres.shape[2]:.0f}",
                     f"{st.median / base:.2f}x",
                     f"{diffs[total][0]:.1e} / {diffs[total][1]:.1e}" if name == "slot BVH" else ""])
    emit(table(["meshes", "path", "fwd+bwd median ms (p25-p75)", "ns / sphere", "/ 16 meshes",
                "max |cost diff| / |grad diff| vs loop"], rows))
    emit(f"Spheres with cost > 0: {int((cost_tree > 0).sum())} of {spheres.shape[2]}. slot BVH = "
         "MeshWorld.sphere_cost (snapshot as trailing argument); per-slot loop = SdfMeshWarpPy on the same "
         "snapshot tensors with its per-slot sign methods (what raw cuRobo tensors get).")
    world_update_costs(b, worlds[totals[-1]], spheres)
    multi_env_slots(b)


def multi_env_slots(b: Bench) -> None:
    """num_envs environments of 16 boxes each (one slot BVH per environment), 20 spheres per
    environment picked by env_index: the trees' one-time build, a query through them against the
    per-slot loop, and a pose change in every environment followed by one query (its refits)."""
    envs = 64 if b.quick else 1024
    section(f"Slot BVHs with {envs} environments x 16 boxes on {b.device}, 20 spheres per environment (fwd)")
    rng = np.random.default_rng(scenes.STANDARD_SEED + 6)
    world = MeshWorld(device=b.device, num_envs=envs, mesh_capacity=16, sign_method=SIGN, max_distance=scenes.MAX_DIST)
    v, t = scenes.box((0.1, 0.1, 0.1), 0.1)
    for env in range(envs):
        for i in range(16):
            world.add_mesh(f"m{i}", v, t, pose=(*rng.uniform(-1.0, 1.0, 3), 1.0, 0.0, 0.0, 0.0), env=env)
    spheres = np.concatenate([rng.uniform(-1.0, 1.0, (envs, 1, 20, 3)), np.full((envs, 1, 20, 1), 0.05)], -1)
    spheres = torch.from_numpy(spheres.astype(np.float32)).to(b.device)
    env_index = torch.arange(envs, dtype=torch.int32, device=b.device)
    t0 = time.perf_counter()
    cost, _ = world.evaluate_sphere_cost(spheres, scenes.ACTIVATION, env_index=env_index)
    first = time.perf_counter() - t0
    loop_world, loop_sign = _slot_loop_args(world)
    dev = world.device
    one, eta, md = (torch.ones(1, device=dev), torch.full((1,), scenes.ACTIVATION, device=dev),
                    torch.full((1,), scenes.MAX_DIST, device=dev))
    out = (torch.empty(spheres.shape[:3], device=dev), torch.empty(spheres.shape, device=dev),
           torch.zeros(spheres.shape[:3], dtype=torch.uint8, device=dev))

    def loop() -> None:
        SdfMeshWarpPy.apply(spheres, *out, one, eta, *loop_world, md, env_index, False, False, loop_sign)

    loop()
    res = b.timed({"slot BVH": lambda: world.evaluate_sphere_cost(spheres, scenes.ACTIVATION, env_index=env_index,
                                                                   compute_gradient=False),
                   "per-slot loop": loop}, budget_s=b.budget_s / 4)
    t0 = time.perf_counter()
    for env in range(envs):
        world.set_pose("m3", (0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 0.0), env=env)
    poses = time.perf_counter() - t0
    t0 = time.perf_counter()
    world.evaluate_sphere_cost(spheres, scenes.ACTIVATION, env_index=env_index, compute_gradient=False)
    after = time.perf_counter() - t0
    rows = [["first query (builds the trees)", fmt_ms(first)],
            *[[f"query, {name}", st.ms()] for name, st in res.items()],
            [f"set_pose in each of the {envs} environments", fmt_ms(poses)],
            ["next query (refits every tree)", fmt_ms(after)]]
    emit(table(["case", "ms"], rows))
    emit(f"{int((cost > 0).sum())} of {cost.numel()} spheres with cost > 0; max |cost difference| slot BVH vs loop: "
         f"{float((cost - out[0]).abs().max()):.1e}. Trees: {world._slot_index.tree_count()}.")


def world_update_costs(b: Bench, world: MeshWorld, spheres: torch.Tensor) -> None:
    """Pose, enable, ADD and REMOVE at ``world``'s size: the update call itself and the slot-BVH
    maintenance the next evaluation pays for it (refit or rebuild), against one query."""
    count = world.mesh_count()
    section(f"World updates at {count:,} meshes on {b.device} (slot BVH maintenance included)")
    v, t = scenes.box((0.1, 0.1, 0.1), 0.1)
    reps = 20 if b.quick else 200
    times: dict[str, list[float]] = {}

    def timed(name: str, fn) -> None:
        t0 = time.perf_counter()
        fn()
        times.setdefault(name, []).append(time.perf_counter() - t0)

    maintain = world._update_slot_index
    s = spheres.clone().requires_grad_(True)
    for k in range(reps):
        pose = (3.0 + 0.01 * (k % 2), -2.0, 0.0, 1.0, 0.0, 0.0, 0.0)
        timed("set_pose (far block)", lambda: world.set_pose("far0", pose))
        timed("  + refit before the next query", maintain)
        timed("set_enabled", lambda: world.set_enabled("far1", bool(k % 2)))
        timed("  + next query's maintenance (none)", maintain)
        geo = (v * (1.0 + 1e-3 * (k + 1)), t)  # content never seen before: a geometry build
        timed("ADD replacing a block's geometry (new content)", lambda: world.add_mesh("far2", *geo, pose=pose))
        timed("  + refit before the next query ", maintain)
        timed("ADD of a new id (cached geometry)", lambda: world.add_mesh("extra", v, t, pose=(3.0, 3.0, 0, 1, 0, 0, 0)))
        timed("  + rebuild before the next query", maintain)
        timed("REMOVE", lambda: world.remove_mesh("far3"))
        timed("  + rebuild before the next query ", maintain)
        world.add_mesh("far3", v, t, pose=(3.0, 2.0, 0, 1, 0, 0, 0))
        world.remove_mesh("extra")
        if k % 10 == 0:
            maintain()
            timed("query: sphere_cost fwd+bwd, 4096 spheres", lambda: world.sphere_cost(s, scenes.ACTIVATION, 1.0)
                  .sum().backward())
    rows = [[name, f"{1e6 * Stats.of(x).median:.0f} ({1e6 * Stats.of(x).p25:.0f}-{1e6 * Stats.of(x).p75:.0f})"]
            for name, x in times.items()]
    emit(table(["update", "median us (p25-p75)"], rows))
    emit(f"Trees built {world._slot_index.builds}, refitted {world._slot_index.refits} in this world's life. "
         "The maintenance runs once before the next evaluation however many updates came in between.")


def _cuda_event_times(fn: Callable[[], object], reps: int) -> float:
    """Median GPU time [s] between events recorded around ``fn`` on the current stream."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return float(np.median(times))


def call_overhead(b: Bench) -> None:
    """Fixed cost of one evaluation: 1 and 5k spheres, fwd+bwd, next to a bare torch autograd
    round trip ((s * 2).sum().backward()) on the same tensor."""
    section(f"Per-call overhead on {b.device}: sphere_cost fwd+bwd vs. a bare torch autograd round trip")
    world = build_world(b.meshes, b.device)
    rows = []
    cuda = b.device.startswith("cuda")
    for count in (1, 5_000):
        spheres = scenes.near_surface_spheres(b.meshes, count)
        runner = CostRunner(world, spheres)
        s = runner.spheres_grad

        def high_level() -> None:
            s.grad = None
            world.sphere_cost(s, scenes.ACTIVATION, 1.0).sum().backward()

        def bare() -> None:
            s.grad = None
            (s * 2.0).sum().backward()

        # The same round trips under torch.func.grad and torch.compile, each against the bare
        # round trip under the same mechanism (and, for torch.func, a trivial autograd.Function:
        # torch's own per-Function cost under a transform).
        detached = s.detach()
        func_grad = torch.func.grad(lambda x: world.sphere_cost(x, scenes.ACTIVATION, 1.0).sum())
        func_bare = torch.func.grad(lambda x: (x * 2.0).sum())
        func_trivial = torch.func.grad(lambda x: _TrivialFunction.apply(x).sum())
        compiled = torch.compile(lambda x: world.sphere_cost(x, scenes.ACTIVATION, 1.0).sum(), fullgraph=True)
        compiled_bare = torch.compile(lambda x: (x * 2.0).sum(), fullgraph=True)

        def compiled_case(fn):
            def run() -> None:
                s.grad = None
                fn(s).backward()
            return run

        cases = {"world.sphere_cost + backward": high_level, "SdfMeshWarpPy.apply + backward (preallocated)":
                 runner.forward_backward, "bare torch autograd round trip": bare,
                 "torch.func.grad(world.sphere_cost)": lambda: func_grad(detached),
                 "torch.func.grad(bare)": lambda: func_bare(detached),
                 "torch.func.grad(trivial autograd.Function)": lambda: func_trivial(detached),
                 "torch.compile(world.sphere_cost) + backward": compiled_case(compiled),
                 "torch.compile(bare) + backward": compiled_case(compiled_bare)}
        baselines = {"torch.func.grad(world.sphere_cost)": "torch.func.grad(bare)",
                     "torch.func.grad(trivial autograd.Function)": "torch.func.grad(bare)",
                     "torch.compile(world.sphere_cost) + backward": "torch.compile(bare) + backward"}
        for fn in cases.values():  # compile once, outside the timing
            fn()
        res = measure(cases, 300 if b.quick else 3000, warmup=20, sync=b.sync, budget_s=b.budget_s / 2,
                      min_reps=50)
        for name, st in res.items():
            base_name = baselines.get(name, "bare torch autograd round trip")
            gpu = f"{1e6 * _cuda_event_times(cases[name], 200):.1f}" if cuda else "-"
            rows.append([f"{count:,}", name, f"{1e6 * st.median:.1f} ({1e6 * st.p25:.1f}-{1e6 * st.p75:.1f})", gpu,
                         f"{st.median / res[base_name].median:.2f}", base_name])
    emit(table(["spheres", "case", "wall us median (p25-p75)", "CUDA events us", "ratio", "ratio to"], rows))
    emit("Wall clock per call including a device sync on CUDA; 8-mesh standard scene, sign method normal. "
         "torch.func rows pay torch's per-autograd.Function cost under a transform (the trivial Function row).")


class _TrivialFunction(torch.autograd.Function):
    """x -> x.sum(-1) with a setup_context: torch's floor for a custom Function under torch.func."""

    @staticmethod
    def forward(x):
        return x.sum(-1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx, grad_output):
        return grad_output.unsqueeze(-1).expand(ctx.shape)


def tables() -> dict[str, Callable[..., None]]:
    """Every core table by name, in the order a full run prints them."""
    from bench import kernel_sets, perception_bench, real_bench

    parts = (world_updates, call_overhead, standard_table, raw_mesh_table, real_bench.real_mesh_table,
             kernel_sets.kernel_sets, sphere_scaling, triangle_scaling, mppi_batch, sign_methods, swept_table,
             perception_free_space, perception_bench.perception_fusion, perception_bench.perception_node,
             far_obstacles)
    return {part.__name__: part for part in parts}


def run(device: str = "cpu", quick: bool = False, only: list[str] | None = None,
        real_spheres: tuple[int, ...] | None = None) -> None:
    """Print every core table, or those named in ``only`` (tables()); ``real_spheres``: the sphere
    counts of real_mesh_table (default 1k and 100k)."""
    b = Bench(device, quick)
    for name, part in tables().items():
        if only and name not in only:
            continue
        if name == "real_mesh_table":
            part(b, real_spheres)
        else:
            part(b)
        emit(f"\n(load average after this table: {load_average()})")
