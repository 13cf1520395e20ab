"""The results files of the benchmarks: one JSON file per benchmark in ``benchmarks/results``.

A file maps a run's name (what its options measured: ``"light table, 20 ms, ..."``) to
that run's figures, with the command that produced them, the commit they measured
(``commit``, ``date``; ``uncommitted: true`` when the package or the benchmarks differed
from that commit) and the cores the benchmark could run on (``cores``). A new run replaces
the run of the same name and keeps the others, so one file holds every configuration of
its benchmark. ``benchmarks/report.py`` renders them into ``docs/benchmarks.md``.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _git(*arguments: str) -> str:
    found = subprocess.run(["git", *arguments], cwd=ROOT, capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else ""


def measured_commit() -> dict:
    """The commit this checkout is at, its date, whether the code measured differs from
    it, and the cores this process may run on."""
    found = {
        "commit": _git("rev-parse", "--short=7", "HEAD"),
        "date": _git("show", "-s", "--format=%cs", "HEAD"),
    }
    code = ["lightning_stream", "benchmarks", ":(exclude)benchmarks/results", "tests/s3_server.py"]
    if _git("status", "--porcelain", "--", *code):
        found["uncommitted"] = True
    found["cores"] = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    )
    return found


def command() -> str:
    """This benchmark's command line, as run from the repository's root."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join(["python", str(shown), *sys.argv[1:]])


def save(path: Path, name: str, figures: dict) -> None:
    """Keep ``figures`` as run ``name`` of the results file ``path``, with the command and
    the commit measured; the file's other runs stay."""
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[name] = {**measured_commit(), "command": command(), **figures}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(runs, indent=1) + "\n")
    print(f"{path}: run {name!r} written")
