"""A reader's blocks cut straight from the local copy of the token column.

The copy (:class:`~lightning_stream.lance.token_cache.LocalTokens`) holds every row's
tokens end to end in storage order, each followed by its end-of-document token, and where
each row starts: any row can be read at any time. So each block is cut on its own from
the rows it holds (:func:`~lightning_stream.packing.blocks.cut_blocks`), one slice per run
of consecutive storage rows, and nothing is carried from block to block: a row that
crosses into its split's next block is sliced again there. A reader plans up to
``PLAN_BLOCKS`` blocks at once (which rows, where in the copy; fewer where their rows
would not fit its budget) and reads them a group of batches at a time, each slice by one
positional read into the group's buffer: no page of the tokens is mapped into the
process (where each row starts is, anew for each plan), so nothing of the copy stays
resident beyond the plan being read.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from lightning_stream.lance.order import storage_offsets
from lightning_stream.lance.reader import ReadCounters
from lightning_stream.lance.selection import Selection
from lightning_stream.lance.token_cache import LocalTokens
from lightning_stream.packing.blocks import cut_blocks
from lightning_stream.packing.layout import ReaderBlocks, runs_of
from lightning_stream.packing.option import TokenPacking

# Blocks a reader plans at once: the layout's cost per call (the row starts of every
# clump looked at) is spread over this many.
PLAN_BLOCKS = 4096
# Bytes a plan holds for each row it cuts (where it is, where it lands, its length): a
# plan holds at most the reader's budget of them, at the epoch's rows per block.
PLAN_ROW_BYTES = 128


def copied_groups(
    blocks: ReaderBlocks,
    selection: Selection | None,
    local: LocalTokens,
    groups: Sequence[Sequence[int]],
    packing: TokenPacking,
    table: str,
    counters: ReadCounters,
    budget: int,
) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
    """The arrays of each of ``groups`` (of batches) of ``blocks``, in order, and each
    block's tokens that are not padding."""
    dtype = np.dtype(local.dtype)
    size = packing.block_size
    layout = blocks.layout
    row_blocks = max(1.0, layout.clumps.total / (layout.blocks * layout.num_splits))
    plan_blocks = int(max(1, min(PLAN_BLOCKS, budget // (PLAN_ROW_BYTES * row_blocks))))
    total = layout.total
    with open(local.tokens, "rb") as tokens, open(local.starts, "rb") as starts:
        _checked_sizes(tokens, starts, dtype, local)
        planned = held = 0
        try:
            for run in runs_of([sum(group) for group in groups], plan_blocks):
                plan = groups[run.start : run.stop]
                count = sum(sum(group) for group in plan)
                needs = blocks.needs(planned, planned + count, carried=False)
                rows = storage_offsets(selection, layout.selected(needs.laid))
                offsets = _mapped(starts, np.dtype(np.int64))
                sources = offsets[rows]
                cuts = cut_blocks(needs, total, size, sources, offsets[rows + 1] - sources)
                del offsets  # its pages leave resident memory once the plan is cut
                counters.add("rows_read", len(rows) - int((needs.offsets > 0).sum()))
                at = 0
                for group in plan:
                    stop = at + sum(group)
                    pieces = cuts.pieces_of(at, stop)
                    read = _read_pieces(tokens, pieces, stop - at, size, dtype)
                    counters.add("bytes_loaded", int(pieces[:, 3].sum()) * dtype.itemsize)
                    counters.add("resident_bytes", read.nbytes - held)
                    held = read.nbytes
                    arrays, found = cuts.arrays(read, at, stop, packing)
                    if found:
                        raise packing.pad_error(table)
                    yield arrays, cuts.real[at:stop]
                    at = stop
                planned += count
        finally:
            counters.add("resident_bytes", -held)


def _read_pieces(
    file: Any, pieces: np.ndarray, blocks: int, size: int, dtype: np.dtype
) -> np.ndarray:
    """``blocks`` rows of ``size + 1`` tokens, each of ``pieces`` (block, where it lands,
    where it starts in the copy, tokens) read where it lands: positional reads, so no
    page of the copy is mapped into this process."""
    read = np.empty((blocks, size + 1), dtype)
    view = memoryview(read).cast("B")
    item, fd = dtype.itemsize, file.fileno()
    block, landed, source, length = pieces.T * item
    starts = (block * (size + 1) + landed).tolist()
    for at, count, offset in zip(starts, length.tolist(), source.tolist(), strict=True):
        if os.preadv(fd, [view[at : at + count]], offset) != count:
            raise RuntimeError(
                f"the local token copy {file.name} ended before token"
                f" {(offset + count) // item}: it was cut short while it was read; delete"
                " it and start again (it is written anew)"
            )
    return read


def _mapped(file: Any, dtype: np.dtype) -> np.ndarray:
    if not os.fstat(file.fileno()).st_size:
        return np.zeros(0, dtype)
    return np.frombuffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), dtype)


def _checked_sizes(tokens: Any, starts: Any, dtype: np.dtype, local: LocalTokens) -> None:
    """Raise unless the copy's files agree with each other and with its table version
    (a file cut short would be read past its end)."""
    starts_size = os.fstat(starts.fileno()).st_size
    rows = starts_size // 8 - 1
    whole = rows == local.rows and starts_size == 8 * (rows + 1)
    if whole:
        (last,) = np.frombuffer(os.pread(starts.fileno(), 8, starts_size - 8), np.int64)
        whole = os.fstat(tokens.fileno()).st_size == int(last) * dtype.itemsize
    if not whole:
        raise RuntimeError(
            f"the local token copy {local.tokens} (or its .starts) does not match its table"
            " version: it was cut short or changed; delete both files and start again"
            " (they are written anew)"
        )
