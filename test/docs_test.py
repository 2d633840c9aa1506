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


# --- what a newcomer reads: README and docs/ -------------------------------------------------

README = REPO / "README.md"
README_MAX_LINES = 300
# Numbers of sessions and issues mean nothing to a reader of the checkout; docs/history/ keeps them.
# "PR 711"-style references to other projects' pull requests are written out in words.
SESSION_OR_ISSUE = re.compile(r"\b[Ss]essions?\s+\d|\b[Ii]ssues?\s*#?\d|(?<![\w/&])#\d{1,4}\b|\bS\d{1,2}\b")


def _reader_pages() -> list[Path]:
    """README.md and docs/*.md (not docs/history/)."""
    return [README, *sorted((REPO / "docs").glob("*.md"))]


def test_readme_is_short():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines (at most {README_MAX_LINES})"


def test_session_pattern_catches_session_and_issue_numbers():
    """The pattern of the next test is not vacuous, and lets ordinary text through."""
    for text in ("session 23", "Sessions 13 and 16", "issue 14", "issue #14", "see #14", "(S22)", "Issue 7 baseline"):
        assert SESSION_OR_ISSUE.search(text), text
    for text in ("sm_87", "one session at a time", "the issue's case", "colour #fff", "a/b#1", "Section 4", "SS2"):
        assert not SESSION_OR_ISSUE.search(text), text


def test_reader_pages_carry_no_session_or_issue_numbers():
    found = [f"{page.relative_to(REPO)}:{n}: {line.strip()}"
             for page in _reader_pages()
             for n, line in enumerate(page.read_text().splitlines(), 1) if SESSION_OR_ISSUE.search(line)]
    assert not found, "session or issue numbers (move the story to docs/history/):\n" + "\n".join(found)


def _layout_block() -> str:
    section = README.read_text().split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section


def _layout_modules(block: str) -> dict[str, set[str]]:
    """package folder ("robot_sdf", "robot_sdf/ros", ...) -> the module files the layout list names."""
    named: dict[str, set[str]] = {}
    package = None
    for line in block.splitlines():
        first = line.split()[0] if line.split() else ""
        if first.endswith("/") and not line.startswith("      "):
            package = first.rstrip("/") if first.startswith("robot_sdf/") or first == "robot_sdf/" else None
            if package is not None:
                named.setdefault(package, set())
        if package is not None:
            named[package].update(re.findall(r"\b(\w+\.py)\b", line))
    return named


def test_layout_parser_reads_packages_and_modules():
    block = ("    robot_sdf/           core\n      world.py         MeshWorld\n"
             "    robot_sdf/ros/       the node: sdf_server.py, client.py\n"
             "                         and frames.py\n    test/                suite, reference.py\n")
    assert _layout_modules(block) == {"robot_sdf": {"world.py"},
                                      "robot_sdf/ros": {"sdf_server.py", "client.py", "frames.py"}}


def test_readme_layout_names_every_module():
    named = _layout_modules(_layout_block())
    missing = []
    for folder in [REPO / "robot_sdf", *sorted(p.parent for p in (REPO / "robot_sdf").glob("*/__init__.py"))]:
        package = folder.relative_to(REPO).as_posix()
        for module in sorted(folder.glob("*.py")):
            if module.name != "__init__.py" and module.name not in named.get(package, set()):
                missing.append(f"{package}/{module.name}")
    assert not missing, f"modules missing from README's layout list: {missing}"
    core = REPO / "robot_sdf"
    listed_core = [line.split()[0] for line in _layout_block().splitlines()
                   if line.startswith("      ") and line.split() and line.split()[0].endswith(".py")
                   and (core / line.split()[0]).is_file()]
    assert sorted(listed_core) == sorted(set(listed_core)), "a core module is listed twice"
    stale = sorted(name for package, names in named.items() for name in names if not (REPO / package / name).is_file())
    assert not stale, f"README's layout list names modules that do not exist: {stale}"


