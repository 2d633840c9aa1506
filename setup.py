"""Build script of the ament_python package ``robot_sdf``.

Serves both colcon (ROS 2 workspace build) and pip (``pip install -e .`` into a venv).
Data directories that do not exist yet are skipped, so the package builds at every stage.
"""

from glob import glob
import os

from setuptools import find_packages, setup

PACKAGE_NAME = "robot_sdf"
HERE = os.path.dirname(os.path.abspath(__file__))


def _files(pattern: str) -> list[str]:
    """Plain files matching ``pattern`` (relative to this file), sorted; [] when none exist."""
    # Paths stay relative: setuptools rejects absolute data_files sources in wheels.
    matches = glob(pattern, root_dir=HERE)
    return sorted(m for m in matches if os.path.isfile(os.path.join(HERE, m)))


def _data_files() -> list[tuple[str, list[str]]]:
    """ament index marker, package.xml, launch files and configuration under share/."""
    share = os.path.join("share", PACKAGE_NAME)
    entries = [
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE_NAME}"]),
        (share, ["package.xml"]),
        (os.path.join(share, "launch"), _files("launch/*.launch.py")),
        (os.path.join(share, "config"), _files("config/*.yaml") + _files("config/*.rviz")),
        (os.path.join(share, "config", "meshes"), _files("config/meshes/*")),
    ]
    return [(dest, srcs) for dest, srcs in entries if srcs]


setup(
    name=PACKAGE_NAME,
    version="0.1.0",
    packages=find_packages(exclude=["test", "test.*", "bench", "bench.*"]),
    data_files=_data_files(),
    install_requires=["setuptools"],
    zip_safe=True,
    maintainer="robot_sdf maintainers",
    maintainer_email="robot-sdf@example.com",
    description=(
        "Collision costs and gradients of robot spheres against triangle meshes "
        "(NVIDIA Warp, torch.autograd, ROS 2 services)"
    ),
    license="Apache-2.0",
    python_requires=">=3.11",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "sdf_server = robot_sdf.ros.sdf_server:main",
            "sdf_server_managed = robot_sdf.ros.lifecycle:main",
            "mpc_demo = robot_sdf.examples.mpc_demo:main",
            "render_slice = robot_sdf.tools.render_slice:main",
            "fit_spheres = robot_sdf.tools.fit_spheres:main",
            "arm_demo = robot_sdf.examples.arm_demo:main",
        ],
    },
)
