"""Parameters of the ``sdf_server`` node: one table, declared and validated in one place.

The table is plain Python (no rclpy import at module level) so tools and tests can compare it
with ``config/sdf_server.yaml`` without starting ROS. ``declare_and_validate(node)`` declares
every entry with a ParameterDescriptor (description, constraints, ranges where rclpy can express
them) and returns a validated ServerConfig, or raises ConfigError naming the parameter, the value
and what is allowed. Parameters the world or the interfaces are built from are read-only;
``dynamic=True`` ones (cost defaults, marker, slice, diagnostics and tf lookup settings) may be
set at run time (``ros2 param set``); the node validates the whole new configuration with
``validate_values`` before it applies a change.
"""
from __future__ import annotations

import json
import math
import re
import textwrap
from dataclasses import dataclass, fields
from typing import Any, Callable

SIGN_METHODS = ("auto", "default", "normal", "winding_number", "parity")
SLICE_PLANES = ("xy", "xz", "yz")
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
_INT_MAX = 2**31 - 1


class ConfigError(ValueError):
    """A parameter value the node cannot start with."""


Check = Callable[[Any], "str | None"]


@dataclass(frozen=True)
class ParamSpec:
    """One node parameter.

    name: parameter name; default: value and type (bool, int, float, str or list[float]);
    description: meaning and unit; constraint: human-readable rule; check: returns an error
    text or None; int_range/float_range: (lo, hi) published in the descriptor for tools.
    """

    name: str
    default: Any
    description: str
    constraint: str = ""
    check: Check | None = None
    int_range: tuple[int, int] | None = None
    float_range: tuple[float, float] | None = None
    dynamic: bool = False


def _positive(v: float) -> str | None:
    return None if math.isfinite(v) and v > 0 else "must be a finite number > 0"


def _non_negative(v: float) -> str | None:
    return None if math.isfinite(v) and v >= 0 else "must be a finite number >= 0"


def _finite(v: float) -> str | None:
    return None if math.isfinite(v) else "must be finite"


def _at_least(lo: int) -> Check:
    return lambda v: None if v >= lo else f"must be >= {lo}"


def _one_of(choices: tuple[str, ...]) -> Check:
    return lambda v: None if v in choices else f"must be one of {', '.join(choices)}"


def _device(v: str) -> str | None:
    return None if _DEVICE_RE.match(v) else "must be auto, cpu, cuda or cuda:N"


def _static_transforms(v: str) -> str | None:
    from robot_sdf.ros.frames import parse_static_transforms

    try:
        parse_static_transforms(v)
    except ValueError as exc:
        return f"is invalid: {exc}"
    return None


def _pair(positive: bool) -> Check:
    def check(v: list[float]) -> str | None:
        if len(v) != 2 or not all(math.isfinite(x) for x in v):
            return "must be a list of 2 finite numbers"
        if positive and not all(x > 0 for x in v):
            return "must hold 2 numbers > 0"
        return None

    return check


PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("world_frame", "world", "Frame of all poses, spheres and points; poses of incoming "
              "messages in another header.frame_id are transformed into it (tf2, or a "
              "built-in buffer with tf2's rules where tf2_ros is not installed).", "non-empty",
              lambda v: None if v.strip() else "must not be empty"),
    ParamSpec("device", "auto", "Compute device: auto (cuda:0 when available, else cpu), cpu, "
              "cuda or cuda:N.", "auto|cpu|cuda|cuda:N", _device),
    ParamSpec("num_envs", 1, "Number of independent environments (env index of messages and "
              "requests is 0..num_envs-1).", ">= 1", _at_least(1), int_range=(1, 4096)),
    ParamSpec("mesh_capacity", 16, "Mesh slots per environment reserved up front (the world "
              "grows beyond it when needed).", ">= 1", _at_least(1), int_range=(1, 1_000_000)),
    ParamSpec("max_distance", 0.5, "Search bound outside meshes [m]: spheres farther than "
              "max_distance + radius + activation_distance cost 0; query_signed_distance "
              "default clamp.", "> 0", _positive, float_range=(0.0, 1000.0)),
    ParamSpec("activation_distance", 0.05, "Default activation distance eta [m] when a request "
              "sends <= 0.", "> 0", _positive, float_range=(0.0, 100.0), dynamic=True),
    ParamSpec("weight", 1.0, "Default cost weight when a request sends <= 0.", "> 0", _positive,
              float_range=(0.0, 1e9), dynamic=True),
    ParamSpec("sign_method", "auto", "Inside/outside test of the mesh queries: auto (chosen per "
              "mesh when it is added), default, normal, winding_number or parity (see "
              "config/sdf_server.yaml).", "auto|default|normal|winding_number|parity",
              _one_of(SIGN_METHODS)),
    ParamSpec("max_spheres_per_request", 2_000_000, "Largest batch*horizon*spheres_per_step one "
              "cost request may carry.", ">= 1", _at_least(1), int_range=(1, _INT_MAX)),
    ParamSpec("max_sweep_steps", 32, "Largest sweep_steps a swept-cost request may ask for.",
              ">= 0", _at_least(0), int_range=(0, 1_000_000)),
    ParamSpec("max_points_per_request", 1_000_000, "Largest number of points one "
              "query_signed_distance request may carry (also bounds the distance slice).",
              ">= 1", _at_least(1), int_range=(1, _INT_MAX)),
    ParamSpec("max_coordinate", 1e5, "Largest |x|, |y|, |z| of a request sphere or point [m]; "
              "farther ones are refused (float32 resolution is ~6 mm at 1e5 m).", "> 0", _positive,
              float_range=(0.0, 1e30)),
    ParamSpec("max_length", 1000.0, "Largest sphere radius, activation_distance and max_distance a "
              "request may send [m]; larger ones are refused instead of answering inf.", "> 0",
              _positive, float_range=(0.0, 1e30)),
    ParamSpec("max_vertices_per_mesh", 2_000_000, "Largest vertex count of one mesh message; "
              "larger ones are rejected before any conversion.", ">= 3", _at_least(3),
              int_range=(3, _INT_MAX)),
    ParamSpec("max_triangles_per_mesh", 2_000_000, "Largest triangle count of one mesh message; "
              "larger ones are rejected before any conversion.", ">= 1", _at_least(1),
              int_range=(1, _INT_MAX)),
    ParamSpec("max_pending_update_mb", 512, "Mesh updates received but not yet applied may hold "
              "at most this many MiB; beyond it the subscription waits (reliable flow control "
              "slows the producers) instead of dropping anything.", ">= 1", _at_least(1),
              int_range=(1, 1_000_000)),
    ParamSpec("geometry_cache_mb", 16, "Unused geometries (BVHs) kept for re-adding identical "
              "meshes without a rebuild, bounded in MiB; 0 = no cache.", ">= 0", _at_least(0),
              int_range=(0, 1_000_000)),
    ParamSpec("state_dir", "", "Directory where the node persists its world (meshes by content "
              "hash, poses, enable flags) and restores it from at start; empty = no persistence.",
              "path or empty"),
    ParamSpec("scene_file", "", "Scene YAML with static obstacles loaded at start; empty = none.",
              "path or empty"),
    ParamSpec("marker_rate_hz", 2.0, "Rate of ~/markers updates [Hz]; 0 = no markers.", ">= 0",
              _non_negative, float_range=(0.0, 1000.0), dynamic=True),
    ParamSpec("publish_request_markers", True, "Also publish the spheres of the last cost "
              "request (batch row 0), coloured green (cost 0) to red (highest cost).", dynamic=True),
    ParamSpec("marker_max_spheres", 4096, "At most this many request spheres in the markers.",
              ">= 1", _at_least(1), int_range=(1, 1_000_000), dynamic=True),
    ParamSpec("marker_max_triangles", 20000, "Meshes with more triangles are drawn as their "
              "bounding box in ~/markers (big TRIANGLE_LISTs are slow to serialise).", ">= 12",
              _at_least(12), int_range=(12, 100_000_000), dynamic=True),
    ParamSpec("slice_plane", "xy", "Plane of the ~/distance_slice point cloud: xy, xz or yz.",
              "xy|xz|yz", _one_of(SLICE_PLANES), dynamic=True),
    ParamSpec("slice_offset", 0.0, "Offset of the slice plane along its normal axis [m].",
              "finite", _finite, dynamic=True),
    ParamSpec("slice_center", [0.0, 0.0], "Centre of the slice in the plane's two axes [m].",
              "2 finite numbers", _pair(False), dynamic=True),
    ParamSpec("slice_size", [2.0, 2.0], "Width and height of the slice [m].", "2 numbers > 0",
              _pair(True), dynamic=True),
    ParamSpec("slice_resolution", 0.02, "Grid spacing of the slice [m].", "> 0", _positive,
              float_range=(0.0, 100.0), dynamic=True),
    ParamSpec("slice_env", 0, "Environment the slice shows.", "0 <= slice_env < num_envs",
              _at_least(0), int_range=(0, 4095), dynamic=True),
    ParamSpec("slice_rate_hz", 1.0, "Rate of ~/distance_slice [Hz], published only while "
              "someone subscribes; 0 = never.", ">= 0", _non_negative,
              float_range=(0.0, 1000.0), dynamic=True),
    ParamSpec("diagnostics_rate_hz", 1.0, "Rate of /diagnostics [Hz]; 0 = none.", ">= 0",
              _non_negative, float_range=(0.0, 1000.0), dynamic=True),
    ParamSpec("diagnostics_window_s", 10.0, "Rejected messages, failed or slow requests and internal "
              "errors within this many seconds turn the diagnostics status to WARN (ERROR for internal "
              "and device errors) [s].", "> 0", _positive, float_range=(0.0, 86400.0), dynamic=True),
    ParamSpec("slow_request_ms", 1000.0, "A service request taking longer than this counts as slow "
              "in the diagnostics [ms]; 0 = never.", ">= 0", _non_negative,
              float_range=(0.0, 3.6e6), dynamic=True),
    ParamSpec("static_transforms", "", "Fixed transforms 'parent child x y z qw qx qy qz' "
              "(metres, unit quaternion), entries separated by ';'. Inserted as static transforms into "
              "tf2, or into the built-in buffer that replaces it where tf2_ros is not installed.",
              "entries 'parent child x y z qw qx qy qz' separated by ';'", _static_transforms),
    ParamSpec("tf_timeout", 0.1, "How far a message's stamp may lie ahead of the newest transform of its "
              "frame and still be waited for [s]: it is held aside (other updates go on) until the "
              "transform comes, rejected after tf_timeout; unknown frames and stamps outside the "
              "transform data are rejected at once. 0 = never wait.", ">= 0", _non_negative,
              float_range=(0.0, 60.0), dynamic=True),
    ParamSpec("tf_use_latest", False, "Transform incoming poses with the latest transform instead "
              "of the one at the message stamp (a zero stamp always means latest).", dynamic=True),
    ParamSpec("num_cameras", 0, "Depth cameras fused into the world (nvblox's name): camera i's "
              "camera_<i>/depth/image (32FC1 m or 16UC1 mm) and camera_<i>/depth/camera_info, relative "
              "to the node's namespace; 0 = no depth input. Their surface is the mesh 'perceived' of "
              "environment 0 (docs/perception.md).", "0..16", _at_least(0), int_range=(0, 16)),
    ParamSpec("use_lidar", False, "Fuse the point clouds of the topic 'pointcloud' (sensor_msgs/PointCloud2 "
              "with float32 x, y, z, organised or not; relative to the node's namespace, nvblox's name) "
              "into the world: each return's ray from the sensor frame's origin carves free space."),
    ParamSpec("voxel_size", 0.02, "Voxel size of the fused depth field [m] (nvblox's name).", "> 0", _positive,
              float_range=(0.001, 1.0)),
    ParamSpec("perception_workspace_lower", [-1.0, -1.0, -0.2], "Lower corner of the box in world_frame "
              "where depth is fused [m].", "3 finite numbers, below the upper corner", None),
    ParamSpec("perception_workspace_upper", [1.0, 1.0, 1.5], "Upper corner of the box in world_frame "
              "where depth is fused [m].", "3 finite numbers, above the lower corner", None),
    ParamSpec("perception_max_weight", 20.0, "Frames of history a voxel keeps: an obstacle that leaves is "
              "carved after about 0.35 x this many frames that see where it was.", ">= 1",
              lambda v: None if math.isfinite(v) and v >= 1 else "must be a finite number >= 1",
              float_range=(1.0, 1e6)),
    ParamSpec("robot_spheres_file", "", "Fitted spheres of the robot (fit_spheres' YAML) whose body is "
              "removed from every depth frame, posed from /robot_description, /joint_states and the "
              "transform of the URDF's root link; empty = no robot removed.", ""),
    ParamSpec("robot_padding", 0.04, "Depth returns within a robot sphere's radius plus this many metres "
              "are dropped [m] (fitted spheres leave parts of a link's meshes outside them: 5.5 cm at "
              "most for the Panda's).", ">= 0", _non_negative, float_range=(0.0, 1.0)),
    ParamSpec("perception_unobserved", "free", "Space no camera has seen: free (where it connects to "
              "space seen free; enclosed by seen inside it is inside) or occupied.", "free|occupied",
              _one_of(("free", "occupied"))),
)

