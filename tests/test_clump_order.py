"""The clumped shuffle of a table (the default): a pure function of (seed, epoch, split)
that keeps storage runs together, so a reader fetches each clump front to back."""

import lancedb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_stream import LanceDataModule
from lightning_stream.demo import make_table
from lightning_stream.lance.order import (
    CLUMP_ROWS,
    CLUMPS_PER_SPLIT,
    POOL_CLUMPS,
    clump_rows,
    pool_clumps,
)
from lightning_stream.lance.source import LanceSource

ROWS = 1000


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("clumps") / "db")
    make_table(uri, ROWS)
    return uri


def split_rows(uri, seed, epoch, num_splits, clump, filter=None):
    """Storage offsets of every split, ``[num_splits, split_len]``, in serving order."""
    source = LanceSource(
        uri,
        "samples",
        version=None,
        num_splits=num_splits,
        shuffle=True,
        shuffle_seed=seed,
        shuffle_clump_size=clump,
        columns=None,
        filter=filter,
        transform=None,
        read_ahead_bytes=2**24,
    )
    order = source.epoch_order(epoch)
    return np.stack([order.offsets(s, np.arange(order.split_len)) for s in range(num_splits)])


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 50),
    num_splits=st.integers(1, 24),
    clump=st.integers(2, 300),
)
def test_clumped_splits_are_a_pure_function_of_seed_epoch_and_split(
    table, seed, epoch, num_splits, clump
):
    splits = split_rows(table, seed, epoch, num_splits, clump)
    again = split_rows(table, seed, epoch, num_splits, clump)  # another open of the table
    np.testing.assert_array_equal(splits, again)
    rows = splits.ravel()
    assert splits.shape == (num_splits, ROWS // num_splits)
    assert len(np.unique(rows)) == len(rows)  # no row twice; the surplus left out
    for split in splits:
        # a split serves from at most POOL_CLUMPS clumps at once, each front to back
        clumps = split // clump
        opened = np.zeros(len(split), dtype=int)
        for clump_id in np.unique(clumps):
            (where,) = np.nonzero(clumps == clump_id)
            np.testing.assert_array_equal(split[where], np.sort(split[where]))
            opened[where[0] : where[-1] + 1] += 1
        assert opened.max() <= POOL_CLUMPS


def test_another_epoch_or_seed_is_another_order(table):
    first = split_rows(table, 0, 0, 4, 50)
    assert not np.array_equal(first, split_rows(table, 0, 1, 4, 50))
    assert not np.array_equal(first, split_rows(table, 1, 0, 4, 50))


def test_a_filter_orders_the_selected_rows_only(table):
    ids = lancedb.connect(table).open_table("samples").to_arrow()["label"].to_numpy()
    selected = np.flatnonzero(ids < 0.5)
    splits = split_rows(table, 3, 1, 6, 20, filter="label < 0.5")
    assert splits.shape == (6, len(selected) // 6)
    assert set(splits.ravel()) <= set(selected.tolist())
    assert len(np.unique(splits)) == splits.size


@given(rows=st.integers(1, 10**9), num_splits=st.integers(1, 512))
def test_the_default_clump_leaves_every_split_several_clumps(rows, num_splits):
    clump = clump_rows(None, rows, num_splits)
    if clump == 1:  # too few rows for clumps of two
        assert rows < 2 * num_splits * CLUMPS_PER_SPLIT
    else:
        assert 2 <= clump <= CLUMP_ROWS
        assert rows // num_splits // clump >= CLUMPS_PER_SPLIT


def test_an_asked_clump_size_is_kept():
    assert clump_rows(1, 10**6, 8) == 1  # single rows
    assert clump_rows(4096, 100, 8) == 4096


def test_a_clumped_epoch_is_exact_and_mixes_more_clumps_than_splits(table):
    dm = LanceDataModule(table, "samples", num_splits=4, batch_size=16, shuffle_clump_size=25)
    dm.setup("fit")
    ids = np.concatenate([batch["id"].numpy() for batch in dm.train_dataloader()])
    order = dm.stream.source.epoch_order(0)
    assert sorted(ids) == sorted(
        np.concatenate([order.offsets(s, np.arange(250)) for s in range(4)])
    )
    assert len(np.unique(ids)) == len(ids) == ROWS
    # one row of each of the 4 splits in turn, each split drawing on a pool of clumps: a
    # batch of 16 holds rows of more clumps than splits
    mixed = [len(np.unique(batch // 25)) for batch in ids[:992].reshape(-1, 16)]
    assert np.mean(mixed) > 6, mixed


def test_a_pool_holds_a_few_mib_of_clumps():
    assert pool_clumps(4096, 76) == POOL_CLUMPS  # light rows: 0.3 MB a clump
    assert pool_clumps(195, 22_000) == 1  # rows of 22 KB: 4.3 MB a clump
    assert pool_clumps(4096, 512) == 2  # 2 MiB a clump
