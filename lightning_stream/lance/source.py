"""A LanceDB table as a stream source: our order over its clumps, read by a byte-bounded
reader."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lancedb
import pyarrow as pa

from lightning_stream.batching import Batch
from lightning_stream.lance.arrays import ColumnTypes
from lightning_stream.lance.columns import BatchMaker, to_batch
from lightning_stream.lance.order import (
    ReaderRows,
    StorageRows,
    TableOrder,
    clump_rows,
    pool_clumps,
)
from lightning_stream.lance.pace import LOCAL_PACE, REMOTE_PACE
from lightning_stream.lance.packed import PackJob, PackRows, TokenCounts
from lightning_stream.lance.reader import ReadCounters, TableOpener
from lightning_stream.lance.selection import Selection, select_rows
from lightning_stream.lance.task import ReadJob, ReadTask
from lightning_stream.lance.token_cache import LocalTokens, default_cache_dir, token_files
from lightning_stream.packing.layout import ReaderBlocks, TokenLayout
from lightning_stream.packing.option import TokenPacking
from lightning_stream.plan import BatchSizes, RankEpochPlan, ReaderOrder
from lightning_stream.serving import PoolSpec, ServingEngine
from lightning_stream.state import DEFAULT
from lightning_stream.storage import is_remote, storage_error
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

    Which rows form each split of an epoch, and the order a split serves them in, is
    :class:`~lightning_stream.lance.order.TableOrder`: arithmetic over clumps of the
    pinned table version's rows, computed by each reader a window at a time. The rows are
    served in the plan's order (see :mod:`lightning_stream.plan`) by a
    :class:`~lightning_stream.lance.reader.BudgetedReader` per reading process, which
    holds at most ``read_ahead_bytes`` (shared by the rank's workers) not yet handed out.

    Who reads, and when, is the rank's :class:`~lightning_stream.serving.ServingEngine`;
    this class is its format: a reader's job is a
    :class:`~lightning_stream.lance.task.ReadJob` (its rows in serving order), run by a
    :class:`~lightning_stream.lance.task.ReadTask`.
    """

    cumulative = ("bytes_loaded", "rows_read", "tokens", "padding_tokens")

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
        storage_options: dict[str, str] | None = None,
        pack: TokenPacking | None = None,
    ) -> None:
        self.uri, self.name, self.storage_options = uri, table, storage_options
        self.num_splits, self.shuffle, self.shuffle_seed = num_splits, shuffle, shuffle_seed
        self.requested_clump_size = shuffle_clump_size
        self.columns, self.filter, self.transform = columns, filter, transform
        self.read_ahead_bytes, self.pack = read_ahead_bytes, pack
        self.read_counters = ReadCounters()  # this process's reads
        self.pace = REMOTE_PACE if is_remote(uri) else LOCAL_PACE
        self._open(version)
        self.engine = ServingEngine(self)

    def _open(self, version: int | None) -> None:
        self.table, self.opener = open_table(self.uri, self.name, version, self.storage_options)
        names = self.table.schema.names
        unknown = [c for c in self.columns or () if c not in names]
        if unknown:
            raise ValueError(
                f"columns={self.columns!r}: {unknown} not in table {self.name!r} (its columns:"
                f" {names})"
            )
        self.selection = self._select()
        self.rows = self.selection.count if self.selection else self._count_rows()
        self.split_len = self.rows // self.num_splits
        # rows per clump (1: single rows) and clumps per pool, from this version's rows
        self.shuffle_clump_size = clump_rows(self.requested_clump_size, self.rows, self.num_splits)
        self.pool_size = pool_clumps(self.shuffle_clump_size, self._row_bytes())
        self.types = ColumnTypes.of_schema(self.table.schema, self.columns)
        self.tokens: TokenCounts | None = None
        self.local_tokens: LocalTokens | None = None
        if self.pack is not None:
            self._count_tokens(self.pack)

    def _count_tokens(self, pack: TokenPacking) -> None:
        """Blocks instead of rows: each split's ``split_len`` counts blocks."""
        pack.check_column(self.table.schema, self.name)
        cache = Path(pack.cache_dir) if pack.cache_dir else default_cache_dir()
        path, self.local_tokens = token_files(self.table, self.opener, pack, cache)
        clump = self.shuffle_clump_size
        self.tokens = TokenCounts(path, self.rows, clump, pack.eos_tokens, self.selection)
        self.split_len = self.token_layout(0).blocks
        self.types = ColumnTypes({}, frozenset())  # every array a tensor

    def _select(self) -> Selection | None:
        """The rows ``filter`` selects (one scan of its columns), or ``None``: all rows."""
        if self.filter is None:
            return None
        try:
            return select_rows(self.table, self.filter)
        except Exception as exc:
            if is_remote(self.uri) and not _names_the_query(exc):
                raise storage_error(self.uri, exc, self.storage_options) from None
            raise ValueError(
                f"filter={self.filter!r} cannot be applied to table {self.name!r} in"
                f" {self.uri!r}: {exc}. Pass a SQL predicate over the table's columns, e.g."
                ' "label = 3"'
            ) from exc

    def _row_bytes(self) -> float:
        """The table's bytes per row on storage (its manifest's figures: no data read)."""
        stats = self.table.stats()
        return stats["total_bytes"] / max(1, stats["num_rows"])

    def _count_rows(self) -> int:
        try:
            return self.table.count_rows()
        except Exception as exc:
            raise storage_error(self.uri, exc, self.storage_options) from None

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
            "filter": self.filter,
            "columns": self.columns,
            "pack": self.pack.identity if self.pack is not None else None,
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

    def epoch_order(self, epoch: int) -> TableOrder:
        """Which storage rows every split of ``epoch`` holds, in their serving order."""
        layout = (self.rows, self.num_splits, self.shuffle_clump_size)
        shuffle = (self.shuffle, self.shuffle_seed, epoch)
        return TableOrder(*layout, *shuffle, self.selection, self.pool_size)

    def token_layout(self, epoch: int, num_splits: int | None = None) -> TokenLayout:
        """The token stream of ``epoch`` (packing only), in ``num_splits`` splits (default:
        the source's)."""
        assert self.tokens is not None and self.pack is not None
        splits = num_splits or self.num_splits
        shuffle = (self.shuffle, self.shuffle_seed, epoch)
        return self.tokens.layout(splits, self.pack.block_size, *shuffle)

    @property
    def read_columns(self) -> list[str] | None:
        return [self.pack.column] if self.pack is not None else self.columns

    def storage_job(self, rank: int, world_size: int, batch_size: int) -> ReadJob | PackJob:
        """Rank ``rank``'s part of the rows in storage order, read in this process
        (validation, test, predict): ``world_size`` contiguous parts, every row once.
        Rows: the first parts one row longer when they do not divide. Packed: the token
        stream cut into ``world_size`` parts of the same number of blocks, the last
        one's end padded."""
        make = self.batch_maker()
        if self.pack is not None:
            layout = self.token_layout(0, world_size)
            zeros = (0,) * world_size
            plan = RankEpochPlan(zeros, layout.blocks, world_size, rank, 0, batch_size)
            order = ReaderOrder.of_worker(plan, 0)
            rows = PackRows(ReaderBlocks(layout, order), self.selection)
            return PackJob(
                rows, order.sizes, self.opener, self.pack, make.from_wire, self.local_tokens
            )
        part, longer = divmod(self.rows, world_size)
        start = rank * part + min(rank, longer)
        storage = StorageRows(self.selection, start, start + part + (rank < longer))
        return ReadJob(storage, BatchSizes.cut(len(storage), batch_size), self.opener, make)

    def read_here(self, job: ReadJob | PackJob) -> Iterator[Batch]:
        """``job`` read in this process, in order."""
        task, reader = self.reader_here()
        return task.run(reader, job)

    def batch_maker(self) -> BatchMaker:
        return BatchMaker(self.types, self.transform)

    def counters(self) -> dict[str, float]:
        """The readers' counters; ``tokens`` and ``padding_tokens`` (placed in blocks)
        when packing."""
        totals = self.engine.counters()
        if self.pack is None:
            for name in ("tokens", "padding_tokens"):
                totals.pop(name, None)
        return totals

    # -- the serving engine's format (lightning_stream.serving.SourceFormat) ----------
    @property
    def activity(self) -> str:
        return f"reading table {self.name!r}"

    def reader_here(self) -> tuple[ReadTask, Any]:
        task = ReadTask(self.opener, self.read_columns, self.read_ahead_bytes, self.pace)
        return task, task.reader_of(self.table, self.read_counters)

    def pool(self, workers: int, batch_size: int) -> PoolSpec:
        """Each worker's share of ``read_ahead_bytes`` goes three quarters to its reader
        and a quarter to its shared-memory slots (resident only once a batch was written
        there)."""
        share = self.read_ahead_bytes // workers
        slot_bytes = share // (4 * SLOTS)
        budget = share - SLOTS * slot_bytes
        imports = () if self.local_tokens is not None else ("lancedb",)
        task = ReadTask(self.opener, self.read_columns, budget, self.pace.for_workers(), imports)
        return PoolSpec(task, slot_bytes, "lance-reader")

    def job(self, epoch: int, order: ReaderOrder, pooled: bool) -> ReadJob | PackJob:
        if self.pack is not None:
            rows = PackRows(ReaderBlocks(self.token_layout(epoch), order), self.selection)
            make = self._block_maker(pooled)
            return PackJob(rows, order.sizes, self.opener, self.pack, make, self.local_tokens)
        rows = ReaderRows(self.epoch_order(epoch), order)
        return ReadJob(rows, order.sizes, self.opener, self._maker(pooled))

    def _block_maker(self, pooled: bool) -> Callable[[dict[str, Any]], Any] | None:
        """What a reader makes of a batch of blocks: as :meth:`_maker`, from its arrays."""
        if not pooled:
            return BatchMaker(self.types, None).from_wire
        return self.batch_maker().from_wire if self.transform is not None else None

    def _maker(self, pooled: bool) -> Callable[[pa.Table], Any]:
        """What a reader makes of its rows. A worker makes the batch and runs the
        transform, or without one makes the batch's arrays (its process imports no
        torch); the thread here makes the batch and leaves the transform to the main
        thread, so that its random draws and training_step's come from the same global
        generators, in batch order."""
        if not pooled:
            return BatchMaker(self.types, None)
        return self.batch_maker() if self.transform is not None else self.types.to_wire

    def finish(self, payload: Any, pooled: bool) -> Batch:
        if not pooled:
            return self.batch_maker().transformed(payload)
        return payload if self.transform is not None else to_batch(self.types, payload)

    def start_workers(self, workers: int) -> None:
        """Start the rank's reading processes now; they are kept for every epoch."""
        self.engine.start_pool(workers, 0)

    def stop_workers(self) -> None:
        self.engine.close()


def _names_the_query(exc: Exception) -> bool:
    """Whether lance refused the query itself (a column or a syntax it does not know)
    rather than failing to read the store."""
    text = str(exc).lower()
    return any(word in text for word in ("schema", "column", "sql", "parse", "field", "type"))
