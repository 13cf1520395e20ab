"""LanceDataModule: a LanceDB table streamed into ``Trainer.fit``, exactly resumable."""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from lightning_stream.batching import Batch
from lightning_stream.datamodule import StreamingDataModule
from lightning_stream.lance.row_range import RowRangeLoader, rank_rows
from lightning_stream.lance.source import LanceSource, count_rows, open_table, pipeline_options
from lightning_stream.plan import check_topology

log = logging.getLogger(__name__)


class LanceDataModule(StreamingDataModule):
    """Streams a LanceDB table, shuffled per epoch, with exact elastic resume.

    Each rank reads its block of ``num_splits`` fixed splits through a
    ``lancedb.streaming.StreamingDataset`` built for the epoch, served by
    ``StreamingDataLoader``. With :class:`~lightning_stream.StreamStateCallback` (added
    to the trainer automatically) a checkpoint at any step resumes on any world size and
    worker count for which ``num_splits`` divides, and every row of an epoch reaches
    ``training_step`` exactly once.

    A batch is a dict: numeric and fixed-size-list columns without nulls become tensors
    stacked along dim 0, any other column a list of Python values.

    Args:
        uri: LanceDB database URI (a directory, or any URI ``lancedb.connect`` takes).
        table: name of the table to train on.
        num_splits: number of fixed splits of each epoch. Decides which rows form each
            global batch, so keep it for the life of a run; it must be divisible by
            ``world_size * max(1, num_workers)`` of every topology you resume on (pick a
            highly composite number, e.g. 48 or 240). ``rows % num_splits`` surplus rows
            are left out of each epoch (logged at setup).
        batch_size: rows per batch per process; the global batch is
            ``batch_size * world_size``. For the same global batches on every topology make
            the global batch a multiple of ``num_splits`` (a warning says when it is not).
        num_workers: DataLoader worker processes per rank; default 0 (main process).
        shuffle: shuffle rows into splits, anew each epoch; default ``True``. ``False``
            cuts the table into splits in storage order.
        shuffle_seed: base seed of the shuffle, combined with the epoch; default 0. A
            resume must use the same seed.
        shuffle_clump_size: shuffle blocks of this many rows that stay together (read in
            storage order) instead of single rows; default ``None`` (rows). Faster reads,
            less mixed batches: see the README's figures. A resume must use the same value.
        columns: columns to read; default ``None`` reads all.
        filter: SQL predicate selecting the training rows; default ``None`` (all rows).
        transform: callable applied to each collated batch (a dict) in the worker; it
            must return a dict with one entry per sample along dim 0 of every column
            (batches are cut at sample boundaries after an elastic resume) and be
            picklable (module level) when ``num_workers > 0``. Default ``None``.
        val_filter: SQL predicate selecting validation rows of ``table``; keep it disjoint
            from ``filter``. Default ``None``.
        val_table: name of a separate validation table in ``uri``; default ``None``.
            Validation is read in storage order, each rank its own contiguous part, no row
            twice; up to ``world_size * max(1, num_workers) - 1`` surplus rows are left out.
            Without either, a trainer that runs validation gets a warning and none.
        test_filter: SQL predicate selecting the rows of ``table`` (at ``version``) that
            ``trainer.test(datamodule=dm)`` reads; default ``None``.
        test_table: name of a separate test table in ``uri``; default ``None``. Test and
            predict rows are read in storage order, each rank a contiguous part (sizes
            differ by at most one row, so ranks can take one batch more or fewer), every
            row exactly once, none left out, none padded; read in the main process.
        predict_filter: SQL predicate selecting the rows of ``table`` that
            ``trainer.predict(datamodule=dm)`` reads; default ``None``: the training rows
            (``filter``), unless ``predict_table`` is given.
        predict_table: name of a separate table to predict on; default ``None``.
        version: table version to train on; default ``None`` pins the latest version at
            setup. A resume always reads the version the checkpoint recorded.
        read_ahead_rows: rows each reading process (the main process, or each worker)
            keeps requested from LanceDB ahead of training, shared by its splits; default
            32768. Sets lancedb's read batch size (up to 1,024 rows) and reads in flight per
            split. It bounds the requests in flight, not lancedb's queues behind them: with
            training slower than the reads, lancedb 0.40 keeps reading ahead (README).
        read_batch_size: rows per LanceDB read per split; default ``None`` derives it from
            ``read_ahead_rows``.
        multiprocessing_context: start method of the workers, ``"forkserver"`` (default;
            workers start about a quarter faster than with spawn here) or ``"spawn"``.
            ``"fork"`` is refused: lancedb crashes in forked workers.
    """

    def __init__(
        self,
        uri: str,
        table: str,
        *,
        num_splits: int,
        batch_size: int,
        num_workers: int = 0,
        shuffle: bool = True,
        shuffle_seed: int = 0,
        columns: list[str] | None = None,
        filter: str | None = None,
        transform: Callable[[Batch], Batch] | None = None,
        val_filter: str | None = None,
        val_table: str | None = None,
        version: int | None = None,
        test_filter: str | None = None,
        test_table: str | None = None,
        predict_filter: str | None = None,
        predict_table: str | None = None,
        shuffle_clump_size: int | None = None,
        read_ahead_rows: int = 32768,
        read_batch_size: int | None = None,
        multiprocessing_context: str = "forkserver",
    ) -> None:
        super().__init__()
        _check_positive(num_splits=num_splits, batch_size=batch_size)
        _check_positive(read_ahead_rows=read_ahead_rows)
        if read_batch_size is not None:
            _check_positive(read_batch_size=read_batch_size)
        if shuffle_clump_size is not None:
            _check_positive(shuffle_clump_size=shuffle_clump_size)
        if num_workers < 0:
            raise ValueError(f"num_workers must be 0 or more, got {num_workers}")
        if multiprocessing_context not in ("spawn", "forkserver"):
            raise ValueError(
                f"multiprocessing_context={multiprocessing_context!r}: use 'spawn' or"
                " 'forkserver' (lancedb crashes in workers started with 'fork')"
            )
        for stage, given in (
            ("val", (val_filter, val_table)),
            ("test", (test_filter, test_table)),
            ("predict", (predict_filter, predict_table)),
        ):
            if None not in given:
                raise ValueError(f"pass {stage}_filter or {stage}_table, not both")
        self.uri = _normalise_uri(uri)
        self.table = table
        self.num_splits = num_splits
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.shuffle = shuffle
        self.shuffle_seed = shuffle_seed
        self.columns = columns
        self.filter = filter
        self.transform = transform
        self.val_filter = val_filter
        self.val_table = val_table
        self.version = version
        self.test_filter = test_filter
        self.test_table = test_table
        self.predict_filter = predict_filter
        self.predict_table = predict_table
        self.shuffle_clump_size = shuffle_clump_size
        self.read_ahead_rows = read_ahead_rows
        self.read_batch_size = read_batch_size
        self.multiprocessing_context = multiprocessing_context
        self._val: LanceSource | None = None
        self._evaluation: dict[str, tuple[Any, str | None, int]] = {}

    def setup(self, stage: str) -> None:
        _, world_size = self._rank_and_world()
        check_topology(self.num_splits, world_size, self.num_workers)
        if stage == "fit":
            readers = self.num_splits // world_size // max(1, self.num_workers)
            source = self._source(self.table, self.filter, self.shuffle, self.version, readers)
            self._check_rows(source, "filter", self.filter)
            self._start_stream(source, self.num_workers)
            self._report_layout(source, world_size)
        if stage in ("fit", "validate") and (self.val_filter or self.val_table):
            name = self.val_table or self.table
            self._val = self._source(name, self.val_filter, False, None, 1)
            self._check_rows(self._val, "val_filter", self.val_filter, world_size)
        for evaluation in ("test", "predict"):
            if stage == evaluation:  # stage may be Lightning's TrainerFn, a str enum
                self._evaluation[evaluation] = self._evaluation_rows(evaluation)

    def _evaluation_rows(self, stage: str) -> tuple[Any, str | None, int]:
        """The table, filter and row count that ``trainer.test`` / ``predict`` read."""
        table_name = getattr(self, f"{stage}_table")
        filter = getattr(self, f"{stage}_filter")
        if stage == "test" and table_name is None and filter is None:
            raise ValueError(
                "trainer.test(datamodule=...) needs test rows: pass test_filter (a SQL"
                " predicate over the table) or test_table to LanceDataModule"
            )
        if stage == "predict" and table_name is None and filter is None:
            filter = self.filter
        # rows of the training table are read at the training version
        version = self.version if table_name is None else None
        table, opener = open_table(self.uri, table_name or self.table, version)
        argument = f"{stage}_filter"
        rows = count_rows(table, filter, self.uri, opener.name)
        if rows == 0:
            raise ValueError(
                f"{argument}={filter!r} selects no rows of table {opener.name!r}; loosen it"
            )
        if self.columns is not None:
            unknown = [c for c in self.columns if c not in table.schema.names]
            if unknown:
                raise ValueError(
                    f"columns={self.columns!r}: {unknown} not in table {opener.name!r}"
                    f" (its columns: {table.schema.names})"
                )
        return opener, filter, rows

    def _source(
        self,
        table: str,
        filter: str | None,
        shuffle: bool,
        version: int | None,
        splits_per_reader: int,
    ) -> LanceSource:
        source = LanceSource(
            self.uri,
            table,
            version=version,
            num_splits=self.num_splits,
            shuffle=shuffle,
            shuffle_seed=self.shuffle_seed,
            shuffle_clump_size=self.shuffle_clump_size,
            columns=self.columns,
            filter=filter,
            transform=self.transform,
            pipeline=pipeline_options(
                self.read_ahead_rows, self.read_batch_size, splits_per_reader
            ),
            multiprocessing_context=self.multiprocessing_context,
        )
        if self.columns is not None:
            names = source.table.schema.names
            unknown = [c for c in self.columns if c not in names]
            if unknown:
                raise ValueError(
                    f"columns={self.columns!r}: {unknown} not in table {table!r} (its columns:"
                    f" {names})"
                )
        return source

    def _check_rows(
        self, source: LanceSource, argument: str, filter: str | None, parts: int | None = None
    ) -> None:
        needed = parts * max(1, self.num_workers) if parts else self.num_splits
        if source.rows == 0:
            raise ValueError(
                f"{argument}={filter!r} selects no rows of table {source.name!r} (it has"
                f" {count_rows(source.table, None, self.uri, source.name)} rows); loosen it"
            )
        if source.rows < needed:
            what = "num_splits" if parts is None else "world_size * max(1, num_workers)"
            raise ValueError(
                f"table {source.name!r} has {source.rows} rows ({argument}={filter!r}), fewer"
                f" than {what}={needed}; every split needs at least one row, so lower"
                f" {what} or add rows"
            )

    def _report_layout(self, source: LanceSource, world_size: int) -> None:
        surplus = source.rows % self.num_splits
        log.info(
            "%s: %d rows in %d splits of %d; %d surplus rows per epoch are left out",
            source.name,
            source.rows,
            self.num_splits,
            source.split_len,
            surplus,
        )
        global_batch = self.batch_size * world_size
        if global_batch % self.num_splits:
            log.warning(
                "global batch %d (batch_size %d x world_size %d) is not a multiple of"
                " num_splits=%d: the epoch's samples are the same on every topology, but"
                " which samples share a global step differs between topologies",
                global_batch,
                self.batch_size,
                world_size,
                self.num_splits,
            )

    def val_dataloader(self) -> Any:
        if self._val is None:
            rank_zero_warn(
                "the trainer runs validation (the model has validation_step; see"
                " val_check_interval, check_val_every_n_epoch) but LanceDataModule has no"
                " validation rows: pass val_filter or val_table. Validation is skipped."
            )
            return []
        rank, world_size = self._rank_and_world()
        return _ValidationLoader(self._val, rank, world_size, self.batch_size, self.num_workers)

    def test_dataloader(self) -> RowRangeLoader:
        """This rank's part of the test rows (``test_filter`` / ``test_table``)."""
        return self._row_range_loader("test")

    def predict_dataloader(self) -> RowRangeLoader:
        """This rank's part of the rows to predict (default: the training rows)."""
        return self._row_range_loader("predict")

    def _row_range_loader(self, stage: str) -> RowRangeLoader:
        if stage not in self._evaluation:
            self._evaluation[stage] = self._evaluation_rows(stage)
        opener, filter, rows = self._evaluation[stage]
        rank, world_size = self._rank_and_world()
        return RowRangeLoader(
            opener,
            filter=filter,
            columns=self.columns,
            transform=self.transform,
            positions=rank_rows(rows, rank, world_size),
            batch_size=self.batch_size,
        )


class _ValidationLoader:
    """Re-iterable validation loader: a fresh unshuffled dataset on every pass."""

    def __init__(
        self, source: LanceSource, rank: int, world_size: int, batch_size: int, num_workers: int
    ) -> None:
        self.source = source
        self.rank = rank
        self.world_size = world_size
        self.batch_size = batch_size
        self.num_workers = num_workers

    def __len__(self) -> int:
        """Batches of this rank: each reader (worker) batches its own split."""
        readers = max(1, self.num_workers)
        split = self.source.rows // (self.world_size * readers)
        return readers * math.ceil(split / self.batch_size)

    def __iter__(self) -> Iterator[Batch]:
        parts = self.world_size * max(1, self.num_workers)
        dataset = self.source.dataset(0, self.rank, self.world_size, num_splits=parts)
        return iter(self.source.loader(dataset, self.batch_size, self.num_workers))


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _normalise_uri(uri: str) -> str:
    """Absolute path for a local directory, so every process and worker opens the same one."""
    if "://" in uri:
        return uri
    return os.path.abspath(os.path.expanduser(uri))
