"""LanceDB tables as exactly resumable training streams."""

from lightning_stream.lance.datamodule import LanceDataModule

__all__ = ["LanceDataModule"]
