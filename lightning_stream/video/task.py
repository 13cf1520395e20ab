"""What a reader of a rank's video windows runs: in a worker process, or in the main process.

A :class:`DecodeTask` is the :class:`~lightning_stream.workers.pool.WorkerPool` task of
:class:`~lightning_stream.video.source.VideoSource`: each worker builds its
:class:`~lightning_stream.video.reader.EpisodeReader` once (the Parquet columns, the MP4
indexes and open files) and then serves, per epoch, the windows of its block of splits,
as numpy batches (:mod:`lightning_stream.video.windows`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from lightning_stream.plan import RankEpochPlan, ReaderOrder
from lightning_stream.video.reader import EpisodeReader
from lightning_stream.video.spec import VideoSpec
from lightning_stream.video.windows import Batch, assemble

POSITIONS_WINDOW = 4096  # anchors whose positions are computed at once


@dataclass(frozen=True)
class DecodeJob:
    """One reader's windows of one epoch: worker ``worker`` of ``workers`` of ``plan``,
    with the plan's head first if ``head``."""

    epoch: int
    plan: RankEpochPlan
    worker: int
    workers: int
    head: bool


def reader_positions(plan: RankEpochPlan, splits: range, head: bool) -> Iterator[tuple[int, int]]:
    """(split, position) of every anchor one reader serves, in the plan's order
    (:class:`~lightning_stream.plan.ReaderOrder`), computed a window at a time."""
    order = ReaderOrder(plan, splits, head)
    for start in range(0, len(order), POSITIONS_WINDOW):
        split, position = order.positions(start, min(start + POSITIONS_WINDOW, len(order)))
        yield from zip(split.tolist(), position.tolist(), strict=True)


def job_positions(job: DecodeJob) -> Iterator[tuple[int, int]]:
    """The anchors of ``job``: its worker's contiguous block of the rank's splits."""
    splits = job.plan.splits
    if job.workers > 1:
        per_worker = len(splits) // job.workers
        splits = splits[job.worker * per_worker : (job.worker + 1) * per_worker]
    return reader_positions(job.plan, splits, job.head)


def batches(reader: EpisodeReader, epoch: int, positions: Iterator[tuple[int, int]], size: int):
    """The anchors at ``positions`` as batches of ``size``, each made when asked for."""
    reader.clear()  # a pass stopped early leaves its chunks
    # a round of the splits: their first chunks are read at once, not one by one
    first_round = list(itertools.islice(positions, reader.spec.num_splits))
    reader.begin_pass(epoch, first_round)
    positions = itertools.chain(first_round, positions)
    while chunk := list(itertools.islice(positions, size)):
        yield assemble(reader, epoch, chunk)


@dataclass(frozen=True)
class DecodeTask:
    """Windows of ``spec``'s dataset, for one reader process."""

    spec: VideoSpec

    def open(self, worker: int) -> EpisodeReader:
        return EpisodeReader(self.spec)

    def run(self, reader: EpisodeReader, job: DecodeJob) -> Iterator[Batch]:
        return batches(reader, job.epoch, job_positions(job), job.plan.batch_size)

    def counters(self, reader: EpisodeReader) -> dict[str, float]:
        return reader.counters()
