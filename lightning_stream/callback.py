"""StreamStateCallback: exact, elastic resume of a data module's stream."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_stream import loop_state
from lightning_stream.checkpoint_load import incomplete_checkpoint_message
from lightning_stream.preemption import SigtermSync, gather_through_store
from lightning_stream.provenance import provenance
from lightning_stream.state import StreamState, merge
from lightning_stream.stream import IncompleteStateError, ResumableStream, steps_to_skip

log = logging.getLogger(__name__)


def find_stream(trainer: pl.Trainer) -> ResumableStream | None:
    """The stream of the trainer's data module, if it has one."""
    return getattr(trainer.datamodule, "stream", None)


class StreamBatchCallback(Callback):
    """Base of the callbacks that follow the data module's stream batch by batch: after
    every batch that went through ``training_step`` it runs :meth:`_batch_done` with the
    stream (not at all when the trainer's data module has none)."""

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        stream = find_stream(trainer)
        if stream is not None:
            self._batch_done(trainer, stream, batch)

    def _batch_done(self, trainer: pl.Trainer, stream: ResumableStream, batch: Any) -> None:
        """What the callback does once ``batch`` went through ``training_step``."""


class StreamStateCallback(StreamBatchCallback):
    """Stores the data stream's exact position in every checkpoint and resumes from it.

    Works with :class:`~lightning_stream.LanceDataModule` and
    :class:`~lightning_stream.VideoEpisodeDataModule` (which add it to the trainer
    themselves when it is missing). What it does, hook by hook:

    - ``setup``: finds the data module's stream, has it count consumed batches and
      number a fresh epoch as Lightning does (``trainer.current_epoch``). Under
      ``overfit_batches`` every epoch is served in epoch 0's order: the same batches.
    - ``on_train_batch_end``: the batch has been through ``training_step``; the stream
      advances its per-split counts. Batches the loader pre-fetched are not counted.
    - ``on_train_start`` / ``on_train_batch_end`` (DDP): SIGTERM is recorded by a
      handler that replaces Lightning's during ``fit``; after every training batch the
      ranks agree (one ``all_reduce`` of one integer) whether any rank was signalled, and
      all stop at the end of that same batch (``lightning_stream.preemption``). That is
      the step's one collective: Lightning's own per-batch broadcast of rank 0's SIGTERM
      flag is turned off until ``on_train_end`` / ``on_exception``.
    - ``on_exception``: when every rank is interrupted at the same step (SIGTERM, a
      ``KeyboardInterrupt`` delivered to all at one step), the ranks' counts are
      gathered through the process group's key-value store, waiting at most
      ``interrupt_gather_timeout`` seconds (no collective, so a rank that failed alone
      cannot hang there).
    - ``state_dict`` (called on every rank while a checkpoint is made): gathers every
      rank's counts with the strategy's ``all_gather`` (after an exception: the counts
      ``on_exception`` gathered) and stores the merged record with the run identity
      (data source, version, seed, splits, filter, columns), the topology that saved it
      and its provenance (library versions, git revision). A checkpoint after an
      exception whose gather timed out is marked incomplete and refuses to resume, with
      an error naming the file and the newest complete checkpoint beside it.
    - ``load_state_dict``: hands the merged record to the stream, which checks it
      against the data module's settings (a mismatch raises ``ValueError`` naming the
      setting) and pins the saved data version. Every rank of the new run takes its
      own splits, whatever the new world size and worker count.
    - ``on_train_start``: a resumed epoch that is not finished is Lightning's epoch
      again (after a ``max_steps`` stop Lightning counts it as done; ``max_epochs=N``
      then still trains N whole data epochs); after an elastic resume the remaining
      epoch has another number of batches than Lightning's restored counter implies, so
      the counter is moved for the epoch to end exactly when the stream does.

    Args:
        interrupt_gather_timeout: seconds a rank waits in ``on_exception`` for the
            other ranks' progress; default 30. Past it, the checkpoint is incomplete.
    """

    def __init__(self, interrupt_gather_timeout: float = 30.0) -> None:
        self.interrupt_gather_timeout = interrupt_gather_timeout
        self._trainer: pl.Trainer | None = None
        self._stream: ResumableStream | None = None
        self._interrupted: tuple[int, list[int] | None] | None = None
        self._sigterm = SigtermSync()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._stream = find_stream(trainer)
        self._interrupted = None
        if self._stream is None:
            return
        self._stream.tracking = True
        self._stream.lightning_epoch = lambda: trainer.current_epoch
        # no epoch after the last is begun ahead (its reads would be paid for, unused)
        epochs = trainer.max_epochs or -1  # -1: no limit
        self._stream.last_epoch = epochs - 1 if epochs > 0 else None
        if trainer.overfit_batches:
            self._stream.fixed_order_epoch = 0
            rank_zero_warn(
                f"overfit_batches={trainer.overfit_batches}: the data stream serves epoch 0's"
                " first batches in the same order every epoch (no reshuffle)"
            )

    def _batch_done(self, trainer: pl.Trainer, stream: ResumableStream, batch: Any) -> None:
        stream.commit_batch(last_batch=loop_state.is_last_batch(trainer))
        self._sigterm.agree(trainer)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stream = self._stream
        if stream is not None:
            self._sigterm.install(trainer)
        if stream is None or not stream.resumed:
            return
        if stream.has_partial_epoch() and stream.upcoming_epoch() != trainer.current_epoch:
            log.info(
                "resumed data epoch %d is not finished: Lightning's epoch %d becomes %d",
                stream.upcoming_epoch(),
                trainer.current_epoch,
                stream.upcoming_epoch(),
            )
            loop_state.set_epoch(trainer, stream.upcoming_epoch())
        batches = loop_state.batches_done(trainer)
        target = steps_to_skip(stream, batches, trainer.num_training_batches)
        loop_state.set_batches_done(trainer, target)
        log.debug("resumed stream: Lightning's batch counter set to %d", target)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._sigterm.uninstall(trainer)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._gather_interrupted(trainer)
        self._sigterm.uninstall(trainer)

    def _gather_interrupted(self, trainer: pl.Trainer) -> list[int] | None:
        """The merged progress of all ranks at an exception, or ``None`` (gathered once
        per step: ``on_exception`` and every checkpoint saved after it share it)."""
        stream = self._stream
        if stream is None or trainer.world_size == 1:
            return None
        step = trainer.global_step
        if self._interrupted is None or self._interrupted[0] != step:
            rows = gather_through_store(
                stream.local_progress(),
                trainer.global_rank,
                trainer.world_size,
                f"lightning_stream/interrupt/{step}",
                self.interrupt_gather_timeout,
            )
            self._interrupted = (step, merge(rows) if rows else None)
        return self._interrupted[1]

    @override
    def state_dict(self) -> dict[str, Any]:
        stream, trainer = self._stream, self._trainer
        if stream is None or trainer is None:
            return {}
        progress = stream.local_progress()
        if trainer.world_size == 1:
            complete = True
        elif trainer.interrupted:
            gathered = self._gather_interrupted(trainer)
            complete = gathered is not None
            progress = gathered or progress
        else:
            strategy = trainer.strategy
            row = torch.tensor(progress, dtype=torch.int64, device=strategy.root_device)
            gathered = strategy.all_gather(row)
            progress = merge(gathered.reshape(-1, row.numel()).tolist())
            complete = True
        return stream.merged_state(progress, complete, provenance()).to_dict()

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self._stream is None:
            raise RuntimeError(
                "the checkpoint holds a data stream state but the trainer's data module has"
                " no stream; pass the LanceDataModule or VideoEpisodeDataModule the"
                " checkpoint was trained with"
            )
        try:
            self._stream.load(StreamState.from_dict(state_dict))
        except IncompleteStateError:
            path = self._trainer.ckpt_path if self._trainer is not None else None
            if path is None:
                raise
            raise IncompleteStateError(incomplete_checkpoint_message(path)) from None
