"""Columnar batches: a dict of column name to a tensor or numpy array (rows along dim 0)
or a list.

The package cuts and joins batches at exact sample boundaries, which is how a rank
shapes its rows into the number of steps every rank takes after an elastic resume.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

from lightning_stream.skipped import SKIP_REASON

Batch = dict[str, Any]


def batch_len(batch: Mapping[str, Any]) -> int:
    """Rows in a columnar batch (the length of its first column)."""
    for value in batch.values():
        return value.shape[0] if isinstance(value, torch.Tensor) else len(value)
    return 0


def check_columnar(batch: Any, rows: int, where: str) -> None:
    """Raise ``TypeError`` unless ``batch`` is a dict whose columns all have ``rows`` rows."""
    if not isinstance(batch, Mapping):
        raise TypeError(f"{where} must return a dict of columns, got {type(batch).__name__}")
    for name, value in batch.items():
        length = value.shape[0] if isinstance(value, torch.Tensor) else len(value)
        if length != rows:
            raise TypeError(
                f"{where} returned column {name!r} with {length} rows for a batch of {rows};"
                " every column must keep one entry per sample along dim 0, so that batches"
                " can be cut at sample boundaries on resume"
            )


def _slice(batch: Batch, start: int, stop: int) -> Batch:
    return {name: value[start:stop] for name, value in batch.items()}


def _concat(parts: list[Batch]) -> Batch:
    if len(parts) == 1:
        return parts[0]
    joined = {}
    for name, first in parts[0].items():
        values = [part[name] for part in parts]
        if isinstance(first, torch.Tensor):
            joined[name] = torch.cat(values)
        elif isinstance(first, np.ndarray):
            joined[name] = np.concatenate(values)
        else:
            joined[name] = [item for value in values for item in value]
    return joined


def rechunk(chunks: Iterable[Batch], sizes: Iterable[int]) -> Iterator[Batch]:
    """Re-cut a stream of columnar chunks into batches of the given sizes.

    A chunk that already has the wanted size passes through untouched (no copy); that is
    every batch of an epoch that starts fresh, except near its end.
    """
    pending: list[Batch] = []
    pending_rows = 0
    source = iter(chunks)
    for size in sizes:
        while pending_rows < size:
            try:
                chunk = next(source)
            except StopIteration:
                raise RuntimeError(
                    f"the data source ended {size - pending_rows} rows short of its plan;"
                    " the table or its files changed while the stream was read"
                ) from None
            pending.append(chunk)
            pending_rows += batch_len(chunk)
        parts = []
        wanted = size
        while wanted:
            head = pending[0]
            rows = batch_len(head)
            if rows <= wanted:
                parts.append(pending.pop(0))
                wanted -= rows
            else:
                parts.append(_slice(head, 0, wanted))
                pending[0] = _slice(head, wanted, rows)
                wanted = 0
        pending_rows -= size
        yield _concat(parts)


def drop_skipped(batch: Batch) -> Batch:
    """``batch`` without the rows marked in its ``SKIP_REASON`` column, nor that column."""
    reasons = batch.get(SKIP_REASON)
    if reasons is None:
        return batch
    keep = [i for i, reason in enumerate(reasons) if not reason]
    index = torch.tensor(keep, dtype=torch.long)
    return {
        name: value[index]
        if isinstance(value, torch.Tensor | np.ndarray)
        else [value[i] for i in keep]
        for name, value in batch.items()
        if name != SKIP_REASON
    }
