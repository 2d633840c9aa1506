"""Every reference to the design document points into this repository, at a section that exists."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"


def _tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [REPO / f for f in out.split() if f.endswith((".py", ".md", ".cfg", ".yaml", ".xml", ".txt", ".msg", ".srv"))]


def test_design_references_name_existing_sections():
    sections = {m.group(1).strip() for m in re.finditer(r"^#{2,3} (.+)$", DESIGN.read_text(), re.M)}
    assert {"Tensor layouts", "Cost definition", "Swept cost", "Sign-data layout", "Messages and services"} <= sections
    cited, bare = [], []
    for path in _tracked_text_files():
        if path in (DESIGN, Path(__file__).resolve()) or not path.exists():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "design.md" not in line:
                continue
            where = f"{path.relative_to(REPO)}:{n}"
            if "docs/design.md" not in line and "(design.md)" not in line:
                bare.append(where)  # a design.md outside the repository
            for name in re.findall(r'design\.md\)? "([^"]+)"', line):
                cited.append((where, name))
            for name in re.findall(r'design\.md\)? "[^"]+", "([^"]+)"', line):
                cited.append((where, name))
    assert not bare, f"references to a design.md that is not docs/design.md: {bare}"
    assert cited, "no code cites docs/design.md by section"
    missing = [(where, name) for where, name in cited if name not in sections]
    assert not missing, f"sections that docs/design.md does not have: {missing}"
