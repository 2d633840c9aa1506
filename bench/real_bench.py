"""Real robot meshes (bench.real_meshes): the cost on manufacturers' CAD exports, side by side
with bench/curobo_style.py on the same tensors.

Scene: bench.scenes.real_robot_meshes (11 meshes of rtb-data, 128,992 triangles, as the files
are, at random rotations 10 cm apart). Plain cost: the sphere mix of bench.scenes.mixed_spheres
(35 % near outside, 25 % shallow inside, 25 % deep inside, 15 % anywhere). Swept cost
(sweep_steps 4): MPPI-like rollouts b x h x n (bench.scenes.mpc_rollouts through the scene's
box grown by 0.3 m, mostly in free space), and the plain cost on the same rollouts (the
swept / plain ratio). Every case fwd+bwd on one thread (CPU), interleaved in a new order every
round (bench.measure's shuffle), for:

- cuRobo-style kernels (bench/curobo_style.py) on the raw tensors: the reference of every ratio;
- raw tensors (``wp.Mesh(points, indices, support_winding_number=True)`` per mesh, pose pad 0),
  passed as they are (no trailing sign argument: Warp's own signed query plus robot_sdf's two
  corrections);
- adopted tensors (``robot_sdf.adopt_meshes`` of the raw ids, its ids and per-slot sign codes
  passed as the trailing argument; a skipped row where robot_sdf has no adopt_meshes);
- MeshWorld with its default sign method (auto), called as MeshWorld's own evaluations call the
  Functions (its snapshot as the trailing argument, inside ``world.reading()``).

Then, on the rollouts of the largest count: swept / plain for sweep_steps 1, 2 and 4 for
MeshWorld and adopted tensors (swept_by_sweep_steps: what the number of samples costs), and, for
MeshWorld, the swept and plain cost of the trajectories grouped by their closest approach to a
surface, at sweep_steps 4 and 1 (swept_by_approach): where the swept cost's time beyond the plain
one goes.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

import robot_sdf
from bench import Stats, cpu_model, emit, section, table
from bench import real_meshes, scenes
from bench.core_bench import (CUROBO_STYLE, SWEEP_STEPS, Bench, CostRunner, TensorWorld, build_world,
                              timed_side_by_side)
from bench.curobo_style import CuroboStyleRunner
from robot_sdf import SignMethod
from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy

RAW = "raw tensors, as they are"
ADOPTED = "adopted tensors (adopt_meshes)"
MESHWORLD = "MeshWorld, default sign method (auto)"
PATHS = (CUROBO_STYLE, RAW, ADOPTED, MESHWORLD)
DEFAULT_SPHERES = (1_000, 100_000)
HORIZON, PER_STEP = 30, 52  # rollouts b x 30 x 52 (b = spheres / 1,560; up to 1k: b x 20 x 10)


def rollout_shape(count: int) -> tuple[int, int, int]:
    """(b, h, n) of about ``count`` rollout spheres: b x 20 x 10 up to 1k (5 x 20 x 10: five
    bodies, so that a small set still samples the scene), else b x 30 x 52 (64 x 30 x 52 for 100k)."""
    if count <= 1_000:
        return max(1, count // 200), 20, 10
    return max(1, round(count / (HORIZON * PER_STEP))), HORIZON, PER_STEP


class SnapshotRunner(CostRunner):
    """CostRunner on a MeshWorld, called as MeshWorld's evaluations call the Functions: inside
    ``world.reading()``, the snapshot as the trailing sign argument (its per-slot methods and
    slot BVHs)."""

    def forward_backward(self) -> torch.Tensor:
        self.spheres_grad.grad = None
        with self.world.reading() as snap:
            c = SdfMeshWarpPy.apply(self.spheres_grad, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                    snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh,
                                    self.max_dist, None, False, False, snap)
        c.sum().backward()
        return self.spheres_grad.grad

    def swept_forward_backward(self, sweep_steps: int = SWEEP_STEPS) -> torch.Tensor:
        self.spheres_grad.grad = None
        with self.world.reading() as snap:
            c = SweptSdfMeshWarpPy.apply(self.spheres_grad, self.cost, self.grad, self.sparsity, self.weight,
                                         self.eta, self.speed_dt, snap.mesh_idx, snap.mesh_pose_inverse,
                                         snap.mesh_enable, snap.n_env_mesh, self.max_dist, sweep_steps, False, None,
                                         False, snap)
        c.sum().backward()
        return self.spheres_grad.grad


class RawRunner(CostRunner):
    """CostRunner on raw tensors called as a cuRobo user calls the Functions: no trailing sign
    argument."""

    def forward_backward(self) -> torch.Tensor:
        self.spheres_grad.grad = None
        c = SdfMeshWarpPy.apply(self.spheres_grad, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                *self._world_args())
        c.sum().backward()
        return self.spheres_grad.grad

    def swept_forward_backward(self, sweep_steps: int = SWEEP_STEPS) -> torch.Tensor:
        s = self.snap
        self.spheres_grad.grad = None
        c = SweptSdfMeshWarpPy.apply(self.spheres_grad, self.cost, self.grad, self.sparsity, self.weight, self.eta,
                                     self.speed_dt, s.mesh_idx, s.mesh_pose_inverse, s.mesh_enable, s.n_env_mesh,
                                     self.max_dist, sweep_steps)
        c.sum().backward()
        return self.spheres_grad.grad


def _scene_summary(meshes: list[scenes.SceneMesh], world, adopted) -> None:
    """Per mesh: what MeshWorld's auto chose and why, and what adoption made of the raw mesh."""
    regimes = getattr(getattr(adopted, "adopted", None), "regimes", None)
    rows = []
    for i, m in enumerate(meshes):
        info = world.mesh_info(m.name)
        auto = info.get("auto", {})
        rows.append([m.name, real_meshes.BY_NAME[m.name].kind, f"{len(m.triangles):,}", info["sign_method"],
                     auto.get("reason", ""), "skipped" if regimes is None else str(regimes[0, i])])
    emit(table(["mesh", "kind", "triangles", "MeshWorld auto", "auto's reason", "adopted as"], rows))


