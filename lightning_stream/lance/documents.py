"""A reader's documents in serving order: from its windows of table rows, or of the
token column's local copy.

Either source gives windows of rows in storage order (:class:`TokenWindow`) and where each
serving position's row is among them; :class:`Documents` takes a batch's rows from them
in serving order, each run of consecutive storage rows as one slice, and
:func:`with_ends` adds each document's end-of-document token.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lightning_stream.lance.reader import ReadCounters, RowOrder, Window
from lightning_stream.lance.token_cache import LocalTokens
from lightning_stream.packing.option import TokenPacking

# Bytes of tokens a reader of a local copy reads at once (its rows sorted, so that a
# split's rows of several batches are one file read).
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


def _runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of consecutive storage offsets starts in ``rows``, and its end."""
    cuts = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1
    return np.append(0, cuts), np.append(cuts, len(rows))


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
    """The rows a reader serves, in windows of about ``window_bytes`` of tokens read from
    the column's :class:`LocalTokens` (each with its end-of-document token): a window's
    rows in storage order, each run of consecutive rows by one file read."""
    dtype = np.dtype(local.dtype)
    tokens, starts = os.open(local.tokens, os.O_RDONLY), os.open(local.starts, os.O_RDONLY)
    held = 0
    try:
        table_rows = max(1, os.fstat(starts).st_size // 8 - 1)
        row_bytes = max(1.0, os.fstat(tokens).st_size / table_rows)
        window_rows = max(1, int(window_bytes // row_bytes))
        served = 0
        while served < len(rows):
            count = min(window_rows, len(rows) - served)
            wanted = rows(served, served + count)
            served += count
            order = np.argsort(wanted, kind="stable")
            ascending = wanted[order]
            firsts, ends = _runs(ascending)
            # each run's row starts and its end, one run after another in ``bounds``
            sizes = ends - firsts + 1
            last = np.cumsum(sizes)
            bounds = np.empty(int(last[-1]), dtype=np.int64)
            runs = zip(ascending[firsts].tolist(), last.tolist(), sizes.tolist(), strict=True)
            for row, stop, size in runs:
                _read(starts, bounds[stop - size : stop], row, local)
            low, high = bounds[last - sizes], bounds[last - 1]
            values = np.empty(int((high - low).sum()), dtype=dtype)
            at = 0
            for begin, end in zip(low.tolist(), high.tolist(), strict=True):
                _read(tokens, values[at : at + end - begin], begin, local)
                at += end - begin
            lengths = np.delete(np.diff(bounds), last[:-1] - 1)
            where = np.empty(count, dtype=np.int64)
            where[order] = np.arange(count)
            counters.add("resident_bytes", values.nbytes - held)
            held = values.nbytes
            counters.add("rows_read", count)
            counters.add("bytes_loaded", values.nbytes)
            yield TokenWindow(values, np.append(0, np.cumsum(lengths)), where)
    finally:
        counters.add("resident_bytes", -held)
        os.close(tokens)
        os.close(starts)


def _read(fd: int, into: np.ndarray, first: int, local: LocalTokens) -> None:
    """Fill ``into`` from the file's values at ``first`` on."""
    wanted = into.nbytes
    if wanted and os.preadv(fd, [into], first * into.itemsize) != wanted:
        raise RuntimeError(
            f"the local token copy {local.tokens} (or its .starts) is shorter than its table"
            " version: it was cut short or changed; delete both files and start again"
            " (they are written anew)"
        )


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
            firsts, ends = _runs(rows)
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
