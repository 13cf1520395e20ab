"""The processes of a :class:`~lightning_stream.workers.pool.WorkerPool`: a supervisor
that forks the workers, and each worker's loop.

The supervisor is a fresh interpreter that reads its configuration from stdin, imports
the modules the pool's task needs (and the training script only when the task is defined
in it), then forks the workers, so that what they import is imported once. It never runs
the training script otherwise: a worker whose task needs neither torch nor Lightning
starts in a fraction of a second. It forks before any task object exists, so no library
thread or runtime is running when it does.

Every process here watches a *lifeline*, a pipe whose only write end the main process
holds: the pipe reads as closed the moment the main process is gone (however it ended:
``SIGKILL`` included) or closes the pool, and the process exits at once.

This module imports only the standard library and :mod:`~lightning_stream.workers.slots`.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import os
import pickle
import random
import select
import signal
import sys
import threading
import traceback
import warnings
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from lightning_stream.workers.slots import SLOTS, Arena, fetch, pack, plain, post, to_pipe

_PR_SET_NAME = 15


def supervise() -> None:
    """The supervisor's life: import, fork the workers, report how each one ends."""
    config = pickle.load(sys.stdin.buffer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the main process decides
    os.chdir(config["cwd"])
    sys.path[:] = config["sys_path"]
    fds = config["fds"]
    try:
        if config["main_path"] is not None:
            from multiprocessing import spawn

            spawn.import_main_path(config["main_path"])
        # lancedb warns in every forked process; the fork happens before it runs anything
        warnings.filterwarnings("ignore", message="lancedb fork support", category=RuntimeWarning)
        for module in config["modules"]:
            importlib.import_module(module)
    except BaseException as exc:
        for fd in fds["results"]:
            _send_error(Connection(fd, readable=False), ("start-error", -1, -1), exc)
        sys.exit(1)
    workers = {}
    for worker in range(len(fds["jobs"])):
        pid = os.fork()
        if pid == 0:
            _close_all_but(fds, worker)
            os._exit(_work(worker, config))
        workers[pid] = worker
    _close_all_but(fds, None)
    _watch_lifeline(fds["lifeline"])
    status = Connection(fds["status"], readable=False)
    while workers:
        pid, code = os.wait()
        if pid in workers:
            with contextlib.suppress(OSError):  # the main process may be gone
                post(status, (workers.pop(pid), os.waitstatus_to_exitcode(code)))


def _close_all_but(fds: dict[str, Any], worker: int | None) -> None:
    """Close the fds of every worker but ``worker`` (the supervisor keeps none of them)."""
    mine = {fds["lifeline"]} if worker is None else {fds["lifeline"], fds["arena"]}
    if worker is None:
        mine.add(fds["status"])
    else:
        mine |= {fds["jobs"][worker], fds["results"][worker]}
    for fd in {fds["arena"], fds["status"], *fds["jobs"], *fds["results"]} - mine:
        os.close(fd)


def _watch_lifeline(fd: int) -> None:
    """Exit this process the moment the main process's end of the lifeline closes."""

    def watch() -> None:
        select.select([fd], [], [])  # nobody writes: readable means closed
        os._exit(0)

    threading.Thread(target=watch, name="lifeline", daemon=True).start()


def _work(worker: int, config: dict[str, Any]) -> int:
    """One worker: build its state, then serve the jobs the main process sends."""
    fds = config["fds"]
    _watch_lifeline(fds["lifeline"])
    name = f"{config['name']}-{worker}"[:15].encode()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)
    _seed(config["seed"] + worker)
    jobs = Connection(fds["jobs"][worker], writable=False)
    results = Connection(fds["results"][worker], readable=False)
    try:
        arena = Arena(config["workers"], config["slot_bytes"], fds["arena"])
        task = pickle.loads(config["task"])
        state = task.open(worker)
    except BaseException as exc:
        _send_error(results, ("start-error", -1, -1), exc)
        return 1
    post(results, ("ready", os.getpid()))
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the trainer is gone
        _Server(worker, task, state, jobs, results, arena).loop()
    return 0


