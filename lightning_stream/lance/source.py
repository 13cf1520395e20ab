"""A LanceDB table as a stream source: one ``StreamingDataset`` per rank and epoch."""

from __future__ import annotations

import logging
import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import lancedb
from lancedb.streaming import StreamingDataLoader, StreamingDataset

from lightning_stream.batching import Batch
from lightning_stream.lance import _lancedb_fixes
from lightning_stream.lance.columns import ColumnarCollate, record_batch_rows
from lightning_stream.plan import RankEpochPlan
from lightning_stream.storage import storage_error

log = logging.getLogger(__name__)
_lancedb_fixes.apply()


@dataclass(frozen=True)
class TableOpener:
    """Picklable reopen of one table version, for DataLoader workers (spawn/forkserver)."""

    uri: str
    name: str
    version: int
    # credentials: out of repr (and so out of logs and errors)
    storage_options: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def __call__(self, name: str | None = None) -> Any:
        db = lancedb.connect(self.uri, storage_options=self.storage_options)
        table = db.open_table(name or self.name)
        table.checkout(self.version)
        return table


def open_table(
    uri: str, name: str, version: int | None, storage_options: dict[str, str] | None = None
) -> tuple[Any, TableOpener]:
    """Open ``name`` in the database at ``uri`` at ``version`` (``None``: the latest).

    An object store that cannot be reached raises
    :class:`~lightning_stream.storage.StorageError` naming ``uri`` and the option to set.
    """
    try:
        db = lancedb.connect(uri, storage_options=storage_options)
        table = db.open_table(name)
    except (ValueError, FileNotFoundError, OSError) as exc:
        if "was not found" not in str(exc):
            raise storage_error(uri, exc, storage_options) from None
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
    return table, TableOpener(uri, name, table.version, storage_options)


class LanceSource:
    """Rows of a LanceDB table, split into ``num_splits`` equal splits.

    A rank's epoch is served by one ``lancedb.streaming.StreamingDataset`` through
    ``StreamingDataLoader``. With several workers, the plan's head (the lagging rows after
    an elastic resume, then whole cycles up to the first batch) is read in this process
    first: lancedb starts several workers only from equal counts, and the workers start
    up while training runs on the first batch.
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
        shuffle_clump_size: int | None,
        columns: list[str] | None,
        filter: str | None,
        transform: Callable[[Batch], Batch] | None,
        pipeline: dict[str, int],
        multiprocessing_context: str,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.uri = uri
        self.name = table
        self.num_splits = num_splits
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.shuffle_clump_size = shuffle_clump_size
        self.columns = columns
        self.filter = filter
        self.pipeline = pipeline
        self.multiprocessing_context = multiprocessing_context
        self.collate = ColumnarCollate(transform)
        self.current: StreamingDataset | None = None
        self.storage_options = storage_options
        self._open(version)

    def _open(self, version: int | None) -> None:
        self.table, self.opener = open_table(self.uri, self.name, version, self.storage_options)
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
            "shuffle_clump_size": self.shuffle_clump_size,
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

    def dataset(
        self, epoch: int, rank: int, world_size: int, consumed: list[int] | None = None, **options
    ) -> StreamingDataset:
        """The epoch's dataset for ``rank``, from ``consumed`` rows per split if given."""
        shuffle = options.pop("shuffle", self.shuffle)
        dataset = StreamingDataset(
            self.table,
            num_splits=options.pop("num_splits", self.num_splits),
            shuffle=shuffle,
            shuffle_seed=self.shuffle_seed,
            shuffle_clump_size=self.shuffle_clump_size if shuffle else None,
            epoch=epoch,
            rank=rank,
            world_size=world_size,
            columns=self.columns,
            filter=options.pop("filter", self.filter),
            transform=record_batch_rows,
            connection_factory=self.opener,
            **{**self.pipeline, **options},
        )
        if consumed is not None:
            dataset.load_state_dict(
                {
                    "num_splits": self.num_splits,
                    "shuffle_seed": self.shuffle_seed,
                    "epoch": epoch,
                    "samples_consumed_per_split": consumed,
                }
            )
        return dataset

    def loader(self, dataset: StreamingDataset, batch_size: int, num_workers: int) -> Any:
        return StreamingDataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=num_workers,
            collate_fn=self.collate,
            multiprocessing_context=worker_context(self.multiprocessing_context)
            if num_workers
            else None,
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
        # With several workers, serve the plan's head here, with small reads: lancedb
        # starts them only from equal counts, and they start up while training runs on
        # the first batch.
        head = len(plan.head) if plan.num_workers > 1 else 0
        if head:
            per_split = -(-head // len(plan.splits))
            small = {"read_batch_size": per_split, "io_queue_depth": 1, "transform_queue_depth": 1}
            rows = iter(self.dataset(epoch, plan.rank, plan.world_size, consumed, **small))
            try:
                for start in range(0, head, plan.batch_size):
                    count = min(plan.batch_size, head - start)
                    yield self.collate([next(rows) for _ in range(count)])
            finally:
                rows.close()
            consumed = list(consumed)
            for split, count in zip(plan.splits, plan.counts_after(head), strict=True):
                consumed[split] = count
        dataset = self.current = self.dataset(epoch, plan.rank, plan.world_size, consumed)
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


def pipeline_options(
    read_ahead_rows: int, read_batch_size: int | None, splits_per_reader: int
) -> dict[str, int]:
    """lancedb pipeline settings that keep about ``read_ahead_rows`` rows requested.

    A reader (the main process, or each worker) serves ``splits_per_reader`` splits; each
    gets an equal share of the read-ahead, read in batches of up to 1,024 rows (lancedb's
    reads are CPU-bound and cost per call, so larger reads are much cheaper per row), with
    at most 4 reads in flight per split (lancedb's default). One transform thread: the
    transform only turns columns into numpy arrays, and on few cores more threads compete
    with the reads.
    """
    per_split = max(1, read_ahead_rows // splits_per_reader)
    batch = read_batch_size or min(1024, per_split)
    depth = min(4, max(1, per_split // batch))
    return {
        "read_batch_size": batch,
        "io_queue_depth": depth,
        "transform_queue_depth": depth,
        "transform_parallelism": 1,
    }


def worker_context(method: str) -> multiprocessing.context.BaseContext:
    """The workers' start method; a forkserver imports torch, numpy and pyarrow once.

    Workers forked from that server start without importing them again (about a second
    each on these machines). lancedb is not preloaded: it would then be forked after
    import, which lancedb calls experimental; each worker imports it itself.
    """
    context = multiprocessing.get_context(method)
    if method == "forkserver":
        context.set_forkserver_preload(["__main__", "torch", "numpy", "pyarrow"])
    return context


def count_rows(table: Any, filter: str | None, uri: str, name: str) -> int:
    """Rows of ``table`` that ``filter`` selects, with an error that names the filter."""
    try:
        return table.count_rows(filter)
    except Exception as exc:
        raise ValueError(
            f"filter={filter!r} cannot be applied to table {name!r} in {uri!r}: {exc}."
            ' Pass a SQL predicate over the table\'s columns, e.g. "label = 3"'
        ) from exc
