"""A batch of blocks' arrays from the document tokens they hold: pure numpy, no I/O.

:class:`BlockBuilder` fills one reader's blocks in serving order. Blocks of several
splits interleave in a reader, so it keeps, per split, the document that crossed the end
of that split's last block (the rest of one document, never more), and opens the split's
next block with it. A block is copied from the documents' tokens as at most two slices
(that rest, then the documents it brings in); the arrays of a batch (labels, positions,
segments) are computed for the whole batch at once from where its segments start
(:func:`packed_fields`): nothing runs per document or per token in Python.
"""

from __future__ import annotations

import functools

import numpy as np

from lightning_stream.packing.option import IGNORE_INDEX, TokenPacking


def packed_fields(
    input_ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray, follows: np.ndarray
) -> dict[str, np.ndarray]:
    """A batch's arrays (see :class:`~lightning_stream.packing.option.TokenPacking`).

    Args:
        input_ids: ``[B, block_size]`` int64, each block's tokens then padding.
        starts: where the batch's segments start, ascending, as positions in the
            flattened ``input_ids``: every block's position 0, every document's first
            token, and where a block's padding starts.
        lengths: ``[B]`` tokens of each block that are not padding.
        follows: ``[B]`` the token after each block's last position in its document,
            ``IGNORE_INDEX`` where it has none.
    """
    count, size = input_ids.shape
    seqlens = np.diff(starts, append=count * size)
    rows, columns = np.divmod(starts, size)
    segments = np.bincount(rows, minlength=count)
    first = np.cumsum(segments) - segments
    rank = np.arange(len(starts)) - np.repeat(first, segments)
    position_ids = _flat_positions(count * size) - np.repeat(starts, seqlens)
    # a block's padding is the segment that starts where its tokens end
    segment_ids = np.where(columns == lengths[rows], -1, rank).astype(np.int32)
    labels = np.empty((count, size), dtype=np.int64)
    labels[:, :-1] = input_ids[:, 1:]
    labels[:, -1] = follows
    # a position before a segment's start has no next token in its document
    labels.ravel()[starts[columns > 0] - 1] = IGNORE_INDEX
    for row in np.flatnonzero(lengths < size).tolist():
        labels[row, lengths[row] :] = IGNORE_INDEX
    cu_seqlens = np.full((count, size + 1), size, dtype=np.int32)
    cu_seqlens[rows, rank] = columns
    return {
        "input_ids": input_ids,
        "labels": labels,
        "position_ids": position_ids.reshape(count, size),
        "document_ids": np.repeat(segment_ids, seqlens).reshape(count, size),
        "cu_seqlens": cu_seqlens,
        "max_seqlen": np.maximum.reduceat(seqlens, first).astype(np.int32),
    }


@functools.lru_cache(maxsize=4)
def _flat_positions(total: int) -> np.ndarray:
    """``0 .. total - 1``, kept: a batch's positions are computed from it every batch."""
    positions = np.arange(total)
    positions.flags.writeable = False
    return positions


class BlockBuilder:
    """Makes the blocks of ``packing.block_size`` tokens of a stream of ``total`` tokens."""

    def __init__(self, packing: TokenPacking, total: int) -> None:
        self.packing = packing
        self.total = total
        self._carried: dict[int, np.ndarray] = {}

    def batch(
        self, blocks: np.ndarray, tokens: np.ndarray, ends: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The arrays of the next blocks.

        Args:
            blocks: ``[B, 4]``, per block in serving order: its split, its stream offset,
                the documents it brings in and the offset into the first of them where it
                starts (see :meth:`~lightning_stream.lance.packed.PackRows.next_blocks`).
            tokens: the documents the blocks bring in, one after another.
            ends: the position after each of those documents' last token, in ``tokens``.
        """
        size = self.packing.block_size
        count = len(blocks)
        input_ids = np.empty((count, size), dtype=np.int64)
        # where segments start other than at a block's first position and at a brought-in
        # document's first token: after a carried document, and where padding starts
        starts: list[int] = []
        lengths = self.lengths(blocks)
        follows = np.full(count, IGNORE_INDEX, dtype=np.int64)
        last_row = np.cumsum(blocks[:, 2])
        opened = np.concatenate([[0], ends])  # where each document starts, and the end
        bounds = opened[np.concatenate([[0], last_row])]
        # the end of each block's last document but one (where it brings in two or more)
        second_last = opened[np.maximum(last_row - 1, 0)].tolist()
        shift = [0] * count  # where each block's first brought-in token lands in it
        for row, (split, start, brought, low, high, real) in enumerate(
            zip(
                *blocks[:, :3].T.tolist(),
                (bounds[:-1] + blocks[:, 3]).tolist(),
                bounds[1:].tolist(),
                lengths.tolist(),
                strict=True,
            )
        ):
            carried = self._carried.pop(split, None)
            filled = 0 if carried is None else min(real, len(carried))
            if filled:
                input_ids[row, :filled] = carried[:filled]
                if filled < real:
                    starts.append(row * size + filled)
            taken = real - filled
            if taken > high - low:
                raise self._mismatch(split, start)
            input_ids[row, filled:real] = tokens[low : low + taken]
            shift[row] = filled - low
            if carried is not None and filled < len(carried):
                if brought:  # the carried document fills the block and goes on
                    raise self._mismatch(split, start)
                rest = carried[filled:]
            elif low + taken < high:
                if brought > 1 and second_last[row] > low + taken:
                    raise self._mismatch(split, start)  # only the last document goes on
                rest = tokens[low + taken : high].copy()
            else:
                rest = None
            if rest is not None:
                self._carried[split] = rest
                follows[row] = rest[0]
            if real < size:
                input_ids[row, real:] = self.packing.pad_id
                starts.append(row * size + real)
        # a document that ends inside its block opens the next segment after its end
        owner = np.repeat(np.arange(count), blocks[:, 2])
        inside = ends + np.asarray(shift, dtype=np.int64)[owner]
        keep = (inside > 0) & (inside < lengths[owner])
        segments = np.concatenate(
            [
                np.arange(0, count * size, size),
                owner[keep] * size + inside[keep],
                np.asarray(starts, dtype=np.int64),
            ]
        )
        segments.sort()
        # an empty document ends where the one before it does: one segment start
        distinct = np.append(True, segments[1:] != segments[:-1])
        return packed_fields(input_ids, segments[distinct], lengths, follows)

    def lengths(self, blocks: np.ndarray) -> np.ndarray:
        """The tokens of each of ``blocks`` (as :meth:`batch` takes them) that are not
        padding."""
        return np.clip(self.total - blocks[:, 1], 0, self.packing.block_size)

    def _mismatch(self, split: int, start: int) -> RuntimeError:
        return RuntimeError(
            f"the documents read for split {split} do not fill its block at token {start}:"
            " the table's rows changed while the stream was read (or since its token"
            " counts were cached); start a new run on the current table version"
        )
