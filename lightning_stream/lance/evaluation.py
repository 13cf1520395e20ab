"""The loader of a LanceDataModule's validation, test and predict rows: every row once."""

from __future__ import annotations

from collections.abc import Iterator

from lightning_stream.batching import Batch
from lightning_stream.lance.order import StorageRows
from lightning_stream.lance.source import LanceSource
from lightning_stream.plan import BatchSizes


class EvaluationLoader:
    """Re-iterable validation, test or predict loader: the rows in storage order, each
    rank its own part; ``len()`` is its number of batches.

    The rows are cut into ``world_size`` contiguous parts (the first ones one row longer
    when they do not divide), so every row is read once, none twice. They are read in
    this process, with the reader's threads, whatever ``num_workers`` is.
    """

    def __init__(self, source: LanceSource, rank: int, world_size: int, batch_size: int) -> None:
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size

    @property
    def _rows(self) -> StorageRows:
        part, longer = divmod(self.source.rows, self.world_size)
        start = self.rank * part + min(self.rank, longer)
        return self.source.storage_rows(start, start + part + (self.rank < longer))

    def __len__(self) -> int:
        return -(-len(self._rows) // self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        rows = self._rows
        sizes = BatchSizes.cut(len(rows), self.batch_size)
        return self.source.read_here(rows, sizes)
