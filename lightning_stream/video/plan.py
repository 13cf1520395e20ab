"""Which frame is the anchor of which sample, per split and epoch: pure arithmetic.

Each epoch the episodes are put in a seeded order and their frames, laid end to end, are
cut into ``num_splits`` contiguous runs of exactly ``total // num_splits`` frames
(:mod:`lightning_stream.placement`), so the splits are balanced by frame count whatever
the world size or worker count; the last ``total % num_splits`` frames of that order are
left out of the epoch. A split's run is made of pieces (contiguous frames of one
episode), cut into chunks of at most ``chunk_frames`` anchors (the byte budget sets it:
:func:`chunk_frames`). Its anchor order is a pure function of ``(seed, epoch, split)``
and the chunk length: the split's chunks in a seeded order, served ``pool_size`` at a
time, one anchor of each per round (:class:`~lightning_stream.placement.SplitOrder`, as
a table's clumps), a chunk's anchors in a seeded random order of its frames. So the
frames of ``pool_size`` chunks per split are needed at a time, and each chunk is fetched
and decoded once per epoch. Everything here is array arithmetic over episodes, pieces
and anchors, with no loop per frame and no object per episode.

Windows: a ``delta`` in seconds must lie on the fps grid within ``tolerance_s`` (as
LeRobot's ``check_delta_timestamps``: ``|delta * fps - round(delta * fps)| / fps <=
tolerance_s``) and becomes ``round(delta * fps)`` frames; a frame outside its episode is
clamped to the episode's edge and flagged as padding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from lightning_stream.placement import (
    LengthLayout,
    Permutation,
    SplitOrder,
    derive_key,
    epoch_permutation,
)


@dataclass(frozen=True)
class Piece:
    """Frames ``[start, stop)`` of one episode."""

    episode: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True, eq=False)
class Pieces:
    """Pieces as arrays (piece ``i``: frames ``[start[i], stop[i])`` of the episode at
    slot ``episode[i]``): a split holds thousands, and an array costs no object each."""

    episode: np.ndarray
    start: np.ndarray
    stop: np.ndarray

    @classmethod
    def of(cls, pieces: Sequence[Piece]) -> Pieces:
        episode, start, stop = (
            np.asarray([getattr(p, name) for p in pieces], dtype=np.int64)
            for name in ("episode", "start", "stop")
        )
        return cls(episode, start, stop)

    def __len__(self) -> int:
        return len(self.episode)

    def __getitem__(self, index: int) -> Piece:
        return Piece(int(self.episode[index]), int(self.start[index]), int(self.stop[index]))

    def __iter__(self) -> Iterator[Piece]:
        return map(Piece, self.episode.tolist(), self.start.tolist(), self.stop.tolist())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pieces):
            if isinstance(other, Sequence):  # of Piece
                return list(self) == list(other)
            return NotImplemented
        return all(
            np.array_equal(getattr(self, name), getattr(other, name))
            for name in ("episode", "start", "stop")
        )

    @property
    def lengths(self) -> np.ndarray:
        return self.stop - self.start

    def subset(self, index: np.ndarray | slice) -> Pieces:
        """The pieces at ``index``, in its order."""
        return Pieces(self.episode[index], self.start[index], self.stop[index])


def cut_splits(
    lengths: Sequence[int], num_splits: int, seed: int, epoch: int
) -> tuple[list[Pieces], int]:
    """The pieces of every split for ``epoch``, and the frames per split: the episodes
    laid end to end in their order of ``epoch`` (:mod:`lightning_stream.placement`) and
    cut at every multiple of the split length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    split_len = int(lengths.sum()) // num_splits
    if split_len == 0:
        raise ValueError(
            f"{int(lengths.sum())} frames cannot fill num_splits={num_splits} splits; lower"
            " num_splits"
        )
    order = epoch_permutation(len(lengths), seed, epoch, shuffle=True)
    layout = LengthLayout(tuple(lengths.tolist()), order)
    positions = np.arange(len(lengths))
    starts = layout.start(positions)
    # the laid offsets where an episode or a split begins, up to the epoch's end
    end = num_splits * split_len
    cuts = np.union1d(starts[starts < end], np.arange(0, end + 1, split_len))
    low, high = cuts[:-1], cuts[1:]
    position, within = layout.locate(low)
    pieces = Pieces(layout.item(position), within, within + (high - low))
    bounds = np.searchsorted(low, np.arange(num_splits + 1) * split_len)
    splits = [pieces.subset(slice(a, b)) for a, b in itertools.pairwise(bounds.tolist())]
    return splits, split_len


