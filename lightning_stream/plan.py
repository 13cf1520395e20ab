"""Which sample goes to which rank, worker and step: pure arithmetic, no I/O.

A stream is cut into ``num_splits`` splits of equal length (which rows each holds, in
which order: :mod:`lightning_stream.placement`). Rank ``r`` of ``W`` owns a contiguous
block of ``num_splits / W`` splits and its worker ``k`` of ``K`` a contiguous sub-block.
Within one reader the rows of its splits arrive round-robin, one row per split per cycle
(:class:`ReaderOrder`, computed a window at a time); the workers' batches are handed out
in turn.

The state of a stream is, per split, how many of its rows ``training_step`` has consumed
in the current epoch. After an elastic resume a rank's splits can have unequal counts; the
rank then first serves the lagging splits until its counts are level (lowest count first,
lower split index on ties: the *head*), so that its workers start from equal counts and
their round-robin stays arithmetic. With several workers the head is served in the main
process, the cycles by the workers.

Every rank must take the same number of steps in an epoch (DDP pairs collectives by
step), so :class:`RankEpochPlan` shapes each rank's remainder into the same number of
batches, all of them non-empty and none larger than ``batch_size``.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np


def check_topology(num_splits: int, world_size: int, num_workers: int) -> None:
    """Raise ``ValueError`` unless ``num_splits`` divides evenly over ranks and workers."""
    if num_splits <= 0:
        raise ValueError(f"num_splits must be a positive integer, got {num_splits}")
    parts = world_size * max(1, num_workers)
    if num_splits % parts:
        options = [d for d in range(1, num_splits + 1) if num_splits % d == 0]
        raise ValueError(
            f"num_splits={num_splits} is not divisible by world_size * max(1, num_workers)"
            f" = {world_size} * {max(1, num_workers)} = {parts}. Choose num_splits as a"
            f" multiple of {parts} (e.g. {parts * math.ceil(num_splits / parts)}), or a"
            f" topology whose product divides {num_splits}: {options}."
        )


def rank_splits(num_splits: int, world_size: int, rank: int) -> range:
    """The contiguous block of splits that ``rank`` owns."""
    per_rank = num_splits // world_size
    return range(rank * per_rank, (rank + 1) * per_rank)


def worker_rows(rows: int, num_workers: int, batch_size: int, rows_per_worker: int) -> list[int]:
    """Rows each worker has delivered after ``rows`` rows of a round-robin DataLoader.

    Every worker holds ``rows_per_worker`` rows and cuts them into batches of
    ``batch_size`` (its last batch may be short); the DataLoader returns one batch of
    each worker in turn. ``rows`` may end inside a batch.
    """
    workers = max(1, num_workers)
    delivered = [0] * workers
    if rows_per_worker == 0:
        return delivered
    batches_per_worker = math.ceil(rows_per_worker / batch_size)
    full_rounds = min(rows // (workers * batch_size), batches_per_worker - 1)
    delivered = [full_rounds * batch_size] * workers
    left = rows - full_rounds * workers * batch_size
    this_round = min(batch_size, rows_per_worker - full_rounds * batch_size)
    for worker in range(workers):
        take = min(this_round, left)
        delivered[worker] += take
        left -= take
    if left:
        raise ValueError(f"{rows} rows exceed the {workers * rows_per_worker} the workers hold")
    return delivered


def catch_up_order(counts: Sequence[int]) -> list[int]:
    """Indices of the splits that serve each row until every count equals the highest."""
    level = max(counts, default=0)
    pending = [(count, index) for index, count in enumerate(counts) if count < level]
    heapq.heapify(pending)
    order = []
    while pending:
        count, index = heapq.heappop(pending)
        order.append(index)
        if count + 1 < level:
            heapq.heappush(pending, (count + 1, index))
    return order


@dataclass(frozen=True)
class BatchSizes(Sequence[int]):
    """``steps`` batch sizes that add up to ``rows``: full batches first, none empty (a
    partial batch, then batches of one row, when ``rows`` is short of full ones). Held as
    three numbers, whatever the epoch's length."""

    rows: int
    steps: int
    batch_size: int

    def __post_init__(self) -> None:
        if not self.steps <= self.rows <= self.steps * self.batch_size:
            raise ValueError(
                f"cannot cut {self.rows} rows into {self.steps} batches of 1..{self.batch_size}"
            )

    @classmethod
    def cut(cls, rows: int, batch_size: int) -> BatchSizes:
        """Full batches of ``rows``, then the rest."""
        return cls(rows, -(-rows // batch_size), batch_size)

    @cached_property
    def full(self) -> int:
        """Full batches: as many as leave a row for every later step."""
        if self.batch_size == 1:
            return self.steps
        return min(self.steps, (self.rows - self.steps) // (self.batch_size - 1))

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> int:  # type: ignore[override]
        if not -self.steps <= step < self.steps:
            raise IndexError(step)
        step %= self.steps
        if step < self.full:
            return self.batch_size
        if step == self.full:
            return self.rows - self.full * self.batch_size - (self.steps - self.full - 1)
        return 1

    def __iter__(self) -> Iterator[int]:
        yield from itertools.repeat(self.batch_size, self.full)
        if self.full < self.steps:
            yield self[self.full]
            yield from itertools.repeat(1, self.steps - self.full - 1)


@dataclass(frozen=True)
class RankEpochPlan:
    """One rank's part of one epoch, from a (possibly partly consumed) merged state.

    Args:
        consumed: rows consumed so far in this epoch, per split (all ``num_splits``).
        split_len: rows in every split.
        world_size: processes of this run.
        rank: this process.
        num_workers: DataLoader workers of this rank (0: in the main process).
        batch_size: the largest batch ``training_step`` receives.
    """

    consumed: tuple[int, ...]
    split_len: int
    world_size: int
    rank: int
    num_workers: int
    batch_size: int

    @cached_property
    def splits(self) -> range:
        return rank_splits(len(self.consumed), self.world_size, self.rank)

    @cached_property
    def start(self) -> tuple[int, ...]:
        return tuple(self.consumed[s] for s in self.splits)

    @cached_property
    def head(self) -> list[int]:
        """Local split index of each row served before the cycles: the lagging splits'
        rows after an elastic resume, until every count is level. A rank with several
        workers serves them in its own process; one reader catches up by itself, in the
        same order."""
        return catch_up_order(self.start)

    @cached_property
    def level(self) -> int:
        """The equal count of every split once the head rows are served."""
        return max(self.start, default=0)

    @cached_property
    def rows(self) -> int:
        return sum(self.split_len - count for count in self.start)

    @cached_property
    def steps(self) -> int:
        """Batches every rank takes: enough for the rank with the most rows left."""
        per_rank = len(self.splits)
        remaining = [
            sum(self.split_len - c for c in self.consumed[r * per_rank : (r + 1) * per_rank])
            for r in range(self.world_size)
        ]
        steps = math.ceil(max(remaining) / self.batch_size)
        if min(remaining) < steps:
            raise ValueError(
                f"cannot resume this epoch on {self.world_size} processes: rank"
                f" {remaining.index(min(remaining))} has {min(remaining)} samples left and"
                f" another rank {max(remaining)}, but DDP needs every rank to take the same"
                f" {steps} steps with at least one sample each. Resume on the number of"
                " processes that saved the checkpoint, or from an earlier checkpoint."
            )
        return steps

    @cached_property
    def sizes(self) -> BatchSizes:
        return BatchSizes(self.rows, self.steps, self.batch_size)

    def head_order(self) -> tuple[np.ndarray, np.ndarray]:
        """``(local split, position in split)`` of each head row, in serving order."""
        splits = np.asarray(self.head, dtype=np.int64)
        positions = np.asarray(self.start, dtype=np.int64)[splits] if len(splits) else splits
        if len(splits):
            # the k-th head row of a split is its (start + k)-th row
            order = np.argsort(splits, kind="stable")
            firsts = np.searchsorted(splits[order], splits[order])
            ranks = np.empty_like(order)
            ranks[order] = np.arange(len(order)) - firsts
            positions = positions + ranks
        return splits, positions

    def counts_after(self, rows: int) -> list[int]:
        """Per-split consumed counts of this rank's splits after ``rows`` rows of the plan."""
        counts = list(self.start)
        served = min(rows, len(self.head))
        for index in self.head[:served]:
            counts[index] += 1
        rows -= served
        if rows <= 0:
            return counts
        workers = max(1, self.num_workers)
        per_worker = len(counts) // workers
        delivered = worker_rows(
            rows, self.num_workers, self.batch_size, per_worker * (self.split_len - self.level)
        )
        for worker, given in enumerate(delivered):
            cycles, extra = divmod(given, per_worker)
            for offset in range(per_worker):
                counts[worker * per_worker + offset] = (
                    self.level + cycles + (1 if offset < extra else 0)
                )
        return counts


@dataclass(frozen=True)
class ReaderOrder:
    """The ``(split, position)`` of every row one reader serves, in its order, a window at
    a time: nothing per row of the reader's share is held.

    With at most one worker, the one reader serves the whole plan (head first); with
    several, the head is served by the main process before the workers
    (``ReaderOrder(plan, range(0), head=True)``) and each worker reads its contiguous
    sub-block of splits, one row per split per cycle, from ``plan.level``.
    """

    plan: RankEpochPlan
    splits: range
    head: bool

    @classmethod
    def of_worker(cls, plan: RankEpochPlan, worker: int) -> ReaderOrder:
        """Worker ``worker``'s order (0 workers: the main process's reading thread)."""
        if plan.num_workers <= 1:
            return cls(plan, plan.splits, head=True)
        per_worker = len(plan.splits) // plan.num_workers
        return cls(plan, plan.splits[worker * per_worker : (worker + 1) * per_worker], False)

    @cached_property
    def sizes(self) -> BatchSizes:
        """The batches this reader cuts its rows into: the plan's own when it serves the
        whole plan (so that every rank takes the same number of steps), else full batches
        and then the rest."""
        if self.head and self.splits == self.plan.splits:
            return self.plan.sizes
        return BatchSizes.cut(len(self), self.plan.batch_size)

    @cached_property
    def _head(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.head:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        local, positions = self.plan.head_order()
        return local + self.plan.splits.start, positions

    @cached_property
    def spans(self) -> dict[int, tuple[int, int]]:
        """The first position this reader serves of each split it serves, and the
        position after its last."""
        heads, positions = self._head
        spans: dict[int, tuple[int, int]] = {}
        for split, position in zip(heads.tolist(), positions.tolist(), strict=True):
            spans[split] = (spans.get(split, (position,))[0], position + 1)
        if self.plan.level < self.plan.split_len:
            for split in self.splits:
                spans[split] = (spans.get(split, (self.plan.level,))[0], self.plan.split_len)
        return spans

    def __len__(self) -> int:
        cycles = self.plan.split_len - self.plan.level
        return len(self._head[0]) + len(self.splits) * cycles

    def positions(self, start: int = 0, stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(split, position)`` of the rows at serving positions ``[start, stop)``: the
        head's rows, then one row of each split in turn from ``plan.level``."""
        stop = len(self) if stop is None else stop
        heads, positions = self._head
        head = len(heads)
        cycle = np.arange(max(start, head), max(stop, head), dtype=np.int64) - head
        width = max(1, len(self.splits))
        splits = np.concatenate([heads[start:stop], self.splits.start + cycle % width])
        rows = np.concatenate([positions[start:stop], self.plan.level + cycle // width])
        return splits, rows


def full_epoch_steps(num_splits: int, split_len: int, world_size: int, batch_size: int) -> int:
    """Batches per rank in an epoch that starts from nothing consumed."""
    return math.ceil(num_splits // world_size * split_len / batch_size)
