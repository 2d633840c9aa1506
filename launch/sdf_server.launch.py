"""Launch the robot_sdf ``sdf_server`` node.

    ros2 launch robot_sdf sdf_server.launch.py
    ros2 launch robot_sdf sdf_server.launch.py config:=/path/to/params.yaml device:=cuda:0
    ros2 launch robot_sdf sdf_server.launch.py managed:=true    # lifecycle node, left unconfigured

Arguments:
    config     parameter file (default: share/robot_sdf/config/sdf_server.yaml)
    device     overrides the file's ``device`` parameter when not empty (auto, cpu, cuda, cuda:N)
    log_level  ROS log level of the node (default info)
    managed    true: start the lifecycle variant (sdf_server_managed), which waits unconfigured for
               a lifecycle manager (or `ros2 lifecycle set /sdf_server configure`, then `activate`)
"""
from __future__ import annotations

import os

from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, OpaqueFunction
from launch.substitutions import LaunchConfiguration
from launch_ros.actions import Node

PACKAGE = "robot_sdf"
EXECUTABLE = "sdf_server"
MANAGED_EXECUTABLE = "sdf_server_managed"
CONFIG_NAME = "sdf_server.yaml"


def default_config_path() -> str:
    """The installed config/sdf_server.yaml, or the source tree's when the package is not installed."""
    try:
        from ament_index_python.packages import get_package_share_directory

        return os.path.join(get_package_share_directory(PACKAGE), "config", CONFIG_NAME)
    # PackageNotFoundError is a LookupError; an unset AMENT_PREFIX_PATH raises OSError.
    except (ImportError, LookupError, OSError):
        return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "config", CONFIG_NAME)


def _node(context, *args, **kwargs) -> list:
    """Build the node once the arguments are known: ``device`` overrides only when given."""
    parameters: list = [LaunchConfiguration("config").perform(context)]
    device = LaunchConfiguration("device").perform(context).strip()
    if device:
        parameters.append({"device": device})
    managed = LaunchConfiguration("managed").perform(context).strip().lower() in ("true", "1", "yes")
    return [Node(package=PACKAGE, executable=MANAGED_EXECUTABLE if managed else EXECUTABLE, name=EXECUTABLE,
                 output="screen",
                 parameters=parameters,
                 ros_arguments=["--log-level", LaunchConfiguration("log_level").perform(context)])]


def generate_launch_description() -> LaunchDescription:
    return LaunchDescription([
        DeclareLaunchArgument("config", default_value=default_config_path(),
                              description="parameter file of the sdf_server node"),
        DeclareLaunchArgument("device", default_value="",
                              description="compute device override: auto, cpu, cuda, cuda:N "
                                          "(empty = the config file's value)"),
        DeclareLaunchArgument("log_level", default_value="info",
                              description="log level of the node"),
        DeclareLaunchArgument("managed", default_value="false",
                              description="true: the lifecycle variant sdf_server_managed"),
        OpaqueFunction(function=_node),
    ])
