"""What differs between the Warp releases robot_sdf runs on, decided once at import: every module
that writes version-dependent code reads it from here.

    CHECKED_RELEASES  the minor releases whose internals robot_sdf's shortcuts were checked
                      against: the C++ snippets of kernels.native (the layout of wp::Mesh and
                      wp::BVH, BVH_QUERY_STACK_SIZE and the helpers they call are the same in
                      each: native/mesh.h, bvh.h and solid_angle.h differ between 1.15 and 1.19
                      only in debug-only code, comments and a read-only load helper) and
                      robot_sdf.launch's recorded launches (wp.Launch's packed parameters and the
                      CPU kernel hooks' argument struct). CI runs the core tests on the oldest
                      (requirements/warp-oldest.txt) and on the pin (requirements.txt).
    WARP_MINOR        the installed Warp's (major, minor), e.g. (1, 17)
    WARP_CHECKED      whether the installed Warp is one of CHECKED_RELEASES
    OUT_OF_LINE       keyword arguments of ``wp.func`` that keep a function out of line where Warp
                      can (the ``inline`` option came with 1.18; before it every function is
                      inlined, which changes register use on the GPU, never a result)
"""
from __future__ import annotations

import warp as wp

CHECKED_RELEASES = ("1.15", "1.16", "1.17", "1.18", "1.19")


def minor_release(version: str) -> str:
    """"major.minor" of a Warp version string such as "1.19.0" or "1.17.1+cu12"."""
    return ".".join(version.split("+")[0].split(".")[:2])


WARP_MINOR = tuple(int("".join(c for c in part if c.isdigit()) or 0)
                   for part in minor_release(wp.config.version).split("."))
WARP_CHECKED = minor_release(wp.config.version) in CHECKED_RELEASES
OUT_OF_LINE = {"inline": False} if WARP_MINOR >= (1, 18) else {}
