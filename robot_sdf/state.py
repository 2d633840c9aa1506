"""Persisting a MeshWorld to a directory and restoring it, crash-safe.

Layout of ``state_dir``:

    scene.json          every mesh slot: env, id, mesh file, pose, enabled; the last update
                        stamp per (env, id) (removed ids included) and the world revision
    meshes/<hash>.npz   vertices (V,3) float32 and triangles (T,3) int32, named by a hash of
                        their content (written once, shared by every slot with that content)

Every file is written to a temporary name in the same directory, flushed with fsync, renamed
over the final name (atomic on POSIX) and the directory is fsynced: a crash at any instant
leaves either the previous or the new complete scene.json, never a torn one. Mesh files are
written before the scene.json that names them and deleted only after a scene.json that no
longer names them is in place. Leftover temporaries are removed at load.

``StateSaver`` saves on a background thread after changes, at most once per ``period_s``: the
saved scene trails the world by at most that period (plus one save's duration). This module
imports no ROS package.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
import zipfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SCENE_FILE = "scene.json"
MESH_DIR = "meshes"
FORMAT_VERSION = 1

Stamp = tuple[int, int]  # (sec, nanosec) of the message that last changed an id; (0, 0) = none


@dataclass
class SavedMesh:
    env: int
    id: str
    vertices: np.ndarray  # (V,3) float32
    triangles: np.ndarray  # (T,3) int32
    pose: np.ndarray  # (7,) float64 x,y,z,qw,qx,qy,qz
    enabled: bool


@dataclass
class SavedWorld:
    meshes: list[SavedMesh] = field(default_factory=list)
    stamps: dict[tuple[int, str], Stamp] = field(default_factory=dict)
    revision: int = 0


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _atomic_write(path: Path, write) -> None:
    """write(file object) into path.tmp, fsync, rename over path, fsync the directory."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def content_hash(vertices: np.ndarray, triangles: np.ndarray) -> str:
    """Hex name of a mesh's content (float32 vertices, int32 triangles)."""
    v = np.ascontiguousarray(vertices, dtype=np.float32)
    t = np.ascontiguousarray(triangles, dtype=np.int32)
    h = hashlib.blake2b(digest_size=20)
    h.update(np.int64(v.shape[0]).tobytes())
    h.update(v.tobytes())
    h.update(t.tobytes())
    return h.hexdigest()


class WorldStore:
    """Reads and writes one state directory (created if missing)."""

    def __init__(self, state_dir: str | os.PathLike) -> None:
        self.root = Path(state_dir)
        self.meshes_dir = self.root / MESH_DIR
        self.meshes_dir.mkdir(parents=True, exist_ok=True)
        # id(vertices), id(triangles) -> (hash, vertices, triangles): the world's arrays are
        # read-only and replaced (new objects) on every geometry change, so identity is a valid
        # cache key while the arrays are referenced here.
        self._hashes: dict[tuple[int, int], tuple[str, np.ndarray, np.ndarray]] = {}

    # -------------------------------------------------------------- load
    def load(self) -> SavedWorld | None:
        """The saved world, or None when the directory holds none. Raises ValueError when
        scene.json or a mesh it names cannot be read (the files are left as they are)."""
        for tmp in list(self.root.glob("*.tmp")) + list(self.meshes_dir.glob("*.tmp")):
            tmp.unlink(missing_ok=True)  # a write interrupted by a crash
        path = self.root / SCENE_FILE
        if not path.exists():
            return None
        try:
            doc = json.loads(path.read_text())
            if doc.get("version") != FORMAT_VERSION:
                raise ValueError(f"unsupported format version {doc.get('version')!r}")
            saved = SavedWorld(revision=int(doc.get("revision", 0)))
            for entry in doc["meshes"]:
                with np.load(self.meshes_dir / f"{entry['mesh']}.npz") as data:
                    v, t = data["vertices"], data["triangles"]
                if content_hash(v, t) != entry["mesh"]:
                    raise ValueError(f"mesh file {entry['mesh']}.npz does not match its name")
                saved.meshes.append(SavedMesh(int(entry["env"]), str(entry["id"]), v, t,
                                              np.asarray(entry["pose"], np.float64), bool(entry["enabled"])))
            for env, name, sec, nsec in doc.get("stamps", []):
                saved.stamps[(int(env), str(name))] = (int(sec), int(nsec))
            return saved
        except (OSError, KeyError, TypeError, ValueError, json.JSONDecodeError, zipfile.BadZipFile) as exc:
            raise ValueError(f"cannot restore the world from {path}: {exc}") from exc

    # -------------------------------------------------------------- save
    def save(self, meshes, stamps: dict[tuple[int, str], Stamp], revision: int) -> int:
        """Write the scene: meshes = [(env, id, vertices, triangles, pose, enabled)].

        Returns the number of mesh files written (new content)."""
        entries, written, keep, live = [], 0, set(), {}
        for env, name, v, t, pose, enabled in meshes:
            cached = self._hashes.get((id(v), id(t)))
            digest = cached[0] if cached is not None else content_hash(v, t)
            live[(id(v), id(t))] = (digest, v, t)
            keep.add(digest)
            mesh_path = self.meshes_dir / f"{digest}.npz"
            if not mesh_path.exists():
                _atomic_write(mesh_path, lambda f, v=v, t=t: np.savez(
                    f, vertices=np.asarray(v, np.float32), triangles=np.asarray(t, np.int32)))
                written += 1
            entries.append({"env": int(env), "id": name, "mesh": digest,
                            "pose": [float(x) for x in pose], "enabled": bool(enabled)})
        self._hashes = live
        doc = {"version": FORMAT_VERSION, "revision": int(revision), "meshes": entries,
               "stamps": [[env, name, sec, nsec] for (env, name), (sec, nsec) in sorted(stamps.items())]}
        data = json.dumps(doc, separators=(",", ":")).encode()
        _atomic_write(self.root / SCENE_FILE, lambda f: f.write(data))
        for old in self.meshes_dir.glob("*.npz"):  # only after the new scene.json is in place
            if old.stem not in keep:
                old.unlink(missing_ok=True)
        return written


