"""A batch of blocks' arrays from the document tokens they hold: pure numpy, no I/O.

Blocks are made in one of two ways, as the documents come:

- read once each, in serving order (from the table): :class:`BlockBuilder` fills one
  reader's blocks in serving order. Blocks of several splits interleave in a reader, so
  it keeps, per split, the document that crossed the end of that split's last block (the
  rest of one document, never more), and opens the split's next block with it;
- from a flat array that can be read anywhere (the local copy of the token column):
  :func:`cut_blocks` finds each block's tokens there on its own, as one slice per run of
  documents that lie one after another; once the reader has read the slices where they
  land, :meth:`BlockCuts.arrays` makes the batch from them.

Either way a block is a few slices, and the arrays of a batch (labels, positions,
segments) are computed for the whole batch at once from where its segments start
(:func:`packed_fields`): nothing runs per document or per token in Python.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from lightning_stream.packing.layout import BlockNeeds
from lightning_stream.packing.option import IGNORE_INDEX, TokenPacking


def packed_fields(
    input_ids: np.ndarray, opens: np.ndarray, lengths: np.ndarray, follows: np.ndarray
) -> dict[str, np.ndarray]:
    """A batch's arrays (see :class:`~lightning_stream.packing.option.TokenPacking`).

    Args:
        input_ids: ``[B, block_size]`` int64, each block's tokens then padding.
        opens: where documents open inside the blocks, as positions in the flattened
            ``input_ids``, in any order, repeats allowed (an empty document opens where
            the next one does); every block's position 0, and where its padding starts,
            open a segment too.
        lengths: ``[B]`` tokens of each block that are not padding.
        follows: ``[B]`` the token after each block's last position in its document,
            ``IGNORE_INDEX`` where it has none.
    """
    count, size = input_ids.shape
    padded = np.flatnonzero(lengths < size)
    starts = np.concatenate(
        [np.arange(0, count * size, size), opens, padded * size + lengths[padded]]
    )
    starts.sort()
    starts = starts[np.append(True, starts[1:] != starts[:-1])]
    seqlens = np.empty_like(starts)
    np.subtract(starts[1:], starts[:-1], out=seqlens[:-1])
    seqlens[-1] = count * size - starts[-1]
    rows, columns = np.divmod(starts, size)
    segments = np.bincount(rows, minlength=count)
    first = np.cumsum(segments) - segments
    rank = np.arange(len(starts)) - np.repeat(first, segments)
    # written over the repeated starts: a batch's arrays are each written once
    position_ids = np.repeat(starts, seqlens)
    np.subtract(_flat_positions(count * size), position_ids, out=position_ids)
    # a block's padding is the segment that starts where its tokens end
    segment_ids = np.where(columns == lengths[rows], -1, rank).astype(np.int32)
    labels = np.empty((count, size), dtype=np.int64)
    labels.reshape(-1)[:-1] = input_ids.reshape(-1)[1:]
    labels[:, -1] = follows
    # a position before a segment's start has no next token in its document
    labels.ravel()[starts[columns > 0] - 1] = IGNORE_INDEX
    for row in padded.tolist():
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
        # where documents open other than at a brought-in document's first token: after
        # a carried document
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
                raise _mismatch(split, start)
            input_ids[row, filled:real] = tokens[low : low + taken]
            shift[row] = filled - low
            if carried is not None and filled < len(carried):
                if brought:  # the carried document fills the block and goes on
                    raise _mismatch(split, start)
                rest = carried[filled:]
            elif low + taken < high:
                if brought > 1 and second_last[row] > low + taken:
                    raise _mismatch(split, start)  # only the last document goes on
                rest = tokens[low + taken : high].copy()
            else:
                rest = None
            if rest is not None:
                self._carried[split] = rest
                follows[row] = rest[0]
            if real < size:
                input_ids[row, real:] = self.packing.pad_id
        # a document that ends inside its block opens the next segment after its end
        owner = np.repeat(np.arange(count), blocks[:, 2])
        inside = ends + np.asarray(shift, dtype=np.int64)[owner]
        keep = (inside > 0) & (inside < lengths[owner])
        opens = np.append(owner[keep] * size + inside[keep], np.asarray(starts, np.int64))
        return packed_fields(input_ids, opens, lengths, follows)

    def lengths(self, blocks: np.ndarray) -> np.ndarray:
        """The tokens of each of ``blocks`` (as :meth:`batch` takes them) that are not
        padding."""
        return np.clip(self.total - blocks[:, 1], 0, self.packing.block_size)


@dataclass(frozen=True)
class BlockCuts:
    """Where the tokens of consecutive blocks lie in a flat array of documents, and
    where their documents open (made by :func:`cut_blocks`).

    ``real``: each block's tokens that are not padding; ``pieces``: ``[P, 4]``, one row
    per slice to read, in block order: its block, where it lands in the block, where it
    starts in the flat array and how many tokens to read (the last slice of a block whose
    last document goes on reads one token more: the token that follows the block, which
    lands just past its end); ``goes_on``: whether each block's last document goes on past
    it; ``opens``: where documents open inside the blocks, as ascending positions in the
    blocks laid end to end; ``ended``: documents whose last token lies in each block.
    """

    block_size: int
    real: np.ndarray
    pieces: np.ndarray
    goes_on: np.ndarray
    opens: np.ndarray
    ended: np.ndarray

    def __len__(self) -> int:
        return len(self.real)

    def pieces_of(self, start: int, stop: int) -> np.ndarray:
        """The slices of blocks ``[start, stop)``, their blocks counted from ``start``."""
        low, high = np.searchsorted(self.pieces[:, 0], [start, stop])
        pieces = self.pieces[low:high].copy()
        pieces[:, 0] -= start
        return pieces

    def arrays(
        self, read: np.ndarray, start: int, stop: int, packing: TokenPacking
    ) -> tuple[dict[str, np.ndarray], int]:
        """The arrays of blocks ``[start, stop)`` from ``read``, ``[stop - start,
        block_size + 1]``: each block's slices (:meth:`pieces_of`) where they land, then
        the token that follows it; and how many of their documents' tokens (their
        end-of-document tokens aside) equal ``packing.pad_id``."""
        size, pad_id = self.block_size, packing.pad_id
        count = stop - start
        input_ids = read[:, :size].astype(np.int64)
        real = self.real[start:stop]
        for row in np.flatnonzero(real < size).tolist():
            input_ids[row, real[row] :] = pad_id
        found = int(np.count_nonzero(input_ids == pad_id)) - (count * size - int(real.sum()))
        if packing.eos_id == pad_id:
            found -= int(self.ended[start:stop].sum())
        low, high = np.searchsorted(self.opens, [start * size, stop * size])
        opens = self.opens[low:high] - start * size
        follows = np.where(self.goes_on[start:stop], read[:, size], IGNORE_INDEX)
        return packed_fields(input_ids, opens, real, follows), found


def cut_blocks(
    needs: BlockNeeds, total: int, block_size: int, sources: np.ndarray, lengths: np.ndarray
) -> BlockCuts:
    """Where the tokens of the blocks of ``needs`` (every row each holds: ``carried``
    false) lie in a flat array of documents, of a stream of ``total`` tokens.

    Args:
        needs: the blocks and the rows each holds, in order.
        total: tokens of the epoch's stream (past it, a block is padding).
        block_size: tokens per block.
        sources: where each row of ``needs.laid`` starts in the flat array.
        lengths: its tokens there (an end-of-document token included).
    """
    size = block_size
    count = len(needs.starts)
    held = needs.rows
    real = np.clip(total - needs.starts, 0, size)
    owner = np.repeat(np.arange(count), held)
    firsts = np.cumsum(held) - held
    before = np.concatenate([[0], np.cumsum(lengths)])
    # where each row's first token lands in its block (below 0: in an earlier block)
    dest = before[:-1] - np.repeat(before[firsts] + needs.offsets, held)
    ends = dest + lengths
    short = np.flatnonzero(before[firsts + held] - before[firsts] - needs.offsets < real)
    if len(short):
        raise _mismatch(int(needs.splits[short[0]]), int(needs.starts[short[0]]))
    # a slice per run of a block's rows that lie one after another in the flat array
    cuts = np.flatnonzero((sources[1:] != sources[:-1] + lengths[:-1]) | (owner[1:] != owner[:-1]))
    first = np.append(0, cuts + 1)[: len(owner)]
    last = np.append(cuts, len(owner) - 1)[: len(owner)]
    block = owner[first]
    skipped = np.maximum(0, -dest[first])
    landed = dest[first] + skipped
    length = np.minimum(ends[last], real[block]) - landed
    goes_on = np.zeros(count, dtype=bool)
    goes_on[held > 0] = ends[(firsts + held - 1)[held > 0]] > size
    # a block's last slice is its last run: it ends at the block's end if the block goes on
    length[np.append(block[1:] != block[:-1], True)[: len(block)] & goes_on[block]] += 1
    pieces = np.stack([block, landed, sources[first] + skipped, length], axis=1)
    inside = (dest > 0) & (dest < real[owner])
    ending = (ends > 0) & (ends <= real[owner])
    return BlockCuts(
        block_size,
        real,
        pieces[length > 0],
        goes_on,
        owner[inside] * size + dest[inside],
        np.bincount(owner[ending], minlength=count),
    )


def _mismatch(split: int, start: int) -> RuntimeError:
    return RuntimeError(
        f"the documents read for split {split} do not fill its block at token {start}:"
        " the table's rows changed while the stream was read (or since its token"
        " counts were cached); start a new run on the current table version"
    )