def test_relative_links_of_reader_pages_resolve():
    broken = []
    for page in [*_reader_pages(), *sorted((REPO / "docs" / "history").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def _documented_signature(function: str) -> list[str]:
    """Argument names of ``function.apply(...)`` as docs/design.md "Tensor layouts" writes them."""
    text = DESIGN.read_text()
    call = re.search(rf"^\s+{function}\.apply\((.*?)\)", text, re.M | re.S).group(1)
    return [arg.split("=")[0].strip() for arg in call.split(",") if arg.strip()]


def test_design_contract_lists_every_argument_of_the_functions():
    import inspect

    from robot_sdf.warp_primitives import SdfMeshWarpPy, SweptSdfMeshWarpPy

    for function in (SdfMeshWarpPy, SweptSdfMeshWarpPy):
        actual = list(inspect.signature(function.forward).parameters)
        assert _documented_signature(function.__name__) == actual, function.__name__
    rows = set(re.findall(r"^\| (\w+)(?:, \w+)* \|", DESIGN.read_text(), re.M))
    rows |= {name for line in re.findall(r"^\| ([\w, ]+) \|", DESIGN.read_text(), re.M) for name in line.split(", ")}
    for name in set(_documented_signature("SdfMeshWarpPy")) | set(_documented_signature("SweptSdfMeshWarpPy")):
        if name not in ("return_loss", "compute_esdf", "sweep_steps", "enable_speed_metric"):
            assert name in rows, f"docs/design.md's argument table has no row for {name}"


def test_node_page_lists_every_parameter():
    from robot_sdf.ros.parameters import PARAMETERS

    page = (REPO / "docs" / "node.md").read_text()
    missing = [p.name for p in PARAMETERS if f"`{p.name}`" not in page]
    assert not missing, f"docs/node.md does not list these node parameters: {missing}"


def test_readme_pytorch_example_runs_as_written():
    """The README's MeshWorld example, executed from the README text, in the repository root."""
    import os

    import torch

    section = README.read_text().split("## 1. PyTorch", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(REPO)  # the example loads config/meshes/boulder.stl by a relative path
    try:
        exec(compile(code, "README.md", "exec"), namespace)  # noqa: S102 - the documented example itself
    finally:
        os.chdir(cwd)
    spheres, cost = namespace["spheres"], namespace["cost"]
    assert cost.shape == spheres.shape[:3] and spheres.grad.shape == spheres.shape
    assert (cost > 0).any() and torch.isfinite(spheres.grad).all()
    assert namespace["dist"].shape == (1,) and namespace["grad"].shape == (1, 3)


def test_code_carries_no_session_or_issue_numbers():
    """Comments, docstrings and strings of the package, the benchmarks and the tests say why,
    not which session or issue: "session N" and "issue N" in any tracked Python file (this file
    excepted, whose examples must match; a bare "#1" is code's own notation there)."""
    words = re.compile(r"\b[Ss]essions?\s+\d|\b[Ii]ssues?\s*#?\d")
    found = []
    for path in _tracked_text_files():
        if path.suffix != ".py" or path == Path(__file__).resolve() or not path.exists():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if words.search(line):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert not found, "session or issue numbers in code:\n" + "\n".join(found)


# Names docs/design.md may use that live outside this repository (Warp, torch, ROS).
EXTERNAL_NAMES = {"wp", "Mesh", "id", "mesh_query_point", "mesh_query_point_sign_normal", "mesh_eval_velocity",
                  "torch", "autograd", "Function", "tf2_ros", "static_transforms", "requires_grad", "backward",
                  "apply"}


def _code_words() -> set[str]:
    """Every identifier in robot_sdf's code, its interfaces, launch and config files."""
    words: set[str] = set()
    for folder in ("robot_sdf", "robot_sdf_interfaces", "launch", "config"):
        for path in (REPO / folder).rglob("*"):
            if path.is_file() and path.suffix in (".py", ".msg", ".srv", ".yaml", ".txt") and "build" not in path.parts:
                words.update(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", path.read_text(errors="replace")))
    return words


def test_design_names_only_what_exists():
    """Every code name docs/design.md writes in backticks (dotted names: each part) is a word of the
    code, the interfaces, the launch or config files, or one of Warp's, torch's or ROS's
    (EXTERNAL_NAMES): a renamed or removed function fails here until the page follows."""
    words = _code_words() | EXTERNAL_NAMES
    names = set(re.findall(r"`([A-Za-z_][A-Za-z0-9_.]*)(?:\(\))?`", DESIGN.read_text()))
    assert len(names) > 40
    missing = sorted(name for name in names if any(part and part not in words for part in name.split(".")))
    assert not missing, f"docs/design.md names what the code does not have: {missing}"


def test_readme_figures_come_from_the_results_page():
    """Every speed figure README gives ("0.74 x", "1.8-40x") is a number docs/results.md prints: a
    re-run that replaces the results page shows stale README figures here."""
    readme = README.read_text()
    results = (REPO / "docs" / "results.md").read_text()
    figures = re.findall(r"(\d+\.\d+)(?:-(\d+(?:\.\d+)?))? ?x\b", readme)
    numbers = {n for pair in figures for n in pair if n and "." in n}
    assert len(numbers) >= 8, numbers
    missing = sorted(n for n in numbers if not re.search(rf"(?<![\d.]){re.escape(n)}(?![\d])", results))
    assert not missing, f"README figures that docs/results.md does not print: {missing}"
