"""A LanceDB table as a stream source: one ``StreamingDataset`` per rank and epoch."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import lancedb
from lancedb.streaming import StreamingDataLoader, StreamingDataset

from lightning_stream.batching import Batch
from lightning_stream.lance.columns import ColumnarCollate, record_batch_rows
from lightning_stream.plan import RankEpochPlan

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TableOpener:
    """Picklable reopen of one table version, for DataLoader workers (spawn/forkserver)."""

    uri: str
    name: str
    version: int

    def __call__(self, name: str | None = None) -> Any:
        table = lancedb.connect(self.uri).open_table(name or self.name)
        table.checkout(self.version)
        return table


def open_table(uri: str, name: str, version: int | None) -> tuple[Any, TableOpener]:
    """Open ``name`` in the database at ``uri`` at ``version`` (``None``: the latest)."""
    db = lancedb.connect(uri)
    try:
        table = db.open_table(name)
    except (ValueError, FileNotFoundError) as exc:
        tables = list(db.table_names())
        raise ValueError(
            f"table={name!r} not found in uri={uri!r} (tables there: {tables}); pass the"
            " name of an existing table"
        ) from exc
    latest = table.version
    if version is not None:
        try:
            table.checkout(version)
        except Exception as exc:
            raise ValueError(
                f"version={version} of table {name!r} in {uri!r} cannot be opened (the"
                f" latest is {latest}; old versions are gone after table.cleanup_old_versions)"
            ) from exc
    else:
        table.checkout(latest)
    return table, TableOpener(uri, name, table.version)


class LanceSource:
    """Rows of a LanceDB table, split into ``num_splits`` equal splits.

    A rank's epoch is served by one ``lancedb.streaming.StreamingDataset``. When the
    rank's splits start from unequal counts (after an elastic resume) the lagging rows
    are read in this process first, since lancedb's loader starts workers only from
    equal counts; the rest goes through ``StreamingDataLoader`` and its workers.
    """

    def __init__(
        self,
        uri: str,
        table: str,
        *,
        version: int | None,
        num_splits: int,
        shuffle: bool,
        shuffle_seed: int,
        columns: list[str] | None,
        filter: str | None,
        transform: Callable[[Batch], Batch] | None,
        read_batch_size: int,
        multiprocessing_context: str,
    ) -> None:
        self.uri = uri
        self.name = table
        self.num_splits = num_splits
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.columns = columns
        self.filter = filter
        self.read_batch_size = read_batch_size
        self.multiprocessing_context = multiprocessing_context
        self.collate = ColumnarCollate(transform)
        self.current: StreamingDataset | None = None
        self._open(version)

    def _open(self, version: int | None) -> None:
        self.table, self.opener = open_table(self.uri, self.name, version)
        self.rows = count_rows(self.table, self.filter, self.uri, self.name)
        self.split_len = self.rows // self.num_splits

    @property
    def version(self) -> int:
        return self.opener.version

    @property
    def identity(self) -> dict[str, Any]:
        return {
            "source": "lance",
            "uri": self.uri,
            "table": self.name,
            "version": self.version,
            "num_splits": self.num_splits,
            "shuffle": self.shuffle,
            "shuffle_seed": self.shuffle_seed,
            "filter": self.filter,
            "columns": self.columns,
        }

    def pin(self, identity: dict[str, Any]) -> None:
        saved = identity["version"]
        if saved != self.version:
            log.info(
                "resuming on table %r version %d, the one the checkpoint read (opened: %d)",
                self.name,
                saved,
                self.version,
            )
            self._open(saved)

    def dataset(self, epoch: int, rank: int, world_size: int, **options: Any) -> StreamingDataset:
        return StreamingDataset(
            self.table,
            num_splits=options.pop("num_splits", self.num_splits),
            shuffle=options.pop("shuffle", self.shuffle),
            shuffle_seed=self.shuffle_seed,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            columns=self.columns,
            filter=options.pop("filter", self.filter),
            transform=record_batch_rows,
            read_batch_size=self.read_batch_size,
            connection_factory=self.opener,
            **options,
        )

    def loader(self, dataset: StreamingDataset, batch_size: int, num_workers: int) -> Any:
        return StreamingDataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=self.collate,
            multiprocessing_context=self.multiprocessing_context if num_workers else None,
        )

    def counters(self) -> dict[str, float]:
        dataset = self.current
        if dataset is None:
            return {}
        return {
            "bytes_loaded": dataset.bytes_loaded,
            "prefetched_rows": dataset.prefetch_queue_depth,
            "raw_rows": dataset.raw_queue_depth,
            "rows_skipped": dataset.rows_skipped,
        }

    def chunks(self, epoch: int, consumed: list[int], plan: RankEpochPlan) -> Iterator[Batch]:
        dataset = self.current = self.dataset(epoch, plan.rank, plan.world_size)
        dataset.load_state_dict(
            {
                "num_splits": self.num_splits,
                "shuffle_seed": self.shuffle_seed,
                "epoch": epoch,
                "samples_consumed_per_split": consumed,
            }
        )
        lagging = len(plan.catch_up)
        if lagging:
            rows = iter(dataset)
            try:
                for start in range(0, lagging, plan.batch_size):
                    count = min(plan.batch_size, lagging - start)
                    yield self.collate([next(rows) for _ in range(count)])
            finally:
                rows.close()
        try:
            yield from self.loader(dataset, plan.batch_size, plan.num_workers)
        except (RuntimeError, ConnectionError, EOFError) as exc:
            # A dead worker surfaces as torch's RuntimeError, or as a broken connection
            # when it dies while handing over a batch's shared memory.
            if not plan.num_workers or (
                isinstance(exc, RuntimeError) and "DataLoader worker" not in str(exc)
            ):
                raise
            raise RuntimeError(
                f"a DataLoader worker of rank {plan.rank} died while reading table"
                f" {self.name!r} ({exc}). Nothing after the last checkpoint is lost: resume"
                " with trainer.fit(..., ckpt_path=<last checkpoint>)"
            ) from exc


def count_rows(table: Any, filter: str | None, uri: str, name: str) -> int:
    """Rows of ``table`` that ``filter`` selects, with an error that names the filter."""
    try:
        return table.count_rows(filter)
    except Exception as exc:
        raise ValueError(
            f"filter={filter!r} cannot be applied to table {name!r} in {uri!r}: {exc}."
            ' Pass a SQL predicate over the table\'s columns, e.g. "label = 3"'
        ) from exc
