"""The CUDA hazards that only a GPU can show, checked in one run (bench/gpu_session.sh runs it first).

    python -m bench.gpu_hazards [--device cuda:0]

Each check prints one line, PASS, FAIL (with the reason) or SKIP (with why), and the run exits
non-zero when one failed. Expected values come from the numpy reference (test/reference.py) or
from the same call made eagerly outside the hazard. The checks:

- host syncs: torch.cuda.set_sync_debug_mode("error") around set_pose, sphere_cost with backward,
  the swept cost, SdfMeshWarpPy on the snapshot of a world changed under inference_mode, and
  RobotModel.spheres (a URDF with a mimic joint), in a world of 8 obstacles (slot BVHs);
- two reader streams, one kept busy, evaluating while a thread refits and moves the meshes: every
  result equals the reference of the world revision it reports;
- a CUDA graph of SdfMeshWarpPy replayed after in-place updates of its pose tensor (float32, and
  float64: a converted copy made inside the capture);
- refusals with a clear message: a world change and a MeshWorld evaluation inside a capture, CPU
  spheres given to a cuda:0 world (a correct copy is fine too).

Under compute-sanitizer (bench/gpu_session.sh uses it where the image has it) memory errors of
any of these end the run with the sanitizer's report.
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import traceback
from pathlib import Path

import numpy as np
import torch

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))

import reference as ref  # noqa: E402
from robot_sdf import MeshWorld  # noqa: E402
from robot_sdf.types import SignMethod  # noqa: E402
from robot_sdf.warp_primitives import SdfMeshWarpPy  # noqa: E402

ETA, MAX_DIST = 0.05, 0.5
BOX_V, BOX_T = ref.box((0.3, 0.3, 0.3))
SPH_V, SPH_T = ref.icosphere(0.15, 2)
ATOL = 2e-4


def _pose(i: int, shift: float = 0.0) -> np.ndarray:
    return np.array([0.4 * (i % 4) - 0.6 + shift, 0.4 * (i // 4) - 0.2, 0.0, 1.0, 0.0, 0.0, 0.0])


def _geometry(i: int) -> tuple[np.ndarray, np.ndarray]:
    return (SPH_V, SPH_T) if i % 2 else (BOX_V, BOX_T)


def _world(device: str) -> MeshWorld:
    world = MeshWorld(device=device, sign_method="auto", max_distance=MAX_DIST)
    for i in range(8):
        world.add_mesh(f"m{i}", *_geometry(i), _pose(i))
    return world


def _spheres(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = rng.uniform([-0.9, -0.5, -0.3], [0.9, 0.5, 0.3], size=(n, 3))
    r = rng.uniform(0.0, 0.05, size=(n, 1))
    return np.concatenate([p, r], 1)[None, None].astype(np.float32)


def _reference(spheres: np.ndarray, poses: list[np.ndarray]) -> np.ndarray:
    meshes = [ref.RefMesh(*_geometry(i), pose) for i, pose in enumerate(poses)]
    return ref.sphere_cost(spheres.astype(np.float64), [meshes], ETA, 1.0, MAX_DIST)[0]


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def run(self, name: str, check) -> None:
        try:
            skipped = check()
        except Exception as error:  # every failure is reported, the other checks still run
            self.failed += 1
            print(f"FAIL {name}: {type(error).__name__}: {error}")
            traceback.print_exc(limit=4)
            return
        print(f"SKIP {name}: {skipped}" if skipped else f"PASS {name}", flush=True)


def check_no_host_sync(device: str):
    with torch.inference_mode():
        world = _world(device)
    spheres = torch.from_numpy(_spheres(2000, 1)).to(device)
    b, h, n, _ = spheres.shape
    outs = (torch.empty(b, h, n, device=device), torch.empty(b, h, n, 4, device=device),
            torch.zeros(b, h, n, dtype=torch.uint8, device=device))
    scalars = [torch.tensor([v], device=device) for v in (1.0, ETA, MAX_DIST)]
    robot = _robot(device)

    def step(k: int):
        world.set_pose("m3", _pose(3, 0.01 * k))
        s = spheres.clone().requires_grad_(True)
        world.sphere_cost(s, ETA, 1.0).sum().backward()
        world.swept_sphere_cost(spheres, ETA, 1.0, sweep_steps=2)
        snap = world.snapshot()
        SdfMeshWarpPy.apply(spheres, *outs, scalars[0], scalars[1], snap.mesh_idx, snap.mesh_pose_inverse,
                            snap.mesh_enable, snap.n_env_mesh, scalars[2], None, False, False, snap.sign_methods)
        if robot is not None:
            robot.spheres(torch.zeros(4, robot.dof, device=device))

    step(0)  # first calls load modules, build slot BVHs and fill the caches
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for k in range(1, 4):
            step(k)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    cost = world.sphere_cost(spheres, ETA, 1.0).cpu().numpy()
    poses = [_pose(i, 0.03 if i == 3 else 0.0) for i in range(8)]
    np.testing.assert_allclose(cost, _reference(spheres.cpu().numpy(), poses), atol=ATOL, rtol=ATOL)
    return None if robot is not None else "RobotModel part skipped: pytorch_kinematics is not installed"


_URDF = """<?xml version="1.0"?>
<robot name="gpu_check">
  <link name="base"/><link name="a"/><link name="b"/><link name="c"/>
  <joint name="j1" type="revolute"><parent link="base"/><child link="a"/><origin xyz="0 0 0.1"/>
    <axis xyz="0 0 1"/><limit lower="-2" upper="2" velocity="1" effort="1"/></joint>
  <joint name="j2" type="revolute"><parent link="a"/><child link="b"/><origin xyz="0 0 0.3"/>
    <axis xyz="0 1 0"/><limit lower="-2" upper="2" velocity="1" effort="1"/></joint>
  <joint name="j3" type="prismatic"><parent link="b"/><child link="c"/><origin xyz="0.2 0 0"/>
    <axis xyz="1 0 0"/><limit lower="0" upper="0.1" velocity="1" effort="1"/>
    <mimic joint="j1" multiplier="0.1" offset="0.01"/></joint>
