"""What every streaming data module shares: topology from the trainer, the callback,
``pin_memory``."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Checkpoint
from typing_extensions import override

from lightning_stream.callback import StreamStateCallback
from lightning_stream.checkpoint_load import name_load_errors
from lightning_stream.pinning import PinnedLoader, resolve_pin_memory
from lightning_stream.stream import ResumableStream

log = logging.getLogger(__name__)


class StreamingDataModule(pl.LightningDataModule):
    """Base of the data modules whose train stream resumes exactly.

    Outside a ``Trainer`` (``dm.setup("fit")``, then iterating ``dm.train_dataloader()``)
    the module acts as rank 0 of 1 and each iteration is one epoch, starting at 0.

    Args:
        pin_memory: as ``DataLoader``'s (:mod:`lightning_stream.pinning`); default
            ``False``.
    """

    def __init__(self, pin_memory: bool = False) -> None:
        super().__init__()
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory must be True or False, got {pin_memory!r}")
        self.pin_memory = pin_memory
        self._pins: bool | None = None
        self.stream: ResumableStream | None = None

    def _pinned_batches(self) -> bool:
        """Whether batches are pinned (decided, and warned about, once per module)."""
        if self._pins is None:
            self._pins = resolve_pin_memory(self.pin_memory, type(self).__name__)
        return self._pins

    def _pin_loader(self, loader: Iterable[Any]) -> Iterable[Any]:
        """A validation, test or predict loader, pinned as ``pin_memory`` says."""
        return PinnedLoader(loader) if self._pinned_batches() else loader

    def _rank_and_world(self) -> tuple[int, int]:
        trainer = self.trainer
        if trainer is None:
            return 0, 1
        return trainer.global_rank, trainer.world_size

    def _start_stream(self, source, num_workers: int) -> None:
        """This rank's stream over ``source``, and the callback that resumes it."""
        rank, world_size = self._rank_and_world()
        self.stream = ResumableStream(
            source,
            batch_size=self._served_batch_size,
            num_workers=num_workers,
            rank=rank,
            world_size=world_size,
            owner=type(self).__name__,
            pin_memory=self._pinned_batches(),
        )
        self._attach_callback()

    def _served_batch_size(self) -> int:
        """``batch_size`` as it is now: Lightning's batch-size finder changes it between
        trials (on the data module and its ``hparams`` alike) without calling setup."""
        size = self.batch_size
        if not isinstance(size, int) or size <= 0:
            raise ValueError(f"batch_size must be a positive integer, got {size!r}")
        return size

    def _attach_callback(self) -> None:
        """Add a StreamStateCallback to the trainer when the user did not, and have the
        strategy name a checkpoint file that fails to load (a strategy whose
        ``checkpoint_io`` cannot be wrapped is refused: :func:`name_load_errors`).

        Without it a resume would silently restart the epoch. It goes before the
        checkpoint callbacks so a batch is counted before a checkpoint saved at its end.
        """
        trainer = self.trainer
        if trainer is None:
            return
        name_load_errors(trainer.strategy, type(self).__name__)
        if any(isinstance(c, StreamStateCallback) for c in trainer.callbacks):
            return
        position = next(
            (i for i, c in enumerate(trainer.callbacks) if isinstance(c, Checkpoint)),
            len(trainer.callbacks),
        )
        trainer.callbacks.insert(position, StreamStateCallback())
        log.info("%s added StreamStateCallback to the trainer", type(self).__name__)

    @override
    def train_dataloader(self):
        if self.stream is None:
            raise RuntimeError(f"call {type(self).__name__}.setup('fit') before train_dataloader()")
        return self.stream.loader()


def check_positive(**values: Any) -> None:
    """Raise ``ValueError`` naming the first argument that is not a positive integer."""
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
