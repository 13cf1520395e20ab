"""ServingEngine: how a rank's batches are read, for every source format.

A source (a LanceDB table, a LeRobot dataset) is a :class:`SourceFormat`: it says what
one reader reads for its share of an epoch (a *job*, made from a
:class:`~lightning_stream.plan.ReaderOrder`) and how a payload becomes a batch. The
engine owns everything else, the same for every format:

- ``num_workers=0``: the rank's reader runs on a thread of this process
  (:class:`~lightning_stream.workers.inline.InlineReader`), a few batches ahead of
  ``training_step``; what the user's transform draws at random comes from the main
  thread's generators, in batch order, because the thread makes batches without it and
  the transform runs here. A job whose work only computes on local data under the GIL
  (its ``runs_on_caller`` is true: packed blocks cut from a local copy) is run by the
  thread that asks for its batches instead, as each is asked for: a thread would not
  overlap that work with the training step, only contend with the training loop for the
  GIL.
- ``num_workers>0``: the readers are worker processes
  (:class:`~lightning_stream.workers.pool.WorkerPool`), started once and kept while their
  number and slot size stay the same. After an elastic resume the lagging rows (the
  plan's *head*) come first, read by this process's thread while the workers start; the
  workers then serve their blocks of splits.
- When an epoch starts, its readers are also given the epoch that probably follows: they
  begin it once they are done, so its first batches are ready before it is asked for.
- A worker that dies becomes one error that says how to resume.
- Payloads are made into batches by the readers; this process only wraps what they made
  (:meth:`SourceFormat.finish`), so no Arrow or image conversion runs between steps.
- Counters: every reader's, added up, with those of pools already closed.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from lightning_stream.batching import Batch
from lightning_stream.plan import RankEpochPlan, ReaderOrder
from lightning_stream.workers.inline import InlineReader
from lightning_stream.workers.jobs import Task
from lightning_stream.workers.pool import WorkerDied, WorkerPool


@dataclass(frozen=True)
class PoolSpec:
    """The worker processes a format wants: their task, the bytes of each shared-memory
    slot (a batch that does not fit crosses a pipe), their name as ``ps`` shows it, and
    the seed of worker 0's generators (worker ``k`` gets ``seed + k``)."""

    task: Task
    slot_bytes: int
    name: str
    seed: int = 0


class SourceFormat(Protocol):
    """What a source adds to the engine."""

    #: what a worker does, for the error when one dies ("reading table 'samples'")
    activity: str
    #: counters that add up over the run, kept when a pool closes (others are gauges)
    cumulative: tuple[str, ...]

    @property
    def identity(self) -> dict[str, Any]:
        """What the data is; a job queued under another identity is not reused."""

    def reader_here(self) -> tuple[Task, Any]:
        """The task and state of this process's reading thread (asked once)."""

    def pool(self, workers: int, batch_size: int) -> PoolSpec:
        """The worker processes for ``workers`` readers of batches of ``batch_size``."""

    def job(self, epoch: int, order: ReaderOrder, pooled: bool) -> Any:
        """What one reader reads of ``epoch``: the rows of ``order``, in order, cut into
        ``order.sizes``; ``pooled``: for a worker process, else for this process (where a
        job with a true ``runs_on_caller`` is made on the thread that asks for it)."""

    def finish(self, payload: Any, pooled: bool) -> Batch:
        """A reader's payload as the batch ``training_step`` receives, on the main thread
        (the user's transform runs here when the reader is the thread here)."""


