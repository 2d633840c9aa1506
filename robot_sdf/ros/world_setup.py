"""What the sdf_server node puts into its world when it is configured, before it serves: the
scene file's obstacles (in world_frame), the world saved in state_dir, and a warm-up of the
kernels. Each failure that must keep the node from starting is a ConfigError.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Callable

import torch

from robot_sdf.ros.frames import LookupFailed, TransformCache, compose, parse_static_transforms
from robot_sdf.ros.parameters import ConfigError
from robot_sdf.state import SCENE_FILE, StateSaver, WorldStore, restore_world


def resolve_scene_path(path: str) -> Path:
    """A relative scene_file that does not exist from the working directory is looked up in the
    installed package's share directory (so `config/...` works under `ros2 launch` anywhere)."""
    p = Path(path)
    if p.is_absolute() or p.exists():
        return p
    try:
        from ament_index_python.packages import get_package_share_directory

        candidate = Path(get_package_share_directory("robot_sdf")) / p
        if candidate.exists():
            return candidate
    except (ImportError, LookupError, OSError):  # no ament index (plain venv)
        pass
    return p


def load_scene(world, path: str, world_frame: str, static_transforms: str) -> dict[str, list[tuple[str, int]]]:
    """Load the scene file ``path`` ("" = none) into ``world`` (a MeshWorld); return pose topic
    -> [(obstacle id, env)]. ConfigError when the file cannot be read or placed in world_frame."""
    if not path:
        return {}
    from robot_sdf.scene import apply_scene, load_scene as read_scene, scene_frame

    path = str(resolve_scene_path(path))
    try:
        specs = read_scene(path)
        frame = scene_frame(path)
        if frame != world_frame:
            specs = scene_in_world(specs, frame, world_frame, static_transforms)
        apply_scene(world, specs)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"cannot load scene_file '{path}': {exc}") from exc
    topics: dict[str, list[tuple[str, int]]] = {}
    for spec in specs:
        if spec.pose_topic:
            topics.setdefault(spec.pose_topic, []).append((spec.id, spec.env))
    return topics


def scene_in_world(specs: list, frame: str, world_frame: str, static_transforms: str) -> list:
    """Scene obstacles declared in ``frame`` -> in world_frame, through static_transforms (the
    scene is loaded at configure time, before any tf data can arrive). ValueError otherwise."""
    static = TransformCache(parse_static_transforms(static_transforms))
    try:
        world_from_frame = static.lookup(world_frame, frame, None, 0.0)
    except LookupFailed as exc:
        raise ValueError(f"its frame '{frame}' is not world_frame '{world_frame}' and not connected to it "
                         f"by static_transforms: {exc}") from None
    return [dataclasses.replace(spec, pose=compose(world_from_frame, spec.pose)) for spec in specs]


def restore_state(world, state_dir: str, logger, snapshot: Callable[[], tuple],
                  restore_stamps: Callable[[dict], None]) -> StateSaver | None:
    """Restore the world saved in ``state_dir`` ("" = no persistence: None) into ``world``, hand
    its update stamps to ``restore_stamps``, and return the StateSaver that saves ``snapshot()``
    from now on (robot_sdf.state).

    A state that cannot be read is moved aside (``scene.json.unreadable-<time>``) and the node
    starts from its scene file: a bad file must not keep the node from starting.
    """
    if not state_dir:
        return None
    try:
        store = WorldStore(state_dir)
    except OSError as exc:
        raise ConfigError(f"state_dir '{state_dir}' cannot be used: {exc}") from exc
    try:
        saved = store.load()
    except ValueError as exc:
        aside = store.root / f"{SCENE_FILE}.unreadable-{int(time.time())}"
        (store.root / SCENE_FILE).replace(aside)
        logger.error(f"{exc}; moved it to {aside}, starting from the scene file")
        saved = None
    if saved is not None:
        for warning in restore_world(world, saved):
            logger.warning(warning)
        restore_stamps(saved.stamps)
        logger.info(f"restored {len(saved.meshes)} meshes from {store.root} (saved at revision {saved.revision})")
    saver = StateSaver(store, snapshot, on_error=lambda exc: logger.error(f"saving the world failed: {exc!r}"))
    saver.mark_dirty()
    return saver


def warm_up(world) -> None:
    """Run each query of ``world`` once so the Warp kernels are loaded before the services appear."""
    dev = world.device
    spheres = torch.tensor([[[[0.0, 0.0, 0.0, 0.1]], [[0.1, 0.0, 0.0, 0.1]]]], device=dev)
    world.evaluate_sphere_cost(spheres, compute_gradient=True)
    world.evaluate_swept_sphere_cost(spheres, sweep_steps=1, compute_gradient=True)
    world.signed_distance(torch.zeros((1, 3), device=dev))
