"""lightning-stream: streaming training data as an exactly resumable part of Lightning."""

from lightning_stream.callback import StreamStateCallback
from lightning_stream.checkpoint_io import AtomicCheckpointIO
from lightning_stream.lance import LanceDataModule
from lightning_stream.monitor import LoaderMonitor

__version__ = "0.1.0"

__all__ = [
    "AtomicCheckpointIO",
    "LanceDataModule",
    "LoaderMonitor",
    "StreamStateCallback",
    "__version__",
]
