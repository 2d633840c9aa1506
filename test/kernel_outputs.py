"""Every kernel's outputs on the test corpus, saved once and compared bitwise with a later run
(CPU): the check of a change to the kernels that must not change a bit (a refactoring, a faster
search). Run `save` before the change, `compare` after it:

    python test/kernel_outputs.py save /tmp/kernels_before.npz
    python test/kernel_outputs.py compare /tmp/kernels_before.npz

Covers SdfMeshWarpPy (plain, esdf, with gradient), SweptSdfMeshWarpPy (sweep_steps 2, 4 and 9,
speed metric on and off) and the Hessian (plain, esdf) on every mesh of test/mesh_corpus.py, through
a MeshWorld per sign method (auto, normal, winding_number, default; two environments, so the slot
BVH and env_query are used) and through raw tensors (passthrough, call-wide methods) and adopted
ones (robot_sdf.adopt_meshes).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import mesh_corpus  # noqa: E402
import reference as ref  # noqa: E402
from conftest import build_warp_env  # noqa: E402
from robot_sdf import MeshWorld, adopt_meshes  # noqa: E402
from robot_sdf.warp_primitives import Query, SdfMeshWarpPy, SweptSdfMeshWarpPy  # noqa: E402

ETA, MAX_DIST = 0.02, 0.1
SPACING = 1.0  # m between the meshes' centres along x


def _scene():
    """(geometries [(name, v, t)], poses per env [(7,) per mesh], world spheres (2, 1, N, 4),
    trajectories (2, 10, M, 4))."""
    rng = np.random.default_rng(7)
    geos, poses0, poses1, spheres, trajs = [], [], [], [], []
    for i, case in enumerate(mesh_corpus.CORPUS):
        v, t = case.build()
        v = np.asarray(v, np.float64)
        geos.append((case.name, v, np.asarray(t, np.int64)))
        shift = np.array([SPACING * i, 0.0, 0.0])
        poses0.append(np.concatenate([shift, [1.0, 0.0, 0.0, 0.0]]))
        q = ref.random_quaternion(rng)
        poses1.append(np.concatenate([shift + rng.uniform(-0.05, 0.05, 3), q]))
        pts = mesh_corpus.sample_points(v, 24, seed=i)
        r = rng.uniform(0.0, 0.04, len(pts))
        r[rng.random(len(pts)) < 0.1] = -1.0
        spheres.append(np.concatenate([pts + shift, r[:, None]], 1))
        lo, hi = v.min(0), v.max(0)
        ends = rng.uniform(lo - 0.1 * (hi - lo), hi + 0.1 * (hi - lo), (2, 4, 3))
        s = np.linspace(0.0, 1.0, 10)[:, None, None]
        path = ends[0][None] * (1 - s) + ends[1][None] * s  # (10, 4, 3)
        path[:, 3] = path[0, 3]  # one stationary sphere
        path[:, 2] += rng.normal(0.0, 0.01, (10, 3))  # one wobbling one
        radius = np.broadcast_to(rng.uniform(0.0, 0.03, 4), (10, 4)).copy()
        radius[4, 1] = -1.0  # a switched-off step: its neighbours lose a side
        trajs.append(np.concatenate([path + shift, radius[..., None]], -1))
    spheres = np.concatenate(spheres)
    trajs = np.concatenate(trajs, 1)
    return geos, [poses0, poses1], np.stack([spheres, spheres])[:, None], np.stack([trajs, trajs[:, ::-1]])


def _outs(x):
    b, h, n = x.shape[:3]
    return (torch.zeros((b, h, n)), torch.zeros((b, h, n, 4)), torch.zeros((b, h, n), dtype=torch.uint8))


def _tensors(world: tuple, spheres, trajs, sign, tag: str, results: dict, snapshot=None) -> None:
    mesh_idx, pose_inv, enable, n_env = world
    one, eta, md, dt = (torch.ones(1), torch.full((1,), ETA), torch.full((1,), MAX_DIST), torch.full((1,), 0.1))
    env = torch.tensor([0, 1], dtype=torch.int32)
    for esdf in (False, True):
        x = torch.tensor(spheres, dtype=torch.float32).requires_grad_(True)
        outs = _outs(x)
        cost = SdfMeshWarpPy.apply(x, *outs, one, eta, mesh_idx, pose_inv, enable, n_env, md, env, False, esdf, sign,
                                   None, snapshot)
        results[f"{tag}/plain/esdf{int(esdf)}/cost"] = cost.detach().numpy().copy()
        results[f"{tag}/plain/esdf{int(esdf)}/grad"] = outs[1].numpy().copy()
        results[f"{tag}/plain/esdf{int(esdf)}/sparsity"] = outs[2].numpy().copy()
        hess = Query(one, eta, md, mesh_idx, pose_inv, enable, n_env, sign, snapshot, esdf=esdf).hessian(
            x.detach(), env)
        results[f"{tag}/hessian/esdf{int(esdf)}"] = hess.numpy().copy()
    for steps in (2, 4, 9):
        for speed in (False, True):
            x = torch.tensor(trajs, dtype=torch.float32).requires_grad_(True)
            outs = _outs(x)
            cost = SweptSdfMeshWarpPy.apply(x, *outs, one, eta, dt, mesh_idx, pose_inv, enable, n_env, md, steps,
                                            speed, env, False, sign, None, snapshot)
            (grad,) = torch.autograd.grad(cost.sum(), x)
            results[f"{tag}/swept/{steps}/{int(speed)}/cost"] = cost.detach().numpy().copy()
            results[f"{tag}/swept/{steps}/{int(speed)}/out_grad"] = outs[1].numpy().copy()
            results[f"{tag}/swept/{steps}/{int(speed)}/grad"] = grad.numpy().copy()


def run() -> dict:
    geos, poses, spheres, trajs = _scene()
    results: dict = {}
    for method in ("auto", "normal", "winding_number", "default"):
        world = MeshWorld(device="cpu", num_envs=2, sign_method=method, max_distance=MAX_DIST)
        for env in (0, 1):
            for (name, v, t), pose in zip(geos, poses[env]):
                world.add_mesh(name, v, t, pose=pose, env=env)
        s = torch.tensor(spheres, dtype=torch.float32)
        env_index = torch.tensor([0, 1])
        with world.reading() as snap:
            _tensors((snap.mesh_idx, snap.mesh_pose_inverse, snap.mesh_enable, snap.n_env_mesh), spheres, trajs,
                     "auto", f"world_{method}", results, snap)
        cost, grad = world.evaluate_sphere_cost(s, ETA, 1.0, env_index, MAX_DIST)
        results[f"world_{method}/evaluate/cost"] = cost.numpy()
        results[f"world_{method}/evaluate/grad"] = grad.numpy()
        for steps in (2, 4):
            cost, grad = world.evaluate_swept_sphere_cost(torch.tensor(trajs, dtype=torch.float32), ETA, 1.0, steps,
                                                          0.1, True, env_index, MAX_DIST)
            results[f"world_{method}/evaluate_swept/{steps}/cost"] = cost.numpy()
            results[f"world_{method}/evaluate_swept/{steps}/grad"] = grad.numpy()
        sd, g = world.signed_distance(torch.tensor(spheres[0, 0, :, :3], dtype=torch.float32), 0, MAX_DIST)
        results[f"world_{method}/signed_distance/sd"] = sd.detach().numpy()
        results[f"world_{method}/signed_distance/grad"] = g.detach().numpy()
    envs = [[ref.RefMesh(v, t, pose) for (name, v, t), pose in zip(geos, poses[e])] for e in (0, 1)]
    raw = build_warp_env(envs, "cpu")
    raw_world = (raw.mesh_idx, raw.mesh_pose_inverse, raw.mesh_enable, raw.n_env_mesh)
    for sign in ("auto", "normal", "default", "winding_number", "parity"):
        _tensors(raw_world, spheres, trajs, sign, f"raw_{sign}", results)
    for sign in ("auto", "normal", "winding_number"):
        adopted = adopt_meshes(raw.mesh_idx, sign, mesh_enable=raw.mesh_enable, n_env_mesh=raw.n_env_mesh)
        _tensors((adopted.mesh_idx, raw.mesh_pose_inverse, raw.mesh_enable, raw.n_env_mesh), spheres, trajs,
                 adopted.sign_methods, f"adopted_{sign}", results)
    return results


def main() -> int:
    mode, path = sys.argv[1], sys.argv[2]
    results = run()
    if mode == "save":
        np.savez(path, **results)
        print(f"saved {len(results)} arrays to {path}")
        return 0
    saved = np.load(path)
    assert set(saved.files) == set(results), set(saved.files) ^ set(results)
    # Bitwise: dtype, shape and every byte.
    differ = [k for k in sorted(results) if saved[k].dtype != results[k].dtype or saved[k].shape != results[k].shape
              or saved[k].tobytes() != results[k].tobytes()]
    nonzero = sum(int(np.count_nonzero(results[k])) for k in results)
    print(f"{len(results)} arrays, {sum(v.size for v in results.values())} values ({nonzero} non-zero): "
          f"{len(differ)} differ")
    for k in differ:
        d = np.abs(saved[k].astype(np.float64) - results[k].astype(np.float64))
        print(f"  {k}: {int(np.count_nonzero(d))} values, max |difference| {d.max():.3g}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
