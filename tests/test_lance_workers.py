"""Reading workers serve every row once, in batches that do not depend on their timing;
without workers, a thread of the main process reads ahead of training_step."""

import gc
import subprocess
import sys
import threading
import time

import lancedb
import numpy as np
import pyarrow as pa
import pytest
import torch

from lightning_stream import LanceDataModule
from lightning_stream.lance.synthetic import heavy_rows

from .conftest import HEAVY_ROWS, gone, worker_pids


def reference() -> pa.Table:
    # make_heavy_table wrote the rows 300 at a time (conftest)
    return pa.concat_tables(heavy_rows(start, 300, 2_000) for start in range(0, HEAVY_ROWS, 300))


def assert_rows_match(batch: dict, table: pa.Table) -> None:
    ids = batch["id"].numpy()
    rows = table.take(pa.array(ids))
    assert batch["caption"] == rows.column("caption").to_pylist()
    assert list(batch["jpeg"]) == rows.column("jpeg").to_pylist()
    embedding = np.stack(rows.column("embedding").to_numpy(zero_copy_only=False))
    assert np.array_equal(batch["embedding"].numpy(), embedding)
    for values, expected in zip(batch["tokens"], rows.column("tokens").to_pylist(), strict=True):
        assert values.tolist() == torch.tensor(expected or [], dtype=torch.float32).tolist()


def rows_read(dm: LanceDataModule) -> list[float]:
    """Rows read by each reader of the rank: this process first, then each worker."""
    return [counters["rows_read"] for counters in dm.stream.source.engine.reader_counters()]


def module(uri: str, budget: int = 8 * 2**20) -> LanceDataModule:
    gc.collect()  # earlier tests' modules, and so their workers, are gone
    return LanceDataModule(
        uri, "heavy", num_splits=12, batch_size=24, num_workers=2, read_ahead_bytes=budget
    )


# 8 MiB: a batch (24 rows, 105 KB) fits in a worker's shared-memory slot; 1 MiB: it does
# not, and crosses the pipe
@pytest.mark.parametrize("budget", [8 * 2**20, 2**20])
def test_workers_serve_every_row_in_the_same_batches_every_run(heavy_uri, budget):
    table = reference()
    served = {}
    for run in (0, 1):
        dm = module(heavy_uri, budget)
        dm.setup("fit")
        epochs = [list(dm.train_dataloader()) for _ in range(2)]
        main_rows, *worker_rows = rows_read(dm)
        started = worker_pids(dm)
        dm.teardown("fit")
        assert gone(started), "teardown stops them"
        # the main process reads only a resume's catch-up rows: none here
        assert main_rows == 0
        assert sum(worker_rows) == 2 * HEAVY_ROWS
        for batches in epochs:
            ids = torch.cat([batch["id"] for batch in batches])
            assert sorted(ids.tolist()) == list(range(HEAVY_ROWS))
            for batch in batches:
                assert_rows_match(batch, table)
        served[run] = [[batch["id"].tolist() for batch in batches] for batches in epochs]
    assert served[0] == served[1], "the workers' timing changes no batch"
    assert served[0][0] != served[0][1], "each epoch has its own order"


@pytest.mark.parametrize("budget", [8 * 2**20, 2**20])
def test_an_epoch_stopped_early_leaves_the_next_one_whole(heavy_uri, budget):
    table = reference()
    dm = module(heavy_uri, budget)
    dm.setup("fit")
    worker_pids(dm)
    for index, _ in enumerate(dm.train_dataloader()):
        if index == 5:
            break  # the workers hold batches the main process never takes
    before = sum(rows_read(dm)[1:])
    batches = list(dm.train_dataloader())
    ids = torch.cat([batch["id"] for batch in batches])
    assert sorted(ids.tolist()) == list(range(HEAVY_ROWS))
    for batch in batches:
        assert_rows_match(batch, table)
    # the workers served the next epoch, even those blocked sending a batch (1 MiB:
    # batches cross the pipe and fill it) of the one stopped early
    assert sum(rows_read(dm)[1:]) - before >= HEAVY_ROWS  # and the stopped one's last reads
    dm.teardown("fit")


def test_workers_begin_the_next_epoch_before_it_is_asked_for(heavy_uri):
    table = reference()
    dm = module(heavy_uri)
    dm.setup("fit")
    first = list(dm.train_dataloader())
    # every batch of this epoch and the workers' end of it were taken: what waits now in
    # a worker's pipe is a batch of the next epoch
    results = dm.stream.source.engine.pool.results
    deadline = time.monotonic() + 60
    while not all(pipe.poll(0) for pipe in results) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert all(pipe.poll(0) for pipe in results), "the workers read the next epoch ahead"
    second = list(dm.train_dataloader())
    dm.teardown("fit")
    ids = torch.cat([batch["id"] for batch in second])
    assert sorted(ids.tolist()) == list(range(HEAVY_ROWS))
    for batch in second:
        assert_rows_match(batch, table)
    assert [b["id"].tolist() for b in first] != [b["id"].tolist() for b in second]


def test_workers_stop_with_their_data_module(heavy_uri):
    dm = module(heavy_uri)
    dm.setup("fit")
    started = worker_pids(dm)
    del dm
    gc.collect()
    assert gone(started)


def test_without_workers_a_thread_reads_ahead_and_begins_the_next_epoch(heavy_uri):
    """``num_workers=0``: once an epoch is read the next is begun before it is asked for;
    an epoch stopped early leaves the next whole; the transform runs on the main thread,
    in batch order."""
    table = reference()
    transformed = []

    def transform(batch: dict) -> dict:
        on_main = threading.current_thread() is threading.main_thread()
        transformed.append((on_main, batch["id"].tolist()))
        return batch

    dm = LanceDataModule(
        heavy_uri, "heavy", num_splits=12, batch_size=24, num_workers=0, transform=transform
    )
    dm.setup("fit")
    first = list(dm.train_dataloader())
    deadline = time.monotonic() + 60
    while rows_read(dm)[0] <= HEAVY_ROWS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert rows_read(dm)[0] > HEAVY_ROWS, "the next epoch is read before it is asked for"
    for index, _ in enumerate(dm.train_dataloader()):
        if index == 5:
            break
    third = list(dm.train_dataloader())
    dm.teardown("fit")
    for batches in (first, third):
        ids = torch.cat([batch["id"] for batch in batches])
        assert sorted(ids.tolist()) == list(range(HEAVY_ROWS))
        for batch in batches:
            assert_rows_match(batch, table)
    assert all(on_main for on_main, _ in transformed)
    assert [ids for _, ids in transformed[: len(first)]] == [b["id"].tolist() for b in first]


def test_a_script_that_ends_without_teardown_exits_while_the_next_epoch_is_read(tmp_path):
    # Python exits while the reading thread draws or reads the next epoch: before the
    # thread was stopped at exit, about one run in ten of this script hung or crashed
    rows = 8_000
    blobs = pa.array([bytes([i % 256]) * 2_000 for i in range(rows)], pa.binary())
    db = str(tmp_path / "db")
    lancedb.connect(db).create_table("t", pa.table({"id": np.arange(rows), "b": blobs}))
    script = (
        "import sys\n"
        "from lightning_stream import LanceDataModule\n"
        "dm = LanceDataModule(sys.argv[1], 't', num_splits=8, batch_size=64)\n"
        "dm.setup('fit')\n"
        "for batch in dm.train_dataloader():\n"
        "    pass\n"
    )
    for _ in range(5):
        result = subprocess.run(
            [sys.executable, "-c", script, db], capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-3000:]
