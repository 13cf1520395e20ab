"""Rows of a LanceDB table read in a given order, with the bytes held bounded by a budget.

A reading process (the main process, or one reading worker) serves its rows in the
order the plan gives, a few reads in flight on threads (lance's reads release the GIL),
at a :class:`~lightning_stream.lance.pace.ReadPace` that depends on where the table is
(local disk or object store). Consecutive reads are joined into windows: a window's rows
are read in storage order, split between its reads, and handed out in the plan's order
once all of them are in. A plan cycles over its splits, so a read holds a short run of
each split's storage rows; in a window the runs of consecutive reads join, and lance
fetches them in fewer, larger range reads. Everything the process holds that training
has not taken yet (windows in flight, at their estimated size, and rows read but not yet
handed out as batches) counts against its byte budget: a window is only started when it
fits. The row size is learnt from a first small read.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

import lancedb
import numpy as np
import pyarrow as pa

from lightning_stream.lance.pace import LOCAL_PACE, ReadPace

FIRST_READ_ROWS = 16


# Reads of more rows than this are not joined into windows: at 32 splits they already
# read runs of 512 rows or more a split, and a window of them would hold a small table's
# whole epoch before its first batch.
WINDOW_READ_ROWS = 2**14

ReadRows = Callable[[np.ndarray], pa.Table]  # storage offsets -> their rows, in order


class ReadCounters:
    """Counters of every reading process of a rank, in the main process.

    Row ``r`` belongs to reader ``r`` (0: the main process, ``k + 1``: worker ``k``). A
    worker keeps its own one-row counters and sends them with every batch
    (:mod:`lightning_stream.workers`), so the totals cover the workers too.
    """

    FIELDS = ("resident_bytes", "bytes_loaded", "rows_read")

    def __init__(self, readers: int) -> None:
        self.values = np.zeros((readers, len(self.FIELDS)), dtype=np.int64)
        # at 0 workers the reading thread and an evaluation read in the main thread both
        # count as reader 0: an unlocked ``+=`` could lose one's update
        self._lock = threading.Lock()

    def add(self, reader: int, field: str, amount: int) -> None:
        with self._lock:
            self.values[reader, self.FIELDS.index(field)] += amount

    def totals(self) -> dict[str, float]:
        return dict(zip(self.FIELDS, map(float, self.values.sum(axis=0)), strict=True))


@dataclass(frozen=True)
class TableOpener:
    """Picklable reopen of one table version, for the reading workers."""

    uri: str
    name: str
    version: int
    # credentials: out of repr (and so out of logs and errors)
    storage_options: dict[str, str] | None = field(default=None, repr=False, compare=False)

    def __call__(self) -> Any:
        table = lancedb.connect(self.uri, storage_options=self.storage_options).open_table(
            self.name
        )
        table.checkout(self.version)
        return table


class RowOrder(Protocol):
    """Rows a reader serves, in order, computed a window at a time (see
    :class:`~lightning_stream.lance.order.ReaderRows`)."""

    def __len__(self) -> int: ...

    def __call__(self, start: int, stop: int) -> np.ndarray:
        """Storage offsets of the rows served at ``[start, stop)``."""


@dataclass(frozen=True)
class ArrayRows:
    """A :class:`RowOrder` held as one array of storage offsets."""

    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.offsets)

    def __call__(self, start: int, stop: int) -> np.ndarray:
        return self.offsets[start:stop]


def take_offsets(table, columns: list[str] | None) -> ReadRows:
    """A read of rows by storage offset (of the table's checked-out version) that
    returns them in the order asked."""

    def read(offsets: np.ndarray) -> pa.Table:
        order = np.argsort(offsets, kind="stable")
        ascending = bool(np.all(order[1:] > order[:-1]))
        asked = offsets if ascending else offsets[order]
        query = table.take_offsets(asked.tolist())
        if columns is not None:
            query = query.select(columns)
        rows = query.to_arrow()
        if rows.num_rows != len(offsets):
            raise RuntimeError(
                f"lance returned {rows.num_rows} of {len(offsets)} rows asked for: rows of the"
                " pinned table version are gone (its files changed or were deleted)"
            )
        # lance returns the rows in storage order, as BudgetedReader asks for them
        if ascending:
            return rows.cast(pa.schema([_with_view_type(f) for f in rows.schema]))
        where = np.empty_like(order)
        where[order] = np.arange(len(order))
        return reordered(rows, where)

    return read


# Binary and string values are reordered by their views (16 bytes a value) over lance's
# buffers instead of copied: a read's bytes are then copied once, into the batch's
# ``bytes`` (25k rows of 22 KB at 0 workers: 49-52k rows/s with a copying reorder, 56-61k).
# Views stay in the reading process: a worker's batch crosses as plain arrays
# (:func:`lightning_stream.workers.slots.plain`).
_VIEW_TYPES = {
    pa.binary(): pa.binary_view(),
    pa.large_binary(): pa.binary_view(),
    pa.string(): pa.string_view(),
    pa.large_string(): pa.string_view(),
}


def _with_view_type(field: pa.Field) -> pa.Field:
    return field.with_type(_VIEW_TYPES.get(field.type, field.type))


def held_bytes(table: pa.Table) -> int:
    """Bytes ``table`` holds: ``nbytes``, except that a view column's data buffers count
    once each, at their largest extent.

    lance hands a read's binary data to all its chunks as one buffer, from the same start,
    and :func:`_reordered` keeps it: ``nbytes`` counts it once a chunk (1.5x a 22 KB-row
    read in two chunks), ``get_total_buffer_size`` only at its first chunk's extent (0.7x).
    """
    held = 0
    for column in table.columns:
        if column.type not in _VIEW_TYPES.values():
            held += column.nbytes
            continue
        extents: dict[int, int] = {}
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                if buffer is not None:
                    extents[buffer.address] = max(extents.get(buffer.address, 0), buffer.size)
        held += sum(extents.values())
    return held


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """``column`` as one array, joined (a copy) only when it has several chunks: a batch
    within one read is one chunk already (a read's columns are joined by
    :func:`_reordered`)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def reordered(rows: pa.Table, where: np.ndarray) -> pa.Table:
    """``rows.take(where)`` as one chunk a column, binary and string values as views over
    ``rows``' buffers (not copied)."""
    columns = [_reordered(column, where) for column in rows.columns]
    return pa.Table.from_arrays(columns, names=rows.column_names)


def _joined(futures: list[Future], serving: np.ndarray) -> pa.Table:
    """A window's rows in serving order, from its reads' rows in storage order."""
    return reordered(pa.concat_tables([future.result() for future in futures]), serving)


def _reordered(column: pa.ChunkedArray, where: np.ndarray) -> pa.Array:
    """``column.take(where)``, with binary and string values not copied."""
    view_type = _VIEW_TYPES.get(column.type, column.type)
    if view_type not in _VIEW_TYPES.values():
        return column.take(where)
    # cast first: joining views appends each chunk's data buffers instead of copying them
    # (a read of more than 1,024 rows, lance's batch, comes as several chunks)
    views = column.cast(view_type).combine_chunks()
    buffers = views.buffers()
    slots = np.frombuffer(buffers[1], dtype="V16")[views.offset : views.offset + len(views)]
    validity = views.is_valid().take(where).buffers()[1] if views.null_count else None
    return pa.Array.from_buffers(
        view_type, len(where), [validity, pa.py_buffer(slots[where]), *buffers[2:]]
    )


class BudgetedReader:
    """Reads ``rows`` in order, holding at most ``budget`` bytes not yet handed out.

    Args:
        read: reads a sequence of row ids, returning them in that order.
        rows: the rows' storage offsets, in serving order: an array, or a
            :class:`RowOrder` that computes them a window at a time.
        budget: bytes this reader may hold: windows in flight plus rows read and not yet
            handed out. One window is always allowed, so a row larger than the budget is
            still served.
        counters: shared counters, updated under ``reader``'s row.
        reader: this reader's row in ``counters``.
        pace: reads in flight at once, how fast their size grows, and reads a window.
    """

    def __init__(
        self,
        read: ReadRows,
        rows: np.ndarray | RowOrder,
        budget: int,
        counters: ReadCounters,
        reader: int,
        pace: ReadPace = LOCAL_PACE,
    ) -> None:
        self.read = read
        self.pace = pace
        self.rows = ArrayRows(rows) if isinstance(rows, np.ndarray) else rows
        self.budget = budget
        self.counters = counters
        self.reader = reader
        self.row_bytes: float | None = None
        self.read_rows = FIRST_READ_ROWS
        self.held = 0

    def _hold(self, amount: int) -> None:
        self.held += amount
        self.counters.add(self.reader, "resident_bytes", amount)

    def _next_read_rows(self) -> int:
        """The next read's rows: grown from the last read's, within the budget's share of a
        read (the reads in flight and a window handed out)."""
        if self.row_bytes is None:
            return FIRST_READ_ROWS
        reads_held = self.pace.io_threads + self.pace.window_reads
        read_bytes = min(self.pace.read_bytes, self.budget // reads_held)
        fits = max(1, int(read_bytes // max(1.0, self.row_bytes)))
        return min(self.read_rows * self.pace.growth, fits)

    def tables(self) -> Iterator[pa.Table]:
        """The rows in order, as Arrow tables of one window each; the next windows' reads
        run while the consumer works on a table."""
        pending: deque[tuple[list[Future], int, np.ndarray]] = deque()
        next_row = 0
        total = len(self.rows)
        with ThreadPoolExecutor(self.pace.io_threads, thread_name_prefix="lance-read") as pool:

            def start_reads() -> None:
                nonlocal next_row
                while next_row < total:
                    if self.row_bytes is None and pending:
                        return  # learn the row size before sizing more reads
                    read_rows = self._next_read_rows()
                    joined = self.row_bytes is not None and read_rows <= WINDOW_READ_ROWS
                    reads = self.pace.window_reads if joined else 1
                    limit = self.pace.io_threads if joined else self.pace.lone_reads_in_flight()
                    in_flight = sum(len(futures) for futures, _, _ in pending)
                    if in_flight and in_flight + reads > limit:
                        return
                    rows = min(read_rows * reads, total - next_row)
                    estimate = int(rows * (self.row_bytes or 0))
                    if self.held and self.held + estimate > self.budget:
                        return
                    self.read_rows = read_rows
                    ids = self.rows(next_row, next_row + rows)
                    # storage order: a split's runs in the window's serving slices join
                    # into one run, read at once (fewer, larger range reads)
                    order = np.argsort(ids, kind="stable")
                    futures = [
                        pool.submit(self.read, part)
                        for part in np.array_split(ids[order], min(reads, rows))
                    ]
                    serving = np.empty_like(order)
                    serving[order] = np.arange(len(order))
                    pending.append((futures, estimate, serving))
                    self._hold(estimate)
                    next_row += rows

            try:
                while next_row < total or pending:
                    start_reads()
                    futures, estimate, serving = pending[0]
                    # the reads' own rows are let go here: the window's table copies all
                    # but its binary values
                    table = _joined(futures, serving)
                    del futures
                    pending.popleft()
                    size = held_bytes(table)
                    self.row_bytes = size / max(1, table.num_rows)
                    self._hold(size - estimate)
                    self.counters.add(self.reader, "bytes_loaded", size)
                    self.counters.add(self.reader, "rows_read", table.num_rows)
                    try:
                        start_reads()
                        yield table
                    finally:
                        self._hold(-size)
            finally:
                for futures, estimate, _ in pending:
                    for future in futures:
                        future.cancel()
                    self._hold(-estimate)

    def batches(self, sizes: Sequence[int]) -> Iterator[pa.Table]:
        """The rows in order, cut into Arrow tables of ``sizes`` rows (zero-copy slices)."""
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
