"""LanceDataModule: a LanceDB table streamed into ``Trainer.fit``, exactly resumable."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_stream.allocator import keep_read_buffers
from lightning_stream.batching import Batch
from lightning_stream.datamodule import StreamingDataModule, check_positive
from lightning_stream.lance.evaluation import EvaluationLoader
from lightning_stream.lance.setup_report import check_rows, report_layout
from lightning_stream.lance.source import LanceSource
from lightning_stream.packing.option import TokenPacking
from lightning_stream.plan import check_topology
from lightning_stream.storage import check_options
from lightning_stream.workers.checks import check_sendable

log = logging.getLogger(__name__)


class LanceDataModule(StreamingDataModule):
    """Streams a LanceDB table, shuffled per epoch, with exact elastic resume.

    Each epoch the rows are cut into ``num_splits`` fixed splits of equal length (clumps
    of storage rows in a seeded order per epoch, :mod:`lightning_stream.placement`), and
    each rank reads its block of them, holding at most ``read_ahead_bytes`` of rows not
    yet trained on. Nothing is held per row of the table: setup, the first batch and
    memory do not grow with the table's size. With
    :class:`~lightning_stream.StreamStateCallback` (added to the trainer automatically)
    a checkpoint at any step resumes on any world size and worker count for which
    ``num_splits`` divides, and every row of an epoch reaches ``training_step`` exactly
    once.

    A batch is a dict with one Python type per column, decided at setup from the schema
    (see :mod:`lightning_stream.lance.columns` and the documentation's column types):
    numeric and fixed-size-list columns become tensors stacked along dim 0 (with a bool
    ``<name>_valid`` tensor when the schema declares the column nullable), strings a
    list of ``str``, binary columns a numpy object array of ``bytes``.

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
        num_workers: reading worker processes per rank; default 0 (the main process reads,
            on its reader's threads). Started at ``setup`` without waiting for them, kept
            for every epoch, stopped at ``teardown``, and gone within moments of the
            training process if it dies, even by ``SIGKILL``. The batches do not depend
            on who reads them (:mod:`lightning_stream.workers.pool`). The readers begin
            the next epoch once they have read this one, except after ``max_epochs``.
        shuffle: shuffle rows into splits, anew each epoch; default ``True``. ``False``
            cuts the table into splits in storage order.
        shuffle_seed: base seed of the shuffle, combined with the epoch; default 0. A
            resume must use the same seed.
        shuffle_clump_size: shuffle clumps of this many storage-order rows that stay
            together instead of single rows; ``1`` shuffles single rows. Default ``None``:
            clumps of ``CLUMP_ROWS`` (4,096) rows, or fewer on a table of fewer than
            ``CLUMP_ROWS * CLUMPS_PER_SPLIT * num_splits`` rows, so that every split holds
            at least ``CLUMPS_PER_SPLIT`` (4) clumps. Clumps are what make reads fast: on an
            object store a row shuffle fetches whole storage pages for scattered rows
            (several times the table's bytes per epoch) where a clump is read in a few large
            range reads (about 1x); on local disk lance takes a clump at about half the CPU
            of scattered rows. What they trade: a batch still mixes rows of every split a
            reader cycles over, and each split serves up to ``POOL_CLUMPS`` (4) clumps at
            once, as many as fit in ``POOL_BYTES`` (4 MiB) (a batch of 64 from 32 splits
            holds rows of up to 64 clumps), but rows that sit next to each other in storage
            arrive in the same split, in storage order; pass ``1`` where that matters more
            than speed. The clumps are put in a seeded order per (seed, epoch), the same on
            every topology, at a cost that does not grow with the table
            (:mod:`lightning_stream.placement`). A resume must use the same value; the
            checkpoint records it, so resuming with another refuses.
        columns: columns to read; default ``None`` reads all.
        filter: SQL predicate selecting the training rows; default ``None`` (all rows).
            Evaluated once per table version at setup (a scan of the columns it names)
            into one bit per row; the epoch's order is over the selected rows.
        transform: callable applied to each collated batch (a dict) in the worker; it
            must return a dict with one entry per sample along dim 0 of every column
            (batches are cut at sample boundaries after an elastic resume) and be
            picklable (module level) when ``num_workers > 0``. Default ``None``.
        val_filter: SQL predicate selecting validation rows of ``table``; keep it disjoint
            from ``filter``. Default ``None``.
        val_table: name of a separate validation table in ``uri``; default ``None``.
            Validation is read in storage order, each rank its own contiguous part, every
            row once.
            Without either, a trainer that runs validation gets a warning and none.
        test_filter: SQL predicate selecting the rows of ``table`` (at ``version``) that
            ``trainer.test(datamodule=dm)`` reads; default ``None``.
        test_table: name of a separate test table in ``uri``; default ``None``. Test and
            predict rows are read like validation rows: storage order, each rank a
            contiguous part (sizes differ by at most one row, so ranks can take one batch
            more or fewer), every row exactly once, none left out, none padded.
        predict_filter: SQL predicate selecting the rows of ``table`` that
            ``trainer.predict(datamodule=dm)`` reads; default ``None``: the training rows
            (``filter``), unless ``predict_table`` is given.
        predict_table: name of a separate table to predict on; default ``None``.
        version: table version to train on; default ``None`` pins the latest version at
            setup. A resume always reads the version the checkpoint recorded.
        read_ahead_bytes: bytes of rows each rank may hold that training has not taken
            yet: reads in flight and rows read but not yet handed out as batches, summed
            over the rank's reading processes (the main process, or its workers, each
            with an equal share); default 256 MiB. Memory stays flat whatever the table's
            size and however slow the training step is. A worker's share goes three
            quarters to its reads and a quarter to the shared memory slots its batches
            cross in; at 0 workers the main process's reading thread also holds up to 5
            batches it made ahead of training_step. Each reading process also always
            allows one window of reads of at least one row beyond it.
        storage_options: object-store options for ``lancedb.connect`` (and every worker's
            reopen), e.g. ``{"aws_access_key_id": ..., "aws_secret_access_key": ...,
            "aws_region": ..., "aws_endpoint": ..., "allow_http": "true"}``; default
            ``None`` (lance reads the ``AWS_*`` environment variables). They are never
            written to checkpoints, logs or error messages: the stream's identity holds
            ``uri`` only.
        pin_memory: as ``DataLoader``'s: with an accelerator, every batch (training,
            validation, test, predict) is copied into page-locked memory in the training
            process, for Lightning's ``non_blocking`` copy to the device; without one, a
            warning once and no effect. Default ``False``; the batches' rows do not change.
        pack: pack the documents of a token column into fixed-length blocks
            (:class:`~lightning_stream.packing.TokenPacking`: the column, ``block_size``,
            ``eos_id``, ``pad_id``); default ``None`` serves rows. A sample is then a
            block, ``batch_size`` counts blocks, and each split is a stream of tokens cut
            into the same number of blocks: the resume guarantee holds per token (every
            token of an epoch reaches ``training_step`` once, on any topology).
            Validation, test and predict rows are packed the same way, in storage order.
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
        read_ahead_bytes: int = 256 * 2**20,
        storage_options: dict[str, str] | None = None,
        pin_memory: bool = False,
        pack: TokenPacking | None = None,
    ) -> None:
        super().__init__(pin_memory)
        check_options(storage_options)
        check_positive(num_splits=num_splits, batch_size=batch_size)
        check_positive(read_ahead_bytes=read_ahead_bytes)
        if shuffle_clump_size is not None:
            check_positive(shuffle_clump_size=shuffle_clump_size)
        if pack is not None and columns is not None:
            raise ValueError(
                f"columns={columns!r} with pack: a packed batch holds the blocks of"
                f" pack.column={pack.column!r} only; leave columns=None"
            )
        if num_workers < 0:
            raise ValueError(f"num_workers must be 0 or more, got {num_workers}")
        for stage, given in (
            ("val", (val_filter, val_table)),
            ("test", (test_filter, test_table)),
            ("predict", (predict_filter, predict_table)),
        ):
            if None not in given:
                raise ValueError(f"pass {stage}_filter or {stage}_table, not both")
        keep_read_buffers()  # before lancedb starts its threads: prepare_data may use it
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
        self.read_ahead_bytes = read_ahead_bytes
        self.storage_options = storage_options
        self.pack = pack
        self._val: LanceSource | None = None
        self._evaluation: dict[str, LanceSource] = {}

    @override
    def setup(self, stage: str) -> None:
        _, world_size = self._rank_and_world()
        check_topology(self.num_splits, world_size, self.num_workers)
        if self.num_workers:
            check_sendable(self.transform, "transform")
        if stage == "fit":
            source = self._source(self.table, self.filter, self.shuffle, self.version)
            check_rows(source, "filter", self.filter, self.num_splits)
            self._start_stream(source, self.num_workers)
            report_layout(source, self.shuffle, self.batch_size, world_size)
            if self.num_workers:
                source.start_workers(self.num_workers)
        if stage in ("fit", "validate") and (self.val_filter or self.val_table):
            name = self.val_table or self.table
            self._val = self._source(name, self.val_filter, False, None)
            check_rows(self._val, "val_filter", self.val_filter, world_size, "world_size")
        for evaluation in ("test", "predict"):
            if stage == evaluation:  # stage may be Lightning's TrainerFn, a str enum
                self._evaluation[evaluation] = self._evaluation_source(evaluation)

    def _evaluation_source(self, stage: str) -> LanceSource:
        """The rows that ``trainer.test`` / ``trainer.predict`` read."""
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
        source = self._source(table_name or self.table, filter, False, version)
        check_rows(source, f"{stage}_filter", filter, 1, "world_size")
        return source

    def _source(
        self,
        table: str,
        filter: str | None,
        shuffle: bool,
        version: int | None,
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
            read_ahead_bytes=self.read_ahead_bytes,
            storage_options=self.storage_options,
            pack=self.pack,
        )
        return source

    @override
    def teardown(self, stage: str) -> None:
        """Stops the reading workers that ``setup("fit")`` started."""
        if stage == "fit" and self.stream is not None:
            self.stream.source.stop_workers()

    @override
    def val_dataloader(self) -> Any:
        if self._val is None:
            rank_zero_warn(
                "the trainer runs validation (the model has validation_step; see"
                " val_check_interval, check_val_every_n_epoch) but LanceDataModule has no"
                " validation rows: pass val_filter or val_table. Validation is skipped."
            )
            return []
        rank, world_size = self._rank_and_world()
        return self._pin_loader(EvaluationLoader(self._val, rank, world_size, self.batch_size))

    @override
    def test_dataloader(self) -> Any:
        """This rank's part of the test rows (``test_filter`` / ``test_table``)."""
        return self._evaluation_loader("test")

    @override
    def predict_dataloader(self) -> Any:
        """This rank's part of the rows to predict (default: the training rows)."""
        return self._evaluation_loader("predict")

    def _evaluation_loader(self, stage: str) -> Any:
        if stage not in self._evaluation:
            self._evaluation[stage] = self._evaluation_source(stage)
        rank, world_size = self._rank_and_world()
        loader = EvaluationLoader(self._evaluation[stage], rank, world_size, self.batch_size)
        return self._pin_loader(loader)


def _normalise_uri(uri: str) -> str:
    """Absolute path for a local directory, so every process and worker opens the same one."""
    return uri if "://" in uri else os.path.abspath(os.path.expanduser(uri))
