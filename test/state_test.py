"""robot_sdf.state: save / restore of a MeshWorld, atomic files, stale temporaries, bad files."""
from __future__ import annotations

import json

import numpy as np
import pytest

import reference as ref
from robot_sdf import MeshWorld
from robot_sdf.state import StateSaver, WorldStore, content_hash, restore_world

BOX_V, BOX_T = ref.box((0.4, 0.3, 0.2))
SPH_V, SPH_T = ref.icosphere(0.2, 1)


def _world():
    w = MeshWorld(device="cpu", num_envs=2, mesh_capacity=2)
    w.add_mesh("box", BOX_V, BOX_T, [0.5, 0, 0, 1, 0, 0, 0])
    w.add_mesh("ball", SPH_V, SPH_T, [0, 0.5, 0, 0.7071068, 0, 0, 0.7071068], env=1)
    w.add_mesh("box_twin", BOX_V, BOX_T, [0, 0, 1, 1, 0, 0, 0], env=1)
    w.set_enabled("box_twin", False, env=1)
    return w


def _distances(world, pts):
    out = []
    for env in range(world.num_envs):
        import torch
        d, _ = world.signed_distance(torch.from_numpy(pts), env=env)
        out.append(d.numpy())
    return np.stack(out)


def test_save_and_restore_round_trip(tmp_path):
    w = _world()
    store = WorldStore(tmp_path)
    stamps = {(0, "box"): (5, 6), (1, "gone"): (7, 8)}
    store.save(w.export_meshes(), stamps, w.revision)
    assert len(list((tmp_path / "meshes").glob("*.npz"))) == 2  # identical content stored once
    saved = WorldStore(tmp_path).load()
    assert saved.stamps == stamps and saved.revision == w.revision
    fresh = MeshWorld(device="cpu", num_envs=2)
    fresh.add_mesh("stale", SPH_V, SPH_T)  # a scene-file obstacle removed at run time
    assert restore_world(fresh, saved) == []
    assert fresh.mesh_names(0) == ["box"] and sorted(fresh.mesh_names(1)) == ["ball", "box_twin"]
    assert fresh.mesh_geometry("box_twin", 1)[3] is False
    pts = np.random.default_rng(0).uniform(-1, 1, (200, 3)).astype(np.float32)
    np.testing.assert_array_equal(_distances(fresh, pts), _distances(w, pts))
    # against the reference: the rotated ball of env 1
    sd, _ = ref.RefMesh(SPH_V, SPH_T, np.array([0, 0.5, 0, 0.7071068, 0, 0, 0.7071068])).signed_distance_world(pts)
    np.testing.assert_allclose(_distances(fresh, pts)[1], np.minimum(sd, 0.5), atol=1e-4)


def test_unreferenced_mesh_files_are_deleted_after_the_new_scene(tmp_path):
    w = _world()
    store = WorldStore(tmp_path)
    store.save(w.export_meshes(), {}, w.revision)
    w.remove_mesh("ball", env=1)
    store.save(w.export_meshes(), {}, w.revision)
    assert [p.stem for p in (tmp_path / "meshes").glob("*.npz")] == [content_hash(BOX_V, BOX_T)]


def test_interrupted_writes_leave_the_previous_state(tmp_path):
    w = _world()
    store = WorldStore(tmp_path)
    store.save(w.export_meshes(), {}, w.revision)
    good = (tmp_path / "scene.json").read_bytes()
    # a crash while writing: the temporary is torn, the scene.json is untouched
    (tmp_path / "scene.json.999.tmp").write_text('{"version": 1, "mes')
    (tmp_path / "meshes" / "abc.npz.999.tmp").write_bytes(b"\0" * 10)
    saved = WorldStore(tmp_path).load()
    assert len(saved.meshes) == 3 and (tmp_path / "scene.json").read_bytes() == good
    assert not list(tmp_path.rglob("*.tmp"))


def test_unreadable_state_is_an_error_naming_the_file(tmp_path):
    w = _world()
    store = WorldStore(tmp_path)
    store.save(w.export_meshes(), {}, w.revision)
    doc = json.loads((tmp_path / "scene.json").read_text())
    victim = tmp_path / "meshes" / f"{doc['meshes'][0]['mesh']}.npz"
    victim.write_bytes(victim.read_bytes()[:-20])
    with pytest.raises(ValueError, match="cannot restore the world from"):
        WorldStore(tmp_path).load()
    assert WorldStore(tmp_path / "empty").load() is None


def test_saver_coalesces_and_flushes(tmp_path):
    w = _world()
    store = WorldStore(tmp_path)
    saver = StateSaver(store, lambda: (w.export_meshes(), {}, w.revision), period_s=0.05)
    for i in range(50):
        w.set_pose("box", [0.5 + 0.01 * i, 0, 0, 1, 0, 0, 0])
        saver.mark_dirty()
    assert saver.flush(10)
    assert saver.saves < 50
    saved = store.load()
    box = next(m for m in saved.meshes if m.id == "box")
    np.testing.assert_allclose(box.pose[:3], [0.99, 0, 0])
    saver.close()
