"""Rows of a LanceDB table read in a given order, with the bytes held bounded by a budget.

A reading process (the main process, or one reading worker) serves its rows in the
order the plan gives, in *windows*: the next rows of its order, read in storage order
and handed out in the plan's order once all of their reads are in. The order serves
``width`` clumps at once (a reader's splits times their pool, see
:mod:`lightning_stream.lance.order`), so a window holds a run of storage rows of each:
a window grows (from the first batch's rows) until each run is ``run_bytes`` long, or its
whole clump, and every run is read once: a long run by a range scan, short ones together
by offset. Reads run on threads (lance releases the GIL), ``windows`` windows in flight
at a :class:`~lightning_stream.lance.pace.ReadPace` that depends on where the table is
(local disk or object store). Everything the process holds that training has not taken
yet (windows in flight, at their estimated size, and rows read but not yet handed out as
batches) counts against its byte budget: a window is only started when it fits. The row
size is learnt from the first window.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from lightning_stream.lance.arrow import held_bytes, reordered, with_views
from lightning_stream.lance.pace import LOCAL_PACE, ReadPace
from lightning_stream.storage import StorageError, is_remote, storage_error

T = TypeVar("T")

# Rows of the first window at least; it brings the first batch in, and its rows give the
# row size that sizes the windows after it.
FIRST_READ_ROWS = 16
# Rows of one take at most: lance takes rows by offset at a fixed cost per row and holds
# memory per row while it does, far more than the rows' own bytes for narrow rows, where a
# range scan has a fixed cost per call and holds little beyond its rows (so long runs
# are scanned where a pace says so). A window is read in several takes, on as many
# threads.
TAKE_ROWS = 2**16


class ReadCounters:
    """Counters of one process's reads.

    A worker keeps its own and sends them with every batch; the rank's
    :class:`~lightning_stream.serving.ServingEngine` adds every reader's up.
    """

    FIELDS = ("resident_bytes", "bytes_loaded", "rows_read", "tokens", "padding_tokens")

    def __init__(self) -> None:
        self.values = dict.fromkeys(self.FIELDS, 0)
        # at 0 workers the reading thread and an evaluation read in the main thread both
        # count here: an unlocked ``+=`` could lose one's update
        self._lock = threading.Lock()

    def add(self, field: str, amount: int) -> None:
        with self._lock:
            self.values[field] += amount

    def totals(self) -> dict[str, float]:
        with self._lock:
            return {field: float(value) for field, value in self.values.items()}


@dataclass(frozen=True)
class TableOpener:
    """Picklable reopen of one table version, for the reading workers."""

    uri: str
    name: str
    version: int
    # credentials: out of repr (and so out of logs and errors)
    storage_options: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def __call__(self) -> Any:
        import lancedb  # here, not above: a worker that cuts a local copy never needs it

        table = lancedb.connect(self.uri, storage_options=self.storage_options).open_table(
            self.name
        )
        table.checkout(self.version)
        return table


class RowOrder(Protocol):
    """Rows a reader serves, in order, computed a window at a time (see
    :class:`~lightning_stream.lance.order.ReaderRows`).

    ``width``: the clumps it serves from at once; ``run_rows``: the rows of a clump at
    most (storage order: one clump of every row).
    """

    width: int
    run_rows: int

    def __len__(self) -> int: ...

    def __call__(self, start: int, stop: int) -> np.ndarray:
        """Storage offsets of the rows served at ``[start, stop)``."""


class LanceReads:
    """Rows of ``columns`` (``None``: all) of a table at its checked-out version, by
    storage offset: a run by a range scan, or any rows by offset. A read that fails
    raises one error naming the table (``opener``) and what to check."""

    def __init__(
        self, table: Any, columns: list[str] | None, opener: TableOpener | None = None
    ) -> None:
        self.table = table
        self.columns = columns
        self.opener = opener

    def scan(self, start: int, stop: int) -> pa.Table:
        """Rows ``[start, stop)``, in storage order."""
        query = self.table.search().offset(start).limit(stop - start)
        if self.columns is not None:
            query = query.select(self.columns)
        return self._checked(query, stop - start)

    def take(self, offsets: np.ndarray) -> pa.Table:
        """The rows at ``offsets`` (ascending), in that order."""
        query = self.table.take_offsets(offsets.tolist())
        if self.columns is not None:
            query = query.select(self.columns)
        return self._checked(query, len(offsets))  # lance: in storage order

    def _checked(self, query: Any, asked: int) -> pa.Table:
        try:
            rows = query.to_arrow()
        except Exception as exc:
            raise self._failed(exc) from None
        if rows.num_rows != asked:
            raise self._failed(f"lance returned {rows.num_rows} of {asked} rows asked for")
        return with_views(rows)

    def _failed(self, cause: BaseException | str) -> Exception:
        cause = RuntimeError(cause) if isinstance(cause, str) else cause
        opener = self.opener
        if opener is None:
            return RuntimeError(f"reading the table failed: {cause}")
        if is_remote(opener.uri):
            error = storage_error(opener.uri, cause, opener.storage_options)
            return StorageError(f"reading table {opener.name!r} failed: {error}")
        return RuntimeError(
            f"reading table {opener.name!r} in {opener.uri!r} at version {opener.version}"
            f" failed: {cause}. The files of that version changed or are gone (removed by"
            " table.cleanup_old_versions, or copied in part); resume from a checkpoint of a"
            " version that still exists, or start a new run"
        )


def runs(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of consecutive storage offsets starts in ``offsets``, and its end."""
    cuts = np.flatnonzero(offsets[1:] != offsets[:-1] + 1) + 1
    return np.append(0, cuts), np.append(cuts, len(offsets))


