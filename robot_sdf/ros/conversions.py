"""Conversions between numpy arrays and robot_sdf / ROS messages.

Array fields of rclpy messages are ``array.array``; everything here converts whole buffers
(``np.frombuffer`` one way, ``array.array(tc, ndarray.tobytes())`` the other), never element by
element, except where the message type itself is a list of objects (shape_msgs/Mesh), which
only the slow path uses.

Poses are 7-vectors x, y, z, qw, qx, qy, qz (metres, scalar-first quaternion), as in the core.
"""
from __future__ import annotations

import array

import numpy as np
from geometry_msgs.msg import Pose
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy
from sensor_msgs.msg import PointCloud2, PointField
from std_msgs.msg import Header

from robot_sdf_interfaces.msg import MeshObstacle, ObstaclePose

# QoS of ~/mesh_obstacles. Producers must publish with it (at least reliable + transient_local):
# a default (volatile) publisher does not match the node's subscription and nothing arrives.
# transient_local with a depth above the number of obstacles lets a restarted node get the scene.
MESH_OBSTACLE_QOS = QoSProfile(depth=100, history=HistoryPolicy.KEEP_LAST,
                               reliability=ReliabilityPolicy.RELIABLE,
                               durability=DurabilityPolicy.TRANSIENT_LOCAL)

try:  # present on a ROS install, not in the pip wheels
    from sensor_msgs_py import point_cloud2 as _pc2
except ImportError:  # pragma: no cover - depends on the environment
    _pc2 = None

OPERATION_NAMES = {
    MeshObstacle.ADD: "ADD",
    MeshObstacle.REMOVE: "REMOVE",
    MeshObstacle.MOVE: "MOVE",
    MeshObstacle.ENABLE: "ENABLE",
    MeshObstacle.DISABLE: "DISABLE",
}


# ------------------------------------------------------------------ flat arrays


def float32_array(x) -> array.array:
    """Any array-like -> array.array('f') for a float32[] field (one buffer copy when x is
    already contiguous float32: frombytes reads the numpy buffer directly)."""
    out = array.array("f")
    out.frombytes(memoryview(np.ascontiguousarray(x, dtype=np.float32)).cast("B"))
    return out


def uint32_array(x) -> array.array:
    """Any array-like of non-negative integers -> array.array('I') for a uint32[] field."""
    a = np.asarray(x)
    if a.size and (a.min() < 0 or a.max() > np.iinfo(np.uint32).max):
        raise ValueError("values do not fit uint32")
    return array.array("I", np.ascontiguousarray(a, dtype=np.uint32).tobytes())


def as_float32(field) -> np.ndarray:
    """float32[] field (array.array('f') or sequence) -> 1-D float32 view or array."""
    if isinstance(field, array.array) and field.typecode == "f":
        return np.frombuffer(field, dtype=np.float32)
    return np.asarray(field, dtype=np.float32).reshape(-1)


def as_uint32(field) -> np.ndarray:
    """uint32[] field -> 1-D uint32 view or array."""
    if isinstance(field, array.array) and field.itemsize == 4 and field.typecode in "IL":
        return np.frombuffer(field, dtype=np.uint32)
    return np.asarray(field, dtype=np.uint32).reshape(-1)


# ------------------------------------------------------------------ poses


def pose_to_array(pose: Pose) -> np.ndarray:
    """geometry_msgs/Pose -> (7,) float64 x,y,z,qw,qx,qy,qz, unvalidated (the world validates)."""
    p, q = pose.position, pose.orientation
    return np.array([p.x, p.y, p.z, q.w, q.x, q.y, q.z], dtype=np.float64)


def array_to_pose(pose) -> Pose:
    """(7,) x,y,z,qw,qx,qy,qz (or a Pose, returned as is, or None = identity) -> geometry_msgs/Pose."""
    if isinstance(pose, Pose):
        return pose
    msg = Pose()
    if pose is None:
        return msg
    p = np.asarray(pose, dtype=np.float64).reshape(-1)
    if p.shape != (7,):
        raise ValueError(f"pose must have 7 values x,y,z,qw,qx,qy,qz, got {p.size}")
    msg.position.x, msg.position.y, msg.position.z = (float(v) for v in p[:3])
    msg.orientation.w, msg.orientation.x, msg.orientation.y, msg.orientation.z = (
        float(v) for v in p[3:])
    return msg


# ------------------------------------------------------------------ meshes


