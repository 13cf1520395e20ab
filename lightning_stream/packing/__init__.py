"""Token packing: documents of a table packed into fixed-length blocks, exactly resumable.

The option is :class:`.option.TokenPacking` (``from lightning_stream import
TokenPacking``). The arithmetic (which tokens each block of each split holds,
:mod:`.layout`) and the making of a batch's arrays (:mod:`.blocks`) are pure; reading the
documents is the table source's (:mod:`lightning_stream.lance.packed`).
"""