def _seed(seed: int) -> None:
    """Seed the random generators a task's transform may draw from, once per worker."""
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)


def _send_error(results: Connection, header: tuple, exc: BaseException) -> None:
    text = f"{exc}\n\nin worker process {os.getpid()}:\n{traceback.format_exc()}"
    with contextlib.suppress(OSError):
        post(results, (*header, type(exc), text))


class _Server:
    """A worker's loop over its jobs, one at a time, in the order they arrive.

    Messages from the main process: ``("run", id, job)`` drops whatever runs or waits and
    runs this job; ``("queue", id, job)`` runs it after the ones before it; ``("free",
    slot)`` hands a slot (``-1``: a batch sent through the pipe) back. A worker sends at
    most ``SLOTS`` batches ahead of what the main process has taken.
    """

    def __init__(self, worker, task, state, jobs: Connection, results: Connection, arena):
        self.worker, self.task, self.state = worker, task, state
        self.inbox = _Inbox(jobs)
        self.results, self.arena = results, arena
        self.pending: deque[tuple[int, Any]] = deque()
        self.free = list(range(SLOTS))
        self.credits = SLOTS
        self.replaced = False

    def take(self, block: bool) -> None:
        """Apply the messages that arrived, waiting for one first when ``block``."""
        for kind, *message in self.inbox.messages(block):
            if kind == "run":
                self.pending = deque([tuple(message)])
                self.replaced = True
            elif kind == "queue":
                self.pending.append(tuple(message))
            elif kind == "free":
                self.credits += 1
                if message[0] >= 0:
                    self.free.append(message[0])

    def loop(self) -> None:
        while True:
            while not self.pending:
                self.take(block=True)
            job_id, job = self.pending.popleft()
            self.replaced = False
            self.serve(job_id, job)

    def serve(self, job_id: int, job: Any) -> None:
        payloads = self.task.run(self.state, job)
        try:
            for index in range(sys.maxsize):
                self.take(block=False)
                if self.replaced:
                    return
                try:
                    payload = next(payloads)
                except StopIteration:
                    post(self.results, ("end", job_id, index, self.task.counters(self.state)))
                    return
                except Exception as exc:
                    _send_error(self.results, ("error", job_id, index), exc)
                    return
                while not self.credits:
                    self.take(block=True)
                    if self.replaced:
                        return
                try:
                    message = self.pack(job_id, index, payload)
                except Exception as exc:
                    _send_error(self.results, ("error", job_id, index), exc)
                    return
                del payload
                self.credits -= 1
                post(self.results, message)
        finally:
            payloads.close()

    def pack(self, job_id: int, index: int, payload: Any) -> tuple:
        payload = plain(payload)
        slot = self.free[-1]
        size = pack(payload, self.arena.slot(self.worker, slot))
        counters = self.task.counters(self.state)
        if size is None:
            return ("batch", job_id, index, -1, to_pipe(payload), counters)
        self.free.pop()
        return ("batch", job_id, index, slot, size, counters)


class _Inbox:
    """The main process's messages, read on a thread as they come, so that the main
    process never waits on a full pipe while this worker computes or sends a batch."""

    def __init__(self, jobs: Connection) -> None:
        self.jobs = jobs
        self.arrived: deque = deque()
        self.condition = threading.Condition()
        threading.Thread(target=self._read, name="inbox", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                message = fetch(self.jobs)
            except (EOFError, OSError):
                os._exit(0)  # the main process closed the pool or is gone
            with self.condition:
                self.arrived.append(message)
                self.condition.notify()

    def messages(self, block: bool) -> list:
        """The messages that arrived; with ``block``, at least one."""
        with self.condition:
            while block and not self.arrived:
                self.condition.wait()
            taken = list(self.arrived)
            self.arrived.clear()
        return taken
