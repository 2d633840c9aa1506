"""rviz markers of the demo robot (ROS path only): namespaces robot, plan, path, goal."""
from __future__ import annotations

import numpy as np
from geometry_msgs.msg import Point
from std_msgs.msg import ColorRGBA
from visualization_msgs.msg import Marker, MarkerArray


def _marker(ns: str, mid: int, kind: int, frame: str, stamp, rgba: tuple[float, float, float, float]) -> Marker:
    m = Marker(ns=ns, id=mid, type=kind, action=Marker.ADD)
    m.header.frame_id, m.header.stamp = frame, stamp
    m.pose.orientation.w = 1.0
    m.color = ColorRGBA(r=rgba[0], g=rgba[1], b=rgba[2], a=rgba[3])
    return m


def demo_markers(frame: str, stamp, spheres: np.ndarray, plan: np.ndarray, path: np.ndarray,
                 goal: np.ndarray, height: float) -> MarkerArray:
    """spheres (n,4) x,y,z,r of the robot now; plan (H,>=2) and path (k,>=2) x,y [m]; goal (2,)."""
    out = []
    for i, (x, y, z, r) in enumerate(np.asarray(spheres, dtype=float)):
        m = _marker("robot", i, Marker.SPHERE, frame, stamp, (0.15, 0.45, 0.95, 0.85))
        m.pose.position.x, m.pose.position.y, m.pose.position.z = float(x), float(y), float(z)
        m.scale.x = m.scale.y = m.scale.z = 2.0 * float(r)
        out.append(m)
    for ns, pts, rgba, width in (("plan", plan, (0.1, 0.8, 0.3, 1.0), 0.02),
                                 ("path", path, (0.1, 0.2, 0.8, 1.0), 0.03)):
        m = _marker(ns, 0, Marker.LINE_STRIP, frame, stamp, rgba)
        m.scale.x = width
        m.points = [Point(x=float(p[0]), y=float(p[1]), z=float(height)) for p in np.asarray(pts)]
        if len(m.points) >= 2:
            out.append(m)
    m = _marker("goal", 0, Marker.CYLINDER, frame, stamp, (0.95, 0.75, 0.1, 0.8))
    m.pose.position.x, m.pose.position.y, m.pose.position.z = float(goal[0]), float(goal[1]), 0.01
    m.scale.x = m.scale.y = 0.2
    m.scale.z = 0.02
    out.append(m)
    return MarkerArray(markers=out)
