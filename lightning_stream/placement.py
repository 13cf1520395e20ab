"""Which rows of an epoch each split holds, and the order a split serves them in.

Pure arithmetic over integers and numpy arrays, no I/O, for both data modules: the
*items* of a stream (clumps of storage-order rows of a table, episodes of a video
dataset) are laid end to end in a seeded order per ``(seed, epoch)`` and cut into
``num_splits`` runs of exactly ``total // num_splits`` rows; the last ``total %
num_splits`` rows of that order are the epoch's surplus. The item order is a seeded
bijection evaluated per index (:class:`Permutation`), so a rank computes the rows of its
own splits, and only those, with nothing held per item or per row of the whole stream
(clumps of equal size are located by arithmetic; episodes of unequal length by one
array of their starts).

Within a split, rows are served from a pool of ``pool`` items at once
(:class:`SplitOrder`): the split's consecutive items are taken ``pool`` at a time and
dealt in rounds, one row of each per round in a seeded random order, each item's rows
staying in storage order. So a batch mixes ``pool`` times as many items as it has
splits, while a reader still fetches every item front to back, each byte once. A split's order is a
pure function of ``(seed, epoch, split)`` and the stream's length: the same on every
world size and worker count.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import numpy as np

_MASK = 2**64 - 1
_M1, _M2 = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on uint64 arrays (products wrap modulo 2**64)."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(_M1)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(_M2)
    return x ^ (x >> np.uint64(31))


def derive_key(*parts: int) -> int:
    """A 64-bit key from integers (seed, epoch, split, ...): the same on every machine."""
    key = 0x9E3779B97F4A7C15
    for part in parts:
        x = (key ^ (part & _MASK)) & _MASK
        x = ((x ^ (x >> 30)) * _M1) & _MASK
        x = ((x ^ (x >> 27)) * _M2) & _MASK
        key = ((x ^ (x >> 31)) + 0x9E3779B97F4A7C15) & _MASK
    return key


@dataclass(frozen=True)
class Permutation:
    """A seeded bijection of ``[0, size)``, evaluated per index.

    A balanced Feistel network over the smallest even power of two that holds ``size``,
    applied again to an index that falls outside (cycle walking: fewer than 4 passes
    expected). Costs O(1) memory whatever ``size``: a billion single rows are shuffled
    without an array of a billion entries.
    """

    size: int
    key: int
    rounds: int = 6

    @cached_property
    def _half(self) -> int:
        return max(1, (max(self.size - 1, 1).bit_length() + 1) // 2)

    @cached_property
    def _keys(self) -> list[np.uint64]:
        return [np.uint64(derive_key(self.key, r)) for r in range(self.rounds)]

    def _rounds(self, x: np.ndarray, keys: list[np.uint64], forward: bool) -> np.ndarray:
        half = np.uint64(self._half)
        mask = np.uint64((1 << self._half) - 1)
        left, right = x >> half, x & mask
        for key in keys:
            if forward:
                left, right = right, left ^ (_mix(right ^ key) & mask)
            else:
                left, right = right ^ (_mix(left ^ key) & mask), left
        return (left << half) | right

    def _walk(self, index: np.ndarray, forward: bool) -> np.ndarray:
        keys = self._keys if forward else self._keys[::-1]
        x = np.asarray(index, dtype=np.int64).astype(np.uint64)
        if self.size <= 1:
            return x.astype(np.int64)
        x = self._rounds(x, keys, forward)
        outside = np.flatnonzero(x >= np.uint64(self.size))
        while len(outside):
            x[outside] = self._rounds(x[outside], keys, forward)
            outside = outside[x[outside] >= np.uint64(self.size)]
        return x.astype(np.int64)

    def __call__(self, index: np.ndarray) -> np.ndarray:
        """The item at each position ``index``."""
        return self._walk(index, forward=True)

    def inverse(self, item: np.ndarray) -> np.ndarray:
        """The position of each item."""
        return self._walk(item, forward=False)


class Layout(Protocol):
    """Items laid end to end: where each position starts, and which item it holds."""

    @property
    def total(self) -> int:
        """Rows of all items."""

    def start(self, position: np.ndarray) -> np.ndarray:
        """The laid offset of each position's first row (``total`` past the last)."""

    def locate(self, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The position holding each laid offset, and the offset's row within its item."""

    def item(self, position: np.ndarray) -> np.ndarray:
        """The item at each position."""


@dataclass(frozen=True)
class ClumpLayout:
    """``total`` rows in clumps of ``size`` (the last one shorter when ``size`` does not
    divide), item ``i`` holding rows ``[i * size, (i + 1) * size)``, laid in the order of
    ``permutation`` (``None``: storage order). Located by arithmetic: nothing per clump."""

    total: int
    size: int
    permutation: Permutation | None

    @cached_property
    def count(self) -> int:
        return -(-self.total // self.size)

    @cached_property
    def _short(self) -> int:
        """Rows the last clump lacks."""
        return self.count * self.size - self.total

    @cached_property
    def _short_position(self) -> int:
        """Where the last (short) clump lies."""
        last = np.asarray([self.count - 1])
        return int(self.permutation.inverse(last)[0]) if self.permutation else self.count - 1

    def start(self, position: np.ndarray) -> np.ndarray:
        position = np.asarray(position, dtype=np.int64)
        return position * self.size - self._short * (position > self._short_position)

    def locate(self, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offset = np.asarray(offset, dtype=np.int64)
        short_start = self._short_position * self.size
        position = np.where(
            offset < short_start + self.size - self._short,
            np.minimum(offset // self.size, self._short_position),
            (offset + self._short) // self.size,
        )
        return position, offset - self.start(position)

    def item(self, position: np.ndarray) -> np.ndarray:
        position = np.asarray(position, dtype=np.int64)
        return self.permutation(position) if self.permutation else position


@dataclass(frozen=True)
class LengthLayout:
    """Items of the given ``lengths`` (episodes), laid in the order of ``permutation``
    (``None``: as given); one array of starts, a position each."""

    lengths: tuple[int, ...]
    permutation: Permutation | None

    @cached_property
    def _order(self) -> np.ndarray:
        positions = np.arange(len(self.lengths), dtype=np.int64)
        return self.permutation(positions) if self.permutation else positions

    @cached_property
    def _starts(self) -> np.ndarray:
        laid = np.asarray(self.lengths, dtype=np.int64)[self._order]
        return np.concatenate([[0], np.cumsum(laid)])

    @property
    def total(self) -> int:
        return int(sum(self.lengths))

    def start(self, position: np.ndarray) -> np.ndarray:
        return self._starts[np.minimum(np.asarray(position, dtype=np.int64), len(self.lengths))]

    def locate(self, offset: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        offset = np.asarray(offset, dtype=np.int64)
        # "right": an empty item shares its start with the next one, which holds the row
        position = np.searchsorted(self._starts, offset, side="right") - 1
        return position, offset - self._starts[position]

    def item(self, position: np.ndarray) -> np.ndarray:
        return self._order[np.asarray(position, dtype=np.int64)]


def epoch_permutation(count: int, seed: int, epoch: int, shuffle: bool) -> Permutation | None:
    """The item order of ``epoch``: seeded per ``(seed, epoch)``, or none unshuffled."""
    return Permutation(count, derive_key(seed, epoch)) if shuffle else None


@dataclass(frozen=True)
class SplitOrder:
    """The rows of the splits of ``layout``, cut into splits of ``split_len``, in the
    order each split serves them.

    A split's items (its *pieces*: the part of each item that falls in it) are served
    ``pool`` at a time: each group of ``pool`` consecutive pieces is dealt in rounds, one
    row of every piece not yet exhausted per round, in a random order each round (seeded
    by ``key``, the split, the group and the round). Each piece's rows keep their storage
    order; where any row is served is arithmetic, with nothing held per row or per group.

    Args:
        layout: the epoch's items, laid end to end.
        split_len: rows in every split.
        pool: pieces served at once (1: one after another).
        key: seeds the order within each round.
    """

    layout: Layout
    split_len: int
    pool: int = 1
    key: int = 0

    def _piece_start(self, low: np.ndarray, first: np.ndarray, piece: np.ndarray) -> np.ndarray:
        """The split's row at which each of its pieces starts (``split_len`` past its last);
        ``piece`` counts from the split's first piece, at laid position ``first``, of the
        split starting at laid offset ``low``."""
        laid = self.layout.start(first + piece) - low
        return np.clip(laid, 0, self.split_len)

    @cached_property
    def _deals(self) -> np.ndarray:
        """Every order of ``pool`` pieces, a row each: a full round's order is one of them."""
        return np.asarray(list(itertools.permutations(range(self.pool))), dtype=np.int64)

    def sequence(self, split: np.ndarray, row: np.ndarray) -> np.ndarray:
        """The rows served at positions ``row`` of splits ``split``, as rows of their split
        laid in item order (``0 .. split_len``)."""
        split, row = np.asarray(split, dtype=np.int64), np.asarray(row, dtype=np.int64)
        if self.pool <= 1 or not len(row):
            return row
        pool = self.pool
        low = split * self.split_len
        first = self.layout.locate(low)[0]
        group = (self.layout.locate(low + row)[0] - first) // pool
        pieces = group[:, None] * pool + np.arange(pool + 1)
        firsts = self._piece_start(low[:, None], first[:, None], pieces)
        lengths = np.diff(firsts, axis=1)  # of the group's pieces, [rows, pool]
        at = row - firsts[:, 0]  # position within the group
        # a group of pieces of one length: round at // pool, every piece in it
        round_, slot = np.divmod(at, pool)
        seed = _mix(split.astype(np.uint64) ^ np.uint64(self.key))
        seed = _mix(seed ^ (group.astype(np.uint64) << np.uint64(32)))
        deal = _mix(seed ^ round_.astype(np.uint64)) % np.uint64(len(self._deals))
        piece = self._deals[deal.astype(np.int64), slot]
        uneven = np.flatnonzero((lengths != lengths[:, :1]).any(axis=1))
        if len(uneven):  # a split's first or last group, or one with the short clump
            round_[uneven], piece[uneven] = self._uneven(lengths[uneven], at[uneven], seed[uneven])
        return firsts[np.arange(len(row)), piece] + round_

    def _uneven(
        self, lengths: np.ndarray, at: np.ndarray, seed: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Round and piece of positions ``at`` of groups of pieces of unequal
        ``lengths``: while ``k`` pieces are exhausted, a round serves ``pool - k`` rows."""
        pool = self.pool
        ordered = np.sort(lengths, axis=1)
        before = np.zeros(len(at), dtype=np.int64)  # positions before the stretch
        done = np.zeros(len(at), dtype=np.int64)  # rounds before it
        round_, slot = np.zeros_like(at), np.zeros_like(at)
        for exhausted in range(pool):
            active = pool - exhausted
            span = active * (ordered[:, exhausted] - done)
            here = (at >= before) & (at < before + span)
            offset = at[here] - before[here]
            round_[here] = done[here] + offset // active
            slot[here] = offset % active
            before += span
            done = ordered[:, exhausted]
        keys = _mix(
            _mix(seed ^ round_.astype(np.uint64))[:, None] ^ np.arange(pool, dtype=np.uint64)
        )
        keys[lengths <= round_[:, None]] = np.uint64(_MASK)  # exhausted: last
        piece = np.argsort(keys, axis=1, kind="stable")[np.arange(len(at)), slot]
        return round_, piece

    def rows(self, split: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(item, row within the item)`` of the rows at positions ``row`` of splits
        ``split``."""
        laid = np.asarray(split, dtype=np.int64) * self.split_len + self.sequence(split, row)
        position, within = self.layout.locate(laid)
        return self.layout.item(position), within


def split_pieces(layout: Layout, split: int, split_len: int) -> list[tuple[int, int, int]]:
    """``(item, start, stop)`` of each item part in split ``split``, in laid order."""
    low, high = split * split_len, (split + 1) * split_len
    first, _ = layout.locate(np.asarray([low]))
    last, _ = layout.locate(np.asarray([high - 1]))
    positions = np.arange(first[0], last[0] + 1)
    starts = layout.start(positions)
    ends = layout.start(positions + 1)
    items = layout.item(positions)
    pieces = []
    for item, begin, end in zip(items.tolist(), starts.tolist(), ends.tolist(), strict=True):
        lo, hi = max(begin, low), min(end, high)
        if hi > lo:
            pieces.append((item, lo - begin, hi - begin))
    return pieces
