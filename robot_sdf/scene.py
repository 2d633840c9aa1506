"""Scene files: static obstacles in YAML, shared by the ROS node and in-process users.

Format (relative mesh paths resolve against the scene file's directory)::

    frame: world
    obstacles:
      - id: table
        mesh: meshes/table.stl          # or primitive: {type: box, size: [x, y, z]}
        scale: 1.0                      #    {type: sphere, radius: r} / {type: cylinder, radius: r, length: l}
        pose: [x, y, z, qw, qx, qy, qz] # optional, identity
        env: 0                          # optional
        enabled: true                   # optional
        pose_topic: /table_pose         # optional (ROS node: geometry_msgs/PoseStamped)
        sign_method: winding_number     # optional: auto, normal, default, winding_number or
                                        # parity; default: the world's (node parameter)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from robot_sdf import geometry, io
from robot_sdf.types import SignMethod


@dataclass
class ObstacleSpec:
    id: str
    vertices: np.ndarray  # (V,3) float32, mesh frame, m
    triangles: np.ndarray  # (T,3) int32
    pose: np.ndarray  # (7,) mesh frame in world
    env: int = 0
    enabled: bool = True
    pose_topic: str | None = None
    source: str = ""  # file path or primitive description, for logs
    sign_method: str | None = None  # None: the world's default


_KNOWN_KEYS = {"id", "mesh", "scale", "primitive", "pose", "env", "enabled", "pose_topic", "sign_method"}


def _pose(entry: dict):
    pose = entry.get("pose")
    if isinstance(pose, dict):
        pose = list(pose.get("position", [0, 0, 0])) + list(pose.get("orientation", [1, 0, 0, 0]))
    return geometry.validate_pose(pose)


def _primitive(spec) -> tuple[np.ndarray, np.ndarray, str]:
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError("primitive must be a mapping with a 'type'")
    kind = str(spec["type"]).lower()
    if kind == "box":
        v, t = io.box_mesh(spec.get("size", [1.0, 1.0, 1.0]))
    elif kind == "sphere":
        v, t = io.sphere_mesh(float(spec.get("radius", 0.5)), int(spec.get("subdivisions", 2)))
    elif kind == "cylinder":
        v, t = io.cylinder_mesh(float(spec.get("radius", 0.5)), float(spec.get("length", 1.0)),
                                int(spec.get("sections", 32)))
    else:
        raise ValueError(f"unknown primitive type {kind!r}; expected box, sphere or cylinder")
    return v, t, f"primitive {kind}"


def parse_obstacle(entry: dict, base_dir: Path) -> ObstacleSpec:
    """One obstacle mapping -> ObstacleSpec; ValueError names what is wrong."""
    if not isinstance(entry, dict):
        raise ValueError(f"obstacle must be a mapping, got {type(entry).__name__}")
    oid = entry.get("id")
    if not isinstance(oid, str) or not oid:
        raise ValueError("missing or empty 'id'")
    unknown = set(entry) - _KNOWN_KEYS
    if unknown:
        raise ValueError(f"obstacle {oid!r}: unknown keys {sorted(unknown)}; allowed: {sorted(_KNOWN_KEYS)}")
    if ("mesh" in entry) == ("primitive" in entry):
        raise ValueError(f"obstacle {oid!r}: give exactly one of 'mesh' or 'primitive'")
    try:
        if "mesh" in entry:
            path = Path(str(entry["mesh"]))
            if not path.is_absolute():
                path = base_dir / path
            v, t = io.load_mesh(path, float(entry.get("scale", 1.0)))
            source = str(path)
        else:
            v, t, source = _primitive(entry["primitive"])
        env = entry.get("env", 0)
        if not isinstance(env, int) or isinstance(env, bool) or env < 0:
            raise ValueError(f"env must be a non-negative integer, got {env!r}")
        topic = entry.get("pose_topic")
        if topic is not None and (not isinstance(topic, str) or not topic):
            raise ValueError(f"pose_topic must be a non-empty string, got {topic!r}")
        sign = entry.get("sign_method")
        if sign is not None:
            if not isinstance(sign, str):
                raise ValueError(f"sign_method must be a string, got {sign!r}")
            sign = SignMethod.parse(sign).name.lower()
        return ObstacleSpec(oid, v, t, _pose(entry), env, bool(entry.get("enabled", True)), topic, source, sign)
    except (TypeError, ValueError) as exc:  # TypeError: e.g. scale: [1, 2] or radius: null
        raise ValueError(f"obstacle {oid!r}: {exc}") from None


def load_scene(path: str | Path) -> list[ObstacleSpec]:
    """Read a scene YAML file; raises ValueError naming the offending entry."""
    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ValueError(f"cannot read scene file {p}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ValueError(f"scene file {p} is not valid YAML: {exc}") from exc
    if data is None:
        return []
    if not isinstance(data, dict) or not isinstance(data.get("obstacles", []), list):
        raise ValueError(f"scene file {p}: expected a mapping with an 'obstacles' list")
    specs, seen = [], set()
    for i, entry in enumerate(data.get("obstacles") or []):
        try:
            spec = parse_obstacle(entry, p.parent)
        except ValueError as exc:
            raise ValueError(f"scene file {p}, obstacle #{i}: {exc}") from None
        if (spec.id, spec.env) in seen:
            raise ValueError(f"scene file {p}, obstacle #{i}: duplicate id {spec.id!r} in env {spec.env}")
        seen.add((spec.id, spec.env))
        specs.append(spec)
    return specs


def scene_frame(path: str | Path) -> str:
    """The 'frame' a scene file declares (default 'world')."""
    data = yaml.safe_load(Path(path).read_text()) or {}
    return str(data.get("frame", "world")) if isinstance(data, dict) else "world"


def apply_scene(world, specs: list[ObstacleSpec]) -> int:
    """Add every obstacle to ``world``; all are validated before any is added, so a bad scene
    changes nothing. Returns the revision."""
    from robot_sdf.geometry import validate_mesh

    for spec in specs:
        try:
            if not 0 <= spec.env < world.num_envs:
                raise ValueError(f"env {spec.env} out of range (world has {world.num_envs})")
            validate_mesh(spec.vertices, spec.triangles)
            geometry.validate_pose(spec.pose)
        except ValueError as exc:
            raise ValueError(f"obstacle {spec.id!r}: {exc}") from None
    for spec in specs:
        world.add_mesh(spec.id, spec.vertices, spec.triangles, spec.pose, spec.env, spec.enabled,
                       sign_method=spec.sign_method)
    return world.revision
