"""A benchmark configuration run in a fresh process, its figures handed back as one line.

The configuration's process prints ``RESULT <json>`` (:func:`hand_back`); the benchmark
that started it reads that line (:func:`run_fresh`). A fresh process per configuration
keeps one configuration's imports, caches and workers out of the next one's figures.
"""

from __future__ import annotations

import json
import subprocess
import sys

_PREFIX = "RESULT "


def hand_back(result: dict) -> None:
    """Prints ``result`` for the :func:`run_fresh` that started this process."""
    print(_PREFIX + json.dumps(result), flush=True)


def run_fresh(arguments: list[str], label: str) -> dict:
    """Runs ``python <arguments>`` and returns the result it handed back, printed after
    ``label``; raises with the end of its stderr if it handed none back."""
    output = subprocess.run(
        [sys.executable, *arguments], capture_output=True, text=True, check=False
    )
    line = next((x for x in output.stdout.splitlines() if x.startswith(_PREFIX)), None)
    if line is None:
        raise RuntimeError(f"{label.strip()} failed:\n{output.stderr[-4000:]}")
    result = json.loads(line.removeprefix(_PREFIX))
    print(f"{label} {json.dumps(result)}", flush=True)
    return result
