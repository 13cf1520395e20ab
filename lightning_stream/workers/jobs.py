"""What a reader runs, and the job it is told to begin next.

Both readers of a rank (:class:`~lightning_stream.workers.pool.WorkerPool`, processes;
:class:`~lightning_stream.workers.inline.InlineReader`, a thread) run a :class:`Task` over
*jobs*: a job is one reader's share of one epoch. Each can be given the job that probably
comes next (the next epoch's) while it serves the current one, so that it begins it as
soon as it is done; :class:`Lookahead` decides, when the next epoch is asked for, whether
that queued job is the one wanted.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

State = TypeVar("State")
Job = TypeVar("Job", contravariant=True)
T = TypeVar("T")

#: what names a job, so that a reader can tell whether the job it queued is the one asked for
Key = Hashable
#: each reader's job of one epoch, in reader order
Jobs = Sequence[Any]
#: the job queued behind the one served (its key and jobs), or none
Queued = tuple[Key, Jobs] | None
#: what the consuming thread makes of each payload
Finish = Callable[[Any], T]


class Task(Protocol[State, Job]):
    """What every reader of a source runs; picklable, since a worker process receives it.

    ``open`` runs once in each worker before its first job (an inline reader is given its
    state instead); ``run`` makes the job's payloads in order; ``counters`` is the state's
    counters (bytes loaded, rows read...), sent with every payload. A task may name, in
    an ``imports`` tuple, modules its jobs need that its own pickle does not: a worker
    pool imports them once, before it forks its workers.
    """

    def open(self, worker: int) -> State: ...

    def run(self, state: State, job: Job) -> Iterator[Any]: ...

    def counters(self, state: State) -> dict[str, float]: ...


class Lookahead:
    """The job queued behind the one being served, under the key that names it."""

    def __init__(self) -> None:
        self._queued: tuple[Key, int] | None = None

    def take(self, key: Key, current_finished: Callable[[], bool]) -> int | None:
        """The id of the queued job if ``key`` names it and the current job was served
        whole (else the queued job would wait behind its leftovers); ``None`` otherwise.
        Either way nothing is queued afterwards."""
        queued, self._queued = self._queued, None
        if queued is not None and queued[0] == key and current_finished():
            return queued[1]
        return None

    def put(self, key: Key, job_id: int) -> None:
        self._queued = (key, job_id)
