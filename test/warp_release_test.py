"""robot_sdf.kernels.warp_release: the Warp releases robot_sdf runs on, read from the version string,
and what CI runs them with (requirements.txt's pin, requirements/warp-oldest.txt)."""
from __future__ import annotations

import inspect
import os
import re
from pathlib import Path

import pytest
import warp as wp

from robot_sdf.kernels import warp_release

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("version, minor", [("1.19.0", "1.19"), ("1.17.3+cu12", "1.17"), ("1.20.0.dev20261101", "1.20"),
                                            ("2.0.1", "2.0")])
def test_minor_release_of_version_strings(version, minor):
    assert warp_release.minor_release(version) == minor


def test_the_installed_warp_is_one_of_the_checked_releases():
    assert warp_release.minor_release(wp.config.version) in warp_release.CHECKED_RELEASES
    assert warp_release.WARP_CHECKED
    assert warp_release.WARP_MINOR == tuple(int(x) for x in warp_release.minor_release(wp.config.version).split("."))


def test_out_of_line_is_offered_where_warp_has_the_option():
    """wp.func's ``inline`` keyword exists from 1.18 on: OUT_OF_LINE passes it exactly there."""
    has_inline = "inline" in inspect.signature(wp.func).parameters
    assert bool(warp_release.OUT_OF_LINE) == has_inline


def test_the_run_uses_the_warp_it_was_started_for():
    """`make test-warp-oldest` names the release it put first on the path: the run must import
    that one, not the venv's pin (an overlay that silently did nothing would test the pin twice)."""
    expected = os.environ.get("ROBOT_SDF_EXPECT_WARP")
    if not expected:
        pytest.skip("ROBOT_SDF_EXPECT_WARP is set by `make test-warp-oldest` only")
    assert wp.config.version == expected


def test_the_checked_range_is_what_the_requirements_say():
    """requirements/warp-oldest.txt pins the oldest checked release and requirements.txt a
    release of the newest, so that CI's two runs span CHECKED_RELEASES."""
    def pin(name):
        text = (REPO / name).read_text(encoding="utf-8")
        return re.search(r"^warp-lang==(\S+)$", text, re.MULTILINE).group(1)
    assert warp_release.minor_release(pin("requirements/warp-oldest.txt")) == warp_release.CHECKED_RELEASES[0]
    assert warp_release.minor_release(pin("requirements.txt")) == warp_release.CHECKED_RELEASES[-1]
