"""lightning-stream: streaming training data as an exactly resumable part of Lightning.

Public names are imported on first use, so that DataLoader workers, which import only
the reading side of the package, start without importing Lightning.
"""

from importlib import import_module
from typing import TYPE_CHECKING

__version__ = "0.2.0"

_PUBLIC = {
    "AtomicCheckpointIO": "lightning_stream.checkpoint_io",
    "LanceDataModule": "lightning_stream.lance.datamodule",
    "LoaderMonitor": "lightning_stream.monitor",
    "StreamStateCallback": "lightning_stream.callback",
    "TokenPacking": "lightning_stream.packing.option",
    "VideoEpisodeDataModule": "lightning_stream.video.datamodule",
}

__all__ = [
    "AtomicCheckpointIO",
    "LanceDataModule",
    "LoaderMonitor",
    "StreamStateCallback",
    "TokenPacking",
    "VideoEpisodeDataModule",
    "__version__",
]

if TYPE_CHECKING:
    from lightning_stream.callback import StreamStateCallback
    from lightning_stream.checkpoint_io import AtomicCheckpointIO
    from lightning_stream.lance.datamodule import LanceDataModule
    from lightning_stream.monitor import LoaderMonitor
    from lightning_stream.packing.option import TokenPacking
    from lightning_stream.video.datamodule import VideoEpisodeDataModule


def __getattr__(name: str):
    if name in _PUBLIC:
        return getattr(import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'lightning_stream' has no attribute {name!r}")