def window_parts(
    offsets: np.ndarray, pieces: int, scan_rows: int | None
) -> list[tuple[str, np.ndarray]]:
    """How to read ``offsets`` (ascending): ``("scan", run)`` for each run of at least
    ``scan_rows`` consecutive offsets (``None``: none), ``("take", offsets)`` for the rest,
    in takes of at most ``TAKE_ROWS`` rows and at least ``pieces`` of them where they have
    16 rows each."""
    firsts, ends = runs(offsets)
    lengths = ends - firsts
    long = lengths >= (scan_rows or len(offsets) + 1)
    parts: list[tuple[str, np.ndarray]] = [
        ("scan", offsets[firsts[run] : ends[run]]) for run in np.flatnonzero(long).tolist()
    ]
    rest = offsets[~np.repeat(long, lengths)]
    if len(rest):
        count = max(-(-len(rest) // TAKE_ROWS), min(pieces, -(-len(rest) // 16)))
        parts += [("take", part) for part in np.array_split(rest, count)]
    return parts


@dataclass(frozen=True)
class Window:
    """A window's rows as read (in storage order), and the row of ``rows`` served at
    each serving position (``where``)."""

    rows: pa.Table
    where: np.ndarray


def _joined(reads: list[tuple[np.ndarray, Future]], served: np.ndarray) -> Window:
    """A window from its reads (each read's offsets and its future) and the storage
    offsets ``served``, in serving order."""
    read = np.concatenate([offsets for offsets, _ in reads])
    order = np.argsort(read, kind="stable")
    where = order[np.searchsorted(read, served, sorter=order)]
    return Window(pa.concat_tables([future.result() for _, future in reads]), where)


@dataclass
class BudgetedReader:
    """Reads ``rows`` in order, holding at most ``budget`` bytes not yet handed out.

    Args:
        reads: the table's rows by storage offset (:class:`LanceReads`).
        rows: the rows' storage offsets, in serving order, computed a window at a time.
        budget: bytes this reader may hold: windows in flight plus rows read and not yet
            handed out. One window is always allowed, so a row larger than the budget is
            still served.
        counters: the process's read counters, which this reader adds to.
        pace: reads in flight at once, windows and their growth, and the runs they hold.
    """

    reads: LanceReads
    rows: RowOrder
    budget: int
    counters: ReadCounters
    pace: ReadPace = LOCAL_PACE
    row_bytes: float | None = field(default=None, init=False)  # measured by the first read
    window_rows: int = field(default=FIRST_READ_ROWS, init=False)
    held: int = field(default=0, init=False)

    def _hold(self, amount: int) -> None:
        self.held += amount
        self.counters.add("resident_bytes", amount)

    def _next_window_rows(self) -> int:
        """The next window's rows: grown from the last one's, to a run of ``run_bytes``
        of every clump served at once (at least ``TAKE_ROWS`` rows when runs are short),
        within the budget's share of a window (those in flight and one handed out)."""
        if self.row_bytes is None:
            return self.window_rows
        row = max(1.0, self.row_bytes)
        run = max(1, min(self.rows.run_rows, int(self.pace.run_bytes // row)))
        share = min(self.pace.window_bytes, self.budget // (self.pace.windows + 1))
        fits = share // (row + self.pace.read_row_bytes)
        full = max(1, min(max(self.rows.width * run, TAKE_ROWS), int(fits)))
        return min(self.window_rows * self.pace.growth, full)

    def tables(self) -> Iterator[pa.Table]:
        """The rows in order, as Arrow tables of one window each; the next windows' reads
        run while the consumer works on a table."""
        return self.windows(lambda window: reordered(window.rows, window.where))

    def windows(self, arrange: Callable[[Window], T]) -> Iterator[T]:
        """The rows as :meth:`tables` serves them, each window handed out as ``arrange``
        makes it from the window as read (a consumer that picks its rows itself needs no
        reordered copy). What ``arrange`` returns is held in the window's place, and
        counted at the window's bytes: it must hold about as many, the read rows are let
        go."""
        pending: deque[tuple[list[tuple[np.ndarray, Future]], int, np.ndarray]] = deque()
        next_row = 0
        total = len(self.rows)
        pieces = max(1, self.pace.io_threads // self.pace.windows)
        with ThreadPoolExecutor(self.pace.io_threads, thread_name_prefix="lance-read") as pool:

            def start_reads() -> None:
                nonlocal next_row
                while next_row < total and len(pending) < self.pace.windows:
                    if self.row_bytes is None and pending:
                        return  # learn the row size before sizing more windows
                    window = self._next_window_rows()
                    rows = min(window, total - next_row)
                    estimate = int(rows * ((self.row_bytes or 0) + self.pace.read_row_bytes))
                    if self.held and self.held + estimate > self.budget:
                        return
                    self.window_rows = window
                    served = self.rows(next_row, next_row + rows)
                    reads = []
                    for kind, offsets in window_parts(np.sort(served), pieces, self.pace.scan_rows):
                        if kind == "scan":
                            read = pool.submit(self.reads.scan, offsets[0], offsets[-1] + 1)
                        else:
                            read = pool.submit(self.reads.take, offsets)
                        reads.append((offsets, read))
                    pending.append((reads, estimate, served))
                    self._hold(estimate)
                    next_row += rows

            try:
                while next_row < total or pending:
                    start_reads()
                    reads, estimate, served = pending[0]
                    window = _joined(reads, served)
                    del reads
                    pending.popleft()
                    size = held_bytes(window.rows)
                    self.row_bytes = size / max(1, window.rows.num_rows)
                    self._hold(size - estimate)
                    self.counters.add("bytes_loaded", size)
                    self.counters.add("rows_read", window.rows.num_rows)
                    # a reordered window copies all but its binary values: the reads'
                    # own rows are let go here
                    table = arrange(window)
                    del window
                    try:
                        start_reads()
                        yield table
                    finally:
                        self._hold(-size)
            finally:
                for reads, estimate, _ in pending:
                    for _, read in reads:
                        read.cancel()
                    self._hold(-estimate)

    def batches(self, sizes: Sequence[int]) -> Iterator[pa.Table]:
        """The rows in order, cut into Arrow tables of ``sizes`` rows (zero-copy slices)."""
        if len(sizes):  # the first window brings the first batch in
            self.window_rows = max(FIRST_READ_ROWS, sizes[0])
        tables = self.tables()
        buffered: list[pa.Table] = []
        buffered_rows = 0
        for size in sizes:
            while buffered_rows < size:
                table = next(tables)
                buffered.append(table)
                buffered_rows += table.num_rows
            joined = pa.concat_tables(buffered) if len(buffered) > 1 else buffered[0]
            yield joined.slice(0, size)
            rest = joined.slice(size)
            buffered = [rest] if rest.num_rows else []
            buffered_rows -= size
        tables.close()
