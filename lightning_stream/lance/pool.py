"""A rank's reading processes: persistent workers that hand batches over in shared memory.

Each worker reads its rows with a :class:`~lightning_stream.lance.reader.BudgetedReader`
and writes each batch, as Arrow IPC, into one of its ``SLOTS`` slots of a shared-memory
arena; the main process turns the slot into the batch (the same conversion as without
workers, which copies every value out) and frees the slot. Only a few bytes cross the
pipe per batch. A batch larger than a slot, or the output of a ``transform`` (run in the
worker), crosses the pipe pickled instead.

The workers start once, when the pool is created (at ``setup``), and serve every epoch;
like a ``DataLoader``'s, the first batch waits for them. The main process reads no row
a worker reads: with its reading beside the workers' start, a rank's processes held
0.1 GB more and the first epoch was no faster (two cores). An epoch stopped early
(``current`` no longer names its job) is abandoned by the workers at their next batch.

This module and :mod:`~lightning_stream.lance.reader` are all a worker imports (with
lancedb, pyarrow and numpy; torch only to run a ``transform``), besides the training
script's own imports, which every spawned or forkserver worker runs again.
"""

from __future__ import annotations

import itertools
import logging
import os
import queue
import shutil
import signal
import threading
import traceback
import weakref
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from lightning_stream.lance.reader import BudgetedReader, ReadCounters, TableOpener, take_rows

if TYPE_CHECKING:
    from lightning_stream.batching import Batch
    from lightning_stream.lance.source import LanceSource

# what a worker imports (the forkserver imports it once for all of them)
WORKER_MODULE = __name__
# A worker may hold this many batches the main process has not taken back: the pipe's
# queue depth and the slots of its arena.
SLOTS = 4
POLL_S = 0.2
NO_JOB = -1
_starting = threading.Lock()
log = logging.getLogger(__name__)


def cut(rows: int, batch_size: int) -> list[int]:
    """Batch sizes of a worker's ``rows``: full batches, then the rest."""
    full, rest = divmod(rows, batch_size)
    return [batch_size] * full + ([rest] if rest else [])


class WorkerDied(RuntimeError):
    """A reading worker exited while the main process needed one of its batches."""


