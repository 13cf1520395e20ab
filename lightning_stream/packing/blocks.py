"""A batch of blocks' arrays from the document tokens they hold: pure numpy, no I/O.

:class:`BlockBuilder` fills one reader's blocks in serving order. Blocks of several
splits interleave in a reader, so it keeps, per split, the document that crossed the end
of that split's last block (the rest of one document, never more), and opens the split's
next block with it. A block is cut from the documents' tokens as one slice; the arrays of
a batch (labels, positions, segments) are computed for the whole batch at once, from where
each document ends: nothing runs per document or per token in Python.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_stream.packing.option import IGNORE_INDEX, TokenPacking

_NONE = np.zeros(0, dtype=np.int64)
_ONE = np.ones(1, dtype=np.int64)


@dataclass(frozen=True)
class FilledBlock:
    """A block's document tokens (``block_size`` of them but at the epoch's end), the
    positions where a document ends, and the token that follows its last position in
    its document (``IGNORE_INDEX``: none)."""

    tokens: np.ndarray
    ends: np.ndarray
    follows: int


class BlockBuilder:
    """Makes the blocks of ``packing.block_size`` tokens of a stream of ``total`` tokens."""

    def __init__(self, packing: TokenPacking, total: int) -> None:
        self.packing = packing
        self.total = total
        self._carried: dict[int, np.ndarray] = {}

    def block(
        self, split: int, start: int, tokens: np.ndarray, ends: np.ndarray, offset: int
    ) -> FilledBlock:
        """The block of ``split`` at stream offset ``start``: the document carried from
        the split's previous block, then ``tokens`` from ``offset`` (the documents the
        block brings in, one after another; ``ends``: the position after each one's last
        token, in ``tokens``)."""
        real = min(self.packing.block_size, max(0, self.total - start))
        carried = self._carried.pop(split, _NONE)
        tokens, shift = tokens[offset:], len(carried) - offset
        if len(carried):
            tokens = np.concatenate([carried, tokens])
            ends = np.concatenate([_ONE * len(carried), ends + shift])
        elif shift:
            ends = ends + shift
        if len(tokens) < real:
            raise self._mismatch(split, start)
        # ends ascend: those within the block are a slice
        inside = slice(np.searchsorted(ends, 0, "right"), np.searchsorted(ends, real, "right"))
        rest = tokens[real:]
        if len(rest):
            if np.searchsorted(ends, len(tokens), "left") > inside.stop:
                raise self._mismatch(split, start)  # only the last document may go on
            self._carried[split] = rest.copy()
        follows = int(rest[0]) if len(rest) else IGNORE_INDEX
        return FilledBlock(tokens[:real], ends[inside] - 1, follows)

    def batch(self, blocks: list[FilledBlock]) -> dict[str, np.ndarray]:
        """The arrays of a batch of ``blocks`` (see
        :class:`~lightning_stream.packing.option.TokenPacking`)."""
        size = self.packing.block_size
        count = len(blocks)
        input_ids = np.full((count, size), self.packing.pad_id, dtype=np.int64)
        ends = np.zeros((count, size), dtype=bool)
        lengths = np.empty(count, dtype=np.int64)
        for row, block in enumerate(blocks):
            input_ids[row, : len(block.tokens)] = block.tokens
            ends[row, block.ends] = True
            lengths[row] = len(block.tokens)
        index = np.arange(size)
        real = index[None, :] < lengths[:, None]
        starts = np.zeros((count, size), dtype=bool)
        starts[:, 0] = True
        starts[:, 1:] = ends[:, :-1]
        starts |= index[None, :] == lengths[:, None]  # padding: a segment of its own
        rows, columns = np.nonzero(starts)
        # every position's segment, counted over the batch, and where that segment starts
        segment = np.cumsum(starts.ravel()) - 1
        position_ids = (np.arange(count * size) - (rows * size + columns)[segment]).reshape(
            count, size
        )
        segment = segment.reshape(count, size)
        document_ids = (segment - segment[:, :1]).astype(np.int32)
        document_ids[~real] = -1
        labels = np.empty((count, size), dtype=np.int64)
        labels[:, :-1] = input_ids[:, 1:]
        labels[:, -1] = [block.follows for block in blocks]
        labels[ends | ~real] = IGNORE_INDEX
        segments = starts.sum(axis=1)
        rank = np.arange(len(rows)) - np.repeat(np.cumsum(segments) - segments, segments)
        cu_seqlens = np.full((count, size + 1), size, dtype=np.int32)
        cu_seqlens[rows, rank] = columns
        return {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": position_ids,
            "document_ids": document_ids,
            "cu_seqlens": cu_seqlens,
            "max_seqlen": np.diff(cu_seqlens, axis=1).max(axis=1).astype(np.int32),
        }

    def _mismatch(self, split: int, start: int) -> RuntimeError:
        return RuntimeError(
            f"the documents read for split {split} do not fill its block at token {start}:"
            " the table's rows changed while the stream was read (or since its token"
            " counts were cached); start a new run on the current table version"
        )