def cut_chunks(pieces: Pieces | Sequence[Piece], chunk_frames: int) -> Pieces:
    """``pieces`` cut into chunks of at most ``chunk_frames`` frames, as even as possible."""
    if not isinstance(pieces, Pieces):
        pieces = Pieces.of(pieces)
    lengths = pieces.lengths
    count = -(-lengths // chunk_frames)
    owner = np.repeat(np.arange(len(pieces)), count)
    k = np.arange(len(owner)) - np.repeat(np.cumsum(count) - count, count)
    size, parts = lengths[owner], count[owner]
    start = pieces.start[owner]
    return Pieces(pieces.episode[owner], start + k * size // parts, start + (k + 1) * size // parts)


def chunk_frames(budget: int, resident: int, cameras: Sequence[tuple[int, int]]) -> int:
    """The most anchors per chunk such that ``resident`` chunks hold at most ``budget``
    bytes of decoded frames (0 if not even one anchor fits).

    ``cameras``: per camera, the bytes of one decoded frame and the frames a chunk holds
    beyond its anchors for its windows (the span of the camera's offsets).
    """
    per_anchor = sum(size for size, _ in cameras)
    if not per_anchor:
        return budget  # no video: chunks bound nothing, keep the pieces whole
    margins = sum(size * span for size, span in cameras)
    return max(0, (budget // resident - margins) // per_anchor)


def anchor_order(
    chunks: Pieces, pool_size: int, seed: int, epoch: int, split: int
) -> tuple[np.ndarray, np.ndarray]:
    """(chunk index, frame) of every anchor of a split, in the order they are served.

    The split's chunks are put in a seeded order and served ``pool_size`` at a time
    (:class:`~lightning_stream.placement.SplitOrder`: one anchor of each per round, in a
    seeded order each round); a chunk's anchors come in a seeded random order of its
    frames. Arrays over the split's anchors, no loop over them."""
    key = derive_key(seed, epoch, split)
    lengths = chunks.lengths
    total = int(lengths.sum())
    layout = LengthLayout(tuple(lengths.tolist()), Permutation(len(chunks), key))
    order = SplitOrder(layout, total, pool_size, key)
    chunk, draw = order.rows(np.zeros(total, dtype=np.int64), np.arange(total))
    # each chunk's frames in a seeded random order: draw ``r`` of a chunk is its r-th
    owner = np.repeat(np.arange(len(chunks)), lengths)
    first = np.cumsum(lengths) - lengths
    noise = np.random.default_rng(key).permutation(total)
    shuffled = np.lexsort((noise, owner))
    frame = chunks.start[chunk] + shuffled[first[chunk] + draw] - first[chunk]
    return chunk, frame


def window(frame: int, length: int, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Frames of a window around ``frame`` in an episode of ``length``, and padding flags."""
    wanted = frame + offsets
    clamped = np.clip(wanted, 0, length - 1)
    return clamped, clamped != wanted


def frame_offsets(key: str, deltas: Sequence[float], fps: float, tolerance_s: float) -> np.ndarray:
    """Frame offsets of ``delta_timestamps[key]`` (seconds); off-grid deltas raise."""
    off_grid = [d for d in deltas if abs(d * fps - round(d * fps)) / fps > tolerance_s]
    if off_grid:
        between = ", ".join(
            f"{d:g} s lies between frames at {math.floor(d * fps) / fps:.4f} and"
            f" {math.ceil(d * fps) / fps:.4f} s"
            for d in off_grid
        )
        raise ValueError(
            f"delta_timestamps[{key!r}] has {off_grid}, not multiples of 1/{fps:g} s (the"
            f" dataset's fps grid) within tolerance_s={tolerance_s:g}: {between}"
        )
    return np.asarray([round(d * fps) for d in deltas], dtype=np.int64)