class StateSaver:
    """Saves ``snapshot()`` -> (meshes, stamps, revision) to ``store`` after ``mark_dirty()``,
    on a daemon thread, at most once per ``period_s``; ``on_error(exc)`` reports failures (the
    next change retries)."""

    def __init__(self, store: WorldStore, snapshot, period_s: float = 0.2, on_error=None) -> None:
        self.store = store
        self._snapshot = snapshot
        self._period = float(period_s)
        self._on_error = on_error or (lambda exc: None)
        self._cond = threading.Condition()
        self._dirty = False
        self._saving = False
        self._closed = False
        self.saves = 0
        self._thread = threading.Thread(target=self._run, name="state_saver", daemon=True)
        self._thread.start()

    def mark_dirty(self) -> None:
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    def flush(self, timeout: float = 10.0) -> bool:
        """Block until every change marked so far is saved."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._cond.notify_all()
            while self._dirty or self._saving:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    def _run(self) -> None:
        last = -float("inf")
        while True:
            with self._cond:
                while not self._dirty and not self._closed:
                    self._cond.wait()
                if not self._dirty:
                    return
            wait = last + self._period - time.monotonic()
            if wait > 0 and not self._closed:
                time.sleep(wait)
            with self._cond:
                self._dirty = False
                self._saving = True
            try:
                meshes, stamps, revision = self._snapshot()
                self.store.save(meshes, stamps, revision)
                self.saves += 1
            except Exception as exc:  # noqa: BLE001 - keep saving later changes
                self._on_error(exc)
            finally:
                last = time.monotonic()
                with self._cond:
                    self._saving = False
                    self._cond.notify_all()

    def close(self) -> None:
        """Save what is pending, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=10.0)


def restore_world(world, saved: SavedWorld) -> list[str]:
    """Make ``world`` hold exactly the saved meshes (obstacles of a scene file that were removed
    at run time stay removed). Returns warnings (entries that do not fit this world)."""
    warnings = []
    wanted = {(m.env, m.id) for m in saved.meshes}
    for env in range(world.num_envs):
        for name in world.mesh_names(env):
            if (env, name) not in wanted:
                world.remove_mesh(name, env=env)
    for m in saved.meshes:
        if not 0 <= m.env < world.num_envs:
            warnings.append(f"saved mesh '{m.id}' of env {m.env} skipped: num_envs is {world.num_envs}")
            continue
        try:
            world.add_mesh(m.id, m.vertices, m.triangles, pose=m.pose, env=m.env, enabled=m.enabled)
        except ValueError as exc:
            warnings.append(f"saved mesh '{m.id}' of env {m.env} skipped: {exc}")
    return warnings
