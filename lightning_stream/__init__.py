"""lightning-stream: streaming training data as an exactly resumable part of Lightning."""

from lightning_stream.callback import StreamStateCallback
from lightning_stream.lance import LanceDataModule

__version__ = "0.1.0"

__all__ = ["LanceDataModule", "StreamStateCallback", "__version__"]
