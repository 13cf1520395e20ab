"""A rank's resumable stream: epochs, the batches ``training_step`` consumed, the loader.

Both data modules keep one :class:`ResumableStream` per fit. It owns the stream state of
this rank, decides which epoch an iterator serves, and counts what ``training_step``
consumed (told by :class:`~lightning_stream.StreamStateCallback` after every batch), so
that Lightning's pre-fetch (the loader running ahead of training) never shows in a
checkpoint.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Protocol

from lightning_stream.batching import Batch, batch_len, drop_skipped, rechunk
from lightning_stream.pinning import pin_batch
from lightning_stream.plan import RankEpochPlan, full_epoch_steps
from lightning_stream.serving import ServingEngine
from lightning_stream.state import StreamState, check_identity


class ChunkSource(Protocol):
    """Where a stream's rows come from (a LanceDB table, a video dataset): what the data
    is, its splits, and the engine that reads them
    (:class:`~lightning_stream.serving.ServingEngine`)."""

    num_splits: int
    split_len: int
    engine: ServingEngine

    @property
    def identity(self) -> dict[str, Any]: ...

    def pin(self, identity: dict[str, Any]) -> None:
        """Read exactly the data version named in a saved identity from now on."""

    def counters(self) -> dict[str, float]:
        """The source's own counters (bytes loaded, queue depths, rows skipped)."""


class _EpochRun:
    """One started iterator of one epoch: its plan and the batches still in flight."""

    def __init__(self, plan: RankEpochPlan) -> None:
        self.plan = plan
        self.in_flight: deque[int] = deque()
        self.rows = 0


