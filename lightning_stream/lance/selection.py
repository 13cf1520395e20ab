"""The rows a ``filter`` selects, found once per table version and kept as one bit a row.

A shuffled epoch is an order over the *selected* rows (``0 .. count``, see
:mod:`lightning_stream.lance.order`); a read needs their storage offsets. The filter is
evaluated once, by a scan of the columns it names (lance reads nothing else), into a
bitmap of the table's rows: 8 MB for 64M rows, whatever the filter selects. The ``k``-th
selected row is found through the count of selected rows before each block of
``BLOCK_ROWS`` rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow.compute as pc

BLOCK_ROWS = 2**16
_BLOCK_BYTES = BLOCK_ROWS // 8
_ONES = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).sum(axis=1)


@dataclass(frozen=True)
class Selection:
    """Bit ``r`` of ``bits`` (little bit order) says whether storage row ``r`` is selected."""

    bits: np.ndarray
    rows: int

    @cached_property
    def _before(self) -> np.ndarray:
        """Selected rows before each block (and in all, last)."""
        per_byte = np.zeros(-(-len(self.bits) // _BLOCK_BYTES) * _BLOCK_BYTES, np.int64)
        per_byte[: len(self.bits)] = _ONES[self.bits]
        return np.concatenate([[0], np.cumsum(per_byte.reshape(-1, _BLOCK_BYTES).sum(axis=1))])

    @property
    def count(self) -> int:
        """Rows selected."""
        return int(self._before[-1])

    def offsets(self, selected: np.ndarray) -> np.ndarray:
        """The storage offset of each ``selected``-th selected row."""
        selected = np.asarray(selected, dtype=np.int64)
        if not len(selected):
            return selected
        block = np.searchsorted(self._before, selected, side="right") - 1
        order = np.argsort(block, kind="stable")
        blocks, firsts = np.unique(block[order], return_index=True)
        offsets = np.empty_like(selected)
        for index, where in zip(blocks.tolist(), np.split(order, firsts[1:]), strict=True):
            start = index * _BLOCK_BYTES
            chosen = np.flatnonzero(
                np.unpackbits(self.bits[start : start + _BLOCK_BYTES], bitorder="little")
            )
            offsets[where] = index * BLOCK_ROWS + chosen[selected[where] - self._before[index]]
        return offsets


def select_rows(table: Any, filter: str) -> Selection:
    """Scan ``filter``'s columns of ``table`` (at its checked-out version) into a
    :class:`Selection`; a row where the filter is null is not selected."""
    rows = table.count_rows()
    bits = np.zeros(-(-rows // 8), dtype=np.uint8)
    done = 0
    carry = np.zeros(0, dtype=bool)
    batches = table.search().select({"selected": f"({filter})"}).to_batches(2**20)
    for batch in batches:
        keep = pc.fill_null(batch.column(0), False).to_numpy(zero_copy_only=False)
        keep = np.concatenate([carry, keep])
        whole = len(keep) // 8 * 8
        packed = np.packbits(keep[:whole], bitorder="little")
        bits[done // 8 : done // 8 + len(packed)] = packed
        done += whole
        carry = keep[whole:]
    if len(carry):
        bits[done // 8] = np.packbits(carry, bitorder="little")[0]
        done += len(carry)
    if done != rows:
        raise RuntimeError(f"the scan of filter {filter!r} gave {done} rows of {rows}")
    return Selection(bits, rows)
