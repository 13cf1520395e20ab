"""A reading process's reads: windows of reads in storage order, served in the plan's order."""

import threading
import time

import lancedb
import numpy as np
import pyarrow as pa

from lightning_stream.demo import make_table
from lightning_stream.lance.pace import ReadPace
from lightning_stream.lance.reader import (
    BudgetedReader,
    ReadCounters,
    held_bytes,
    take_offsets,
)
from lightning_stream.lance.synthetic import heavy_rows

from .conftest import HEAVY_ROWS

CLUMP = 40
SPLITS = 6
# reads of 28 rows of about 2.1 KB (60 KB): six in flight, as two windows of three, and a
# window handed out fit in the budget
READ_BYTES = 60_000
BUDGET = 2_000_000


def serve(uri: str, window_reads: int) -> dict:
    """Every row of the heavy table through a BudgetedReader, in clumps of ``CLUMP``
    storage rows dealt to ``SPLITS`` splits and served cycling over them (as a reading
    process serves its splits): the ids served, the offsets each read asked for, the
    bytes held at each table and the largest table."""
    table = lancedb.connect(uri).open_table("heavy")
    clumps = np.random.default_rng(0).permutation(HEAVY_ROWS // CLUMP)
    splits = [
        np.concatenate([np.arange(c * CLUMP, (c + 1) * CLUMP) for c in clumps[s::SPLITS]])
        for s in range(SPLITS)
    ]
    positions = np.stack(splits, axis=1).reshape(-1)  # storage positions, serving order
    read = take_offsets(table, ["id", "jpeg"])
    asked: list[np.ndarray] = []

    def recorded(ids: np.ndarray):
        asked.append(ids.copy())
        rows = read(ids)
        assert rows.schema.field("jpeg").type == pa.binary_view(), "one type, in any order"
        return rows

    pace = ReadPace(io_threads=6, growth=4, read_bytes=READ_BYTES, window_reads=window_reads)
    counters = ReadCounters(1)
    reader = BudgetedReader(recorded, positions, BUDGET, counters, 0, pace)
    served, jpegs, held, largest = [], [], [], 0
    for rows in reader.tables():
        held.append(reader.held)
        largest = max(largest, held_bytes(rows))
        served.extend(rows["id"].to_pylist())
        jpegs.extend(rows["jpeg"].to_pylist())
    return {
        "positions": positions.tolist(),
        "served": served,
        "jpegs": jpegs,
        "asked": asked,
        "held": held,
        "largest": largest,
        "totals": counters.totals(),
    }


def runs(ids: np.ndarray) -> int:
    """Contiguous runs of storage offsets in one read."""
    return 1 + int(np.count_nonzero(np.diff(ids) != 1))


def test_windows_read_in_storage_order_and_serve_in_the_plans_order(heavy_uri):
    # make_heavy_table wrote the rows 300 at a time (conftest)
    written = [heavy_rows(start, 300, 2_000) for start in range(0, HEAVY_ROWS, 300)]
    reference = [jpeg for rows in written for jpeg in rows["jpeg"].to_pylist()]
    alone, windowed = serve(heavy_uri, 1), serve(heavy_uri, 3)
    for run in (alone, windowed):
        assert run["served"] == run["positions"], "the plan's order, every row once"
        assert run["jpegs"] == [reference[i] for i in run["positions"]]
        assert all(np.array_equal(ids, np.sort(ids)) for ids in run["asked"]), "storage order"
        assert max(run["held"]) <= BUDGET + run["largest"]
        # while a table is handed out, the next reads are in flight: six single reads, or
        # two windows of three
        assert max(run["held"]) >= 2.5 * run["largest"]
        assert run["totals"]["rows_read"] == HEAVY_ROWS
        assert run["totals"]["resident_bytes"] == 0, "every read handed back"
    # a split's rows in consecutive reads join into one run: fewer, larger range reads
    alone_runs = sum(map(runs, alone["asked"]))
    windowed_runs = sum(map(runs, windowed["asked"]))
    assert windowed_runs < 0.7 * alone_runs, (windowed_runs, alone_runs)


def test_reads_not_joined_into_windows_keep_to_their_own_limit(tmp_path):
    """Reads of narrow rows (more than WINDOW_READ_ROWS a read, not joined) run at most
    ``lone_reads`` at once; where it is unset, as many as ``io_threads``."""
    rows = 150_000
    make_table(str(tmp_path), rows)
    table = lancedb.connect(str(tmp_path)).open_table("samples")
    read = take_offsets(table, ["id"])

    def most_at_once(lone_reads: int | None) -> tuple[int, list[int]]:
        running, most, sizes, lock = [0], [0], [], threading.Lock()

        def timed(ids: np.ndarray) -> pa.Table:
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
                sizes.append(len(ids))
            time.sleep(0.05)  # every read overlaps the ones started with it
            try:
                return read(ids)
            finally:
                with lock:
                    running[0] -= 1

        # a 16-row first read, then reads of 32,768 ids of 8 bytes: above WINDOW_READ_ROWS
        pace = ReadPace(io_threads=4, growth=2048, read_bytes=2**18, window_reads=2,
                        lone_reads=lone_reads)  # fmt: skip
        reader = BudgetedReader(timed, np.arange(rows), 2**30, ReadCounters(1), 0, pace)
        served = [i for part in reader.tables() for i in part["id"].to_pylist()]
        assert served == list(range(rows))
        return most[0], sizes

    limited, sizes = most_at_once(2)
    assert limited == 2
    assert sizes[0] == 16 and min(sizes[1:-1]) == 32_768, sizes
    assert most_at_once(None)[0] == 4
