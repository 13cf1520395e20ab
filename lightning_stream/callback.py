"""StreamStateCallback: exact, elastic resume of a data module's stream."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from lightning_stream.provenance import provenance
from lightning_stream.state import StreamState, merge
from lightning_stream.stream import ResumableStream, steps_to_skip

log = logging.getLogger(__name__)


def find_stream(trainer: pl.Trainer) -> ResumableStream | None:
    """The stream of the trainer's data module, if it has one."""
    return getattr(trainer.datamodule, "stream", None)


class StreamStateCallback(Callback):
    """Stores the data stream's exact position in every checkpoint and resumes from it.

    Works with :class:`~lightning_stream.LanceDataModule` and
    :class:`~lightning_stream.VideoEpisodeDataModule` (which add it to the trainer
    themselves when it is missing). What it does, hook by hook:

    - ``setup``: finds the data module's stream and has it count consumed batches.
    - ``on_train_batch_end``: the batch has been through ``training_step``; the stream
      advances its per-split counts. Batches the loader pre-fetched are not counted.
    - ``state_dict`` (called on every rank while a checkpoint is made): gathers every
      rank's counts with the strategy's ``all_gather`` and stores the merged record with
      the run identity (data source, version, seed, splits, filter, columns), the
      topology that saved it and its provenance (library versions, git revision). A
      checkpoint that one rank makes alone (``trainer.interrupted``, e.g. after an
      exception) does not gather, so it cannot hang; it is marked incomplete and refuses
      to resume.
    - ``load_state_dict``: hands the merged record to the stream, which checks it
      against the data module's settings (a mismatch raises ``ValueError`` naming the
      setting) and pins the saved data version. Every rank of the new run takes its
      own splits, whatever the new world size and worker count.
    - ``on_train_start``: after an elastic resume the remaining epoch has another number
      of batches than Lightning's restored counter implies; the counter is moved so the
      epoch ends exactly when the stream does.
    """

    def __init__(self) -> None:
        self._trainer: pl.Trainer | None = None
        self._stream: ResumableStream | None = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._trainer = trainer
        self._stream = find_stream(trainer)
        if self._stream is not None:
            self._stream.tracking = True

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self._stream is not None:
            last = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
            self._stream.commit_batch(last_batch=last)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        stream = self._stream
        if stream is None or not stream.resumed:
            return
        epoch_loop = trainer.fit_loop.epoch_loop
        current = epoch_loop.batch_progress.current
        target = steps_to_skip(stream, current.processed, trainer.num_training_batches)
        # The epoch loop's reset adds the batch a checkpoint saved in on_train_batch_end
        # had not marked completed yet; leave it one short so it lands on the target.
        bump = 1 if epoch_loop.restarted_on_train_batch_end else 0
        current.ready = current.started = current.processed = target
        current.completed = target - bump
        epoch_loop.batch_progress.is_last_batch = False
        log.debug("resumed stream: Lightning's batch counter set to %d", target)

    def state_dict(self) -> dict[str, Any]:
        stream, trainer = self._stream, self._trainer
        if stream is None or trainer is None:
            return {}
        progress = stream.local_progress()
        if trainer.interrupted or trainer.world_size == 1:
            complete = trainer.world_size == 1
        else:
            strategy = trainer.strategy
            row = torch.tensor(progress, dtype=torch.int64, device=strategy.root_device)
            gathered = strategy.all_gather(row)
            progress = merge(gathered.reshape(-1, row.numel()).tolist())
            complete = True
        return stream.merged_state(progress, complete, provenance()).to_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self._stream is None:
            raise RuntimeError(
                "the checkpoint holds a data stream state but the trainer's data module has"
                " no stream; pass the LanceDataModule or VideoEpisodeDataModule the"
                " checkpoint was trained with"
            )
        self._stream.load(StreamState.from_dict(state_dict))
