"""A reader's documents in serving order, from its windows of table rows.

A window (:class:`TokenWindow`) holds the rows lance read for it, their tokens end to end
in storage order, and where each serving position's row is among them;
:class:`Documents` takes a batch's rows from them in serving order, each run of
consecutive storage rows as one slice, and :func:`with_ends` adds each document's
end-of-document token. (Blocks of the column's local copy are cut from it directly:
:mod:`lightning_stream.lance.copied`.)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lightning_stream.lance.reader import Window, runs
from lightning_stream.packing.option import TokenPacking


def with_ends(
    values: np.ndarray, lengths: np.ndarray, packing: TokenPacking, table: str
) -> tuple[np.ndarray, np.ndarray]:
    """Documents' tokens (``values``, of documents of ``lengths``) each followed by the
    end-of-document token, if any, and the position after each one's last token."""
    eos = packing.eos_id
    if np.count_nonzero(values == packing.pad_id):
        raise packing.pad_error(table)
    ends = np.cumsum(lengths)
    if eos is None:
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
