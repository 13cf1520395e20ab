"""A LanceDB table as a stream source: lancedb's splits, read by a byte-bounded reader."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import lancedb
import numpy as np
import pyarrow as pa

from lightning_stream.batching import Batch
from lightning_stream.lance.columns import BatchMaker, ColumnTypes
from lightning_stream.lance.order import CLUMPS_PER_SPLIT, clump_rows
from lightning_stream.lance.pace import LOCAL_PACE, REMOTE_PACE
from lightning_stream.lance.reader import ReadCounters, TableOpener
from lightning_stream.lance.splits import (
    Drawer,
    ReaderRows,
    count_rows,
    failed,
    rank_rows,
    split_rows,
)
from lightning_stream.lance.task import ReadJob, ReadTask, cut
from lightning_stream.plan import RankEpochPlan
from lightning_stream.state import DEFAULT
from lightning_stream.storage import is_remote, storage_error
from lightning_stream.workers.inline import InlineReader
from lightning_stream.workers.pool import WorkerDied, WorkerPool
from lightning_stream.workers.slots import SLOTS

log = logging.getLogger(__name__)


def open_table(
    uri: str, name: str, version: int | None, storage_options: dict[str, str] | None = None
) -> tuple[Any, TableOpener]:
    """Open ``name`` in the database at ``uri`` at ``version`` (``None``: the latest).

    An object store that cannot be reached raises
    :class:`~lightning_stream.storage.StorageError` naming ``uri`` and the option to set.
    """
    if "://" not in uri and not os.path.isdir(uri):
        # lancedb.connect would create an empty database there
        raise ValueError(
            f"uri={uri!r} does not exist; pass the directory of an existing LanceDB"
            " database (nothing was created)"
        )
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

    ``lancedb.streaming.StreamingDataset`` decides which rows form each split of an epoch
    (its permutation table); the rows are then read in the plan's order (the order of
    lancedb's own loader, see :mod:`lightning_stream.plan`) by a
    :class:`~lightning_stream.lance.reader.BudgetedReader` per reading process, which
    holds at most ``read_ahead_bytes`` (shared by the rank's workers) not yet handed out.

    With workers, each one reads its block of splits (a
    :class:`~lightning_stream.lance.task.ReadTask` in a
    :class:`~lightning_stream.workers.pool.WorkerPool`); with several, the plan's head
    (the lagging rows after an elastic resume) is read in this process first.
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
        read_ahead_bytes: int,
        num_workers: int,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.uri = uri
        self.name = table
        self.num_splits = num_splits
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.requested_clump_size = shuffle_clump_size
        self.columns = columns
        self.filter = filter
        self.transform = transform
        self.read_ahead_bytes = read_ahead_bytes
        self.read_counters = ReadCounters(1 + num_workers)
        self.storage_options = storage_options
        self.pace = REMOTE_PACE if is_remote(uri) else LOCAL_PACE
        self.pool: WorkerPool | None = None
        self.inline: InlineReader | None = None  # num_workers=0: the reader's thread
        self.drawer = Drawer()  # the epochs' split rows
        self._open(version)

    def _open(self, version: int | None) -> None:
        self.table, self.opener = open_table(self.uri, self.name, version, self.storage_options)
        self.rows = count_rows(self.table, self.filter, self.uri, self.name)
        self.split_len = self.rows // self.num_splits
        # rows per clump (None: single rows), from the rows of this version
        self.shuffle_clump_size = clump_rows(self.requested_clump_size, self.rows, self.num_splits)
        names = self.table.schema.names
        unknown = [c for c in self.columns or () if c not in names]
        if unknown:
            raise ValueError(
                f"columns={self.columns!r}: {unknown} not in table {self.name!r} (its columns:"
                f" {names})"
            )
        self.types = ColumnTypes.of_table(self.table, self.columns)

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
            # the clump size follows from the pinned version's rows; unshuffled, none
            "shuffle_clump_size": (self.requested_clump_size or DEFAULT) if self.shuffle else None,
            # the default clump's rule (saved_identity reads checkpoints without it)
            **({"clumps_per_split": CLUMPS_PER_SPLIT} if self.default_clumps else {}),
            "filter": self.filter,
            "columns": self.columns,
        }

    # the default clump's size follows from the pinned version's rows
    pinned_settings = ("shuffle_clump_size", "clumps_per_split")

    @property
    def default_clumps(self) -> bool:
        return self.shuffle and self.requested_clump_size is None

    def saved_identity(self, identity: dict[str, Any]) -> dict[str, Any]:
        # lightning-stream 0.1 recorded None for its default, single rows (CHANGELOG)
        if identity.get("shuffle") and identity.get("shuffle_clump_size", DEFAULT) is None:
            return {**identity, "shuffle_clump_size": 1}
        if identity.get("shuffle") and identity.get("shuffle_clump_size") == DEFAULT:
            # checkpoints that do not record the rule left 8 clumps per split: the same
            # rows on a large table; on a smaller one the clump size it meant, written out
            then = identity.get("clumps_per_split", 8)
            rows = clump_rows(None, self.rows, self.num_splits, then)
            now = clump_rows(None, self.rows, self.num_splits)
            written = {"shuffle_clump_size": rows or 1} if rows != now else {}
            return {**identity, "clumps_per_split": CLUMPS_PER_SPLIT, **written}
        return identity

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

    def split_rows(self, epoch: int) -> np.ndarray:
        """Row ids of every split of ``epoch``, ``[num_splits, split_len]``, in split order:
        the draw the readers take their rows from (:meth:`_draw`)."""
        return self._draw(epoch).result()

    def _split_options(self, epoch: int) -> dict[str, Any]:
        return {
            "num_splits": self.num_splits,
            "shuffle": self.shuffle,
            "shuffle_seed": self.shuffle_seed,
            "shuffle_clump_size": self.shuffle_clump_size if self.shuffle else None,
            "epoch": epoch,
            "filter": self.filter,
            "split_len": self.split_len,
        }

    def storage_rows(self) -> np.ndarray:
        """Row ids of every row ``filter`` selects, in storage order."""
        return split_rows(
            self.table,
            num_splits=1,
            shuffle=False,
            filter=self.filter,
            split_len=self.rows,
        )[0]

    def read_here(self, row_ids: np.ndarray, sizes: list[int]) -> Iterator[Any]:
        """``row_ids`` read in this process, in order, as Arrow tables of ``sizes`` rows."""
        task = ReadTask(self.opener, self.columns, self.read_ahead_bytes, self.pace)
        reader = task.reader_of(self.table, self.read_counters, 0)
        return task.run(reader, ReadJob(row_ids, sizes, self.opener))

    def batch_maker(self) -> BatchMaker:
        return BatchMaker(self.types, self.transform)

    def counters(self) -> dict[str, float]:
        self._take_worker_counters()
        return self.read_counters.totals()

    def _take_worker_counters(self) -> None:
        """The workers' counters as of their last batch, into their rows of the totals."""
        for worker, counters in enumerate(self.pool.counters if self.pool is not None else ()):
            if counters is not None:
                self.read_counters.values[worker + 1] = counters

    def chunks(
        self,
        epoch: int,
        consumed: list[int],
        plan: RankEpochPlan,
        upcoming: tuple[int, RankEpochPlan] | None = None,
    ) -> Iterator[Batch]:
        make = self.batch_maker()
        if plan.num_workers == 0:
            # the transform runs here, in batch order: its random draws and training_step's
            # come from the same global generators
            key, job = self._inline_job(epoch, plan)
            after = upcoming and self._inline_job(*upcoming)
            yield from self._inline().serve(key, job, make.transformed, after)
            return
        pool = self.start_workers(plan.num_workers)
        drawn = self._draw(epoch)
        following = upcoming and self._draw(upcoming[0])
        if plan.num_workers > 1:
            rows = rank_rows(drawn, plan)
            splits, positions = plan.head_order()
            for table in self.read_here(rows[splits, positions], cut(len(splits), plan.batch_size)):
                pool.ready()  # a worker that failed to start says so now
                yield make(table)
        try:
            jobs = self._worker_jobs(epoch, plan, drawn)
            for batch in pool.serve(*jobs, lambda sent: _made(sent, make)):
                yield batch
                if following and following.done():
                    if not failed(following):  # begun once this one is read
                        pool.queue(*self._worker_jobs(*upcoming, following))
                    following = None
        except WorkerDied as exc:
            self.stop_workers()
            raise RuntimeError(
                f"a reading worker of rank {plan.rank} died while reading table"
                f" {self.name!r} ({exc}). Nothing after the last checkpoint is lost: resume"
                " with trainer.fit(..., ckpt_path=<last checkpoint>)"
            ) from exc
        finally:
            self._take_worker_counters()

    def _draw(self, epoch: int) -> Future:
        """The split rows of ``epoch``, drawn on the drawer's thread (once): the next
        epoch's while this one is served."""
        return self.drawer.draw((self.version, epoch), self.table, self._split_options(epoch))

    def _worker_jobs(
        self, epoch: int, plan: RankEpochPlan, drawn: Future
    ) -> tuple[tuple, list[ReadJob]]:
        """The key of ``epoch`` under ``plan`` and each worker's job, from its draw."""
        # without a transform the main process makes every batch from the Arrow rows
        make = self.batch_maker() if self.transform is not None else None
        jobs = []
        for worker in range(plan.num_workers):
            served = ReaderRows(drawn, plan, worker)()
            jobs.append(ReadJob(served, cut(len(served), plan.batch_size), self.opener, make))
        return (self.version, epoch, plan), jobs

    def _inline_job(self, epoch: int, plan: RankEpochPlan) -> tuple[tuple, ReadJob]:
        """The key and job of ``epoch`` under ``plan`` at 0 workers: its rows taken from
        their draw when the reading thread starts it, its batches made there without the
        transform."""
        rows = ReaderRows(self._draw(epoch), plan, 0)
        job = ReadJob(rows, plan.sizes, self.opener, BatchMaker(self.types, None))
        return (self.version, epoch, plan), job

    def _inline(self) -> InlineReader:
        """``num_workers=0``: a thread of this process that reads and makes the batches
        ``depth`` ahead of training_step (lance, numpy and the copies release the GIL) and
        begins the epoch that probably follows once this one is read."""
        if self.inline is None:
            task = ReadTask(self.opener, self.columns, self.read_ahead_bytes, self.pace)
            state = task.reader_of(self.table, self.read_counters, 0)
            self.inline = InlineReader(task, state)
        return self.inline

    def start_workers(self, workers: int) -> WorkerPool:
        """The rank's reading processes, started once and kept for every epoch.

        Each worker's share of ``read_ahead_bytes`` goes three quarters to its reader and a
        quarter to its shared-memory slots (resident only once a batch was written there).
        """
        if self.pool is None or self.pool.workers != workers:
            self.stop_workers()
            share = self.read_ahead_bytes // workers
            slot_bytes = share // (4 * SLOTS)
            budget = share - SLOTS * slot_bytes
            task = ReadTask(self.opener, self.columns, budget, self.pace.for_workers())
            self.pool = WorkerPool(task, workers, slot_bytes, name="lance-reader")
        return self.pool

    def stop_workers(self) -> None:
        if self.inline is not None:
            inline, self.inline = self.inline, None
            inline.close()
        if self.pool is not None:
            pool, self.pool = self.pool, None
            pool.close()
        self.drawer.close()


def _made(sent: Any, make: BatchMaker) -> Batch:
    """A worker's payload as a batch: its Arrow rows converted here, or the batch its
    ``transform`` made."""
    return make(sent) if isinstance(sent, pa.Table) else sent
