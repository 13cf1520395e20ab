"""AtomicCheckpointIO: a checkpoint is either complete under its final name, or absent."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.types import _PATH

from lightning_stream.atomic import atomic_write

log = logging.getLogger(__name__)


def _is_local(path: _PATH) -> bool:
    text = str(path)
    return "://" not in text or text.startswith("file://")


class AtomicCheckpointIO(TorchCheckpointIO):
    """Publishes checkpoints atomically and durably on local file systems.

    Use it as a Trainer plugin: ``Trainer(plugins=[AtomicCheckpointIO()])`` or
    ``--trainer.plugins=lightning_stream.AtomicCheckpointIO``.

    A local checkpoint is serialised straight into a temporary file in the same directory
    (``.<name>.<pid>.partial``), flushed and ``fsync``-ed, renamed over the final name
    (``os.replace``, atomic on POSIX file systems), and the directory is ``fsync``-ed so
    the rename itself survives a power loss. A process killed at any moment leaves either
    the previous complete file or the new complete file under the final name, never a
    truncated one; at most a ``.partial`` file is left behind, which is never loaded and is
    removed by the next save of the same name.

    Remote paths (``s3://``, ``gs://``, any other fsspec URL) are written as Lightning
    writes them: the serialised bytes in a single upload, which object stores publish
    whole when it completes. There is no rename and no directory sync there, and whether a
    completed upload is durable is the storage service's guarantee, not this plugin's.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None or not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        final = Path(str(path).removeprefix("file://"))
        with atomic_write(final) as file:
            torch.save(checkpoint, file)
        log.debug("published checkpoint %s", final)
