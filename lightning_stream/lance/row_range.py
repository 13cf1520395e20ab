"""Test and predict rows: each rank its contiguous part of a table, in storage order.

Evaluation needs every row exactly once and nothing resumable: no splits, no shuffle, no
padding. The selected rows (a filter over a table version) are numbered in storage
order and cut into ``world_size`` contiguous parts whose sizes differ by at most one
(``numpy.array_split``); each rank reads its part with one LanceDB query from its offset.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from lightning_stream.batching import Batch, batch_len, check_columnar, rechunk
from lightning_stream.lance.columns import ColumnarCollate, record_batch_rows
from lightning_stream.lance.source import TableOpener


def rank_rows(rows: int, rank: int, world_size: int) -> range:
    """The positions ``rank`` reads: its ``numpy.array_split`` part of ``range(rows)``."""
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


class RowRangeLoader:
    """Re-iterable loader of one rank's rows; ``len()`` is its number of batches.

    Reads in this process (no workers): evaluation reads each row once, in order.
    """

    def __init__(
        self,
        opener: TableOpener,
        *,
        filter: str | None,
        columns: list[str] | None,
        transform: Callable[[Batch], Batch] | None,
        positions: range,
        batch_size: int,
    ) -> None:
        self.opener = opener
        self.filter = filter
        self.columns = columns
        self.transform = transform
        self.positions = positions
        self.batch_size = batch_size

    def __len__(self) -> int:
        return math.ceil(len(self.positions) / self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        rows = len(self.positions)
        if not rows:
            return iter(())
        full, last = divmod(rows, self.batch_size)
        sizes = [self.batch_size] * full + ([last] if last else [])
        return self._batches(sizes)

    def _batches(self, sizes: list[int]) -> Iterator[Batch]:
        query = self.opener().search()
        if self.filter is not None:
            query = query.where(self.filter)
        if self.columns is not None:
            query = query.select(self.columns)
        query = query.offset(self.positions.start).limit(len(self.positions))
        collate = ColumnarCollate()
        chunks = (
            collate(record_batch_rows(record_batch))
            for record_batch in query.to_batches(self.batch_size)
            if record_batch.num_rows
        )
        for batch in rechunk(chunks, sizes):
            if self.transform is not None:
                rows = batch_len(batch)
                batch = self.transform(batch)
                check_columnar(batch, rows, "transform")
            yield batch
