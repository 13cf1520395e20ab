"""Read a checkpoint's data provenance without reading its tensors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lightning_stream.callback import StreamStateCallback


def read_stream_record(path: str | Path) -> dict[str, Any]:
    """The stream state and provenance stored in a Lightning checkpoint.

    The file is memory-mapped: tensors are not read from disk.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable torch checkpoint: {exc}") from exc
    state = checkpoint.get("callbacks", {}).get(StreamStateCallback.__qualname__)
    if not state:
        raise ValueError(f"{path} holds no lightning-stream state (no StreamStateCallback)")
    return {"checkpoint": str(path), "global_step": checkpoint.get("global_step"), **state}


def _split_summary(consumed: list[int]) -> str:
    return f"{sum(consumed)} in all, {min(consumed)}..{max(consumed)} per split: {consumed}"


def table(record: dict[str, Any]) -> str:
    """The record as aligned ``name  value`` lines."""
    identity = record["identity"]
    topology = record.get("topology", {})
    provenance = record.get("provenance", {})
    code = provenance.get("code") or {}
    rows = [
        ("checkpoint", record["checkpoint"]),
        ("global step", record["global_step"]),
        *((f"data {key}", value) for key, value in identity.items()),
        ("epoch", record["epoch"]),
        ("epoch finished", record["epoch_done"]),
        ("steps in epoch", record["steps"]),
        ("samples consumed", _split_summary(record["consumed"])),
        ("complete (all ranks)", record["complete"]),
        *((f"saved by {key}", value) for key, value in topology.items()),
        ("code commit", code.get("commit", "not a git checkout")),
        ("code dirty", code.get("dirty", "-")),
        *((f"version {name}", v) for name, v in provenance.get("versions", {}).items()),
        ("saved at", provenance.get("saved_at")),
    ]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def render(path: str | Path, as_json: bool) -> str:
    record = read_stream_record(path)
    return json.dumps(record, indent=2) if as_json else table(record)
