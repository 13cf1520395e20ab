"""A reading process's reads: windows of runs read once each, served in the plan's order."""

import threading
import time

import lancedb
import numpy as np
import pyarrow as pa

from lightning_stream.demo import make_table
from lightning_stream.lance.arrow import held_bytes
from lightning_stream.lance.pace import ReadPace
from lightning_stream.lance.reader import (
    TAKE_ROWS,
    BudgetedReader,
    LanceReads,
    ReadCounters,
)
from lightning_stream.lance.synthetic import heavy_rows

from .conftest import HEAVY_ROWS, Rows

CLUMP = 40
SPLITS = 6
BUDGET = 2_000_000


class Recorded(LanceReads):
    """Every read asked for, by kind: ``("scan", start, stop)`` or ``("take", offsets)``."""

    def __init__(self, table, columns) -> None:
        super().__init__(table, columns)
        self.asked: list[tuple] = []
        self.lock = threading.Lock()
        self.running = self.most = 0

    def _timed(self, read, *args):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        try:
            time.sleep(0.01)  # reads started together overlap
            return read(*args)
        finally:
            with self.lock:
                self.running -= 1

    def scan(self, start, stop):
        self.asked.append(("scan", start, stop))
        return self._timed(super().scan, start, stop)

    def take(self, offsets):
        self.asked.append(("take", offsets.copy()))
        rows = self._timed(super().take, offsets)
        assert rows.schema.field("jpeg").type == pa.binary_view(), "one type, in any order"
        return rows


def serve(uri: str, pace: ReadPace, first: int = 16) -> dict:
    """Every row of the heavy table through a BudgetedReader, in clumps of ``CLUMP``
    storage rows dealt to ``SPLITS`` splits and served one row of each split in turn: the
    ids served, the reads asked for, the bytes held at each window and the largest."""
    table = lancedb.connect(uri).open_table("heavy")
    clumps = np.random.default_rng(0).permutation(HEAVY_ROWS // CLUMP)
    splits = [
        np.concatenate([np.arange(c * CLUMP, (c + 1) * CLUMP) for c in clumps[s::SPLITS]])
        for s in range(SPLITS)
    ]
    positions = np.stack(splits, axis=1).reshape(-1)  # storage positions, serving order
    reads = Recorded(table, ["id", "jpeg"])
    counters = ReadCounters()
    reader = BudgetedReader(reads, Rows(positions, SPLITS, CLUMP), BUDGET, counters, pace)
    reader.window_rows = first
    served, jpegs, held, largest, sizes = [], [], [], 0, []
    for rows in reader.tables():
        held.append(reader.held)
        sizes.append(rows.num_rows)
        largest = max(largest, held_bytes(rows))
        served.extend(rows["id"].to_pylist())
        jpegs.extend(rows["jpeg"].to_pylist())
    return {
        "positions": positions.tolist(),
        "served": served,
        "jpegs": jpegs,
        "reads": reads,
        "held": held,
        "largest": largest,
        "sizes": sizes,
        "totals": counters.totals(),
    }


def read_offsets(asked: list[tuple]) -> list[int]:
    return [
        i
        for kind, *rest in asked
        for i in (range(rest[0], rest[1]) if kind == "scan" else rest[0].tolist())
    ]


def test_windows_read_each_run_once_and_serve_in_the_plans_order(heavy_uri):
    # make_heavy_table wrote the rows 300 at a time (conftest)
    written = [heavy_rows(start, 300, 2_000) for start in range(0, HEAVY_ROWS, 300)]
    reference = [jpeg for rows in written for jpeg in rows["jpeg"].to_pylist()]
    # runs of 16 rows or more are scanned
    pace = ReadPace(
        io_threads=4, windows=2, growth=4, window_bytes=10**6, run_bytes=40_000, scan_rows=16
    )
    run = serve(heavy_uri, pace)
    assert run["served"] == run["positions"], "the plan's order, every row once"
    assert run["jpegs"] == [reference[i] for i in run["positions"]]
    offsets = read_offsets(run["reads"].asked)
    assert sorted(offsets) == list(range(HEAVY_ROWS)), "every row read once"
    assert all(np.all(np.diff(r[1]) > 0) for r in run["reads"].asked if r[0] == "take")
    scans = [r for r in run["reads"].asked if r[0] == "scan"]
    assert scans and all(stop - start >= 16 for _, start, stop in scans)
    # windows grow from the first one to their full size (here the budget's share)
    assert run["sizes"][:3] == [16, 64, 256] and len(set(run["sizes"][3:-1])) == 1
    assert max(run["held"]) <= BUDGET + run["largest"]
    assert run["totals"]["rows_read"] == HEAVY_ROWS
    assert run["totals"]["resident_bytes"] == 0, "every read handed back"


def test_windows_in_flight_and_reads_at_once_keep_to_the_pace(heavy_uri):
    # takes only: each window's rows in several takes, on the reader's threads
    pace = ReadPace(io_threads=4, windows=2, growth=4, window_bytes=10**6, run_bytes=10**5)
    run = serve(heavy_uri, pace)
    assert run["served"] == run["positions"]
    assert run["reads"].most == 4, "the threads are kept busy, and no more"
    assert all(kind == "take" for kind, *_ in run["reads"].asked)
    single = ReadPace(io_threads=1, windows=1, growth=4, window_bytes=10**6, run_bytes=10**5)
    assert serve(heavy_uri, single)["reads"].most == 1


class Takes(LanceReads):
    def __init__(self, table, columns) -> None:
        super().__init__(table, columns)
        self.sizes: list[int] = []

    def take(self, offsets):
        self.sizes.append(len(offsets))
        return super().take(offsets)


def test_single_rows_are_read_in_takes_of_bounded_size(tmp_path):
    make_table(str(tmp_path), 150_000)
    reads = Takes(lancedb.connect(str(tmp_path)).open_table("samples"), ["id"])
    order = np.random.default_rng(0).permutation(150_000)  # single rows: no runs
    pace = ReadPace(io_threads=4, windows=2, growth=4, window_bytes=2**30, run_bytes=2**20)
    reader = BudgetedReader(reads, Rows(order), 2**30, ReadCounters(), pace)
    served = [i for part in reader.tables() for i in part["id"].to_pylist()]
    assert served == order.tolist()
    assert max(reads.sizes) <= TAKE_ROWS < sum(reads.sizes)