class ReaderPool:
    """``workers`` reading processes of one rank, sharing ``budget`` bytes.

    Each worker's share goes three quarters to its reader's read-ahead and a quarter to
    its slots; slot pages are only resident once a batch has been written to them.
    """

    def __init__(
        self, source: LanceSource, workers: int, budget: int, context: BaseContext
    ) -> None:
        share = budget // workers
        self.workers = workers
        # slots start 64-byte aligned, so Arrow reads the batch in place
        self.slot_bytes = _slot_bytes(share // (4 * SLOTS), workers)
        self.read_budget = share - SLOTS * self.slot_bytes
        self.arena = SharedMemory(create=True, size=workers * SLOTS * self.slot_bytes)
        # per worker: the job it serves; written by the main process only
        self.current = context.Array("q", [NO_JOB] * workers, lock=False)
        self.credits = [context.Semaphore(SLOTS) for _ in range(workers)]
        self.processes: list[BaseProcess | None] = [None] * workers
        self.start_errors: list[BaseException | None] = [None] * workers
        self.results: list[Connection] = []
        self.outboxes: list[queue.SimpleQueue] = []
        self.feeders: list[threading.Thread] = []
        self.next_job = 0
        # also at exit, for a pool nobody closed (a data module used outside a Trainer)
        self._finalizer = weakref.finalize(
            self, _shutdown, self.outboxes, self.feeders, self.processes, self.results, self.arena
        )
        for worker in range(workers):
            job_recv, job_send = context.Pipe(duplex=False)
            result_recv, result_send = context.Pipe(duplex=False)
            channels = _Channels(
                self.arena.name, self.slot_bytes, job_recv, result_send, self.current,
                self.credits[worker],
            )  # fmt: skip
            process = context.Process(
                target=_work,
                args=(worker, source.opener, source.columns, self.read_budget, channels),
                name=f"lightning-stream-reader-{worker}",
                daemon=True,
            )
            outbox: queue.SimpleQueue = queue.SimpleQueue()
            # Starting a process waits for the forkserver (seconds, the first time) and a
            # job's rows fill the pipe until the worker reads them: neither holds up
            # setup or the main process (only its first batch waits for the worker).
            feeder = threading.Thread(
                target=_feed,
                args=(
                    process,
                    self.processes,
                    self.start_errors,
                    worker,
                    (job_recv, result_send),
                    job_send,
                    outbox,
                ),
                name=f"lightning-stream-feeder-{worker}",
                daemon=True,
            )
            feeder.start()
            self.results.append(result_recv)
            self.outboxes.append(outbox)
            self.feeders.append(feeder)

    def batches(
        self, source: LanceSource, streams: list[np.ndarray], batch_size: int
    ) -> Iterator[Batch]:
        """Worker ``k`` 's rows ``streams[k]`` of ``source`` cut into batches, the workers
        in turn."""
        job = self.next_job
        self.next_job += 1
        sizes = cut(len(streams[0]), batch_size)
        # a worker still serving an earlier epoch (stopped early) drops it at this
        self.current[:] = [job] * self.workers
        make = source.batch_maker()
        # without a transform the main process makes every batch from the Arrow rows
        sent_make = make if source.transform is not None else None
        for worker, rows in enumerate(streams):
            self.outboxes[worker].put((job, rows, batch_size, source.opener, sent_make))
        try:
            for index in range(len(sizes)):
                for worker in range(self.workers):
                    yield self._receive(worker, job, index, make, source.read_counters)
        finally:
            for worker in range(self.workers):
                if self.current[worker] == job:  # a later epoch's job is left alone
                    self.current[worker] = NO_JOB

    def _check_alive(self, worker: int) -> None:
        if self.start_errors[worker] is not None:
            raise WorkerDied(f"it could not start: {self.start_errors[worker]!r}")
        process = self.processes[worker]
        if process is not None and process.exitcode is not None:
            raise WorkerDied(f"exit code {process.exitcode}")

    def _receive(
        self, worker: int, job: int, index: int, make: Callable, counters: ReadCounters
    ) -> Batch:
        connection = self.results[worker]
        if self.current[worker] != job:
            raise RuntimeError("a later epoch of this data module started while this one ran")
        while True:
            while not connection.poll(POLL_S):
                self._check_alive(worker)
            try:
                sent_job, sent_index, kind, payload, sent_counters = connection.recv()
            except (EOFError, ConnectionError) as exc:
                raise WorkerDied(str(exc)) from exc
            counters.values[worker + 1] = sent_counters
            if sent_job != job:  # left over from an epoch stopped early
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


def _feed(process, processes, start_errors, worker, child_ends, jobs, outbox) -> None:
    """Start a worker, then send it the jobs put in ``outbox`` (a feeder thread).

    It holds the pool's lists, not the pool, so that a pool nobody refers to is collected
    (and its workers stopped).
    """
    try:
        with _starting:
            process.start()
    except Exception as exc:
        start_errors[worker] = exc
        return
    finally:
        for end in child_ends:
            end.close()
    processes[worker] = process
    while True:
        job = outbox.get()
        try:
            jobs.send(job)
        except OSError:
            return  # the worker is gone; the main process finds out when it waits
        if job is None:
            jobs.close()
            return


def _shutdown(outboxes, feeders, processes, results, arena) -> None:
    for outbox in outboxes:
        outbox.put(None)
    # a worker blocked sending a batch nobody will take gets a broken pipe and exits
    for connection in results:
        connection.close()
    for process in processes:
        if process is None:
            continue  # it never started
        process.join(timeout=5)
        if process.is_alive():
            process.terminate()
            process.join()
    for feeder in feeders:
        feeder.join(timeout=5)
    try:
        arena.unlink()
    finally:
        arena.close()


def _slot_bytes(wanted: int, workers: int) -> int:
    """Slot size: ``wanted``, or less when /dev/shm cannot hold every slot (a container's
    default is 64 MiB); rounded down to 64 bytes. A batch larger than its slot crosses
    the pipe instead."""
    try:
        free = shutil.disk_usage("/dev/shm").free
    except OSError:
        free = wanted * workers * SLOTS
    fits = free // (2 * workers * SLOTS)  # leave half of what is free to others
    if fits < wanted:
        log.warning(
            "/dev/shm has %d MiB free: the reading workers' shared-memory slots shrink from"
            " %d to %d KiB each (larger batches cross a pipe, slower); give the container"
            " more shared memory (docker run --shm-size)",
            free // 2**20, wanted // 1024, fits // 1024,
        )  # fmt: skip
    return max(64, min(wanted, fits) // 64 * 64)


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


class _Channels:
    """What connects one worker to the main process (picklable while it starts)."""

    def __init__(self, arena_name, slot_bytes, jobs, results, current, credits) -> None:
        self.arena_name = arena_name
        self.slot_bytes = slot_bytes
        self.jobs = jobs
        self.results = results
        self.current = current
        self.credits = credits


def _work(
    worker: int, opener: TableOpener, columns: list[str] | None, budget: int, io: _Channels
) -> None:
    """A worker process: serve each job it is sent, unless a later one replaced it."""
    # Ctrl-C reaches the whole process group: the main process decides what stops
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    served = _Worker(worker, io)
    try:
        table = opener()  # ready before the first job; a failure is reported with it
    except Exception:
        table = None
    try:
        while True:
            try:
                job = io.jobs.recv()
            except EOFError:
                return  # the main process is gone
            if job is None:
                return
            job_id, rows, batch_size, job_opener, make = job
            if not served.current(job_id):
                continue  # stopped before this worker got to it
            try:
                if table is None or job_opener != opener:  # a resume pins another version
                    opener, table = job_opener, job_opener()
            except Exception as exc:
                served.send_error(job_id, 0, exc)
                continue
            reader = BudgetedReader(
                take_rows(table, columns), rows, budget, served.counters, 0, io_threads=1
            )
            tables = reader.batches(cut(len(rows), batch_size))
            try:
                served.serve(job_id, tables, make)
            finally:
                tables.close()
    except (BrokenPipeError, ConnectionResetError):
        return  # the main process is gone
    finally:
        served.arena.close()


class _Worker:
    """One worker's side of the slots, and its counters."""

    def __init__(self, worker: int, io: _Channels) -> None:
        self.worker = worker
        self.io = io
        self.arena = SharedMemory(name=io.arena_name)
        self.counters = ReadCounters(1)
        self.held = [0] * SLOTS  # bytes written to each slot, counted until it is reused

    def current(self, job_id: int) -> bool:
        return self.io.current[self.worker] == job_id

    def serve(self, job_id: int, tables: Iterator[pa.Table], make) -> None:
        """Send the job's batches until it ends or the main process stops it."""
        io = self.io
        for index in itertools.count():
            if not self.current(job_id):
                return  # the main process stopped this epoch
            try:
                table = next(tables)
            except StopIteration:
                return
            except Exception as exc:
                self.send_error(job_id, index, exc)
                return
            while not io.credits.acquire(timeout=POLL_S):
                if not self.current(job_id) or io.jobs.poll():
                    return  # the main process stopped this epoch
            try:
                kind, payload = self.pack(index, table, make)
            except Exception as exc:
                io.credits.release()
                self.send_error(job_id, index, exc)
                return
            del table
            io.results.send((job_id, index, kind, payload, self.counters.values[0].tolist()))

    def pack(self, index: int, table: pa.Table, make) -> tuple[str, Any]:
        slot = index % SLOTS
        self.counters.add(0, "resident_bytes", -self.held[slot])
        self.held[slot] = 0
        if make is not None:
            return "batch", make(table)
        begin = (self.worker * SLOTS + slot) * self.io.slot_bytes
        size = _pack(table, self.arena.buf[begin : begin + self.io.slot_bytes])
        if size is None:
            return "inline", _inline(table)
        self.held[slot] = size
        self.counters.add(0, "resident_bytes", size)
        return "slot", size

    def send_error(self, job_id: int, index: int, exc: Exception) -> None:
        text = f"{exc}\n\nin reading worker (pid {os.getpid()}):\n{traceback.format_exc()}"
        counters = self.counters.values[0].tolist()
        self.io.results.send((job_id, index, "error", (type(exc), text), counters))
