"""A rank's reading processes: persistent workers that hand batches over in shared memory.

Each worker reads its rows with a :class:`~lightning_stream.lance.reader.BudgetedReader`
and writes each batch, as Arrow IPC, into one of its ``SLOTS`` slots of a shared-memory
arena; the main process turns the slot into the batch (the same conversion as without
workers, which copies every value out) and frees the slot. Only a few bytes cross the
pipe per batch. A batch larger than a slot, or the output of a ``transform`` (run in the
worker), crosses the pipe pickled instead.

The workers start once, when the pool is created (at ``setup``), and serve every epoch.
Until a worker has taken up an epoch's job, the main process reads that worker's batches
itself (claiming them one at a time under a lock), so the first batches never wait for a
worker to start, and a worker takes over from the first batch nobody claimed. Which rows
form which batch never depends on who reads it.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import traceback
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lightning_stream.batching import Batch

if TYPE_CHECKING:
    from lightning_stream.lance.source import LanceSource

# A worker may hold this many batches the main process has not taken back: the pipe's
# queue depth and the slots in its arena.
SLOTS = 4
POLL_S = 0.2
NO_JOB = -1
_starting = threading.Lock()


def cut(rows: int, batch_size: int) -> list[int]:
    """Batch sizes of a worker's ``rows``: full batches, then the rest."""
    full, rest = divmod(rows, batch_size)
    return [batch_size] * full + ([rest] if rest else [])


class WorkerDied(RuntimeError):
    """A reading worker exited while the main process waited for one of its batches."""


class ReaderPool:
    """``workers`` reading processes of one rank, sharing ``budget`` bytes.

    Each worker's share is split in half: its reader's read-ahead, and its slots. Slot
    pages are only resident once a batch is written to them.
    """

    def __init__(
        self, source: LanceSource, workers: int, budget: int, context: BaseContext
    ) -> None:
        share = budget // workers
        self.source = source
        self.workers = workers
        self.slot_bytes = max(1, share // (4 * SLOTS))
        self.read_budget = share - SLOTS * self.slot_bytes
        self.arena = SharedMemory(create=True, size=workers * SLOTS * self.slot_bytes)
        # per worker: [batches the main process claimed, job taken up, job current]
        self.handoff = context.Array("q", [0, NO_JOB, NO_JOB] * workers)
        self.credits = [context.Semaphore(SLOTS) for _ in range(workers)]
        self.processes: list[BaseProcess | None] = [None] * workers
        self.results: list[Connection] = []
        self.outboxes: list[queue.SimpleQueue] = []
        self.feeders = []
        self.next_job = 0
        for worker in range(workers):
            job_recv, job_send = context.Pipe(duplex=False)
            result_recv, result_send = context.Pipe(duplex=False)
            process = context.Process(
                target=_work,
                args=(
                    worker,
                    source,
                    self.read_budget,
                    self.arena.name,
                    self.slot_bytes,
                    job_recv,
                    result_send,
                    self.handoff,
                    self.credits[worker],
                ),
                name=f"lightning-stream-reader-{worker}",
                daemon=True,
            )
            outbox: queue.SimpleQueue = queue.SimpleQueue()
            # Starting a process waits for the forkserver (seconds, the first time) and a
            # job's rows fill the pipe until the worker reads them: neither holds up the
            # main process, which serves the batches itself until a worker takes over.
            feeder = threading.Thread(
                target=self._feed,
                args=(worker, process, (job_recv, result_send), job_send, outbox),
                name=f"lightning-stream-feeder-{worker}",
                daemon=True,
            )
            feeder.start()
            self.results.append(result_recv)
            self.outboxes.append(outbox)
            self.feeders.append(feeder)
        # also at exit, for a pool nobody closed (a data module used outside a Trainer)
        self._finalizer = weakref.finalize(
            self, _shutdown, self.outboxes, self.feeders, self.processes, self.results, self.arena
        )

    def _feed(self, worker, process, child_ends, jobs, outbox) -> None:
        with _starting:
            process.start()
        self.processes[worker] = process
        for end in child_ends:
            end.close()
        while True:
            job = outbox.get()
            try:
                jobs.send(job)
            except OSError:
                return  # the worker is gone; the main process finds out when it waits
            if job is None:
                jobs.close()
                return

    def batches(self, streams: list[np.ndarray], batch_size: int) -> Iterator[Batch]:
        """Worker ``k`` 's rows ``streams[k]`` cut into batches, the workers in turn."""
        job = self.next_job
        self.next_job += 1
        sizes = cut(len(streams[0]), batch_size)
        with self.handoff.get_lock():
            for worker in range(self.workers):
                self.handoff[3 * worker : 3 * worker + 3] = [0, NO_JOB, job]
        source = self.source
        for worker, rows in enumerate(streams):
            self.outboxes[worker].put((job, rows, batch_size, source.opener, source.types))
        own: dict[int, Iterator[pa.Table]] = {}
        make = source.batch_maker()
        try:
            for index in range(len(sizes)):
                for worker in range(self.workers):
                    if self._claim(worker, index):
                        if worker not in own:
                            offset = index * batch_size
                            own[worker] = source.reader(
                                streams[worker][offset:], self.read_budget
                            ).batches(sizes[index:])
                        yield make(next(own[worker]))
                    else:
                        if worker in own:
                            own.pop(worker).close()
                        yield self._receive(worker, job, index, make)
        finally:
            for reader in own.values():
                reader.close()
            with self.handoff.get_lock():
                for worker in range(self.workers):
                    self.handoff[3 * worker + 2] = NO_JOB

    def _claim(self, worker: int, index: int) -> bool:
        """Claim batch ``index`` of ``worker`` for the main process, unless it took over."""
        process = self.processes[worker]
        if process is not None and process.exitcode is not None:
            raise WorkerDied(f"exit code {process.exitcode}")
        with self.handoff.get_lock():
            if self.handoff[3 * worker + 1] == self.handoff[3 * worker + 2]:
                return False
            self.handoff[3 * worker] = index + 1
            return True

    def _receive(self, worker: int, job: int, index: int, make) -> Batch:
        connection = self.results[worker]
        while True:
            while not connection.poll(POLL_S):
                if not self.processes[worker].is_alive():
                    raise WorkerDied(f"exit code {self.processes[worker].exitcode}")
            try:
                sent_job, sent_index, kind, payload = connection.recv()
            except (EOFError, ConnectionError) as exc:
                raise WorkerDied(str(exc)) from exc
            if sent_job != job:  # left over from an epoch the main process stopped early
                if kind != "error":
                    self.credits[worker].release()
                continue
            if sent_index != index:
                raise RuntimeError(f"worker {worker} sent batch {sent_index}, not {index}")
            if kind == "error":
                raise _rebuilt(*payload)
            try:
                if kind == "slot":
                    start = (worker * SLOTS + index % SLOTS) * self.slot_bytes
                    return make(_unpack(self.arena.buf[start : start + payload]))
                if kind == "inline":
                    return make(_unpack(payload))
                return payload
            finally:
                self.credits[worker].release()

    def close(self) -> None:
        """Stop the workers (they finish the batch in hand) and free the arena."""
        self._finalizer()


def _shutdown(outboxes, feeders, processes, results, arena) -> None:
    for outbox in outboxes:
        outbox.put(None)
    for worker, feeder in enumerate(feeders):
        feeder.join()
        process = processes[worker]
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()
            process.join()
    for connection in results:
        connection.close()
    arena.close()
    arena.unlink()


def _rebuilt(error_type: type[BaseException], message: str) -> BaseException:
    """The worker's exception, of its type where that type takes a message."""
    try:
        return error_type(message)
    except Exception:
        return RuntimeError(message)


def _unpack(buffer: Any) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(buffer)).read_all()


