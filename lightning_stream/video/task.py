"""What a reader of a rank's video windows runs: in a worker process, or in the main process.

A :class:`DecodeTask` is the :class:`~lightning_stream.workers.jobs.Task` of
:class:`~lightning_stream.video.source.VideoSource`: each worker builds its
:class:`~lightning_stream.video.reader.EpisodeReader` once (the Parquet columns, the MP4
indexes and open files; the rank's reading thread is given the main process's) and then
serves, per epoch, the windows of its share of the plan, as numpy batches
(:mod:`lightning_stream.video.windows`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from lightning_stream.plan import ReaderOrder
from lightning_stream.video.reader import EpisodeReader
from lightning_stream.video.spec import VideoSpec
from lightning_stream.video.windows import Batch, assemble

POSITIONS_WINDOW = 4096  # anchors whose positions are computed at once


@dataclass(frozen=True)
class DecodeJob:
    """One reader's windows of ``epoch``: the anchors of ``order``, cut into
    ``order.sizes``."""

    epoch: int
    order: ReaderOrder


def reader_positions(order: ReaderOrder) -> Iterator[tuple[int, int]]:
    """(split, position) of every anchor of ``order``, computed a window at a time."""
    for start in range(0, len(order), POSITIONS_WINDOW):
        split, position = order.positions(start, min(start + POSITIONS_WINDOW, len(order)))
        yield from zip(split.tolist(), position.tolist(), strict=True)


def batches(reader: EpisodeReader, job: DecodeJob) -> Iterator[Batch]:
    """The anchors of ``job`` as batches, each made when asked for; the chunks left
    resident when it stops are dropped (after the head of an elastic resume, the workers
    finish its chunks)."""
    reader.clear()  # a pass stopped early leaves its chunks
    positions = reader_positions(job.order)
    # a round of the splits: their first chunks are read at once, not one by one
    first_round = list(itertools.islice(positions, reader.spec.num_splits))
    reader.begin_pass(job.epoch, first_round)
    positions = itertools.chain(first_round, positions)
    try:
        for size in job.order.sizes:
            yield assemble(reader, job.epoch, list(itertools.islice(positions, size)))
    finally:
        reader.clear()


@dataclass(frozen=True)
class DecodeTask:
    """Windows of ``spec``'s dataset, for one reader process."""

    spec: VideoSpec

    def open(self, worker: int) -> EpisodeReader:
        return EpisodeReader(self.spec)

    def run(self, reader: EpisodeReader, job: DecodeJob) -> Iterator[Batch]:
        return batches(reader, job)

    def counters(self, reader: EpisodeReader) -> dict[str, float]:
        return reader.counters()