def mesh_arrays(msg: MeshObstacle) -> tuple[np.ndarray, np.ndarray]:
    """Geometry of an ADD message -> vertices, triangles as numpy arrays (flat or (n,3)).

    Uses the flat ``vertices``/``triangles`` fields (zero-copy views), or ``mesh``
    (shape_msgs/Mesh) when ``vertices`` is empty. Only decides which form the message uses
    (ValueError when neither holds geometry); shapes, finite values and index ranges are checked
    by MeshWorld.add_mesh.
    """
    if len(msg.vertices) > 0:
        return as_float32(msg.vertices), as_uint32(msg.triangles)
    if len(msg.triangles) > 0:
        raise ValueError("triangles given but vertices is empty")
    mesh = msg.mesh
    if len(mesh.vertices) == 0:
        raise ValueError("empty mesh: neither vertices/triangles nor mesh holds geometry")
    # shape_msgs/Mesh is a list of objects: the slow path the flat fields exist to avoid.
    v = np.array([(p.x, p.y, p.z) for p in mesh.vertices], dtype=np.float32)
    t = (np.stack([np.asarray(tri.vertex_indices) for tri in mesh.triangles])
         if len(mesh.triangles) else np.zeros((0, 3), np.uint32))
    return v, t


def make_mesh_obstacle(id: str, vertices, triangles, pose=None, env: int = 0,
                       operation: int = MeshObstacle.ADD, frame_id: str = "world",
                       stamp=None) -> MeshObstacle:
    """Build a MeshObstacle message for ``~/mesh_obstacles``.

    id: obstacle name; vertices (V,3) metres in the mesh frame (or None for operations without
    geometry); triangles (T,3) vertex indices, counter-clockwise seen from outside; pose (7,)
    x,y,z,qw,qx,qy,qz of the mesh frame in ``frame_id`` or a geometry_msgs/Pose (None =
    identity); env: environment index; operation: MeshObstacle.ADD/REMOVE/MOVE/ENABLE/DISABLE;
    stamp: builtin_interfaces/Time (e.g. ``node.get_clock().now().to_msg()``) or None.
    """
    msg = MeshObstacle()
    msg.header = Header(frame_id=frame_id)
    if stamp is not None:
        msg.header.stamp = stamp
    msg.id = id
    msg.env = int(env)
    msg.operation = int(operation)
    msg.pose = array_to_pose(pose)
    if vertices is not None:
        msg.vertices = float32_array(np.asarray(vertices).reshape(-1))
    if triangles is not None:
        msg.triangles = uint32_array(np.asarray(triangles).reshape(-1))
    return msg


def make_obstacle_pose(id: str, pose, env: int = 0, frame_id: str = "world",
                       stamp=None) -> ObstaclePose:
    """Build an ObstaclePose message for ``~/obstacle_poses``.

    pose: (7,) x,y,z,qw,qx,qy,qz of the mesh frame in ``frame_id`` or a geometry_msgs/Pose.
    """
    msg = ObstaclePose()
    msg.header = Header(frame_id=frame_id)
    if stamp is not None:
        msg.header.stamp = stamp
    msg.id = id
    msg.env = int(env)
    msg.pose = array_to_pose(pose)
    return msg


# ------------------------------------------------------------------ point clouds

_CLOUD_FIELDS = ("x", "y", "z", "distance")


def make_distance_cloud(points: np.ndarray, distance: np.ndarray, header: Header) -> PointCloud2:
    """Points (N,3) and values (N,) -> PointCloud2 with float32 fields x, y, z, distance.

    The cloud is unorganised (height 1); uses sensor_msgs_py when installed, else copies the
    (N,4) float32 rows into ``data`` in one buffer copy.
    """
    fields = [PointField(name=n, offset=4 * i, datatype=PointField.FLOAT32, count=1)
              for i, n in enumerate(_CLOUD_FIELDS)]
    data = np.empty((points.shape[0], 4), dtype=np.float32)  # rows x, y, z, distance: 16 bytes
    data[:, :3] = points
    data[:, 3] = distance
    if _pc2 is not None:
        return _pc2.create_cloud(header, fields, data)
    msg = PointCloud2(header=header, height=1, width=int(points.shape[0]), fields=fields,
                      is_bigendian=False, point_step=16, row_step=16 * int(points.shape[0]),
                      is_dense=True)
    msg.data = array.array("B", data.tobytes())
    return msg
