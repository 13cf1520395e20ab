"""How fast a reading process reads: its threads, its windows and the runs it reads.

The paces of a table on local disk and on an object store, and of a reading worker of
each. A :class:`~lightning_stream.lance.reader.BudgetedReader` reads at one of them,
within its byte budget.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ReadPace:
    """How one reading process reads.

    Attributes:
        io_threads: reads running at once (lance releases the GIL while it reads).
        windows: windows of rows in flight at once, besides the one handed out.
        growth: the factor each window grows by over the one before (the first one
            brings the first batch in), up to its full size.
        window_bytes: a window's bytes at most (and never more than the budget's share).
        run_bytes: the bytes of each run of storage rows a window holds at full size: a
            window holds, per clump it serves from, this much of the clump (or all of it).
        scan_rows: runs of at least this many rows are read by a range scan, shorter ones
            by offset (``None``: every run by offset).
        workers: the pace of each reading worker (``None``: this one).
        read_row_bytes: bytes lance holds per row while it takes rows by offset, beyond
            the rows' own, counted against the budget for every row of a window in flight
            (for narrow rows more than the rows themselves: ``benchmarks/bench_packing.py``
            measures the process tree's memory on such rows); windows of narrow rows are
            then cut shorter rather than the process outgrowing its budget.
    """

    io_threads: int
    windows: int
    growth: int
    window_bytes: int
    run_bytes: int
    scan_rows: int | None = None
    workers: ReadPace | None = None
    read_row_bytes: int = 0

    def for_workers(self) -> ReadPace:
        """The pace of each reading worker."""
        return self.workers or self


# Local disk: windows read in takes of up to TAKE_ROWS rows (a window of long runs read by
# range scans held far more and ran slower; a take also holds memory per row, little
# beside wide rows, more than narrow ones: the budget counts it, read_row_bytes).
# Windows of wide rows grow to 64 MiB, so that each of the many clumps a window serves
# from gives a run of more than a few rows (lance's cost per row falls with the run), in
# four takes of about 16 MB on eight threads (larger takes cost more CPU a row). Two
# windows in flight keep lance decoding the next while the main process makes batches of
# the last. A worker reads one window of up to 16 MiB at a time: the rank's workers
# together run about as many reads as its main process alone, in less memory.
LOCAL_PACE = ReadPace(
    io_threads=8,
    windows=2,
    growth=4,
    window_bytes=64 * 2**20,
    run_bytes=16 * 2**10,
    workers=ReadPace(
        io_threads=1,
        windows=1,
        growth=4,
        window_bytes=16 * 2**20,
        run_bytes=16 * 2**10,
        read_row_bytes=2**10,
    ),
    read_row_bytes=2**10,
)
# Object store: every read waits a round trip, and a run's pages come as range GETs per
# column, those at its ends fetched whole, so every cut of a run costs bytes and GETs:
# runs of 1 MiB (whole clumps of light rows), read by range scans where they are long,
# and full windows straight after the first one (which brings the first batch in; no bytes
# a row counted beside the rows: the budget bounds the runs, measured as they were). One
# window in flight, of up to half the budget, holds the longest runs the budget allows
# (two smaller windows would cut the runs shorter, in more GETs); its many reads at once
# hide the round trips. A worker runs half as many at once, as the workers of a rank share
# its cores.
_REMOTE = ReadPace(
    io_threads=16,
    windows=1,
    growth=2**10,
    window_bytes=128 * 2**20,
    run_bytes=2**20,
    scan_rows=2048,
)
REMOTE_PACE = replace(_REMOTE, workers=replace(_REMOTE, io_threads=8))
