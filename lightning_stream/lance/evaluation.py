"""The loader of a LanceDataModule's validation, test and predict rows: every row once."""

from __future__ import annotations

from collections.abc import Iterator

from lightning_stream.batching import Batch
from lightning_stream.lance.source import LanceSource


class EvaluationLoader:
    """Re-iterable validation, test or predict loader: the rows in storage order, each
    rank its own part (:meth:`LanceSource.storage_job
    <lightning_stream.lance.source.LanceSource.storage_job>`); ``len()`` is its number of
    batches. They are read in this process, with the reader's threads, whatever
    ``num_workers`` is.
    """

    def __init__(self, source: LanceSource, rank: int, world_size: int, batch_size: int) -> None:
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size

    def __len__(self) -> int:
        return len(self.source.storage_job(self.rank, self.world_size, self.batch_size).sizes)

    def __iter__(self) -> Iterator[Batch]:
        job = self.source.storage_job(self.rank, self.world_size, self.batch_size)
        return self.source.read_here(job)
