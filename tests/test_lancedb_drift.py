"""lancedb's own loader must serve rows in the order lightning_stream.plan models.

LanceDataModule reads lancedb's splits with its own reader, in the order that
``lancedb.streaming.StreamingDataset`` / ``StreamingDataLoader`` deliver them; that order
is modelled from outside in :mod:`lightning_stream.plan`. If a lancedb release changes it,
these tests fail and name the release.
"""

import lancedb
import numpy as np
import pytest
from lancedb.streaming import StreamingDataLoader, StreamingDataset

from lightning_stream import LanceDataModule
from lightning_stream.plan import RankEpochPlan

NUM_SPLITS = 12
BATCH = 4


def ids_of(rows):
    return [row["id"] for row in rows]


def lancedb_order(table, rank, world_size, num_workers, consumed, clump, epoch=1):
    dataset = StreamingDataset(
        table,
        num_splits=NUM_SPLITS,
        shuffle=True,
        shuffle_seed=0,
        shuffle_clump_size=clump,
        epoch=epoch,
        rank=rank,
        world_size=world_size,
        columns=["id"],
    )
    dataset.load_state_dict(
        {
            "num_splits": NUM_SPLITS,
            "shuffle_seed": 0,
            "epoch": epoch,
            "samples_consumed_per_split": consumed,
        }
    )
    if num_workers == 0:
        return [row["id"] for row in dataset]
    loader = StreamingDataLoader(
        dataset,
        batch_size=BATCH,
        num_workers=num_workers,
        collate_fn=ids_of,
        multiprocessing_context="spawn",
    )
    return [i for batch in loader for i in batch]


def modelled_order(source, rank, world_size, num_workers, consumed, epoch=1):
    """Row ids in the order plan.py says lancedb serves them."""
    plan = RankEpochPlan(tuple(consumed), source.split_len, world_size, rank, num_workers, BATCH)
    rows = source.split_rows(epoch)[plan.splits.start : plan.splits.stop]
    if num_workers <= 1:
        return rows[plan.reader_order(0)].tolist()
    # Several workers (from equal counts): each serves its sub-block round-robin, cut
    # into batches, and the DataLoader hands out one batch of each worker in turn. (The
    # data module serves the first cycles itself; lancedb's workers start at once.)
    per_worker = len(plan.splits) // num_workers
    level = plan.start[0]
    readers = [
        rows[w * per_worker : (w + 1) * per_worker, level:].T.reshape(-1)
        for w in range(num_workers)
    ]
    batches = [np.array_split(r, range(BATCH, len(r), BATCH)) for r in readers]
    return [int(i) for turn in zip(*batches, strict=True) for batch in turn for i in batch]


@pytest.mark.parametrize(
    ("rank", "world_size", "num_workers", "consumed"),
    [
        (0, 1, 0, [3, 5, 5, 4, 0, 7, 7, 7, 2, 2, 9, 1]),  # uneven: lagging splits first
        (1, 2, 1, [0] * 6 + [4, 6, 6, 5, 3, 6]),
        (0, 1, 2, [5] * NUM_SPLITS),  # several workers start from equal counts
        (1, 2, 3, [2] * NUM_SPLITS),
    ],
)
def test_lancedb_order_matches_the_plan(table_dir, rank, world_size, num_workers, consumed):
    table = lancedb.connect(str(table_dir / "db")).open_table("samples")
    dm = LanceDataModule(str(table_dir / "db"), "samples", num_splits=NUM_SPLITS, batch_size=1)
    dm.setup("fit")
    source = dm.stream.source
    stored = table.search().select(["id"]).with_row_id(True).limit(None).to_arrow()
    by_row = dict(zip(stored["_rowid"].to_pylist(), stored["id"].to_pylist(), strict=True))
    model = [by_row[row] for row in modelled_order(source, rank, world_size, num_workers, consumed)]
    actual = lancedb_order(
        table, rank, world_size, num_workers, consumed, source.shuffle_clump_size
    )
    assert actual == model, (
        f"lancedb {lancedb.__version__} serves rank {rank}/{world_size} with {num_workers}"
        " workers in another order than lightning_stream.plan models: LanceDataModule would"
        " no longer read the rows lancedb's splits define in lancedb's order. Pin lancedb to"
        " the tested range in pyproject.toml (>=0.40,<0.41) or update plan.py"
    )