class ServingEngine:
    """The readers of one rank's stream of ``format``, kept across epochs until
    :meth:`close`."""

    def __init__(self, format: SourceFormat) -> None:
        self.format = format
        self.pool: WorkerPool | None = None
        self._pool_shape: tuple[int, int] | None = None
        self._here: tuple[Task, Any] | None = None
        self._inline: InlineReader | None = None
        self._closed_pools: dict[str, float] = {}

    def serve(
        self,
        epoch: int,
        plan: RankEpochPlan,
        upcoming: tuple[int, RankEpochPlan] | None = None,
    ) -> Iterator[Batch]:
        """This rank's batches of ``epoch`` under ``plan``, in plan order; ``upcoming``:
        the epoch (and its plan) that probably follows, begun once this one is read."""
        fmt = self.format
        key = self._key(epoch, plan)
        if plan.num_workers == 0:
            yield from self._serve_here(key, self._jobs(epoch, plan), upcoming)
            return
        pool = self.start_pool(plan.num_workers, plan.batch_size)
        if plan.num_workers > 1 and plan.head:
            head = [fmt.job(epoch, ReaderOrder(plan, range(0), head=True), pooled=False)]
            for batch in self._serve_here(("head", key), head):
                pool.ready()  # a worker that failed to start says so now
                yield batch
        after = upcoming and (self._key(*upcoming), self._jobs(*upcoming))
        try:
            yield from pool.serve(key, self._jobs(epoch, plan), self._finish_pooled, after)
        except WorkerDied as exc:
            self.close_pool()
            raise RuntimeError(
                f"a reading worker of rank {plan.rank} died while {fmt.activity} ({exc}). Nothing"
                " after the last checkpoint is lost: resume with trainer.fit(...,"
                " ckpt_path=<last checkpoint>)"
            ) from exc

    def _key(self, epoch: int, plan: RankEpochPlan) -> Hashable:
        return (repr(self.format.identity), epoch, plan)

    def _jobs(self, epoch: int, plan: RankEpochPlan) -> list[Any]:
        """Each reader's job: the thread's whole plan, or each worker's block of splits."""
        pooled = plan.num_workers > 0
        return [
            self.format.job(epoch, ReaderOrder.of_worker(plan, worker), pooled)
            for worker in range(max(1, plan.num_workers))
        ]

    def _serve_here(
        self,
        key: Hashable,
        jobs: list[Any],
        upcoming: tuple[int, RankEpochPlan] | None = None,
    ) -> Iterator[Batch]:
        """The batches of ``jobs[0]``, read in this process: by the reading thread (which
        begins ``upcoming`` once they are read), or by this thread as each is asked for
        where the job only computes on local data (``runs_on_caller``)."""
        if not getattr(jobs[0], "runs_on_caller", False):
            after = upcoming and (self._key(*upcoming), self._jobs(*upcoming))
            yield from self._inline_reader().serve(key, jobs, self._finish_here, after)
            return
        if self._inline is not None:  # its thread would share the state this job updates
            inline, self._inline = self._inline, None
            inline.close()
        task, state = self._reader_here()
        payloads = task.run(state, jobs[0])
        try:
            for payload in payloads:
                yield self._finish_here(payload)
        finally:
            payloads.close()

    def _finish_here(self, payload: Any) -> Batch:
        return self.format.finish(payload, pooled=False)

    def _finish_pooled(self, payload: Any) -> Batch:
        return self.format.finish(payload, pooled=True)

    def _inline_reader(self) -> InlineReader:
        if self._inline is None:
            self._inline = InlineReader(*self._reader_here())
        return self._inline

    def _reader_here(self) -> tuple[Task, Any]:
        if self._here is None:
            self._here = self.format.reader_here()
        return self._here

    def start_pool(self, workers: int, batch_size: int) -> WorkerPool:
        """The rank's worker processes, started now (without waiting for them) unless the
        running ones have the same number and slot size."""
        spec = self.format.pool(workers, batch_size)
        if self.pool is None or self._pool_shape != (workers, spec.slot_bytes):
            self.close_pool()
            self.pool = WorkerPool(spec.task, workers, spec.slot_bytes, spec.name, spec.seed)
            self._pool_shape = (workers, spec.slot_bytes)
        return self.pool

    def close_pool(self) -> None:
        if self.pool is None:
            return
        for counters in self.pool.counters:
            for name in self.format.cumulative:
                self._closed_pools[name] = self._closed_pools.get(name, 0.0) + (counters or {}).get(
                    name, 0.0
                )
        pool, self.pool = self.pool, None
        pool.close()

    def close(self) -> None:
        """Stop every reader (at once: they hold nothing the stream needs)."""
        if self._inline is not None:
            inline, self._inline = self._inline, None
            inline.close()
        self.close_pool()

    def reader_counters(self) -> list[dict[str, float]]:
        """Each reader's counters: this process's first, then each worker's as of its
        last batch (empty before it sent one)."""
        if self._inline is not None:
            here = dict(self._inline.counters[0])  # never the state the thread changes
        else:
            task, state = self._reader_here()
            here = task.counters(state)
        workers = [dict(c or {}) for c in self.pool.counters] if self.pool is not None else []
        return [here, *workers]

    def counters(self) -> dict[str, float]:
        """Every reader's counters added up, with those of the pools already closed."""
        totals = dict(self._closed_pools)
        for counters in self.reader_counters():
            for name, value in counters.items():
                totals[name] = totals.get(name, 0.0) + value
        return totals
