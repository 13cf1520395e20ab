"""Read a checkpoint's data provenance without reading its tensors."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import torch

from lightning_stream.state import STATE_KEY
from lightning_stream.storage import fsspec_options, is_remote, storage_error


def _download(url: str, storage_options: dict[str, str] | None) -> io.BytesIO:
    """The bytes of a remote checkpoint, read through fsspec (s3fs for ``s3://``)."""
    from fsspec.core import url_to_fs

    try:
        fs, path = url_to_fs(url, **fsspec_options(storage_options))
        with fs.open(path, "rb") as remote:
            return io.BytesIO(remote.read())
    except FileNotFoundError:
        raise FileNotFoundError(f"no checkpoint at {url}") from None
    except ImportError as exc:
        raise ValueError(
            f"reading {url} needs an fsspec file system for its scheme ({exc}); for s3://"
            " install lightning-stream[s3]"
        ) from None
    except Exception as exc:
        raise storage_error(url, exc, storage_options) from None


def read_stream_record(
    path: str | Path, storage_options: dict[str, str] | None = None
) -> dict[str, Any]:
    """The stream state and provenance stored in a Lightning checkpoint.

    A local file is memory-mapped: tensors are not read from disk. A remote one (any
    fsspec URL, e.g. ``s3://bucket/run/last.ckpt``) is downloaded into memory, with
    ``storage_options`` (lance's option names, or the file system's own) or, without
    them, the credentials of the environment.
    """
    if is_remote(str(path)):
        source: Any = _download(str(path), storage_options)
        options: dict[str, Any] = {}
    else:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no checkpoint at {path}")
        source, options = path, {"mmap": True}
    try:
        checkpoint = torch.load(source, map_location="cpu", weights_only=False, **options)
    except Exception as exc:
        raise ValueError(f"{path} is not a readable torch checkpoint: {exc}") from exc
    state = checkpoint.get("callbacks", {}).get(STATE_KEY)
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


def render(path: str | Path, as_json: bool, storage_options: dict[str, str] | None = None) -> str:
    record = read_stream_record(path, storage_options)
    return json.dumps(record, indent=2) if as_json else table(record)