</robot>
"""


def _robot(device: str):
    try:
        import pytorch_kinematics  # noqa: F401
    except ImportError:
        return None
    import tempfile

    from robot_sdf.robot import RobotModel

    folder = Path(tempfile.mkdtemp(prefix="robot_sdf_gpu_"))
    (folder / "robot.urdf").write_text(_URDF)
    spheres = {"spheres": {"a": [[0.0, 0.0, 0.1, 0.05]], "b": [[0.1, 0.0, 0.0, 0.04]], "c": [[0.0, 0.0, 0.0, 0.03]]}}
    return RobotModel(folder / "robot.urdf", spheres, device=device)


def check_two_streams_against_writer(device: str):
    """Readers on two streams (one kept busy) while a thread moves one mesh and refits another.
    Each result is compared with the reference of the poses its world revision had."""
    world = _world(device)
    spheres_np = _spheres(4000, 2)
    spheres = torch.from_numpy(spheres_np).to(device)
    shifts = {world.revision: (0.0, 1.0)}  # revision -> (m3's x shift, m0's scale)
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer():
        try:
            k = 0
            while not stop.is_set() and k < 60:
                k += 1
                shift, scale = 0.005 * k, 1.0 + 0.002 * k
                with lock:
                    world.set_pose("m3", _pose(3, shift))
                    revision = world.update_vertices("m0", BOX_V * scale)
                    shifts[revision] = (shift, scale)
        except BaseException as error:  # reported by the main thread
            errors.append(error)

    results = []
    busy, other = torch.cuda.Stream(), torch.cuda.Stream()
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        for k in range(30):
            stream = busy if k % 2 else other
            with torch.cuda.stream(stream):
                if stream is busy:
                    torch.cuda._sleep(2_000_000)
                cost, _, revision = world.evaluate_sphere_cost(spheres, ETA, 1.0, max_distance=MAX_DIST,
                                                               compute_gradient=False, return_revision=True)
                results.append((stream, cost, revision))
    finally:
        stop.set()
        thread.join()
    if errors:
        raise errors[0]
    torch.cuda.synchronize()
    checked = 0
    for _, cost, revision in results:
        if revision not in shifts:
            continue  # a revision between set_pose and update_vertices: compared by the next one
        shift, scale = shifts[revision]
        poses = [_pose(i, shift if i == 3 else 0.0) for i in range(8)]
        meshes = [ref.RefMesh(*(_geometry(i) if i else (BOX_V * scale, BOX_T)), pose) for i, pose in enumerate(poses)]
        expected = ref.sphere_cost(spheres_np.astype(np.float64), [meshes], ETA, 1.0, MAX_DIST)[0]
        np.testing.assert_allclose(cost.cpu().numpy(), expected, atol=ATOL, rtol=ATOL)
        checked += 1
    if checked < 5:
        raise AssertionError(f"only {checked} results at revisions with a known world")


def check_graph_replay_after_in_place_updates(device: str):
    meshes = [ref.RefMesh(*_geometry(i), _pose(i)) for i in range(8)]
    import warp as wp

    from robot_sdf.launch import warp_device

    wdev = warp_device(torch.device(device))
    warp_meshes = [wp.Mesh(points=wp.array(m.vertices.astype(np.float32), dtype=wp.vec3, device=wdev),
                           indices=wp.array(m.triangles.astype(np.int32).ravel(), dtype=wp.int32, device=wdev),
                           support_winding_number=True) for m in meshes]
    mesh_idx = torch.tensor([[np.uint64(m.id).astype(np.int64) for m in warp_meshes]], device=device)
    enable = torch.ones(1, 8, dtype=torch.uint8, device=device)
    counts = torch.tensor([8], dtype=torch.int32, device=device)
    scalars = [torch.tensor([v], device=device) for v in (1.0, ETA, MAX_DIST)]
    spheres_np = _spheres(3000, 3)
    spheres = torch.from_numpy(spheres_np).to(device)
    b, h, n, _ = spheres.shape
    for dtype in (torch.float32, torch.float64):
        pose_inv = torch.zeros(1, 8, 8, dtype=dtype, device=device)
        pose_inv[0, :, :7] = torch.from_numpy(np.stack([ref.pose_inverse(m.pose) for m in meshes])).to(device, dtype)
        out = (torch.empty(b, h, n, device=device), torch.empty(b, h, n, 4, device=device),
               torch.zeros(b, h, n, dtype=torch.uint8, device=device))

        def call():
            return SdfMeshWarpPy.apply(spheres, *out, scalars[0], scalars[1], mesh_idx, pose_inv, enable, counts,
                                       scalars[2], None, False, False, SignMethod.NORMAL)

        call()  # validates and fills the caches outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            cost = call()
        moved = [np.array(m.pose) for m in meshes]
        for k in range(3):
            moved[5][0] += 0.05
            pose_inv[0, 5, :7] = torch.from_numpy(ref.pose_inverse(moved[5])).to(device, dtype)  # in place
            graph.replay()
            torch.cuda.synchronize()
            expected = ref.sphere_cost(spheres_np.astype(np.float64),
                                       [[ref.RefMesh(m.vertices, m.triangles, p) for m, p in zip(meshes, moved)]],
                                       ETA, 1.0, MAX_DIST)[0]
            np.testing.assert_allclose(cost.cpu().numpy(), expected, atol=ATOL, rtol=ATOL,
                                       err_msg=f"pose tensor {dtype}, replay {k}")


def check_refusals(device: str):
    world = _world(device)
    spheres = torch.from_numpy(_spheres(100, 4)).to(device)
    world.sphere_cost(spheres, ETA, 1.0)
    torch.cuda.synchronize()
    revision = world.revision
    for name, action in (("set_pose", lambda: world.set_pose("m1", _pose(1, 0.1))),
                         ("sphere_cost", lambda: world.sphere_cost(spheres, ETA, 1.0))):
        graph = torch.cuda.CUDAGraph()
        message = ""
        try:
            with torch.cuda.graph(graph):
                action()
        except RuntimeError as error:
            message = str(error)
        if "CUDA graph" not in message:
            raise AssertionError(f"{name} inside a capture: no clear refusal ({message!r})")
    if world.revision != revision:
        raise AssertionError("a refused world change inside a capture changed the world")
    cpu_spheres = spheres.cpu()
    try:
        got = world.sphere_cost(cpu_spheres, ETA, 1.0)
    except (ValueError, RuntimeError) as error:
        if "device" not in str(error) and "cuda" not in str(error):
            raise AssertionError(f"CPU spheres for a cuda world: unclear error {error!r}") from error
    else:
        expected = world.sphere_cost(spheres, ETA, 1.0)
        torch.testing.assert_close(got.to(expected.device), expected)


CHECKS = {
    "sync": ("no host sync on the hot paths (8 obstacles, world changed under inference_mode)", check_no_host_sync),
    "streams": ("two reader streams against a writer thread", check_two_streams_against_writer),
    "graph": ("graph replay after in-place pose updates", check_graph_replay_after_in_place_updates),
    "refusals": ("clear refusals (capture, CPU spheres)", check_refusals),
}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--only", choices=sorted(CHECKS), action="append",
                        help="run only this check (repeatable); default: all")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("SKIP every check: torch sees no CUDA device")
        return 0
    print(f"device {torch.cuda.get_device_name(args.device)}, torch {torch.__version__}", flush=True)
    checks = Checks()
    for key, (title, check) in CHECKS.items():
        if args.only and key not in args.only:
            print(f"SKIP {title}: not asked for (--only)")
            continue
        checks.run(title, lambda check=check: check(args.device))
    print(f"{checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())