class ResumableStream:
    """This rank's part of a stream, with exact progress per split.

    Args:
        source: the rows.
        batch_size: rows per batch (per process), read anew for every plan (every new
            iterator, ``len()``), so that a batch-size finder changing it between trials
            is served the size it tries.
        num_workers: DataLoader worker processes of this rank (0: the main process).
        rank: this process's rank.
        world_size: processes in the run.
        owner: the data module's name, used in error messages.
        pin_memory: pin each training batch in page-locked memory when it leaves the
            loader (:mod:`lightning_stream.pinning`); default ``False``. Which rows form
            a batch does not depend on it.

    Attributes:
        lightning_epoch: Lightning's epoch counter, when a ``Trainer`` runs the stream
            (set by :class:`~lightning_stream.StreamStateCallback`). An epoch that starts
            fresh takes its number, so the data epoch is Lightning's epoch (a second
            ``fit()`` on the same trainer continues with the next epoch's shuffle).
        fixed_order_epoch: serve every epoch in this epoch's order (``overfit_batches``:
            the same batches every epoch); ``None`` (default) shuffles anew each epoch.
        last_epoch: the run's last epoch (``max_epochs - 1``, set by the callback): the
            source is not asked to begin an epoch after it. ``None``: no last epoch.
    """

    def __init__(
        self,
        source: ChunkSource,
        *,
        batch_size: Callable[[], int],
        num_workers: int,
        rank: int,
        world_size: int,
        owner: str,
        pin_memory: bool = False,
    ) -> None:
        self.source = source
        self.pin_memory = pin_memory
        self._batch_size = batch_size
        self.num_workers = num_workers
        self.rank = rank
        self.world_size = world_size
        self.owner = owner
        self.tracking = False
        self.resumed = False
        self.last_wait = 0.0
        self.lightning_epoch: Callable[[], int] | None = None
        self.fixed_order_epoch: int | None = None
        self.last_epoch: int | None = None
        self.state = StreamState(
            identity=source.identity,
            consumed=[0] * source.num_splits,
            topology=self.topology,
        )
        self._run: _EpochRun | None = None

    @property
    def batch_size(self) -> int:
        return self._batch_size()

    @property
    def topology(self) -> dict[str, int]:
        return {
            "world_size": self.world_size,
            "num_workers": self.num_workers,
            "batch_size": self.batch_size,
        }

    def counters(self) -> dict[str, float]:
        return self.source.counters()

    def loader(self) -> EpochLoader:
        return EpochLoader(self)

    def _epoch_finished(self) -> bool:
        state = self.state
        return state.epoch_done or all(c >= self.source.split_len for c in state.consumed)

    def _upcoming(self) -> tuple[int, list[int], int]:
        """Epoch, consumed counts and steps that the next iterator starts from."""
        state = self.state
        if self._run is not None or self._epoch_finished():
            return state.epoch + 1, [0] * self.source.num_splits, 0
        return state.epoch, list(state.consumed), state.steps

    def upcoming_epoch(self) -> int:
        """The epoch the next iterator serves, before Lightning's counter is applied."""
        return self._upcoming()[0]

    def has_partial_epoch(self) -> bool:
        """Whether the next iterator continues an epoch that some rows already reached."""
        epoch, consumed, _ = self._upcoming()
        return epoch == self.state.epoch and any(consumed)

    def next_plan(self) -> RankEpochPlan:
        """The plan of the epoch the next iterator serves (without starting it)."""
        return self._plan(self._upcoming()[1])

    def _plan(self, consumed: list[int]) -> RankEpochPlan:
        return RankEpochPlan(
            consumed=tuple(consumed),
            split_len=self.source.split_len,
            world_size=self.world_size,
            rank=self.rank,
            num_workers=self.num_workers,
            batch_size=self.batch_size,
        )

    def full_epoch_steps(self) -> int:
        return full_epoch_steps(
            self.source.num_splits, self.source.split_len, self.world_size, self.batch_size
        )

    def start_epoch(self) -> _EpochRun:
        """Begin the iterator of an epoch: the one in progress, or the next one, fresh."""
        state = self.state
        state.epoch, state.consumed, state.steps = self._upcoming()
        if self.lightning_epoch is not None and not any(state.consumed):
            # a fresh epoch loses nothing by taking Lightning's number
            state.epoch = self.lightning_epoch()
        state.epoch_done = False
        run = _EpochRun(self._plan(state.consumed))
        self._run = run
        return run

    def batches(self, run: _EpochRun) -> Iterator[Batch]:
        """The epoch's batches. Rows the source skipped count as consumed with the batch
        they were cut into, so a resume never serves them again; a batch left with no row
        is not handed out, its rows count with the next batch."""
        order = self.state.epoch if self.fixed_order_epoch is None else self.fixed_order_epoch
        # a fresh epoch of the same topology follows an epoch, unless the run stops
        upcoming = (
            self.state.epoch + 1 if self.fixed_order_epoch is None else order,
            self._plan([0] * self.source.num_splits),
        )
        if self.last_epoch is not None and self.state.epoch >= self.last_epoch:
            upcoming = None
        chunks = self.source.engine.serve(order, run.plan, upcoming)
        carried = 0
        for planned in rechunk(chunks, run.plan.sizes):
            batch = drop_skipped(planned)
            rows = carried + batch_len(planned)
            if not batch_len(batch):
                if self.world_size > 1:
                    raise RuntimeError(
                        f"every row of a batch of rank {self.rank} was skipped by the source;"
                        " this rank would take fewer steps than the others (DDP needs the"
                        " same count): raise batch_size, or repair the data"
                    )
                carried = rows
                continue
            carried = 0
            if self.tracking and run is self._run:
                run.in_flight.append(rows)
            yield batch

    def commit_batch(self, last_batch: bool) -> None:
        """Record that ``training_step`` finished the oldest batch still in flight."""
        run = self._run
        if run is None or not run.in_flight:
            raise RuntimeError(
                f"a training batch finished that {self.owner}'s train loader did not hand out;"
                " StreamStateCallback needs training batches to come from"
                f" {self.owner}.train_dataloader()"
            )
        run.rows += run.in_flight.popleft()
        state = self.state
        state.steps += 1
        for split, count in zip(run.plan.splits, run.plan.counts_after(run.rows), strict=True):
            state.consumed[split] = count
        state.epoch_done = last_batch or run.rows == run.plan.rows

    def local_progress(self) -> list[int]:
        """``[epoch, epoch_done, steps, *consumed]`` of this rank, for the gather."""
        state = self.state
        return [state.epoch, int(state.epoch_done), state.steps, *state.consumed]

    def merged_state(
        self, progress: list[int], complete: bool, provenance: dict[str, Any]
    ) -> StreamState:
        epoch, done, steps, *consumed = progress
        return StreamState(
            identity=self.source.identity,
            epoch=epoch,
            consumed=consumed,
            epoch_done=bool(done),
            steps=steps,
            complete=complete,
            topology=self.topology,
            provenance=provenance,
        )

    def load(self, state: StreamState) -> None:
        """Continue from a merged state saved by any topology."""
        if not state.complete:
            raise IncompleteStateError(
                "this checkpoint was written by one rank alone (after an exception), so it"
                " lacks the other ranks' progress and cannot resume exactly; resume from the"
                " last checkpoint that all ranks saved"
            )
        source = self.source
        check_identity(state.identity, source.identity, self.owner)
        source.pin(state.identity)
        if len(state.consumed) != self.source.num_splits:
            raise ValueError(
                f"the checkpoint holds {len(state.consumed)} splits but {self.owner} has"
                f" num_splits={self.source.num_splits}"
            )
        self.state = StreamState(
            identity=self.source.identity,
            epoch=state.epoch,
            consumed=list(state.consumed),
            epoch_done=state.epoch_done,
            steps=state.steps,
            topology=self.topology,
        )
        self._run = None
        self.resumed = True
        _ = self.next_plan().steps  # fail now, not mid-epoch, if this topology cannot resume


