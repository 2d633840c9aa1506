"""The Franka Emika Panda as published in the ``rtb-data`` package (Robotics Toolbox data files).

rtb-data ships the Panda only as xacro (``qut_frankie_description/robots/panda_arm_hand.urdf.xacro``,
Franka's kinematics and visual meshes, primitive collision shapes). ``panda_urdf`` expands it with
the ``xacro`` package into a plain URDF whose ``package://qut_frankie_description/`` mesh URIs are
rewritten to absolute file paths, so the file stands alone on this machine.

    python -m robot_sdf.examples.panda panda.urdf     # writes the URDF, prints its path

The sphere file config/panda_spheres.yaml was fitted to the visual meshes (Franka's COLLADA
models; the collision elements of this description are coarse cylinders and spheres) with

    fit_spheres panda.urdf --geometry visual --tolerance 0.012 --overshoot 0.01 \
        --output config/panda_spheres.yaml
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

PACKAGE = "qut_frankie_description"
XACRO = "robots/panda_arm_hand.urdf.xacro"
JOINTS = tuple(f"panda_joint{i}" for i in range(1, 8))
# Gripper half-opening [m]; the fingers are not planned (the second one mimics the first).
LOCKED_JOINTS = {"panda_finger_joint1": 0.02}
# The "ready" pose of Franka's examples [rad].
READY = (0.0, -0.785, 0.0, -2.356, 0.0, 1.571, 0.785)


def description_dir() -> Path:
    """Directory of the Panda description inside the installed rtb-data package."""
    try:
        import rtbdata
    except ImportError as exc:
        raise RuntimeError("the Panda model needs the rtb-data package (see requirements.txt)") from exc
    d = Path(rtbdata.__file__).resolve().parent / "xacro" / PACKAGE
    if not (d / XACRO).is_file():
        raise RuntimeError(f"{d / XACRO} not found: an rtb-data version without the Panda xacro?")
    return d


def panda_urdf(dest: str | Path | None = None) -> Path:
    """Expand the Panda xacro into a URDF at ``dest`` (default: a file in the temp directory).

    ``$(find qut_frankie_description)`` in the xacro files is replaced by the package directory
    (xacro resolves it through the ROS package index otherwise) before expansion.
    """
    import xacro

    pkg = description_dir()
    with tempfile.TemporaryDirectory() as tmp:
        # xacro reads the includes itself: give it copies that name the directory directly.
        for f in (pkg / "robots").glob("*.xacro"):
            (Path(tmp) / f.name).write_text(f.read_text().replace(f"$(find {PACKAGE})/robots", tmp))
        doc = xacro.process_file(str(Path(tmp) / Path(XACRO).name))
        text = doc.toprettyxml(indent="  ")
    text = text.replace(f"package://{PACKAGE}/", f"file://{pkg}/")
    out = Path(dest) if dest is not None else Path(tempfile.gettempdir()) / "robot_sdf_panda.urdf"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    print(panda_urdf(argv[0] if argv else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
