"""The world from depth cameras: frames fused into a truncated signed distance field, whose
surface joins a MeshWorld as one of its meshes (fusion.DepthFusion); simulated depth cameras that
ray-cast meshes with a real sensor's noise (simulated_camera), for tests, benchmarks and demos."""
from robot_sdf.perception.fusion import DepthFusion
from robot_sdf.perception.tsdf import TsdfVolume

__all__ = ["DepthFusion", "TsdfVolume"]