def real_mesh_table(b: Bench, sphere_counts: tuple[int, ...] | None = None) -> None:
    """The real-mesh rows at each sphere count (module docstring)."""
    counts = tuple(sphere_counts or ((1_000, 6_240) if b.quick else DEFAULT_SPHERES))
    meshes = scenes.real_robot_meshes()
    n_tri = sum(len(m.triangles) for m in meshes)
    section(f"Real robot meshes on {b.device} ({cpu_model() if b.device == 'cpu' else b.device}): "
            f"{len(meshes)} manufacturers' meshes, {n_tri:,} triangles, side by side with cuRobo-style kernels")
    world = build_world(meshes, b.device, SignMethod.AUTO)
    raw = TensorWorld(meshes, b.device, 0.0)
    adoptable = hasattr(robot_sdf, "adopt_meshes")
    adopted = TensorWorld(meshes, b.device, 0.0, adopt=True) if adoptable else None
    _scene_summary(meshes, world, adopted)
    workspace = scenes.scene_box(meshes, scenes.ANYWHERE_MARGIN)
    emit(f"\nPlain: the sphere mix of bench.scenes.mixed_spheres, r = {scenes.SPHERE_RADIUS} m; swept: MPPI-like "
         f"rollouts (bench.scenes.mpc_rollouts through the scene box grown by {scenes.ANYWHERE_MARGIN} m, 1-3 cm "
         f"steps), sweep_steps {SWEEP_STEPS}; max_dist {scenes.MAX_DIST} m, activation {scenes.ACTIVATION} m; fwd+bwd, "
         + ("one thread." if b.device == "cpu" else "GPU.") + f" Reference of '/ cuRobo-style': {CUROBO_STYLE} "
         "(bench/curobo_style.py) on the raw tensors.")
    if not adoptable:
        emit(f"'{ADOPTED}': skipped (this robot_sdf has no adopt_meshes).")
    rows, notes = [], []
    for count in counts:
        spheres, mix = scenes.mixed_spheres(meshes, count)
        shape = rollout_shape(count)
        rollouts = scenes.mpc_rollouts(*shape, workspace=workspace)
        runners = {RAW: (RawRunner(raw, spheres), RawRunner(raw, rollouts)),
                   MESHWORLD: (SnapshotRunner(world, spheres), SnapshotRunner(world, rollouts))}
        if adopted is not None:
            runners[ADOPTED] = (CostRunner(adopted, spheres), CostRunner(adopted, rollouts))
        plain_ref = CuroboStyleRunner(runners[RAW][0])  # the raw tensors: what cuRobo itself would be given
        swept_ref = CuroboStyleRunner(runners[RAW][1])
        cases: dict[tuple[str, str], Callable[[], object]] = {
            ("plain", CUROBO_STYLE): plain_ref.forward_backward,
            ("swept", CUROBO_STYLE): lambda f=swept_ref.forward_backward: f(SWEEP_STEPS),
            ("plain on the rollouts", CUROBO_STYLE): swept_ref.forward_backward}
        for name, (plain, swept) in runners.items():
            cases[("plain", name)] = plain.forward_backward
            cases[("swept", name)] = swept.swept_forward_backward
            cases[("plain on the rollouts", name)] = swept.forward_backward
        res: dict[tuple[str, str], Stats] = timed_side_by_side(b, cases)
        costed = _costed_shares(plain_ref, swept_ref, runners)
        n_plain, n_roll = spheres.shape[0], int(np.prod(shape))
        for kind in ("plain", "swept", "plain on the rollouts"):
            ref = res[(kind, CUROBO_STYLE)].median
            for name in PATHS:
                if (kind, name) not in res:
                    rows.append([f"{n_plain:,}" if kind == "plain" else f"{n_roll:,}", kind, name, "skipped", "", "",
                                 "", ""])
                    continue
                st = res[(kind, name)]
                n = n_plain if kind == "plain" else n_roll
                ratio = ""
                if kind == "swept":
                    ratio = f"{st.median / res[('plain on the rollouts', name)].median:.2f}"
                rows.append([f"{n:,}", kind, name, st.ms(), f"{1e9 * st.median / n:,.0f}", f"{st.median / ref:.2f}",
                             ratio, costed.get((kind, name), "")])
        notes.append(f"{n_plain:,} plain spheres: " + ", ".join(f"{k} {v:,}" for k, v in mix.items())
                     + f"; rollouts {' x '.join(map(str, shape))}.")
    emit("")
    emit(table(["spheres", "cost", "world tensors", "median ms (p25-p75)", "ns / sphere", "/ cuRobo-style",
                "swept / plain on the rollouts", "cost > 0"], rows))
    for note in notes:
        emit(note)
    swept_by_sweep_steps(b, {name: swept for name, (_, swept) in runners.items() if name != RAW})
    swept_by_approach(b, world, scenes.mpc_rollouts(*rollout_shape(counts[-1]), workspace=workspace))


