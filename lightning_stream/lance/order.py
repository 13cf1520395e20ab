"""Which storage rows of a table each split holds in an epoch, in its serving order.

The selected rows (all of them, or those a ``filter`` selects: ``0 .. rows``, see
:mod:`lightning_stream.lance.selection`) form clumps of ``clump`` consecutive rows;
:mod:`lightning_stream.placement` puts the clumps in a seeded order per (seed, epoch),
lays them end to end and cuts them into the splits, and each split serves a pool of up
to ``POOL_CLUMPS`` clumps at a time (:func:`pool_clumps`). All of it is arithmetic: a
reader computes the rows of its next window of reads when it needs them, and nothing is
held per row of the table or of its share.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from lightning_stream.lance.selection import Selection
from lightning_stream.placement import ClumpLayout, SplitOrder, derive_key, epoch_permutation
from lightning_stream.plan import ReaderOrder

# Rows per clump at most: a clump is read in a few large range reads (on an object store
# about the table's bytes per epoch, where scattered rows fetch whole pages for each),
# and lance takes a storage run at less CPU a row than scattered rows.
CLUMP_ROWS = 4096
# Clumps per split at least, so that a small table is still shuffled (with one clump per
# split, a split would hold the same rows every epoch).
CLUMPS_PER_SPLIT = 4
# Clumps a split serves from at once, at most: a batch then mixes up to this many clumps
# per split it draws on, while every clump is still read front to back.
POOL_CLUMPS = 4
# Bytes of a split's pool at most: a reader that serves 64 splits then holds the pools of
# all of them within the default budget (``read_ahead_bytes``, 256 MiB). A pool of wide
# rows' clumps would cut a reader's runs to a few rows each, which lance reads at a
# higher cost per row, and the budget could not hold their reads.
POOL_BYTES = 4 * 2**20


def pool_clumps(clump: int, row_bytes: float) -> int:
    """Clumps a split serves from at once: as many of ``clump`` rows of ``row_bytes``
    (the table's bytes per row on storage, a property of its pinned version) as fit in
    ``POOL_BYTES``, from 1 to ``POOL_CLUMPS``."""
    return int(min(POOL_CLUMPS, max(1, POOL_BYTES // max(1.0, clump * row_bytes))))


def clump_rows(requested: int | None, rows: int, num_splits: int) -> int:
    """Rows per shuffled clump (``1``: single rows).

    ``requested`` is ``shuffle_clump_size``: ``None`` picks ``CLUMP_ROWS``, or fewer so
    that every split holds at least ``CLUMPS_PER_SPLIT`` clumps.
    """
    if requested is None:
        requested = min(CLUMP_ROWS, rows // (num_splits * CLUMPS_PER_SPLIT))
    return max(1, requested)


@dataclass(frozen=True)
class TableOrder:
    """The storage rows of every split of one epoch (see the module's docstring).

    Args:
        rows: selected rows of the pinned table version.
        num_splits: splits of the epoch.
        clump: rows per clump (1: single rows).
        shuffle: ``False`` lays the clumps in storage order, one after another.
        seed: the shuffle's seed.
        epoch: the epoch.
        selection: where the selected rows lie (``None``: every row is selected).
        pool_size: clumps a split serves from at once, shuffled (:func:`pool_clumps`).
    """

    rows: int
    num_splits: int
    clump: int
    shuffle: bool
    seed: int
    epoch: int
    selection: Selection | None = None
    pool_size: int = POOL_CLUMPS

    @property
    def split_len(self) -> int:
        return self.rows // self.num_splits

    @cached_property
    def layout(self) -> ClumpLayout:
        clumps = -(-self.rows // self.clump)
        order = epoch_permutation(clumps, self.seed, self.epoch, self.shuffle)
        return ClumpLayout(self.rows, self.clump, order)

    @property
    def pool(self) -> int:
        """Clumps a split serves from at once (one unshuffled, or of single rows)."""
        return self.pool_size if self.shuffle and self.clump > 1 else 1

    @cached_property
    def splits(self) -> SplitOrder:
        return SplitOrder(self.layout, self.split_len, self.pool, derive_key(self.seed, self.epoch))

    def offsets(self, split: np.ndarray | int, row: np.ndarray) -> np.ndarray:
        """Storage offsets of the rows at positions ``row`` of splits ``split``."""
        split = np.broadcast_to(np.asarray(split, dtype=np.int64), np.shape(row))
        clumps, within = self.splits.rows(split, row)
        return storage_offsets(self.selection, clumps * self.clump + within)


def storage_offsets(selection: Selection | None, selected: np.ndarray) -> np.ndarray:
    """The storage offset of each ``selected``-th selected row."""
    return selected if selection is None else selection.offsets(selected)


@dataclass(frozen=True)
class ReaderRows:
    """One reader's storage rows of an epoch, in its serving order, computed a window at
    a time: ``rows(start, stop)``. It serves from ``width`` clumps at once."""

    table: TableOrder
    order: ReaderOrder

    @property
    def width(self) -> int:
        return max(1, len(self.order.splits)) * self.table.pool

    @property
    def run_rows(self) -> int:
        return self.table.clump

    def __len__(self) -> int:
        return len(self.order)

    def __call__(self, start: int, stop: int) -> np.ndarray:
        return self.table.offsets(*self.order.positions(start, stop))


@dataclass(frozen=True)
class StorageRows:
    """Selected rows ``[start, stop)`` in storage order (validation, test, predict)."""

    selection: Selection | None
    start: int
    stop: int
    width = 1

    @property
    def run_rows(self) -> int:
        return len(self)

    def __len__(self) -> int:
        return self.stop - self.start

    def __call__(self, start: int, stop: int) -> np.ndarray:
        return storage_offsets(self.selection, np.arange(self.start + start, self.start + stop))
