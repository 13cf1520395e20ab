"""What a reader of a rank's table rows runs: in a worker process, or in the main process.

A :class:`ReadTask` is the :class:`~lightning_stream.workers.jobs.Task` of
:class:`~lightning_stream.lance.source.LanceSource`: a reader (a worker process, or the
rank's reading thread) opens the table once and then reads, per epoch, the rows of its
share of the plan in order, with a :class:`~lightning_stream.lance.reader.BudgetedReader`,
and makes each batch's payload from them (the job's ``make``).

This module, :mod:`~lightning_stream.lance.reader` and :mod:`~lightning_stream.lance.pace`
are what a worker imports (with pyarrow and numpy; lancedb where it reads the table, not
where it cuts blocks from a local copy; torch only to run a ``transform``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from lightning_stream.allocator import keep_read_buffers
from lightning_stream.lance.pace import ReadPace
from lightning_stream.lance.reader import (
    BudgetedReader,
    LanceReads,
    ReadCounters,
    RowOrder,
    TableOpener,
)

if TYPE_CHECKING:
    from lightning_stream.lance.packed import PackJob


@dataclass(frozen=True)
class ReadJob:
    """One reader's rows of one epoch, in serving order, and the sizes to cut them into.

    ``rows``: their storage offsets, computed a window at a time
    (:class:`~lightning_stream.lance.order.ReaderRows`: a few numbers, whatever the
    table's size, are sent to a worker). ``opener`` names the table version (a resume
    pins the one its checkpoint read); ``make`` turns a batch's rows into its payload in
    the reader.
    """

    rows: RowOrder
    sizes: Sequence[int]
    opener: TableOpener
    make: Callable[[pa.Table], Any]

    @property
    def reads_table(self) -> bool:
        return True

    def payloads(self, reader: BudgetedReader) -> Iterator[Any]:
        tables = reader.batches(self.sizes)
        try:
            for table in tables:
                yield self.make(table)
        finally:
            tables.close()


@dataclass
class _Reader:
    opener: TableOpener
    table: Any | None  # opened by the first job that reads it
    counters: ReadCounters


@dataclass(frozen=True)
class ReadTask:
    """Reads of one table's ``columns`` holding at most ``budget`` bytes, at ``pace``.

    ``imports``: what a worker imports before it is forked, beside the modules this
    task's pickle names: ``("lancedb",)`` (imported once for all the workers) where its
    jobs read the table, ``()`` where they cut blocks from a local copy (a worker then
    starts without lancedb's imports, the larger part of its start)."""

    opener: TableOpener
    columns: list[str] | None
    budget: int
    pace: ReadPace
    imports: tuple[str, ...] = ("lancedb",)

    def open(self, worker: int) -> _Reader:
        keep_read_buffers()  # before lancedb starts its threads here
        return _Reader(self.opener, None, ReadCounters())

    def reader_of(self, table: Any, counters: ReadCounters) -> _Reader:
        """A reader on a table this process already opened, adding to ``counters``."""
        return _Reader(self.opener, table, counters)

    def run(self, state: _Reader, job: ReadJob | PackJob) -> Iterator[Any]:
        # a resume may pin another version
        if job.reads_table and (state.table is None or job.opener != state.opener):
            state.opener, state.table = job.opener, job.opener()
        reader = BudgetedReader(
            LanceReads(state.table, self.columns, state.opener),
            job.rows,
            self.budget,
            state.counters,
            self.pace,
        )
        payloads = job.payloads(reader)
        try:
            yield from payloads
        finally:
            payloads.close()

    def counters(self, state: _Reader) -> dict[str, float]:
        return state.counters.totals()