PARAMETER_NAMES: tuple[str, ...] = tuple(p.name for p in PARAMETERS)
DYNAMIC_PARAMETERS: frozenset[str] = frozenset(p.name for p in PARAMETERS if p.dynamic)


@dataclass(frozen=True)
class ServerConfig:
    """Validated parameter values (names as in PARAMETERS)."""

    world_frame: str
    device: str
    num_envs: int
    mesh_capacity: int
    max_distance: float
    activation_distance: float
    weight: float
    sign_method: str
    max_spheres_per_request: int
    max_sweep_steps: int
    max_points_per_request: int
    max_coordinate: float
    max_length: float
    max_vertices_per_mesh: int
    max_triangles_per_mesh: int
    max_pending_update_mb: int
    geometry_cache_mb: int
    state_dir: str
    scene_file: str
    marker_rate_hz: float
    publish_request_markers: bool
    marker_max_spheres: int
    marker_max_triangles: int
    slice_plane: str
    slice_offset: float
    slice_center: tuple[float, float]
    slice_size: tuple[float, float]
    slice_resolution: float
    slice_env: int
    slice_rate_hz: float
    diagnostics_rate_hz: float
    diagnostics_window_s: float
    slow_request_ms: float
    static_transforms: str
    tf_timeout: float
    tf_use_latest: bool
    num_cameras: int
    use_lidar: bool
    voxel_size: float
    perception_workspace_lower: tuple[float, float, float]
    perception_workspace_upper: tuple[float, float, float]
    perception_max_weight: float
    robot_spheres_file: str
    robot_padding: float
    perception_unobserved: str

    @property
    def perceives(self) -> bool:
        """Whether depth cameras or a lidar feed the world (camera_inputs)."""
        return self.num_cameras > 0 or self.use_lidar

    def slice_shape(self) -> tuple[int, int]:
        """Grid points of the distance slice along its two in-plane axes."""
        return tuple(max(1, int(math.floor(s / self.slice_resolution + 1e-9)) + 1)
                     for s in self.slice_size)  # type: ignore[return-value]


