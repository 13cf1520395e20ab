"""Which tokens each block of each split of an epoch holds: pure arithmetic, no I/O.

An epoch's documents (the rows of a table, laid in the epoch's clump order by
:class:`~lightning_stream.placement.ClumpLayout`, each clump's rows in storage order) are
laid end to end as one token stream. The stream is cut into ``num_splits`` splits of the
same number of blocks of ``block_size`` tokens, and padded at its end to fill them: split
``s`` holds tokens ``[s * split_tokens, (s + 1) * split_tokens)``. So the blocks of a
split are a function of ``(seed, epoch, split)`` whatever the topology, every split has
the same number of blocks (the plan's ``split_len``), and the state of a split is the
number of blocks consumed: the row it stands in and the offset into that row follow from
it (:meth:`TokenLayout.at`). A document that crosses a block or split boundary is split
there; its rest opens the next block.

What is held: the tokens of every clump (one number per clump) and the row starts of the
few clumps looked at last; never anything per row of the table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lightning_stream.placement import ClumpLayout
from lightning_stream.plan import ReaderOrder

# clumps whose row starts a layout keeps (a reader looks at the clumps of its splits)
_CACHED_CLUMPS = 256


@dataclass(frozen=True)
class TokenLayout:
    """One epoch's token stream and its blocks (see the module's docstring).

    Args:
        clumps: the epoch's rows, in clumps, in the epoch's clump order.
        clump_tokens: tokens of each clump (by clump, not by laid position), a
            document's end-of-document token included.
        row_tokens: the tokens of each row of a clump (by clump).
        num_splits: splits of the epoch.
        block_size: tokens per block.
    """

    clumps: ClumpLayout
    clump_tokens: np.ndarray
    row_tokens: Callable[[int], np.ndarray]
    num_splits: int
    block_size: int
    _rows: dict[int, np.ndarray] = field(default_factory=dict, compare=False, repr=False)

    @cached_property
    def _starts(self) -> np.ndarray:
        """The stream offset of each laid clump's first token (``total`` past the last)."""
        laid = self.clump_tokens[self.clumps.item(np.arange(self.clumps.count))]
        return np.concatenate([[0], np.cumsum(laid, dtype=np.int64)])

    @property
    def total(self) -> int:
        """Tokens of the epoch's documents."""
        return int(self._starts[-1])

    @cached_property
    def blocks(self) -> int:
        """Blocks of every split."""
        per_split = self.num_splits * self.block_size
        return max(1, -(-self.total // per_split))

    @property
    def split_tokens(self) -> int:
        return self.blocks * self.block_size

    def block_start(self, split: int, block: int) -> int:
        """The stream offset of the first token of ``block`` of ``split``."""
        return split * self.split_tokens + block * self.block_size

    def _row_starts(self, position: int) -> np.ndarray:
        """Stream offsets of the rows of the clump at laid ``position`` (and its end)."""
        starts = self._rows.get(position)
        if starts is None:
            tokens = self.row_tokens(int(self.clumps.item(np.asarray([position]))[0]))
            starts = self._starts[position] + np.concatenate([[0], np.cumsum(tokens)])
            if len(self._rows) >= _CACHED_CLUMPS:
                self._rows.pop(next(iter(self._rows)))
            self._rows[position] = starts
        return starts

    def at(self, token: int) -> tuple[int, int]:
        """``(rows, offset)``: the laid rows that start before stream offset ``token``
        (every row at or past the stream's end), and where ``token`` lies in the last of
        them when that row goes on past it (else 0)."""
        if token >= self.total:
            return self.clumps.total, 0
        position = int(np.searchsorted(self._starts, token, side="right")) - 1
        starts = self._row_starts(position)
        begun = int(np.searchsorted(starts[:-1], token, side="left"))
        rows = int(self.clumps.start(np.asarray([position]))[0]) + begun
        if begun == 0:
            return rows, 0
        offset = token - int(starts[begun - 1])
        return rows, offset if token < starts[begun] else 0

    def selected(self, laid: np.ndarray) -> np.ndarray:
        """The selected-row index of each laid row."""
        position, within = self.clumps.locate(laid)
        return self.clumps.item(position) * self.clumps.size + within


@dataclass(frozen=True)
class BlockNeeds:
    """What blocks at consecutive serving positions of one reader need, in order.

    ``splits``/``starts``: each block's split and stream offset; ``rows``: the laid rows
    each brings in (its first one begun at ``offsets``: a row that the reader's previous
    block of that split, if any, did not hold), all concatenated in ``laid``.
    """

    splits: np.ndarray
    starts: np.ndarray
    rows: np.ndarray
    offsets: np.ndarray
    laid: np.ndarray


@dataclass(frozen=True)
class ReaderBlocks:
    """The blocks one reader serves (its :class:`~lightning_stream.plan.ReaderOrder`, in
    blocks) and the rows they need, in order, each row read once: a row that crosses
    into a split's next block is carried there by the reader."""

    layout: TokenLayout
    order: ReaderOrder

    def __len__(self) -> int:
        """Blocks served."""
        return len(self.order)

    @cached_property
    def row_count(self) -> int:
        """Rows read, in all."""
        count = 0
        for split, (first, stop) in self.order.spans.items():
            begin, offset = self.layout.at(self.layout.block_start(split, first))
            end, _ = self.layout.at(self.layout.block_start(split, stop))
            count += end - begin + (offset > 0)
        return count

    def needs(self, start: int, stop: int) -> BlockNeeds:
        """What the blocks at serving positions ``[start, stop)`` need."""
        layout = self.layout
        splits, blocks = self.order.positions(start, min(stop, len(self)))
        starts = splits * layout.split_tokens + blocks * layout.block_size
        rows, offsets, laid = [], [], []
        served = zip(splits.tolist(), blocks.tolist(), starts.tolist(), strict=True)
        for split, block, low in served:
            begin, offset = layout.at(low)
            end, _ = layout.at(low + layout.block_size)
            if block != self.order.spans[split][0]:
                offset = 0  # the previous block of this split carried that row here
            first = begin - (offset > 0)
            rows.append(end - first)
            offsets.append(offset)
            laid.append(np.arange(first, end, dtype=np.int64))
        empty = np.zeros(0, dtype=np.int64)
        return BlockNeeds(
            splits,
            starts,
            np.asarray(rows, dtype=np.int64),
            np.asarray(offsets, dtype=np.int64),
            np.concatenate(laid) if laid else empty,
        )
