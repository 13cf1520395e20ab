"""A reader's documents in serving order: from its windows of table rows, or of the
token column's local copy.

Either source gives windows (:class:`TokenWindow`): rows' tokens end to end in storage
order (the rows lance read for the window, or the whole copy, mapped into memory) and
where each serving position's row is among them; :class:`Documents` takes a batch's rows
from them in serving order, each run of consecutive storage rows as one slice, and
:func:`with_ends` adds each document's end-of-document token.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lightning_stream.lance.reader import ReadCounters, RowOrder, Window, runs
from lightning_stream.lance.token_cache import LocalTokens
from lightning_stream.packing.option import TokenPacking

# Bytes of tokens a reader of a local copy maps at once: the pages it read stay resident
# until the next window maps the files anew.
COPY_WINDOW_BYTES = 8 * 2**20


def with_ends(
    values: np.ndarray, lengths: np.ndarray, packing: TokenPacking, table: str, ended: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Documents' tokens (``values``, of documents of ``lengths``) each followed by the
    end-of-document token, if any (``ended``: ``values`` hold them already), and the
    position after each one's last token."""
    pad, eos = packing.pad_id, packing.eos_id
    found = int(np.count_nonzero(values == pad))
    if ended and pad == eos:
        found -= len(lengths)
    if found:
        raise ValueError(
            f"TokenPacking(pad_id={pad}) is a token of a document of table {table!r}:"
            " padding would be indistinguishable from data; pass a pad_id that no"
            " document uses (eos_id may equal it)"
        )
    ends = np.cumsum(lengths)
    if ended or eos is None:
        return values, ends
    if values.dtype != np.int64 and eos > np.iinfo(values.dtype).max:
        values = values.astype(np.int64)
    return np.insert(values, ends, eos), ends + np.arange(1, len(ends) + 1)


@dataclass(frozen=True)
class TokenWindow:
    """Rows' tokens end to end in storage order (row ``i``'s are
    ``values[offsets[i]:offsets[i + 1]]``) and the row served at each serving position."""

    values: np.ndarray
    offsets: np.ndarray
    where: np.ndarray


def token_window(window: Window) -> TokenWindow:
    """The token column of a window of table rows (its one array: lance's batches
    joined, while the window's table is let go)."""
    rows = window.rows.column(0).combine_chunks()
    if rows.null_count:
        rows = pc.if_else(pc.is_null(rows), pa.scalar([], rows.type), rows)
    offsets = rows.offsets.to_numpy().astype(np.int64)
    return TokenWindow(rows.values.to_numpy(zero_copy_only=False), offsets, window.where)


def copy_windows(
    rows: RowOrder, local: LocalTokens, counters: ReadCounters, window_bytes: int
) -> Iterator[TokenWindow]:
    """The rows a reader serves, in windows of about ``window_bytes`` of tokens, from the
    column's :class:`LocalTokens` (each row with its end-of-document token), mapped into
    memory: nothing is read ahead of a batch, and each window maps the files anew, so
    that the pages read for the last one leave this process's resident memory when it
    is let go."""
    dtype = np.dtype(local.dtype)
    with open(local.tokens, "rb") as tokens, open(local.starts, "rb") as starts:
        table_rows = _checked_sizes(tokens, starts, dtype, local)
        row_bytes = max(1.0, os.fstat(tokens.fileno()).st_size / max(1, table_rows))
        window_rows = max(1, int(window_bytes // row_bytes))
        served = held = 0
        try:
            while served < len(rows):
                count = min(window_rows, len(rows) - served)
                wanted = rows(served, served + count)
                served += count
                offsets = _mapped(starts, np.dtype(np.int64))
                values = _mapped(tokens, dtype)
                size = int((offsets[wanted + 1] - offsets[wanted]).sum()) * dtype.itemsize
                counters.add("resident_bytes", size - held)
                held = size
                counters.add("rows_read", count)
                counters.add("bytes_loaded", size)
                yield TokenWindow(values, offsets, wanted)
        finally:
            counters.add("resident_bytes", -held)


def _mapped(file: Any, dtype: np.dtype) -> np.ndarray:
    if not os.fstat(file.fileno()).st_size:
        return np.zeros(0, dtype)
    return np.frombuffer(mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ), dtype)


def _checked_sizes(tokens: Any, starts: Any, dtype: np.dtype, local: LocalTokens) -> int:
    """The rows of the copy, once its files' sizes agree with each other and with its
    table version (a file cut short would be read past its end)."""
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
    return rows


class Documents:
    """The rows a reader serves, in serving order: their tokens end to end, taken a
    batch's rows at a time from its windows (rows in consecutive storage order as one
    slice), so nothing beyond a batch's rows is copied out of the windows."""

    def __init__(self, windows: Iterator[TokenWindow]) -> None:
        self.windows = windows
        self._window = TokenWindow(_NO_TOKENS, np.zeros(1, np.int64), _NO_TOKENS)
        self._row = 0  # the next serving position of the window

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``count`` rows' tokens, one after another, and each row's length."""
        tokens, lengths = [], []
        while count:
            window = self._window
            if self._row == len(window.where):
                self._window, self._row = next(self.windows), 0
                continue
            taken = min(count, len(window.where) - self._row)
            rows = window.where[self._row : self._row + taken]
            starts, stops = window.offsets[rows], window.offsets[rows + 1]
            firsts, ends = runs(rows)
            for low, high in zip(starts[firsts].tolist(), stops[ends - 1].tolist(), strict=True):
                tokens.append(window.values[low:high])
            lengths.append(stops - starts)
            self._row += taken
            count -= taken
        return _joined_pieces(tokens), _joined_pieces(lengths)

    def close(self) -> None:
        self.windows.close()


def _joined_pieces(pieces: list[np.ndarray]) -> np.ndarray:
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate(pieces) if pieces else _NO_TOKENS


_NO_TOKENS = np.zeros(0, dtype=np.int64)