assert tuple(f.name for f in fields(ServerConfig)) == PARAMETER_NAMES


def _type_name(default: Any) -> str:
    if isinstance(default, bool):
        return "a bool (true/false)"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a float (write 1.0, not 1)"
    if isinstance(default, list):
        return "a list of floats (write [1.0, 2.0], not [1, 2])"
    return "a string"


def _help_type(default: Any) -> str:
    if isinstance(default, bool):
        return "bool"
    if isinstance(default, int):
        return "int"
    if isinstance(default, float):
        return "float"
    if isinstance(default, list):
        return "float list"
    return "string"


def parameter_help(width: int = 100) -> str:
    """Every parameter as text, for the console scripts' --help: name (* when it may be set at run
    time), type, default, rule and description."""
    lines = ["parameters (-p name:=value or a --params-file; * may be changed at run time, ros2 param set):"]
    for spec in PARAMETERS:
        default = json.dumps(spec.default)
        rule = f", {spec.constraint}" if spec.constraint else ""
        lines.append(f"  {spec.name}{' *' if spec.dynamic else ''} ({_help_type(spec.default)}, "
                     f"default {default}{rule})")
        lines.append(textwrap.fill(spec.description, width, initial_indent="      ", subsequent_indent="      "))
    return "\n".join(lines)


