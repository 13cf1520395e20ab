"""WorkerPool: the worker processes of one rank, for both data modules.

Why its own processes rather than a torch ``DataLoader``'s: a forkserver or spawn child
runs the training script's imports again (Lightning and torch: seconds of CPU per start on
a small host) and a DataLoader worker started by a forkserver watches the forkserver,
not the trainer, so a killed trainer left its workers waiting forever. Here a supervisor
process (:mod:`~lightning_stream.workers.process`) imports only what the task needs and
forks the workers; every one of them exits the moment the trainer is gone; batches cross
in shared memory slots (:mod:`~lightning_stream.workers.slots`) with only a few bytes on
the pipe, and at most ``SLOTS`` batches per worker wait in them, which bounds memory.

A *task* (:class:`~lightning_stream.workers.jobs.Task`) is what each worker runs, a *job*
one worker's share of one epoch. :meth:`WorkerPool.serve` hands out the
workers' payloads in turn (worker 0's first, worker 1's first, ..., worker 0's second),
as a ``DataLoader`` does, so which batch comes when does not depend on the workers'
timing. A job can be queued behind the current one (the next epoch's), so that a worker
starts on it as soon as it finishes the current one.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from multiprocessing.connection import Connection, Pipe, wait
from pathlib import Path
from typing import Any

from lightning_stream.workers.checks import main_script_path, pickled_modules
from lightning_stream.workers.jobs import Finish, Jobs, Key, Lookahead, Queued, T, Task
from lightning_stream.workers.slots import Arena, fetch, from_pipe, post, unpack

CLOSE_TIMEOUT_S = 5.0
_ROOT = str(Path(__file__).resolve().parents[2])
_BOOT = (
    f"import sys; sys.path.insert(0, {_ROOT!r}); "
    "from lightning_stream.workers.process import supervise; supervise()"
)


class WorkerDied(RuntimeError):
    """A worker exited while the main process waited for one of its batches."""


class WorkerStartError(RuntimeError):
    """A worker could not start (its task failed to load or to open)."""


class WorkerPool:
    """``workers`` processes running ``task``, started at once, kept until :meth:`close`.

    Args:
        task: what each worker runs (see the module's docstring); picklable.
        workers: processes to start.
        slot_bytes: bytes of each of a worker's ``SLOTS`` shared memory slots; a payload
            that does not fit crosses the pipe instead.
        name: the processes' name (as ``ps`` shows it), ``<name>-<worker>``.
        seed: worker ``k`` seeds Python's, numpy's and (if its task uses it) torch's
            global generators with ``seed + k``.
    """

    def __init__(self, task: Task, workers: int, slot_bytes: int, name: str, seed: int = 0):
        data = pickle.dumps(task)
        modules = pickled_modules(data) | set(getattr(task, "imports", ()))
        self.workers = workers
        self.arena = Arena(workers, slot_bytes)
        lifeline, self._lifeline = os.pipe()
        status, status_end = os.pipe()
        jobs = [Pipe(duplex=False) for _ in range(workers)]
        results = [Pipe(duplex=False) for _ in range(workers)]
        fds = {
            "lifeline": lifeline,
            "status": status_end,
            "arena": self.arena.fd,
            "jobs": [reader.fileno() for reader, _ in jobs],
            "results": [writer.fileno() for _, writer in results],
        }
        config = {
            "cwd": os.getcwd(),
            "sys_path": list(sys.path),
            # the training script runs in the workers only if the task is defined in it
            "main_path": main_script_path() if "__main__" in modules else None,
            "modules": sorted(modules - {"__main__"}),
            "task": data,
            "fds": fds,
            "workers": workers,
            "slot_bytes": self.arena.slot_bytes,
            "name": name,
            "seed": seed,
        }
        passed = [lifeline, status_end, self.arena.fd, *fds["jobs"], *fds["results"]]
        for fd in passed:
            os.set_inheritable(fd, True)
        self.supervisor = subprocess.Popen(
            [sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, pass_fds=passed
        )
        for fd in (lifeline, status_end):
            os.close(fd)
        for reader, writer in (*[(r, None) for r, _ in jobs], *[(None, w) for _, w in results]):
            (reader or writer).close()
        self.jobs: list[Connection] = [writer for _, writer in jobs]
        self.results: list[Connection] = [reader for reader, _ in results]
        self.status = Connection(status, writable=False)
        self.pids: list[int | None] = [None] * workers
        self.exit_codes: dict[int, int] = {}
        self.counters: list[Any] = [None] * workers  # each worker's, as of its last message
        self._early: list[deque] = [deque() for _ in range(workers)]  # read while polling
        self.start_error: WorkerStartError | None = None
        self._next_id = 0
        self._current: int | None = None
        self._ended = [True] * workers  # which workers sent the current job's end
        self._lookahead = Lookahead()
        try:
            self.supervisor.stdin.write(pickle.dumps(config))
            self.supervisor.stdin.close()
        except OSError:
            pass  # it died at once; the first wait for a worker says why
        closed = (self.supervisor, self.jobs, self.results, self.status, self.arena, self.pids)
        self._finalizer = weakref.finalize(self, _close, self._lifeline, *closed)

    # -- starting -------------------------------------------------------------------
    def ready(self) -> bool:
        """Whether every worker has started; raises :class:`WorkerStartError` with a
        worker's own message as soon as one failed. Never blocks."""
        if self.start_error is not None:
            raise self.start_error
        for worker in range(self.workers):
            while self.pids[worker] is None and self.results[worker].poll():
                message = self._receive(worker)
                if message is not None:
                    self._early[worker].append(message)
        return all(pid is not None for pid in self.pids)

    def _receive(self, worker: int) -> tuple | None:
        """The worker's next message; ``None`` for its start message, handled here."""
        try:
            message = fetch(self.results[worker])
        except (EOFError, OSError) as exc:
            raise self._died(worker) from exc
        kind = message[0]
        if kind == "ready":
            self.pids[worker] = message[1]
            return None
        if kind == "start-error":
            error_type, text = message[3:]
            self.start_error = WorkerStartError(f"worker {worker} could not start: {text}")
            self.start_error.__cause__ = _rebuilt(error_type, text)
            raise self.start_error
        return message

    def _died(self, worker: int) -> WorkerDied:
        """Why the worker is gone, with its exit code when the supervisor tells it."""
        deadline = time.monotonic() + 1.0
        while worker not in self.exit_codes and self.status.poll(
            max(0.0, deadline - time.monotonic())
        ):
            try:
                stopped, code = fetch(self.status)
            except (EOFError, OSError):
                break
            self.exit_codes[stopped] = code
        code = self.exit_codes.get(worker)
        if code is None:
            supervisor = self.supervisor.poll()
            how = "it is gone" if supervisor is None else f"its supervisor exited ({supervisor})"
        elif code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}"
        return WorkerDied(f"worker {worker} (pid {self.pids[worker]}) exited: {how}")

    def _message(self, worker: int) -> tuple:
        """The worker's next message, waiting for it (a dead worker's pipe reads as
        closed at once: the wait ends with :class:`WorkerDied`)."""
        if self._early[worker]:
            return self._early[worker].popleft()
        while True:
            message = self._receive(worker)
            if message is not None:
                return message

    # -- serving --------------------------------------------------------------------
    def serve(self, key: Key, jobs: Jobs, finish: Finish[T], after: Queued = None) -> Iterator[T]:
        """Each worker's share ``jobs[k]`` of one job, ``finish``-ed in the main process
        (while the payload's slot is held: ``finish`` must copy what it keeps), in turn.

        ``key`` names the job: if it equals the key of the job queued last time, the
        workers are already on it. ``after``: ``(key, jobs)`` of the job that probably
        comes next, which the workers start as soon as they finish this one.
        """
        self.ready()  # raises a start error a worker already reported
        job_id = self._lookahead.take(key, self._current_finished)
        if job_id is None:
            job_id = self._send("run", jobs)
        if after is not None:
            self._lookahead.put(after[0], self._send("queue", after[1]))
        self._current, self._ended = job_id, [False] * self.workers
        ended = self._ended
        while not all(ended):
            for worker in range(self.workers):
                if ended[worker]:
                    continue
                kind, _, _, *rest = message = self._take(worker, job_id)
                if kind == "end":
                    ended[worker] = True
                    continue
                if kind == "error":
                    error_type, text = rest
                    raise _rebuilt(error_type, text)
                slot, payload = rest[0], rest[1]
                try:
                    if slot < 0:
                        result = finish(from_pipe(payload))
                    else:
                        result = finish(unpack(self.arena.slot(worker, slot)[:payload]))
                finally:
                    self._tell(worker, ("free", slot))
                del message
                yield result

    def _current_finished(self) -> bool:
        """Whether every batch of the current job was served: only its end messages are
        left (a consumer that stops at its last batch never reads them). When batches are
        left (an epoch stopped early), the queued job would wait behind them."""
        for worker in range(self.workers):
            if self._ended[worker]:
                continue
            pending = self._early[worker]
            # the end follows the last batch at once; wait for it a moment, not for work
            while self.results[worker].poll(0 if pending else 0.05):
                message = self._receive(worker)
                if message is None:
                    continue
                pending.append(message)
                if message[1] == self._current:
                    break
            mine = [m for m in pending if m[1] == self._current]
            if not mine or mine[0][0] != "end":
                return False
        return True

    def _take(self, worker: int, job_id: int) -> tuple:
        """The worker's next message of job ``job_id``, dropping (and freeing) those of
        jobs the main process no longer reads (an epoch stopped early)."""
        while True:
            message = self._message(worker)
            kind, sent_job = message[0], message[1]
            self.counters[worker] = (
                message[-1] if kind in ("batch", "end") else self.counters[worker]
            )
            if sent_job == job_id:
                return message
            if kind == "batch":
                self._tell(worker, ("free", message[3]))

    def _send(self, kind: str, jobs: Sequence[Any]) -> int:
        job_id = self._next_id
        self._next_id += 1
        for worker, job in enumerate(jobs):
            self._tell(worker, (kind, job_id, job))
        return job_id

    def _tell(self, worker: int, message: tuple) -> None:
        """Send ``message`` to the worker; a dead worker's pipe is closed: say why."""
        try:
            post(self.jobs[worker], message)
        except OSError as exc:
            self.ready()  # a start error says why, if there was one
            raise self._died(worker) from exc

    def close(self) -> None:
        """Stop the workers (at once: they hold nothing the main process needs)."""
        self._finalizer()


def _close(lifeline, supervisor, jobs, results, status, arena, pids) -> None:
    os.close(lifeline)  # every worker and the supervisor exit on this
    for connection in jobs:
        connection.close()
    try:
        supervisor.wait(CLOSE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        supervisor.kill()
        supervisor.wait()
    deadline = time.monotonic() + CLOSE_TIMEOUT_S
    for worker, connection in enumerate(results):
        if not _drain_until_closed(connection, deadline) and pids[worker] is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pids[worker], signal.SIGKILL)
        connection.close()
    status.close()
    arena.close()


def _drain_until_closed(connection: Connection, deadline: float) -> bool:
    """Read (and drop) what a worker sent until its end closes, meaning it exited."""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not wait([connection], left):
            return False
        try:
            connection.recv_bytes()
        except (EOFError, OSError):
            return True


def _rebuilt(error_type: type[BaseException], message: str) -> BaseException:
    """The worker's exception, of its type where that type takes a message."""
    try:
        return error_type(message)
    except Exception:
        return RuntimeError(message)
