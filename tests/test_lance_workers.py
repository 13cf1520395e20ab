"""Reading workers serve every row once, in batches that do not depend on their timing."""

import gc

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
        main_rows, *worker_rows = dm.stream.source.read_counters.values[:, 2].tolist()
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
    worker_rows = dm.stream.source.read_counters.values[1:, 2]
    before = worker_rows.sum()
    batches = list(dm.train_dataloader())
    ids = torch.cat([batch["id"] for batch in batches])
    assert sorted(ids.tolist()) == list(range(HEAVY_ROWS))
    for batch in batches:
        assert_rows_match(batch, table)
    # the workers served the next epoch, even those blocked sending a batch (1 MiB:
    # batches cross the pipe and fill it) of the one stopped early
    assert worker_rows.sum() - before >= HEAVY_ROWS  # and the stopped one's last reads
    dm.teardown("fit")


def test_workers_stop_with_their_data_module(heavy_uri):
    dm = module(heavy_uri)
    dm.setup("fit")
    started = worker_pids(dm)
    del dm
    gc.collect()
    assert gone(started)
