"""Token packing: documents of a table packed into fixed-length blocks, exactly resumable.

The arithmetic (which tokens each block of each split holds, :mod:`.layout`) and the
making of a block's arrays (:mod:`.blocks`) are pure; reading the documents is the table
source's (:mod:`lightning_stream.lance.packed`). The option is :class:`.option.TokenPacking`.
"""

from typing import TYPE_CHECKING

__all__ = ["TokenPacking"]

if TYPE_CHECKING:
    from lightning_stream.packing.option import TokenPacking


def __getattr__(name: str):
    if name == "TokenPacking":
        from lightning_stream.packing.option import TokenPacking

        return TokenPacking
    raise AttributeError(f"module 'lightning_stream.packing' has no attribute {name!r}")