def _pack(rows: pa.Table, into: memoryview) -> int | None:
    """Write ``rows`` as Arrow IPC into ``into``; ``None`` if they do not fit."""
    sizing = pa.MockOutputStream()
    with pa.ipc.new_stream(sizing, rows.schema) as writer:
        writer.write_table(rows)
    size = sizing.size()
    if size > len(into):
        return None
    with pa.ipc.new_stream(pa.FixedSizeBufferWriter(pa.py_buffer(into)), rows.schema) as writer:
        writer.write_table(rows)
    return size


def _inline(rows: pa.Table) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write_table(rows)
    return sink.getvalue()


def _work(
    worker: int, source: LanceSource, budget: int, arena_name: str, slot_bytes: int,
    jobs, results, handoff, credits,
) -> None:  # fmt: skip
    """A worker process: take up each job from where the main process left it."""
    # Ctrl-C reaches the whole process group: the main process decides what stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    arena = SharedMemory(name=arena_name)
    held = [0] * SLOTS  # bytes written to each slot, counted until it is reused
    try:
        while True:
            try:
                job = jobs.recv()
            except EOFError:
                return  # the main process is gone
            if job is None:
                return
            job_id, rows, batch_size, opener, types = job
            if opener != source.opener:
                source.opener, source.table = opener, opener()
            source.types = types
            with handoff.get_lock():
                if handoff[3 * worker + 2] != job_id:
                    continue  # stopped before this worker got to it
                start = handoff[3 * worker]
                handoff[3 * worker + 1] = job_id
            sizes = cut(len(rows), batch_size)
            _serve(
                worker, source, rows[start * batch_size :], sizes, start, job_id, budget,
                arena, slot_bytes, held, jobs, results, handoff, credits,
            )  # fmt: skip
    except (BrokenPipeError, ConnectionResetError):
        return  # the main process is gone
    finally:
        arena.close()


def _serve(
    worker, source, rows, sizes, start, job_id, budget, arena, slot_bytes, held, jobs,
    results, handoff, credits,
) -> None:  # fmt: skip
    make = source.batch_maker()
    reader = source.reader(rows, budget, reader=worker + 1).batches(sizes[start:])
    try:
        for index in range(start, len(sizes)):
            try:
                table = next(reader)
            except Exception as exc:
                _send_error(results, job_id, index, exc)
                return
            while not credits.acquire(timeout=POLL_S):
                if handoff[3 * worker + 2] != job_id or jobs.poll():
                    return  # the main process stopped this epoch
            if handoff[3 * worker + 2] != job_id:
                credits.release()
                return
            slot = index % SLOTS
            source.read_counters.add(worker + 1, "resident_bytes", -held[slot])
            held[slot] = 0
            if source.transform is not None:
                try:
                    kind, payload = "batch", make(table)
                except Exception as exc:
                    credits.release()
                    _send_error(results, job_id, index, exc)
                    return
            else:
                begin = (worker * SLOTS + slot) * slot_bytes
                size = _pack(table, arena.buf[begin : begin + slot_bytes])
                if size is None:
                    kind, payload = "inline", _inline(table)
                else:
                    kind, payload = "slot", size
                    held[slot] = size
                    source.read_counters.add(worker + 1, "resident_bytes", size)
            del table
            results.send((job_id, index, kind, payload))
    finally:
        reader.close()


def _send_error(results, job_id: int, index: int, exc: Exception) -> None:
    text = f"{exc}\n\nin reading worker (pid {os.getpid()}):\n{traceback.format_exc()}"
    results.send((job_id, index, "error", (type(exc), text)))
