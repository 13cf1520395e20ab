"""Every read and write of Lightning's private loop state, in one place.

Lightning has no public way to say "this epoch has N batches left", "this is epoch E
again" or "stop every rank after this batch"; the stream needs all three. What is touched
here (``fit_loop.epoch_progress``, ``fit_loop.epoch_loop.batch_progress``, the epoch
loop's restart stage and its per-batch SIGTERM broadcast, the signal connector's SIGTERM
flag and handler) is private, so CI
runs the resume tests against the oldest Lightning the package allows as well as the
newest (``.ci/run``), which catches a change in it.
"""

from __future__ import annotations

import lightning.pytorch as pl


def is_last_batch(trainer: pl.Trainer) -> bool:
    """Whether the batch that just finished ends Lightning's epoch."""
    return trainer.fit_loop.epoch_loop.batch_progress.is_last_batch


def batches_done(trainer: pl.Trainer) -> int:
    """The batches Lightning's epoch loop counts as processed in this epoch."""
    return trainer.fit_loop.epoch_loop.batch_progress.current.processed


def set_batches_done(trainer: pl.Trainer, batches: int) -> None:
    """Make Lightning's epoch loop count ``batches`` batches as done in this epoch.

    Called from ``on_train_start`` of a resumed run, before the epoch loop's reset; that
    reset adds the batch a checkpoint saved in ``on_train_batch_end`` had not marked
    completed yet, so the counter is left one short for it to land on ``batches``.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    current = epoch_loop.batch_progress.current
    bump = 1 if getattr(epoch_loop, "restarted_on_train_batch_end", False) else 0
    current.ready = current.started = current.processed = batches
    current.completed = batches - bump
    epoch_loop.batch_progress.is_last_batch = False


def set_epoch(trainer: pl.Trainer, epoch: int) -> None:
    """Make ``epoch`` the epoch Lightning runs next (``trainer.current_epoch``).

    Called from ``on_train_start``, after the fit loop's reset and before its first
    ``on_advance_start``, which marks the epoch ready and started.
    """
    current = trainer.fit_loop.epoch_progress.current
    current.ready = current.started = current.processed = current.completed = epoch


def sigterm_notifier(trainer: pl.Trainer) -> object:
    """Lightning's own SIGTERM handler (part of the handler ``fit`` installed)."""
    return trainer._signal_connector._sigterm_notifier_fn


def mark_sigterm(trainer: pl.Trainer) -> None:
    """Make Lightning stop at the end of this training batch as on its own SIGTERM.

    Its epoch loop raises ``SIGTERMException`` after ``on_train_batch_end`` when the flag
    is set, which runs ``on_exception`` (and ``OnExceptionCheckpoint``) on every rank.
    """
    trainer._signal_connector.received_sigterm = True


def skip_sigterm_broadcast(trainer: pl.Trainer, skip: bool) -> None:
    """Turn off (``skip``) or back on the broadcast of rank 0's received-SIGTERM flag that
    Lightning's epoch loop runs before every training batch under DDP.

    ``_broadcast_sigterm_tensor`` is a method of the epoch loop; skipping shadows it on
    this trainer's loop with one that does nothing, and turning it back on removes the
    shadow. A Lightning without the method has no such broadcast: nothing to skip.
    """
    epoch_loop = trainer.fit_loop.epoch_loop
    if skip and hasattr(epoch_loop, "_broadcast_sigterm_tensor"):
        epoch_loop._broadcast_sigterm_tensor = _no_broadcast
    else:
        vars(epoch_loop).pop("_broadcast_sigterm_tensor", None)


def _no_broadcast() -> None:
    """Stands in for Lightning's per-batch SIGTERM broadcast while it is skipped."""
