"""InlineReader: a task's jobs on one thread of the main process (``num_workers=0``).

It serves like a :class:`~lightning_stream.workers.pool.WorkerPool` of one worker, with no
process: the task runs on a thread, ``depth`` payloads ahead of the consumer, and a job
queued behind the current one (the next epoch) starts as soon as the current one is
made. So a training step overlaps the making of the next batch (PyAV and numpy release
the GIL while they decode and copy), and the first batch of the next epoch is made
while the last ones of this epoch are trained on. Nothing runs in another process, which
is what ``num_workers=0`` is for: a debugger and a profiler see every frame.

The thread holds only the queues it shares with the reader, never the reader itself: a
reader that is no longer referenced (a data module dropped without ``teardown``) stops
its thread, which then lets go of the task's state. At interpreter exit every reader still
running is stopped and its thread joined (after the payload it is making) before Python
tears down: a lance read or an epoch's split drawn on a thread that outlived that point
hung the exit or crashed it (a script that ends without ``teardown``).
"""

from __future__ import annotations

import atexit
import threading
import weakref
from collections import deque
from collections.abc import Iterator
from typing import Any

from lightning_stream.workers.jobs import Finish, Jobs, Key, Lookahead, Queued, T, Task

END_WAIT_S = 0.05  # the end of a job follows its last payload at once

_RUNNING: weakref.WeakSet[InlineReader] = weakref.WeakSet()


def _stop_running() -> None:
    for reader in list(_RUNNING):
        reader.close()


class _Line:
    """What the thread and the consumer share: the jobs to run and the payloads made."""

    def __init__(self, task: Any, state: Any, depth: int) -> None:
        self.task, self.state, self.depth = task, state, depth
        self.condition = threading.Condition()
        self.jobs: deque[tuple[int, Any]] = deque()
        self.out: deque[tuple[int, str, Any]] = deque()
        self.floor = 0  # jobs numbered below it are dropped
        self.closed = False
        self.counters: Any = None  # the task's, as of the last payload made

    def close(self) -> None:
        with self.condition:
            self.closed = True
            self.jobs.clear()
            self.out.clear()
            self.condition.notify_all()


def _loop(line: _Line) -> None:
    while True:
        with line.condition:
            while not line.jobs and not line.closed:
                line.condition.wait()
            if line.closed:
                return
            job_id, job = line.jobs.popleft()
        _run(line, job_id, job)


def _run(line: _Line, job_id: int, job: Any) -> None:
    payloads = line.task.run(line.state, job)
    try:
        for payload in payloads:
            line.counters = line.task.counters(line.state)
            if not _put(line, job_id, "batch", payload):
                return
        _put(line, job_id, "end", None)
    except BaseException as exc:  # a panic in Rust code (pyo3) is not an Exception
        _put(line, job_id, "error", exc)
    finally:
        payloads.close()


def _put(line: _Line, job_id: int, kind: str, payload: Any) -> bool:
    """Hand a made payload over once there is room; ``False`` if the job was dropped."""
    with line.condition:
        while (
            kind == "batch"  # a job's end holds no memory: never held back
            and sum(entry[1] == "batch" for entry in line.out) >= line.depth
            and job_id >= line.floor
            and not line.closed
        ):
            line.condition.wait()
        if job_id < line.floor or line.closed:
            return False
        line.out.append((job_id, kind, payload))
        line.condition.notify_all()
        return True


class InlineReader:
    """``task`` run on a thread over ``state`` (the caller made it: no ``open``).

    Args:
        task: what the thread runs (its ``open`` is not called).
        state: what ``run`` reads and updates; only the thread touches it while a job runs.
        depth: payloads made ahead of the consumer (memory: ``depth`` batches).
    """

    workers = 1

    def __init__(self, task: Task, state: Any, depth: int = 4) -> None:
        self._line = line = _Line(task, state, depth)
        line.counters = task.counters(state)  # before the thread may change the state
        self._next_id = 0
        self._current: int | None = None
        self._lookahead = Lookahead()
        self._thread = threading.Thread(target=_loop, args=(line,), name="inline-reader")
        self._thread.daemon = True
        self._thread.start()
        self._finalizer = weakref.finalize(self, line.close)
        _RUNNING.add(self)
        # atexit calls the latest registered first: before the exit hooks of libraries
        # imported by now (lancedb shuts its runtime down in one)
        atexit.unregister(_stop_running)
        atexit.register(_stop_running)

    @property
    def counters(self) -> list[dict[str, float]]:
        """The task's counters as of the last payload made (or of the start)."""
        return [self._line.counters]

    def serve(self, key: Key, jobs: Jobs, finish: Finish[T], after: Queued = None) -> Iterator[T]:
        """The payloads of ``jobs[0]``, ``finish``-ed on the calling thread; as
        :meth:`WorkerPool.serve <lightning_stream.workers.pool.WorkerPool.serve>` with
        one worker."""
        line = self._line
        with line.condition:
            job_id = self._lookahead.take(key, self._current_finished)
            if job_id is None:
                job_id = self._replace(jobs[0])
            if after is not None:
                self._lookahead.put(after[0], self._add(after[1][0]))
            self._current = job_id
        while True:
            with line.condition:
                while not line.out or line.out[0][0] < job_id:
                    if line.out:
                        line.out.popleft()  # a dropped job's
                        line.condition.notify_all()
                    elif line.closed:
                        raise RuntimeError(
                            "the reader was stopped (teardown) while an epoch was served"
                        )
                    else:
                        line.condition.wait()
                _, kind, payload = line.out.popleft()
                line.condition.notify_all()
            if kind == "end":
                self._current = None  # served whole: the queued job may start
                return
            if kind == "error":
                raise payload
            yield finish(payload)

    def _current_finished(self) -> bool:
        """Whether only the current job's end is left of it (its consumer stopped at its
        last payload); otherwise the queued job would wait behind its leftovers."""
        if self._current is None:
            return True
        out = self._line.out

        def mine() -> list:
            return [entry for entry in out if entry[0] == self._current]

        if not mine():
            self._line.condition.wait_for(lambda: bool(mine()), END_WAIT_S)
        left = mine()
        return bool(left) and left[0][1] == "end"

    def _add(self, job: Any) -> int:
        job_id, self._next_id = self._next_id, self._next_id + 1
        self._line.jobs.append((job_id, job))
        self._line.condition.notify_all()
        return job_id

    def _replace(self, job: Any) -> int:
        """Drop every job made or waiting, then add ``job``."""
        line = self._line
        line.floor = self._next_id
        line.jobs.clear()
        line.out = deque(entry for entry in line.out if entry[0] >= line.floor)
        return self._add(job)

    def ready(self) -> bool:
        return True

    def close(self) -> None:
        """Stop the thread after the payload it is making."""
        self._finalizer()
        self._thread.join()
