"""A checkpoint that cannot be read, or cannot resume, is named with the ones beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.utilities.types import _PATH

from lightning_stream.state import STATE_KEY


class NamedLoadErrors(CheckpointIO):
    """Wraps a strategy's ``CheckpointIO``; a load that fails names the file.

    torch's own message for a truncated or corrupt file ("failed finding central
    directory", an unpickling error) names no file. Saving and removing are passed on
    unchanged.
    """

    def __init__(self, inner: CheckpointIO) -> None:
        self.inner = inner

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        self.inner.save_checkpoint(checkpoint, path, storage_options)

    def remove_checkpoint(self, path: _PATH) -> None:
        self.inner.remove_checkpoint(path)

    def teardown(self) -> None:
        self.inner.teardown()

    def load_checkpoint(self, path: _PATH, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return self.inner.load_checkpoint(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except Exception as exc:
            raise ValueError(
                f"checkpoint {str(path)!r} cannot be read ({type(exc).__name__}: {exc}): it is"
                " truncated or corrupt. Resume from another checkpoint"
                f"{_siblings(path)}, or write checkpoints with"
                " lightning_stream.AtomicCheckpointIO, which never leaves a partial file"
                " under a checkpoint's name"
            ) from exc


def name_load_errors(strategy: Any, owner: str) -> None:
    """Have ``strategy`` name the file when a checkpoint fails to load (once).

    The strategy's ``checkpoint_io`` is replaced by a :class:`NamedLoadErrors` wrapping
    it. Lightning's strategies that keep ``Strategy``'s setter accept that (single device,
    DDP and its spawn / fork variants, FSDP, ModelParallel, DeepSpeed); one whose setter
    refuses it or keeps another plugin (the XLA strategies take only ``XLACheckpointIO``)
    raises ``TypeError`` naming the strategy and those that work.
    """
    if isinstance(strategy.checkpoint_io, NamedLoadErrors):
        return
    wrapped = NamedLoadErrors(strategy.checkpoint_io)
    try:
        strategy.checkpoint_io = wrapped
        refused = None if strategy.checkpoint_io is wrapped else "it kept another plugin"
    except Exception as exc:  # the setter's own check (XLA's is a TypeError)
        refused = f"{type(exc).__name__}: {exc}"
    if refused is not None:
        raise TypeError(
            f"{owner} cannot train with Trainer(strategy={type(strategy).__name__}(...)): its"
            f" checkpoint_io cannot be wrapped ({refused}), and {owner} wraps it to name a"
            " checkpoint file that fails to load. Use a strategy whose checkpoint_io can be"
            ' replaced: "auto" / SingleDeviceStrategy, "ddp" / "ddp_spawn" / "ddp_fork"'
            ' (DDPStrategy), "fsdp", "deepspeed" or ModelParallelStrategy; XLA (TPU)'
            " strategies are not supported"
        )


def checkpoints_beside(path: _PATH) -> list[Path]:
    """The other ``*.ckpt`` files in the directory of a local ``path``, newest first."""
    local = Path(str(path))
    if not local.parent.is_dir():
        return []
    others = [p for p in local.parent.glob("*.ckpt") if p.resolve() != local.resolve()]
    return sorted(others, key=lambda p: p.stat().st_mtime, reverse=True)


def _siblings(path: _PATH) -> str:
    others = checkpoints_beside(path)
    return f" (beside it, newest first: {[str(p) for p in others[:5]]})" if others else ""


def is_complete(path: Path) -> bool:
    """Whether ``path`` is a checkpoint whose stream state holds every rank's progress."""
    try:
        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
    except Exception:
        return False
    state = checkpoint.get("callbacks", {}).get(STATE_KEY) or {}
    return bool(state.get("complete"))


def incomplete_checkpoint_message(path: str | Path) -> str:
    """What to tell a user whose resume hit a checkpoint one rank wrote alone."""
    newest = next((p for p in checkpoints_beside(path) if is_complete(p)), None)
    instead = (
        f"resume with ckpt_path={str(newest)!r}, the newest complete checkpoint beside it"
        if newest is not None
        else "no complete checkpoint is beside it; resume from one that all ranks saved"
    )
    return (
        f"{path} was written by one rank alone (after an exception on that rank), so it"
        f" lacks the other ranks' progress and cannot resume exactly; {instead} (delete or"
        " move the incomplete file if ckpt_path='last' or None picked it)"
    )