# sweep_steps of swept_by_sweep_steps's columns; SWEEP_STEPS (4) is the bench's own.
SWEEP_STEPS_COMPARED = (1, 2, SWEEP_STEPS)


def swept_by_sweep_steps(b: Bench, runners: dict[str, CostRunner]) -> None:
    """Swept (each of SWEEP_STEPS_COMPARED) against plain on the rollouts of ``runners`` (path name ->
    runner on the same rollouts), fwd+bwd, interleaved: what the samples cost beyond the step's own
    query. sweep_steps K puts K samples on each side of a step (docs/design.md "Swept cost")."""
    any_runner = next(iter(runners.values()))
    section(f"Swept / plain on the real-mesh rollouts on {b.device}, by sweep_steps")
    emit(f"The {any_runner.count:,} rollout spheres of the table above ({' x '.join(map(str, any_runner.spheres.shape[:3]))}), "
         "fwd+bwd, " + ("one thread" if b.device == "cpu" else "GPU") + "; each cell: swept median / plain median "
         "of the same path, all cases of the table interleaved.")
    cases: dict[tuple[str, str], Callable[[], object]] = {}
    for name, runner in runners.items():
        cases[(name, "plain")] = runner.forward_backward
        for k in SWEEP_STEPS_COMPARED:
            cases[(name, f"swept {k}")] = lambda f=runner.swept_forward_backward, k=k: f(k)
    res: dict[tuple[str, str], Stats] = timed_side_by_side(b, cases)
    rows = []
    for name in runners:
        plain = res[(name, "plain")].median
        rows.append([name, res[(name, "plain")].ms()]
                    + [f"{res[(name, f'swept {k}')].median / plain:.2f}" for k in SWEEP_STEPS_COMPARED])
    emit(table(["world tensors", "plain median ms (p25-p75)"]
               + [f"swept {k} / plain" for k in SWEEP_STEPS_COMPARED], rows))


# Bands of a trajectory's closest approach to any surface (m): its smallest signed distance over
# its steps. Inside: some step's centre is inside a mesh; below r + eta: some step costs.
APPROACH_BANDS = (("inside a mesh at some step", -np.inf, 0.0),
                  (f"within r + eta ({scenes.SPHERE_RADIUS + scenes.ACTIVATION:g} m)", 0.0,
                   scenes.SPHERE_RADIUS + scenes.ACTIVATION),
                  ("within r + eta + 5 cm", scenes.SPHERE_RADIUS + scenes.ACTIVATION,
                   scenes.SPHERE_RADIUS + scenes.ACTIVATION + 0.05),
                  (f"within max_dist + r + eta ({scenes.MAX_DIST + scenes.SPHERE_RADIUS + scenes.ACTIVATION:g} m)",
                   scenes.SPHERE_RADIUS + scenes.ACTIVATION + 0.05,
                   scenes.MAX_DIST + scenes.SPHERE_RADIUS + scenes.ACTIVATION),
                  ("farther", scenes.MAX_DIST + scenes.SPHERE_RADIUS + scenes.ACTIVATION, np.inf))


