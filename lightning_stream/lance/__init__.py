"""LanceDB tables as exactly resumable training streams."""

from typing import TYPE_CHECKING

__all__ = ["LanceDataModule"]

if TYPE_CHECKING:
    from lightning_stream.lance.datamodule import LanceDataModule


def __getattr__(name: str):
    if name == "LanceDataModule":
        from lightning_stream.lance.datamodule import LanceDataModule

        return LanceDataModule
    raise AttributeError(f"module 'lightning_stream.lance' has no attribute {name!r}")
