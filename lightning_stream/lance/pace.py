"""How fast a reading process reads: reads in flight, their sizes, and their windows.

The paces of a table on local disk and on an object store, and of a reading worker of
each, as measured on 2 cores (``benchmarks/bench_lance.py``, ``--s3``). A
:class:`~lightning_stream.lance.reader.BudgetedReader` reads at one of them, within its
byte budget.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReadPace:
    """How one reading process reads: reads in flight at once, the factor each read's
    size grows by over the one before, the size they grow to, how many reads make a
    window (the rows of a window are read in storage order, split between its reads, and
    handed out once all its reads are in), reads in flight at once when they are not
    joined into windows (``None``: ``io_threads``), and the pace of each reading worker
    (``None``: this one)."""

    io_threads: int
    growth: int
    read_bytes: int
    window_reads: int = 1
    lone_reads: int | None = None
    workers: ReadPace | None = None

    def for_workers(self) -> ReadPace:
        """The pace of each reading worker."""
        return self.workers or self

    def lone_reads_in_flight(self) -> int:
        """Reads in flight at once when they are not joined into windows."""
        return self.lone_reads or self.io_threads


# Two reading workers of 22 KB rows on an object store (``bench_lance.py --s3 --heavy``,
# 20 ms) held 0.6 GB above the first batch with 32 MiB reads, 0.32 GB with 16 MiB; the
# epoch ran at 0.89 and 0.85 of local (0.90 and 0.68 after its first batch).
WORKER_READ_BYTES = 16 * 2**20


# Local disk. Reads grow 4x at a time up to 16 MiB: small first reads bring the first
# batch early, large ones read each storage page once and cost lance less CPU per row
# (scattered 22 KB rows: 1,500-row reads took about 0.6x the CPU of 380-row ones). While a
# read runs lance holds several times its size: 16 MiB keeps a reading process's memory
# flat through an epoch (32 MiB was faster but grew 0.25 GB and kept creeping). Reads are
# joined two at a time into windows read in storage order (see REMOTE_PACE): 25k rows of
# 22 KB at 0 workers ran 1.05 (epoch 1) and 1.08 (epoch 2) times as fast as two single
# reads, medians of 6 rounds. Two windows are in flight, so lance decodes the next while
# the main process works on one: with one, a quarter of the 2 cores sat idle (perf) and the
# same rows ran at 54k (epoch 1) and 61k rows/s (later epochs) where two ran 60k and 65k,
# medians of 5 interleaved rounds, at most 0.17 GB above the first batch instead of 0.14
# (scratch script). Reads that are not joined (narrow rows) stay two in flight: four of 2M
# light rows ran no faster and held up to 0.55 GB above the first batch instead of 0.39.
# A reading worker runs one read at a time: the rank's workers together run about as
# many as its main process does alone.
LOCAL_PACE = ReadPace(
    io_threads=4,
    growth=4,
    read_bytes=16 * 2**20,
    window_reads=2,
    lone_reads=2,
    workers=ReadPace(io_threads=1, growth=4, read_bytes=WORKER_READ_BYTES),
)
# Object store (``bench_lance.py --s3``, 20 ms a request): every read waits a round trip
# and its pages arrive as at least one GET per column and contiguous run of rows; a read
# of a plan that cycles over 32 splits holds 32 runs, so its GETs are its size over 32
# splits. Reads grow 16x at a time (the first batch's reads, then full size) to 32 MiB:
# 12,500 clumped 22 KB rows took 771 GETs (96 KB median) instead of 1,330 (64 KB) at
# 16 MiB and ran 1.5x faster, 0.05-0.1 GB more resident. (Full size straight after the
# first read saves the storage chunks that the short runs of small reads fetch whole,
# about 2 MB per reading process and epoch, but the first batch then waits for a full
# read: 1.6 s instead of 0.7-0.9 s for 2M light rows at 0 workers.) Four full-size reads
# in flight hide the round trips while lance decodes the ones that came back: 25k rows of
# 22 KB at 0 workers, 20 ms, ran at 0.43 (0.39-0.49) of local after the first batch with
# at most two full-size reads in flight and 0.64 (0.57-0.66) with four, 0.29 and 0.31 GB
# above the first batch (one 3-round run each); 2M light rows 0.89 and 0.98 (0.64 and
# 0.72 GB). Eight in flight, joined four at a time into windows read in storage order,
# send a split's rows of four reads as one run (fewer, larger GETs): the same heavy rows
# then ran at 0.82 (0.74-0.85) of local with 0.41 GB above the first batch, where four
# single reads ran at 0.51 (0.50-0.52); light rows at the same speed (their reads are not
# joined; one 3-round run each, scratch script). ``bench_lance.py --s3 --heavy``: 31.8k ->
# 60-64k rows/s, 1,862 -> 1,088 GETs an epoch, 0.75-0.85 of local in two runs. A reading
# worker keeps as many in flight, in reads of at most ``WORKER_READ_BYTES``: two workers of
# the same rows ran at 0.78 of local with eight reads each in windows of four, 0.67 with
# four in windows of two (3 rounds, scratch script).
REMOTE_PACE = ReadPace(
    io_threads=8,
    growth=16,
    read_bytes=32 * 2**20,
    window_reads=4,
    workers=ReadPace(io_threads=8, growth=16, read_bytes=WORKER_READ_BYTES, window_reads=4),
)
