"""Every code block of the README and of docs/ runs, or is checked against what runs it.

The rule, per fenced block of ``README.md`` and ``docs/*.md``:

- ``python``: runs as a script of its own, in a fresh process and an empty directory, with
  a time limit; it makes its own data and must exit 0. Blocks with the same text (the
  README's examples are repeated in the docs) run once.
- ``bash``: a command that sets up the environment (``python3 -m venv``, activating it,
  ``pip install``, ``python -m pytest``) must be a line of ``.ci/run``, which runs them
  (this test runs inside that environment); every other command runs in bash, in an empty
  directory.
- ``yaml``: loads. A ``--8<-- "path"`` line (pymdownx.snippets, which the site renders)
  stands for a file of the repository, which must exist and load.
- any other language (``text``: output shown) is not code.

A block right after a line ``<!-- no-run: reason -->`` is not run; the reason must say
why (an empty one fails). Keep such blocks for what cannot run here in seconds (a cluster,
an object store, minutes of training) and name the test that covers them.

The pages' references to tests (``test_x.py::test_name``) must name tests that exist,
and the API page must render every public name of ``lightning_stream.__all__``.
``docs/benchmarks.md`` must be what ``benchmarks/report.py`` renders from the results files
of ``benchmarks/results`` (no benchmark runs here).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

import lightning_stream

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TIMEOUT_S = 120
FENCE = re.compile(r"^```(\w*)\s*$")
NO_RUN = re.compile(r"^<!--\s*no-run:(.*?)-->\s*$")
SNIPPET = re.compile(r'^--8<--\s+"([^"]+)"\s*$')
SETUP = re.compile(r"^(python3? -m venv |\. \S*activate$|pip install |python -m pytest\b)")
TEST_REFERENCE = re.compile(r"\b(test_\w+\.py)::(\w+)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    skip_reason: str | None  # None: no marker; "" : a marker without a reason

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page``, each with the no-run reason on the line before it."""
    found = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        marker = NO_RUN.match(lines[i - 1]) if i else None
        reason = marker.group(1).strip() if marker else None
        text = "\n".join(lines[i + 1 : end]) + "\n"
        found.append(Block(page, i + 1, opening.group(1), text, reason))
        i = end + 1
    return found


ALL = [block for page in PAGES for block in blocks(page)]


def distinct(language: str) -> list[Block]:
    """The blocks of ``language`` to run: the first of each text, skipped ones left out."""
    seen: dict[str, Block] = {}
    for block in ALL:
        if block.language == language and block.skip_reason is None:
            seen.setdefault(block.text, block)
    return list(seen.values())


def run_env(tmp_path: Path) -> dict[str, str]:
    """This checkout's package first on the path, this interpreter's scripts first on PATH,
    caches inside the test's directory."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    scripts = str(Path(sys.executable).parent)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "PATH": os.pathsep.join([scripts, os.environ.get("PATH", "")]),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PYTHONWARNINGS": "ignore",
    }


def check_ran(result: subprocess.CompletedProcess, block: Block) -> None:
    assert result.returncode == 0, (
        f"{block.name} exited {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    )


@pytest.mark.parametrize("block", distinct("python"), ids=lambda b: b.name)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "block.py"
    script.write_text(block.text, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    check_ran(result, block)


def commands(text: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comments dropped, ``&&`` split."""
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            found.extend(part.strip() for part in line.split("&&"))
    return found


def ci_lines() -> set[str]:
    """The lines of ``.ci/run``, ``--quiet`` dropped (pip's output only)."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    return {" ".join(line.replace("--quiet", "").split()) for line in text.splitlines()}


@pytest.mark.parametrize("block", distinct("bash"), ids=lambda b: b.name)
def test_bash_block_runs_or_is_what_ci_runs(block: Block, tmp_path: Path) -> None:
    setup = [c for c in commands(block.text) if SETUP.match(c)]
    missing = [c for c in setup if " ".join(c.split()) not in ci_lines()]
    assert not missing, f"{block.name}: set-up commands that .ci/run does not run: {missing}"
    rest = [c for c in commands(block.text) if not SETUP.match(c)]
    if not rest:
        return
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", "\n".join(rest)],
        cwd=tmp_path,
        env=run_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    check_ran(result, block)


@pytest.mark.parametrize("block", [b for b in ALL if b.language == "yaml"], ids=lambda b: b.name)
def test_yaml_block_loads(block: Block) -> None:
    included = [SNIPPET.match(line) for line in block.text.splitlines()]
    if any(included):
        for match in filter(None, included):
            path = ROOT / match.group(1)
            assert path.is_file(), f"{block.name} includes {match.group(1)}, which is missing"
            assert isinstance(yaml.safe_load(path.read_text(encoding="utf-8")), dict)
    else:
        yaml.safe_load(block.text)


def test_every_skipped_block_says_why() -> None:
    unexplained = [b.name for b in ALL if b.skip_reason == ""]
    assert not unexplained, f"<!-- no-run: ... --> without a reason: {unexplained}"
    languages = {b.language for b in ALL}
    assert languages <= {"python", "bash", "yaml", "text"}, f"blocks of no rule: {languages}"


def test_named_tests_exist() -> None:
    missing = []
    for page in PAGES:
        for file, name in TEST_REFERENCE.findall(page.read_text(encoding="utf-8")):
            path = ROOT / "tests" / file
            if not path.is_file() or f"def {name}(" not in path.read_text(encoding="utf-8"):
                missing.append(f"{page.relative_to(ROOT)}: {file}::{name}")
    assert not missing, f"references to tests that do not exist: {missing}"


def test_api_page_renders_every_public_name() -> None:
    api = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    public = [name for name in lightning_stream.__all__ if not name.startswith("__")]
    missing = [name for name in public if f"::: lightning_stream.{name}\n" not in api]
    assert not missing, f"docs/api.md does not render {missing}"


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 150, f"README.md has {lines} lines: move detail into docs/"


def test_benchmarks_page_is_what_the_results_render() -> None:
    path = ROOT / "benchmarks" / "report.py"
    spec = importlib.util.spec_from_file_location("benchmarks_report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert page == report.render(report.load()), (
        "docs/benchmarks.md is not what the results files render: run python benchmarks/report.py"
    )
