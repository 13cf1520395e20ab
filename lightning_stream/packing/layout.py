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

What is held: the order and the tokens of every clump (two numbers per clump) and the
row starts of the few clumps looked at last; never anything per row of the table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
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
    def _items(self) -> np.ndarray:
        """The clump at each laid position."""
        return self.clumps.item(np.arange(self.clumps.count))

    @cached_property
    def _starts(self) -> np.ndarray:
        """The stream offset of each laid clump's first token (``total`` past the last)."""
        return np.concatenate([[0], np.cumsum(self.clump_tokens[self._items], dtype=np.int64)])

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

    def block_start(self, split: np.ndarray, block: np.ndarray) -> np.ndarray:
        """The stream offset of the first token of each ``block`` of ``split``."""
        return split * self.split_tokens + block * self.block_size

    def _row_starts(self, position: int) -> np.ndarray:
        """Stream offsets of the rows of the clump at laid ``position`` (and its end)."""
        starts = self._rows.get(position)
        if starts is None:
            tokens = self.row_tokens(int(self._items[position]))
            starts = self._starts[position] + np.concatenate([[0], np.cumsum(tokens)])
            if len(self._rows) >= _CACHED_CLUMPS:
                self._rows.pop(next(iter(self._rows)))
            self._rows[position] = starts
        return starts

    def at(self, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, offsets)``: for each stream offset of ``tokens``, the laid rows that
        start before it (every row, at or past the stream's end), and where it lies in the
        last of them when that row goes on past it (else 0)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        rows = np.full(len(tokens), self.clumps.total, dtype=np.int64)
        offsets = np.zeros(len(tokens), dtype=np.int64)
        inside = np.flatnonzero(tokens < self.total)
        if not len(inside):
            return rows, offsets
        wanted = tokens[inside]
        positions = np.searchsorted(self._starts, wanted, side="right") - 1
        clumps, which = np.unique(positions, return_inverse=True)
        # the row starts (and end) of every clump looked at, one after another: they
        # ascend, as the clumps do in the stream
        starts = [self._row_starts(position) for position in clumps.tolist()]
        base = np.cumsum([0] + [len(s) for s in starts[:-1]])[which]
        starts = np.concatenate(starts)
        # the rows of its clump that start before each token: the entries before it, less
        # those of earlier clumps (all at or before it; where one equals it, the token
        # opens its clump and no row of it starts before)
        begun = np.maximum(np.searchsorted(starts, wanted, side="left") - base, 0)
        rows[inside] = self.clumps.start(positions) + begun
        before = starts[base + np.maximum(begun - 1, 0)]
        goes_on = (begun > 0) & (wanted < starts[base + begun])
        offsets[inside] = np.where(goes_on, wanted - before, 0)
        return rows, offsets

    def selected(self, laid: np.ndarray) -> np.ndarray:
        """The selected-row index of each laid row."""
        position, within = self.clumps.locate(laid)
        return self._items[position] * self.clumps.size + within


@dataclass(frozen=True)
class BlockNeeds:
    """What blocks at consecutive serving positions of one reader need, in order.

    ``splits``/``starts``: each block's split and stream offset; ``rows``: the laid rows
    each brings in (:meth:`ReaderBlocks.needs`), the first of them begun at ``offsets``,
    all concatenated in ``laid``.
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
        spans = [(split, *span) for split, span in self.order.spans.items()]
        spans = np.asarray(spans, dtype=np.int64).reshape(-1, 3)
        splits, firsts, stops = spans.T
        begin, offset = self.layout.at(self.layout.block_start(splits, firsts))
        end, _ = self.layout.at(self.layout.block_start(splits, stops))
        return int((end - begin + (offset > 0)).sum())

    def needs(self, start: int, stop: int, carried: bool = True) -> BlockNeeds:
        """What the blocks at serving positions ``[start, stop)`` need: with ``carried``,
        a row that the reader's previous block of the same split began is not listed
        again (it is carried over); without, every block lists every row it holds."""
        layout = self.layout
        splits, blocks = self.order.positions(start, min(stop, len(self)))
        starts = layout.block_start(splits, blocks)
        begin, offsets = layout.at(starts)
        end, _ = layout.at(starts + layout.block_size)
        if carried:
            spans = self.order.spans
            firsts = np.asarray([spans[s][0] for s in splits.tolist()], dtype=np.int64)
            offsets = np.where(blocks == firsts, offsets, 0)
        begin -= offsets > 0
        rows = end - begin
        within = np.arange(rows.sum()) - np.repeat(np.cumsum(rows) - rows, rows)
        return BlockNeeds(splits, starts, rows, offsets, np.repeat(begin, rows) + within)


def runs_of(sizes: Sequence[int], limit: int) -> Iterator[range]:
    """The indices of ``sizes`` in runs of consecutive ones that add up to at most
    ``limit`` (a run of one where one alone is more)."""
    first, total = 0, 0
    for index, size in enumerate(sizes):
        if index > first and total + size > limit:
            yield range(first, index)
            first, total = index, 0
        total += size
    if first < len(sizes):
        yield range(first, len(sizes))