def swept_by_approach(b: Bench, world, rollouts: np.ndarray) -> None:
    """MeshWorld's swept and plain cost on the rollouts (b, h, n, 4), trajectory by trajectory,
    grouped by how near each comes to a surface: where the swept cost's time over the plain one
    goes. Each group runs as its own call (its trajectories as (count, h, 1) spheres), fwd+bwd,
    swept with the bench's sweep_steps and with 1."""
    count, horizon = rollouts.shape[0] * rollouts.shape[2], rollouts.shape[1]
    trajectories = np.ascontiguousarray(rollouts.transpose(0, 2, 1, 3).reshape(count, horizon, 1, 4))
    centres = torch.from_numpy(np.ascontiguousarray(trajectories[..., :3].reshape(-1, 3)))
    sd, _ = world.signed_distance(centres, max_distance=1.0)
    approach = sd.reshape(count, horizon).cpu().numpy().min(axis=1)
    section(f"Swept against plain on the real-mesh rollouts on {b.device}, by the trajectories' closest approach")
    emit(f"MeshWorld (auto) on the {count * horizon:,} rollout spheres of the table above ({count:,} trajectories of "
         f"{horizon} steps), each group of trajectories in calls of its own, fwd+bwd, "
         + ("one thread" if b.device == "cpu" else "GPU") + "; closest approach: a trajectory's smallest signed "
         "distance to any surface over its steps (MeshWorld.signed_distance).")
    rows, plain_sum, excess, excess_1 = [], 0.0, {}, {}
    for name, lo, hi in APPROACH_BANDS:
        chosen = (approach >= lo) & (approach < hi)
        if not chosen.any():
            rows.append([name, "0", "", "", "", "", ""])
            continue
        runner = SnapshotRunner(world, trajectories[chosen])
        cases = {"plain": runner.forward_backward, "swept": runner.swept_forward_backward,
                 "swept 1": lambda f=runner.swept_forward_backward: f(1)}
        res = timed_side_by_side(b, cases)
        plain, swept = res["plain"].median, res["swept"].median
        plain_sum += plain
        excess[name] = swept - plain
        excess_1[name] = res["swept 1"].median - plain
        rows.append([name, f"{int(chosen.sum()):,}", f"{100 * chosen.mean():.1f} %", res["plain"].ms(),
                     res["swept"].ms(), f"{swept / plain:.2f}", f"{res['swept 1'].median / plain:.2f}"])
    total_excess = sum(excess.values())
    for row in rows:
        row.append(f"{100 * excess[row[0]] / total_excess:.0f} %" if row[0] in excess and total_excess > 0 else "")
    emit(table(["closest approach", "trajectories", "share", "plain median ms (p25-p75)",
                "swept median ms (p25-p75)", "swept / plain", "swept 1 / plain", "share of swept - plain (swept)"],
               rows))
    near = sum(v for (name, lo, hi) in APPROACH_BANDS[:2] if (v := excess.get(name)) is not None)
    if plain_sum > 0:
        emit(f"Summed over the groups' calls: swept / plain {(plain_sum + total_excess) / plain_sum:.2f}; with the "
             "swept cost of every trajectory that never comes within r + eta equal to its plain cost: "
             f"{(plain_sum + near) / plain_sum:.2f}. (Separate calls of one sphere a step: these sums differ from "
             f"the one call of the table above.) 'swept': sweep_steps {SWEEP_STEPS}; 'swept 1': sweep_steps 1, "
             f"whose swept / plain summed over the groups' calls reads "
             f"{(plain_sum + sum(excess_1.values())) / plain_sum:.2f}.")


def _costed_shares(plain_ref: CuroboStyleRunner, swept_ref: CuroboStyleRunner, runners: dict) -> dict:
    """'cost > 0' column: share of spheres each path costs (one untimed call each)."""
    out = {}
    plain_ref.launch(0)
    out[("plain", CUROBO_STYLE)] = plain_ref.cost.clone()
    swept_ref.launch(SWEEP_STEPS)
    out[("swept", CUROBO_STYLE)] = swept_ref.cost.clone()
    swept_ref.launch(0)
    out[("plain on the rollouts", CUROBO_STYLE)] = swept_ref.cost.clone()
    for name, (plain, swept) in runners.items():
        plain.forward_backward()
        out[("plain", name)] = plain.cost.clone()
        swept.swept_forward_backward()
        out[("swept", name)] = swept.cost.clone()
        swept.forward_backward()
        out[("plain on the rollouts", name)] = swept.cost.clone()
    return {k: f"{100 * float((c > 0).float().mean()):.1f} %" for k, c in out.items()}
