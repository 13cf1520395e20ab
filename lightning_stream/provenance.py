"""Where a checkpoint came from: code revision and library versions, recorded at save."""

from __future__ import annotations

import subprocess
from datetime import datetime, timezone
from functools import cache
from importlib import metadata
from typing import Any

LIBRARIES = ("lightning-stream", "lightning", "torch", "lancedb", "pyarrow", "av")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@cache
def code_revision() -> dict[str, Any] | None:
    """Git commit of the working directory and whether it had uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(status.strip())}


def provenance() -> dict[str, Any]:
    """What produced a checkpoint now: versions, code revision, time."""
    return {
        "versions": {name: _version(name) for name in LIBRARIES},
        "code": code_revision(),
        "saved_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
