"""Which rows of a table each split, and each reader of a rank, holds in an epoch.

lancedb's ``StreamingDataset`` draws an epoch's splits (its permutation table, a function
of the table version, seed, epoch, clump size and filter), in the main process only: it
imports torch, and a draw costs about 0.1 s of CPU and 16 bytes per row, which a rank
spends once, not once per reading worker. :class:`ReaderRows` names the one reader's rows
at ``num_workers=0`` so that its reading thread draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from lancedb.streaming import StreamingDataset

from lightning_stream.plan import RankEpochPlan


def split_rows(table: Any, *, split_len: int, **options: Any) -> np.ndarray:
    """Row ids of every split, ``[num_splits, split_len]``, in split order.

    ``options`` are ``StreamingDataset``'s (``num_splits``, ``shuffle``, ``shuffle_seed``,
    ``shuffle_clump_size``, ``epoch``, ``filter``). A split's rows beyond ``split_len`` are
    the epoch's surplus: lancedb's loader ends an epoch at the last complete round of its
    splits, which never reaches them.
    """
    # Only this dataset's permutation table is used: lancedb's own split assignment,
    # built once in its constructor.
    splits = StreamingDataset(table, rank=0, world_size=1, **options)._perm_table.to_arrow()
    split_ids = splits.column("split_id").to_numpy()
    row_ids = splits.column("row_id").to_numpy().astype(np.int64)
    order = np.argsort(split_ids, kind="stable")
    split_ids, row_ids = split_ids[order], row_ids[order]
    starts = np.searchsorted(split_ids, np.arange(options["num_splits"]))
    return np.stack([row_ids[start : start + split_len] for start in starts])


def count_rows(table: Any, filter: str | None, uri: str, name: str) -> int:
    """Rows of ``table`` that ``filter`` selects, with an error that names the filter."""
    try:
        return table.count_rows(filter)
    except Exception as exc:
        raise ValueError(
            f"filter={filter!r} cannot be applied to table {name!r} in {uri!r}: {exc}."
            ' Pass a SQL predicate over the table\'s columns, e.g. "label = 3"'
        ) from exc


@dataclass(frozen=True)
class ReaderRows:
    """Reader ``reader``'s rows of ``plan`` (see
    :meth:`~lightning_stream.plan.RankEpochPlan.reader_order`), in its serving order,
    drawn from the epoch's splits (``options``: :func:`split_rows`'s) of the table it is
    called with."""

    options: dict[str, Any]
    plan: RankEpochPlan
    reader: int

    def __call__(self, table: Any) -> np.ndarray:
        rows = split_rows(table, **self.options)[self.plan.splits.start : self.plan.splits.stop]
        return rows[self.plan.reader_order(self.reader)]

    def count(self) -> int:
        """How many rows :meth:`__call__` returns (without drawing them)."""
        return len(self.plan.reader_order(self.reader)[0])
