"""robot_sdf: collision costs of robot spheres against triangle-mesh worlds, on Warp.

The core (this package without ``robot_sdf.ros`` and the examples) imports
no ROS module, so an MPC can use it in-process.
"""
from robot_sdf.adoption import AdoptedMeshes, adopt_meshes
from robot_sdf.types import IDENTITY_POSE, SignMethod, WorldSnapshot
from robot_sdf.world import MeshWorld, resolve_device

__all__ = ["IDENTITY_POSE", "AdoptedMeshes", "MeshWorld", "SignMethod", "WorldSnapshot", "adopt_meshes",
           "resolve_device"]
__version__ = "0.1.0"
