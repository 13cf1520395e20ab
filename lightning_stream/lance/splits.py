"""Which rows of a table each split, and each reader of a rank, holds in an epoch.

lancedb draws an epoch's splits: its permutation builder, called as
``lancedb.streaming.StreamingDataset`` calls it (a function of the table version, seed,
epoch, clump size and filter). Not through ``StreamingDataset`` itself, which imports
torch: a reading worker draws its rows too and imports no torch (seconds of CPU at its
start). ``tests/test_lancedb_drift.py`` checks both against lancedb's own loader.

:class:`ReaderRows` names one reader's rows of a rank's plan so that they are drawn where
they are read: in a reading worker, or on the main process's reading thread. Drawing
costs about 0.1 s per 200k rows; drawn there, the next epoch's rows are drawn while this
one is still being trained on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from lancedb.permutation import permutation_builder

from lightning_stream.plan import RankEpochPlan

# lancedb.streaming's ``_EPOCH_PRIME``: an epoch's permutation seed is
# ``shuffle_seed + epoch * EPOCH_PRIME``
EPOCH_PRIME = 100_003


def split_rows(
    table: Any,
    *,
    num_splits: int,
    split_len: int,
    epoch: int = 0,
    shuffle: bool = False,
    shuffle_seed: int = 0,
    shuffle_clump_size: int | None = None,
    filter: str | None = None,
) -> np.ndarray:
    """Row ids of every split of ``epoch``, ``[num_splits, split_len]``, in split order.

    The arguments are ``StreamingDataset``'s. A split's rows beyond ``split_len`` are the
    epoch's surplus: lancedb's loader ends an epoch at the last complete round of its
    splits, which never reaches them.
    """
    builder = permutation_builder(table)
    if filter is not None:
        builder = builder.filter(filter)
    if shuffle:
        seed = shuffle_seed + epoch * EPOCH_PRIME
        builder = builder.split_random(fixed=num_splits, seed=seed, clump_size=shuffle_clump_size)
    else:
        builder = builder.split_sequential(fixed=num_splits)
    splits = builder.execute().to_arrow()
    split_ids = splits.column("split_id").to_numpy()
    row_ids = splits.column("row_id").to_numpy().astype(np.int64)
    order = np.argsort(split_ids, kind="stable")
    split_ids, row_ids = split_ids[order], row_ids[order]
    starts = np.searchsorted(split_ids, np.arange(num_splits))
    return np.stack([row_ids[start : start + split_len] for start in starts])


@dataclass(frozen=True)
class ReaderRows:
    """Reader ``reader``'s rows of ``plan`` (see
    :meth:`~lightning_stream.plan.RankEpochPlan.reader_order`), in its serving order,
    drawn from the epoch's splits (``options``: :func:`split_rows`'s) of the table it is
    called with. Picklable."""

    options: dict[str, Any]
    plan: RankEpochPlan
    reader: int

    def __call__(self, table: Any) -> np.ndarray:
        rows = split_rows(table, **self.options)[self.plan.splits.start : self.plan.splits.stop]
        return rows[self.plan.reader_order(self.reader)]

    def count(self) -> int:
        """How many rows :meth:`__call__` returns (without drawing them)."""
        return len(self.plan.reader_order(self.reader)[0])
