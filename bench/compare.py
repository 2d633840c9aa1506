"""Two checkouts of robot_sdf side by side in one run: ``python -m bench.compare --against <commit> [--quick]``.

The other commit is checked out in a temporary git worktree (``git worktree add --detach``,
removed at the end). One worker subprocess per checkout (this working tree, "current", uncommitted
changes included, or the commit given by --current in a worktree of its own; and the worktree,
"other") runs with PYTHONPATH=<its checkout>, so that ``import robot_sdf`` loads that checkout's
package (each worker reports robot_sdf.__file__), with ROBOT_SDF_CPU_THREADS=1 and
torch.set_num_threads(1): one thread each. The workers import nothing from ``bench`` (the other
checkout has a bench package of its own): this process builds the scenes once with the current
checkout's bench/scenes.py and bench/real_meshes.py and hands them over as .npy files, so both
workers load the same bytes. The workers use only API that both commits have: MeshWorld
(add_mesh, reading) and SdfMeshWarpPy / SweptSdfMeshWarpPy.apply in the argument order of
docs/design.md "Tensor layouts".

This process talks to the workers over their stdin/stdout, one JSON line per request, and times
one case at a time: each round asks one worker for one fwd+bwd call (timed inside the worker),
then the other, the order alternating from round to round (ABBA...), so that a burst of load from
other processes hits both alike. Only one worker computes at any moment.

Cases (fwd+bwd, one thread, CPU):

- real-mesh scene (bench.scenes.real_robot_meshes: the 11 rtb-data meshes): plain cost of the
  sphere mix (bench.scenes.mixed_spheres) at 1k and 20k spheres; MPPI-like rollouts
  (bench.scenes.mpc_rollouts in bench/real_bench.py's rollout_shape, through the scene box grown
  by ANYWHERE_MARGIN) swept (sweep_steps 4) and plain at about 1k and 20k spheres; each on
  MeshWorld (sign method auto, its snapshot passed inside ``reading()``) and on
  raw tensors (``wp.Mesh(points, indices, support_winding_number=True)`` per mesh,
  mesh_pose_inverse[..., 7] = 0, no trailing sign argument);
- standard scene of bench/core_bench.py (bench.scenes.standard_meshes, MeshWorld with its sign
  method normal): plain on near-surface spheres and swept on random-walk trajectories
  (bench.scenes.trajectories), 1k and 20k spheres.

Per case: median ms (p25-p75) of each checkout, the ratio current / other, and whether the two
computed the same costs (max |difference| and the share of spheres whose costs differ by more
than 1e-5: information, not an error).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEP_STEPS = 4
SPEED_DT = 0.1
COST_TOLERANCE = 1e-5


# ------------------------------------------------------------------------------------ worker
def _worker_main() -> int:
    """One checkout's side: answers JSON requests on stdin, one per line, until "quit"."""
    import numpy as np
    import torch
    import warp as wp

    import robot_sdf
    from robot_sdf import MeshWorld
    from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy

    import inspect

    SNAPSHOT_ARGUMENT = "snapshot" in inspect.signature(SdfMeshWarpPy.forward).parameters

    torch.set_num_threads(1)
    wp.config.quiet = True
    out = sys.stdout
    sys.stdout = sys.stderr  # stray prints (Warp's, the package's) must not reach the pipe

    def reply(obj: dict) -> None:
        out.write(json.dumps(obj) + "\n")
        out.flush()

    worlds: dict = {}
    runners: dict = {}
    data = Path()

    def arr(name: str) -> np.ndarray:
        return np.load(data / f"{name}.npy")

    def scene_world(scene: dict, kind: str):
        key = (scene["name"], kind, scene["sign_method"])
        if key in worlds:
            return worlds[key]
        names = scene["meshes"]
        if kind == "meshworld":
            world = MeshWorld(device="cpu", mesh_capacity=len(names), sign_method=scene["sign_method"],
                              max_distance=scene["max_dist"])
            for i, name in enumerate(names):
                world.add_mesh(name, arr(f"{scene['name']}_v{i}"), arr(f"{scene['name']}_t{i}"),
                               pose=arr(f"{scene['name']}_pose{i}"))
            worlds[key] = world
        else:
            meshes = [wp.Mesh(points=wp.array(arr(f"{scene['name']}_v{i}"), dtype=wp.vec3, device="cpu"),
                              indices=wp.array(arr(f"{scene['name']}_t{i}").reshape(-1), dtype=wp.int32,
                                               device="cpu"),
                              support_winding_number=True) for i in range(len(names))]
            pose_inv = arr(f"{scene['name']}_pose_inverse")  # (1, m, 8), [..., 7] = 0
            ids = [int(np.uint64(m.id).astype(np.int64)) for m in meshes]
            worlds[key] = {"meshes": meshes,  # the wp.Mesh objects own the BVHs the ids point at
                           "mesh_idx": torch.tensor([ids], dtype=torch.int64),
                           "mesh_pose_inverse": torch.from_numpy(pose_inv),
                           "mesh_enable": torch.ones((1, len(names)), dtype=torch.uint8),
                           "n_env_mesh": torch.tensor([len(names)], dtype=torch.int32)}
        return worlds[key]

    class Runner:
        def __init__(self, case: dict, scene: dict):
            s = torch.from_numpy(arr(case["spheres"]))
            self.spheres = (s if s.dim() == 4 else s.reshape(1, 1, -1, 4)).clone().requires_grad_(True)
            b, h, n, _ = self.spheres.shape
            self.cost = torch.empty((b, h, n), dtype=torch.float32)
            self.grad = torch.empty((b, h, n, 4), dtype=torch.float32)
            self.sparsity = torch.zeros((b, h, n), dtype=torch.uint8)
            self.weight = torch.ones(1)
            self.eta = torch.full((1,), scene["activation"])
            self.max_dist = torch.full((1,), scene["max_dist"])
            self.speed_dt = torch.full((1,), SPEED_DT)
            self.world = scene_world(scene, case["world"])
            self.swept = case["cost"] == "swept"

        def __call__(self) -> torch.Tensor:
            self.spheres.grad = None
            head = (self.spheres, self.cost, self.grad, self.sparsity, self.weight, self.eta)
            if isinstance(self.world, dict):
                w = self.world
                tensors = (w["mesh_idx"], w["mesh_pose_inverse"], w["mesh_enable"], w["n_env_mesh"], self.max_dist)
                if self.swept:
                    c = SweptSdfMeshWarpPy.apply(*head, self.speed_dt, *tensors, SWEEP_STEPS)
                else:
                    c = SdfMeshWarpPy.apply(*head, *tensors)
            else:
                with self.world.reading() as snap:
                    tensors = (snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh,
                               self.max_dist)
                    # The snapshot by its own name where the checkout has one, else in the sign slot.
                    tail = ("auto", None, snap) if SNAPSHOT_ARGUMENT else (snap,)
                    if self.swept:
                        c = SweptSdfMeshWarpPy.apply(*head, self.speed_dt, *tensors, SWEEP_STEPS, False, None,
                                                     False, *tail)
                    else:
                        c = SdfMeshWarpPy.apply(*head, *tensors, None, False, False, *tail)
            c.sum().backward()
            return c

    for line in sys.stdin:
        req = json.loads(line)
        op = req["op"]
        try:
            if op == "hello":
                reply({"ok": True, "robot_sdf": robot_sdf.__file__, "torch_threads": torch.get_num_threads(),
                       "cpu_threads_env": os.environ.get("ROBOT_SDF_CPU_THREADS"), "warp": wp.config.version})
            elif op == "setup":
                data = Path(req["dir"])
                manifest = json.loads((data / "manifest.json").read_text())
                errors = {}
                for case in manifest["cases"]:
                    try:
                        runners[case["name"]] = Runner(case, manifest["scenes"][case["scene"]])
                    except Exception as e:  # noqa: BLE001 - reported per case, the case is skipped
                        errors[case["name"]] = f"{type(e).__name__}: {e}"
                reply({"ok": True, "errors": errors})
            elif op == "warm":  # first call (compiles kernels, fills caches); keeps cost and gradient
                r = runners[req["case"]]
                t0 = time.perf_counter()
                c = r()
                dt = time.perf_counter() - t0
                np.save(Path(req["out"]) / "cost.npy", c.detach().numpy().reshape(-1))
                np.save(Path(req["out"]) / "grad.npy", r.spheres.grad.detach().numpy().reshape(-1, 4)[:, :3])
                reply({"ok": True, "s": dt})
            elif op == "time":
                r = runners[req["case"]]
                t0 = time.perf_counter()
                r()
                reply({"ok": True, "s": time.perf_counter() - t0})
            elif op == "drop":
                runners.pop(req["case"], None)
                reply({"ok": True})
            elif op == "quit":
                reply({"ok": True})
                return 0
            else:
                reply({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as e:  # noqa: BLE001 - the parent reports it and skips the case
            reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


# ------------------------------------------------------------------------------------ parent
class Worker:
    """A worker subprocess on one checkout."""

    def __init__(self, label: str, checkout: Path, log: Path):
        self.label = label
        self.checkout = checkout
        env = dict(os.environ, PYTHONPATH=str(checkout), ROBOT_SDF_CPU_THREADS="1", OMP_NUM_THREADS="1",
                   PYTHONDONTWRITEBYTECODE="1")
        env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
        self._log = open(log, "w")
        # -P: the script's folder (this bench/) is not put on sys.path ahead of the checkout.
        self.proc = subprocess.Popen([sys.executable, "-P", str(Path(__file__).resolve()), "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log,
                                     text=True, env=env, cwd=str(checkout), bufsize=1)

    def send(self, **req) -> None:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.label} exited (rc {self.proc.poll()}); see {self._log.name}")
        return json.loads(line)

    def ask(self, **req) -> dict:
        self.send(**req)
        return self.receive()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.ask(op="quit")
                self.proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a dead worker is closed anyway
            pass
        if self.proc.poll() is None:
            self.proc.kill()
        self._log.close()


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def _write_scenes(data: Path, quick: bool) -> list[dict]:
    """Build every scene and sphere set with this checkout's bench code; write them to ``data``."""
    import numpy as np

    from bench import scenes
    from bench.real_bench import rollout_shape
    from robot_sdf.geometry import pose_inverse

    manifest: dict = {"scenes": {}, "cases": []}

    def put(name: str, a) -> str:
        np.save(data / f"{name}.npy", np.ascontiguousarray(a))
        return name

    def add_scene(name: str, meshes, sign_method: str) -> None:
        pinv = np.zeros((1, len(meshes), 8), np.float32)
        for i, m in enumerate(meshes):
            put(f"{name}_v{i}", np.asarray(m.vertices, np.float32))
            put(f"{name}_t{i}", np.asarray(m.triangles, np.int32))
            put(f"{name}_pose{i}", np.asarray(m.pose, np.float64))
            pinv[0, i, :7] = pose_inverse(m.pose)
        put(f"{name}_pose_inverse", pinv)  # [..., 7] = 0: cull radius unknown, as cuRobo leaves it
        manifest["scenes"][name] = {"name": name, "meshes": [m.name for m in meshes], "sign_method": sign_method,
                                    "max_dist": scenes.MAX_DIST, "activation": scenes.ACTIVATION,
                                    "triangles": int(sum(len(m.triangles) for m in meshes))}

    def add_case(scene: str, label: str, cost: str, world: str, spheres: str) -> None:
        name = f"{spheres}|{cost}|{world}"  # unique: the sphere set names scene and count
        manifest["cases"].append({"name": name, "scene": scene, "label": label, "cost": cost, "world": world,
                                  "spheres": spheres, "count": int(np.prod(np.load(data / f"{spheres}.npy").shape[:-1]))})

    counts = (1_000, 20_000)
    real = scenes.real_robot_meshes()
    add_scene("real", real, "auto")
    workspace = scenes.scene_box(real, scenes.ANYWHERE_MARGIN)
    for count in counts:
        put(f"real_mixed_{count}", scenes.mixed_spheres(real, count)[0])
        shape = rollout_shape(count)
        put(f"real_rollouts_{count}", scenes.mpc_rollouts(*shape, workspace=workspace))
    for count in counts:
        for world in ("meshworld", "raw"):
            add_case("real", "sphere mix", "plain", world, f"real_mixed_{count}")
        for world in ("meshworld", "raw"):
            add_case("real", "rollouts", "swept", world, f"real_rollouts_{count}")
            add_case("real", "rollouts", "plain", world, f"real_rollouts_{count}")
    standard = scenes.standard_meshes()
    add_scene("standard", standard, "normal")  # bench/core_bench.py's SIGN
    for count, traj in ((1_000, (1, 20, 50)), (20_000, (13, 30, 52))):
        put(f"standard_near_{count}", scenes.near_surface_spheres(standard, count))
        put(f"standard_walks_{count}", scenes.trajectories(standard, *traj))
        add_case("standard", "near surface", "plain", "meshworld", f"standard_near_{count}")
        add_case("standard", "random walks", "swept", "meshworld", f"standard_walks_{count}")
    if quick:
        manifest["cases"] = [c for c in manifest["cases"] if c["count"] <= 1_560]
    (data / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def _quartiles(samples: list[float]) -> tuple[float, float, float]:
    import statistics

    s = sorted(samples)
    if len(s) < 4:
        return statistics.median(s), s[0], s[-1]
    q = statistics.quantiles(s, n=4)
    return statistics.median(s), q[0], q[2]


def _ms(x: float) -> str:
    ms = 1e3 * x
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.2f}" if ms >= 1 else f"{ms:.3f}"


def _stats(samples: list[float]) -> str:
    m, p25, p75 = _quartiles(samples)
    return f"{_ms(m)} ({_ms(p25)}-{_ms(p75)})"


def run(against: str, quick: bool = False, rounds: int | None = None, case_budget_s: float | None = None,
        current: str | None = None) -> int:
    import numpy as np

    from bench import cpu_model, load_average, usable_cores

    rounds = rounds or (6 if quick else 30)
    case_budget_s = case_budget_s or (10.0 if quick else 60.0)
    min_rounds = 4 if quick else 8
    current_hash = _git("rev-parse", "--short", f"{current or 'HEAD'}^{{commit}}")
    dirty = current is None and bool(_git("status", "--porcelain", "--", "robot_sdf"))
    other_hash = _git("rev-parse", "--short", f"{against}^{{commit}}")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="robot_sdf_compare_") as tmp:
        tmp_path = Path(tmp)
        other_tree = tmp_path / "other"
        current_tree = REPO if current is None else tmp_path / "current"
        trees = [other_tree] if current is None else [other_tree, current_tree]
        _git("worktree", "add", "--detach", str(other_tree), other_hash)
        if current is not None:
            _git("worktree", "add", "--detach", str(current_tree), current_hash)
        workers: list[Worker] = []
        try:
            data = tmp_path / "scenes"
            data.mkdir()
            t0 = time.perf_counter()
            workers = [Worker("current", current_tree, tmp_path / "current.log"),
                       Worker("other", other_tree, tmp_path / "other.log")]
            for w in workers:
                w.send(op="hello")  # the workers import while the scenes are built here
            manifest = _write_scenes(data, quick)
            print(f"# robot_sdf: {current_hash}{' + uncommitted changes in robot_sdf/ (the working tree)' if dirty else ''} "
                  f"(current) against {other_hash} (other)\n")
            print(f"Machine: {cpu_model()}, {usable_cores()} usable cores (os.cpu_count {os.cpu_count()}); "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; python {sys.version.split()[0]}; load average "
                  f"{load_average()} at the start.")
            for w in workers:
                hello = w.receive()
                print(f"- worker {w.label}: robot_sdf from {hello['robot_sdf']}, torch threads "
                      f"{hello['torch_threads']}, ROBOT_SDF_CPU_THREADS={hello['cpu_threads_env']}, "
                      f"Warp {hello['warp']}")
                expected = (w.checkout / "robot_sdf" / "__init__.py").resolve()
                if Path(hello["robot_sdf"]).resolve() != expected:
                    raise RuntimeError(f"worker {w.label} loaded {hello['robot_sdf']}, not {expected}")
            for w in workers:
                w.send(op="setup", dir=str(data))
            setup = {w.label: w.receive() for w in workers}
            print(f"Scenes built here, sent as .npy files, workers set up: {time.perf_counter() - t0:.0f} s.")
            for name, s in manifest["scenes"].items():
                print(f"- scene {name}: {len(s['meshes'])} meshes, {s['triangles']:,} triangles; MeshWorld sign "
                      f"method {s['sign_method']}; max_dist {s['max_dist']} m, activation {s['activation']} m")
            print(f"\nfwd+bwd per call, one thread each; per case {min_rounds}-{rounds} rounds alternating "
                  f"current/other (ABBA), after one warm-up call each; swept: sweep_steps {SWEEP_STEPS}. "
                  "ratio = current / other (medians); 'costs differ': max |cost difference| and the share of "
                  f"spheres whose costs differ by more than {COST_TOLERANCE:g}.\n")
            rows, skipped = [], []
            for case in manifest["cases"]:
                name = case["name"]
                errors = {w.label: setup[w.label]["errors"].get(name) for w in workers}
                if any(errors.values()):
                    skipped.append(f"- {name}: " + "; ".join(f"{k}: {v}" for k, v in errors.items() if v))
                    continue
                warm = {}
                for w in workers:
                    out = tmp_path / f"out_{w.label}"
                    out.mkdir(exist_ok=True)
                    warm[w.label] = w.ask(op="warm", case=name, out=str(out))
                if not all(r["ok"] for r in warm.values()):
                    skipped.append(f"- {name}: " + "; ".join(f"{k}: {r['error']}" for k, r in warm.items()
                                                           if not r["ok"]))
                    continue
                cost = {w.label: np.load(tmp_path / f"out_{w.label}" / "cost.npy") for w in workers}
                grad = {w.label: np.load(tmp_path / f"out_{w.label}" / "grad.npy") for w in workers}
                diff = np.abs(cost["current"].astype(np.float64) - cost["other"])
                gdiff = float(np.abs(grad["current"].astype(np.float64) - grad["other"]).max())
                # A second call per worker gives the warm per-call time, which sets the rounds.
                first = {w.label: w.ask(op="time", case=name)["s"] for w in workers}
                n_rounds = max(min_rounds, min(rounds, int(case_budget_s / max(1e-6, sum(first.values())))))
                samples: dict[str, list[float]] = {w.label: [] for w in workers}
                for k in range(n_rounds):
                    for w in (workers if k % 2 == 0 else workers[::-1]):
                        r = w.ask(op="time", case=name)
                        if not r["ok"]:
                            raise RuntimeError(f"{name} on {w.label}: {r['error']}")
                        samples[w.label].append(r["s"])
                for w in workers:
                    w.ask(op="drop", case=name)
                med = {k: _quartiles(v)[0] for k, v in samples.items()}
                shape = "x".join(str(x) for x in np.load(data / f"{case['spheres']}.npy").shape[:-1])
                rows.append([case["scene"], case["label"], case["cost"], "MeshWorld (auto)" if case["world"] ==
                             "meshworld" and case["scene"] == "real" else "MeshWorld (normal)" if case["world"] ==
                             "meshworld" else "raw tensors", f"{case['count']:,} ({shape})",
                             _stats(samples["current"]), _stats(samples["other"]),
                             f"{med['current'] / med['other']:.2f}", str(n_rounds),
                             f"{diff.max():.2e}; {100 * float(np.mean(diff > COST_TOLERANCE)):.2f} %",
                             f"{gdiff:.2e}"])
                print(f"  done: {name} ({n_rounds} rounds, {time.time() - started:.0f} s)", file=sys.stderr,
                      flush=True)
            header = ["scene", "spheres", "cost", "world tensors", "count (shape)", f"current {current_hash} ms",
                      f"other {other_hash} ms", "ratio", "rounds", "costs differ: max; share > 1e-5",
                      "max grad diff"]
            print("| " + " | ".join(header) + " |")
            print("|" + "---|" * len(header))
            for r in rows:
                print("| " + " | ".join(r) + " |")
            if skipped:
                print("\nSkipped for both checkouts:\n" + "\n".join(skipped))
            print(f"\nTotal {time.time() - started:.0f} s; load average {load_average()} at the end.")
        finally:
            for w in workers:
                w.close()
            for tree in trees:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                               capture_output=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--against", help="the other commit (any git revision)")
    p.add_argument("--current", default=None,
                   help="a commit to time as 'current' instead of this working tree (checked out like --against)")
    p.add_argument("--quick", action="store_true", help="fewer cases and rounds (a smoke run)")
    p.add_argument("--rounds", type=int, default=None, help="most rounds per case (default 30, --quick 6)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return _worker_main()
    if not args.against:
        p.error("--against is required")
    return run(args.against, args.quick, args.rounds, current=args.current)


if __name__ == "__main__":
    sys.exit(main())