def _value_errors(values: dict[str, Any]) -> list[str]:
    """Errors of the values present in ``values`` (parameters that failed to declare are absent)."""
    errors = []
    for spec in PARAMETERS:
        if spec.name in values and spec.check is not None:
            why = spec.check(values[spec.name])
            if why:
                errors.append(f"parameter '{spec.name}' = {values[spec.name]!r} {why}")
    for corner in ("perception_workspace_lower", "perception_workspace_upper"):
        v = values.get(corner)
        if v is not None and (len(v) != 3 or not all(math.isfinite(x) for x in v)):
            errors.append(f"parameter '{corner}' = {v!r} must be a list of 3 finite numbers")
    if not errors and {"perception_workspace_lower", "perception_workspace_upper"} <= values.keys() and not all(
            lo < hi for lo, hi in zip(values["perception_workspace_lower"], values["perception_workspace_upper"])):
        errors.append(f"parameter 'perception_workspace_lower' = {values['perception_workspace_lower']!r} must lie "
                      f"below perception_workspace_upper = {values['perception_workspace_upper']!r} on every axis")
    if not errors and {"slice_env", "num_envs"} <= values.keys() \
            and values["slice_env"] >= values["num_envs"]:
        errors.append(f"parameter 'slice_env' = {values['slice_env']} must be < num_envs "
                      f"({values['num_envs']})")
    return errors


def validate_values(values: dict[str, Any]) -> ServerConfig:
    """Check every value of ``values`` (name -> value, all of PARAMETERS) and build the config.

    Raises ConfigError listing every bad parameter.
    """
    errors = _value_errors(values)
    if errors:
        raise ConfigError("; ".join(errors))
    kw = dict(values)
    kw["slice_center"] = tuple(float(x) for x in values["slice_center"])
    kw["slice_size"] = tuple(float(x) for x in values["slice_size"])
    kw["perception_workspace_lower"] = tuple(float(x) for x in values["perception_workspace_lower"])
    kw["perception_workspace_upper"] = tuple(float(x) for x in values["perception_workspace_upper"])
    config = ServerConfig(**kw)
    n_slice = math.prod(config.slice_shape())
    if config.slice_rate_hz > 0 and n_slice > config.max_points_per_request:
        raise ConfigError(f"distance slice has {n_slice} points (slice_size / slice_resolution), "
                          f"more than max_points_per_request ({config.max_points_per_request})")
    return config


def _descriptor(spec: ParamSpec):
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor

    d = ParameterDescriptor(description=spec.description, additional_constraints=spec.constraint,
                            read_only=not spec.dynamic)
    if spec.int_range is not None:
        d.integer_range = [IntegerRange(from_value=spec.int_range[0], to_value=spec.int_range[1],
                                        step=1)]
    if spec.float_range is not None:
        d.floating_point_range = [FloatingPointRange(from_value=spec.float_range[0],
                                                     to_value=spec.float_range[1], step=0.0)]
    return d


def declare(node) -> dict[str, Any]:
    """Declare every parameter on ``node`` (an rclpy Node); return name -> value.

    Raises ConfigError for a wrong type or a value outside its declared range (listing the
    failed checks of the other values too).
    """
    from rclpy.exceptions import InvalidParameterTypeException, InvalidParameterValueException

    values: dict[str, Any] = {}
    errors = []
    for spec in PARAMETERS:
        try:
            param = node.declare_parameter(spec.name, spec.default, _descriptor(spec))
        except InvalidParameterTypeException as exc:
            errors.append(f"parameter '{spec.name}' must be {_type_name(spec.default)} ({exc})")
            continue
        except InvalidParameterValueException as exc:
            errors.append(f"parameter '{spec.name}' out of range: {spec.constraint} ({exc})")
            continue
        values[spec.name] = param.value
    if errors:  # report the remaining bad values too, not only the undeclarable ones
        raise ConfigError("; ".join(errors + _value_errors(values)))
    return values


def declare_and_validate(node) -> ServerConfig:
    """Declare every parameter on ``node`` (an rclpy Node) and return the validated config.

    Raises ConfigError for a wrong type, a value outside its declared range or a failed check.
    """
    return validate_values(declare(node))


def current_values(node) -> dict[str, Any]:
    """name -> value of every (declared) parameter of PARAMETERS on ``node``."""
    return {name: node.get_parameter(name).value for name in PARAMETER_NAMES}


def with_changes(config: ServerConfig, changes: dict[str, Any]) -> ServerConfig:
    """The validated config after setting ``changes`` (name -> value); raises ConfigError."""
    values = {f.name: getattr(config, f.name) for f in fields(ServerConfig)}
    values.update(changes)
    return validate_values(values)
