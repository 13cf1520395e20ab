"""A checkpoint that cannot be read is named, with the checkpoints beside it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
from lightning.fabric.utilities.types import _PATH


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


def name_load_errors(strategy: Any) -> None:
    """Have ``strategy`` name the file when a checkpoint fails to load (once)."""
    if not isinstance(strategy.checkpoint_io, NamedLoadErrors):
        strategy.checkpoint_io = NamedLoadErrors(strategy.checkpoint_io)


def _siblings(path: _PATH) -> str:
    local = Path(str(path))
    if not local.parent.is_dir():
        return ""
    others = sorted(
        (p for p in local.parent.glob("*.ckpt") if p != local),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    return f" (beside it, newest first: {[str(p) for p in others[:5]]})" if others else ""