class IncompleteStateError(ValueError):
    """A checkpoint lacks some ranks' progress (one rank wrote it alone)."""


class EpochLoader:
    """What ``train_dataloader()`` returns: each ``iter()`` serves one epoch of this rank.

    Nothing is read until the first ``next()``: Lightning calls ``iter()`` once only to
    check that the loader is iterable. ``len()`` is the number of batches per rank of a
    full epoch on this topology, so the progress bar shows a total; a resumed epoch has
    fewer, and :class:`~lightning_stream.StreamStateCallback` tells Lightning's loop.
    """

    def __init__(self, stream: ResumableStream) -> None:
        self.stream = stream

    def __iter__(self) -> Iterator[Batch]:
        return _LazyEpoch(self.stream)

    def __len__(self) -> int:
        return self.stream.full_epoch_steps()

    def state_dict(self) -> dict[str, Any]:
        """Empty: Lightning saves a loader's state from rank 0 only, which cannot resume
        other ranks; StreamStateCallback gathers every rank instead. Having this method
        tells Lightning the loader is resumable."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Nothing to load; see :meth:`state_dict`."""


class _LazyEpoch(Iterator[Batch]):
    def __init__(self, stream: ResumableStream) -> None:
        self._stream = stream
        self._batches: Iterator[Batch] | None = None

    def __next__(self) -> Batch:
        stream = self._stream
        started = time.perf_counter()
        if self._batches is None:
            self._batches = stream.batches(stream.start_epoch())
        batch = next(self._batches)
        if stream.pin_memory:
            batch = pin_batch(batch)
        stream.last_wait = time.perf_counter() - started
        return batch


def steps_to_skip(stream: ResumableStream, lightning_batches: int, limit: int | float) -> int:
    """Where Lightning's batch counter must stand so that the epoch ends with the stream.

    Lightning ends an epoch after ``num_training_batches`` batches, counting those done
    before the checkpoint; after an elastic resume the stream's remainder has another
    length than Lightning's count implies. With ``limit_train_batches`` below the epoch
    length, Lightning's own count is kept: the user asked for that many batches.
    """
    total = stream.full_epoch_steps()
    if limit < total:
        return lightning_batches
    return total - stream.next_plan().steps
