"""robot_sdf.kernels.mesh_queries: which kernel set a process gets. Each case starts a fresh
interpreter (the choice is made once, at import) and reports the set it loaded and the functions
the kernels then call."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = ("import json; from robot_sdf.kernels import mesh_queries as q, native, portable; "
         "print(json.dumps([q.NATIVE, q.winding_number is native.winding_number, "
         "q.winding_number is portable.winding_number, q.CPU_SPHERES_PER_THREAD]))")


def _probe(choice: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ROBOT_SDF_KERNELS"}
    if choice is not None:
        env["ROBOT_SDF_KERNELS"] = choice
    return subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("choice, native", [(None, True), ("auto", True), ("native", True), ("portable", False),
                                            (" Portable ", False)])
def test_the_set_follows_the_environment(choice, native):
    """On a checked Warp (this venv's): native unless portable is asked for; every function and
    constant comes from the set chosen (one sphere a thread on the CPU with the portable set)."""
    import json

    done = _probe(choice)
    assert done.returncode == 0, done.stderr
    loaded, is_native, is_portable, per_thread = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded is native and is_native is native and is_portable is (not native)
    assert per_thread == (16 if native else 1)


def test_an_unknown_choice_is_refused_by_name():
    done = _probe("fast")
    assert done.returncode != 0
    assert "ROBOT_SDF_KERNELS='fast'" in done.stderr and "auto, native or portable" in done.stderr
