"""Which rows of a table each split, and each reader of a rank, holds in an epoch.

lancedb's ``StreamingDataset`` draws an epoch's splits (its permutation table, a function
of the table version, seed, epoch, clump size and filter), in the main process only: it
imports torch, and a draw costs about 0.1 s of CPU per 200k rows and 16 bytes a row,
which a rank spends once, not once per reading worker. A :class:`Drawer` draws them on a
thread, the next epoch's while this one is served; :class:`ReaderRows` takes one
reader's rows out of a draw.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
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
    :meth:`~lightning_stream.plan.RankEpochPlan.reader_order`), in its serving order, out
    of the epoch's split rows ``drawn`` (waited for when called: the 0-worker reading
    thread calls it when the job starts)."""

    drawn: Future
    plan: RankEpochPlan
    reader: int

    def __call__(self) -> np.ndarray:
        return rank_rows(self.drawn, self.plan)[self.plan.reader_order(self.reader)]


def rank_rows(drawn: Future, plan: RankEpochPlan) -> np.ndarray:
    """The rank's splits of ``plan`` out of the epoch's split rows ``drawn`` (waited for)."""
    return drawn.result()[plan.splits.start : plan.splits.stop]


class Drawer:
    """:func:`split_rows` drawn on a thread of this process, the latest draw kept under
    its key, so that an epoch's rows are drawn while the one before is served."""

    def __init__(self) -> None:
        self._threads: ThreadPoolExecutor | None = None
        self._latest: tuple[Any, Future] | None = None

    def draw(self, key: Any, table: Any, options: dict[str, Any]) -> Future:
        """``split_rows(table, **options)``: the kept draw if its key is ``key`` and it
        did not fail (a failed draw is drawn again, not raised again)."""
        if self._latest is None or self._latest[0] != key or failed(self._latest[1]):
            if self._threads is None:
                self._threads = ThreadPoolExecutor(1, thread_name_prefix="lance-draw")
            self._latest = (key, self._threads.submit(split_rows, table, **options))
        return self._latest[1]

    def close(self) -> None:
        """Forget the kept draw; a draw under way ends on its own."""
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
        self._threads = self._latest = None


def failed(future: Future) -> bool:
    """Whether ``future`` ended without a result (an error, or cancelled)."""
    return future.done() and (future.cancelled() or future.exception() is not None)
