"""Which frame is the anchor of which sample, per split and epoch: pure arithmetic.

Each epoch the episodes are put in a seeded order and their frames, laid end to end, are
cut into ``num_splits`` contiguous runs of exactly ``total // num_splits`` frames
(:mod:`lightning_stream.placement`), so the splits are balanced by frame count whatever
the world size or worker count; the last ``total % num_splits`` frames of that order are
left out of the epoch. A split's run is made of pieces (contiguous frames of one
episode), cut into chunks of at most ``chunk_frames`` anchors (the byte budget sets it:
:func:`chunk_frames`). Its anchor order is a pure function of ``(seed, epoch, split)``
and the chunk length: a pool of ``pool_size`` resident chunks, each step taking the next
anchor of a random resident chunk (anchors within a chunk in a seeded random order), a
finished chunk replaced by a random one of the split's others. So the frames of
``pool_size`` chunks per split are needed at a time, and each chunk is fetched and
decoded once per epoch.

Windows: a ``delta`` in seconds must lie on the fps grid within ``tolerance_s`` (as
LeRobot's ``check_delta_timestamps``: ``|delta * fps - round(delta * fps)| / fps <=
tolerance_s``) and becomes ``round(delta * fps)`` frames; a frame outside its episode is
clamped to the episode's edge and flagged as padding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lightning_stream.placement import LengthLayout, epoch_permutation, split_pieces


@dataclass(frozen=True)
class Piece:
    """Frames ``[start, stop)`` of one episode."""

    episode: int
    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start


def _rng(seed: int, epoch: int, split: int = -1) -> np.random.Generator:
    return np.random.default_rng([seed, epoch, split + 1])


def cut_splits(
    lengths: Sequence[int], num_splits: int, seed: int, epoch: int
) -> tuple[list[list[Piece]], int]:
    """The pieces of every split for ``epoch``, and the frames per split: the episodes
    laid end to end in their order of ``epoch`` (:mod:`lightning_stream.placement`)."""
    total = int(sum(lengths))
    split_len = total // num_splits
    if split_len == 0:
        raise ValueError(
            f"{total} frames cannot fill num_splits={num_splits} splits; lower num_splits"
        )
    order = epoch_permutation(len(lengths), seed, epoch, shuffle=True)
    layout = LengthLayout(tuple(int(n) for n in lengths), order)
    splits = [
        [Piece(*piece) for piece in split_pieces(layout, split, split_len)]
        for split in range(num_splits)
    ]
    return splits, split_len


def cut_chunks(pieces: Sequence[Piece], chunk_frames: int) -> list[Piece]:
    """``pieces`` cut into chunks of at most ``chunk_frames`` frames, as even as possible."""
    chunks = []
    for piece in pieces:
        count = -(-len(piece) // chunk_frames)
        bounds = (piece.start + np.arange(count + 1) * len(piece) // count).tolist()
        chunks += [Piece(piece.episode, a, b) for a, b in itertools.pairwise(bounds)]
    return chunks


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


def anchor_order(pieces: Sequence[Piece], pool_size: int, seed: int, epoch: int, split: int):
    """(piece index, frame) of every anchor of a split, in the order they are served."""
    rng = _rng(seed, epoch, split)
    upcoming = list(rng.permutation(len(pieces)))
    pool: list[tuple[int, list[int]]] = []
    served_piece, served_frame = [], []
    while upcoming or pool:
        while upcoming and len(pool) < pool_size:
            index = int(upcoming.pop(0))
            piece = pieces[index]
            frames = (piece.start + rng.permutation(len(piece))).tolist()
            pool.append((index, frames))
        slot = int(rng.integers(len(pool)))
        index, frames = pool[slot]
        served_piece.append(index)
        served_frame.append(frames.pop())
        if not frames:
            pool.pop(slot)
    return np.asarray(served_piece, dtype=np.int64), np.asarray(served_frame, dtype=np.int64)


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
