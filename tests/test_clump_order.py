"""The clumped shuffle (the default): a pure function of (seed, epoch,
split) that keeps storage runs together, so a reader fetches each clump in a few large
range reads."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_stream import LanceDataModule
from lightning_stream.demo import make_table
from lightning_stream.lance.order import CLUMP_ROWS, CLUMPS_PER_SPLIT, clump_rows
from lightning_stream.lance.source import LanceSource

ROWS = 1000


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    uri = str(tmp_path_factory.mktemp("clumps") / "db")
    make_table(uri, ROWS)
    return uri


def split_rows(uri, seed, epoch, num_splits, clump):
    source = LanceSource(
        uri, "samples", version=None, num_splits=num_splits, shuffle=True, shuffle_seed=seed,
        shuffle_clump_size=clump, columns=None, filter=None, transform=None,
        read_ahead_bytes=2**24, num_workers=0,
    )  # fmt: skip
    return source.split_rows(epoch)


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
        # within a split, a row that does not start a clump follows the row before it
        inside = split[1:] % clump != 0
        np.testing.assert_array_equal(split[1:][inside], split[:-1][inside] + 1)


def test_another_epoch_or_seed_is_another_order(table):
    first = split_rows(table, 0, 0, 4, 50)
    assert not np.array_equal(first, split_rows(table, 0, 1, 4, 50))
    assert not np.array_equal(first, split_rows(table, 1, 0, 4, 50))


@given(rows=st.integers(1, 10**9), num_splits=st.integers(1, 512))
def test_the_default_clump_leaves_every_split_several_clumps(rows, num_splits):
    clump = clump_rows(None, rows, num_splits)
    if clump is None:  # too few rows for clumps of two
        assert rows < 2 * num_splits * CLUMPS_PER_SPLIT
    else:
        assert 2 <= clump <= CLUMP_ROWS
        assert rows // num_splits // clump >= CLUMPS_PER_SPLIT


def test_an_asked_clump_size_is_kept():
    assert clump_rows(1, 10**6, 8) is None  # single rows
    assert clump_rows(4096, 100, 8) == 4096


def test_a_clumped_epoch_is_exact_and_mixes_every_split_of_the_reader(table):
    dm = LanceDataModule(table, "samples", num_splits=8, batch_size=16, shuffle_clump_size=64)
    dm.setup("fit")
    ids = np.concatenate([batch["id"].numpy() for batch in dm.train_dataloader()])
    assert sorted(ids) == sorted(dm.stream.source.split_rows(0).ravel())
    assert len(np.unique(ids)) == len(ids)
    # one row of each of the 8 splits in turn: a batch of 16 holds rows of 8 clumps or more
    assert all(
        len(np.unique(batch // 64)) >= 8 for batch in ids[: len(ids) // 16 * 16].reshape(-1, 16)
    )


def test_a_draw_ahead_that_failed_is_drawn_again(table):
    # the next epoch's rows are drawn on a thread while this one is served: a draw that
    # failed there (an object store's hiccup) must not be the epoch's answer later
    import lancedb

    from lightning_stream.lance.splits import Drawer, failed

    opened = lancedb.connect(table).open_table("samples")
    options = {"num_splits": 4, "split_len": ROWS // 4, "shuffle": True, "epoch": 1}
    drawer = Drawer()
    broken = drawer.draw("epoch 1", None, options)
    broken.exception()  # waits for it
    assert failed(broken)
    again = drawer.draw("epoch 1", opened, options)
    assert again is not broken
    assert np.array_equal(again.result(), split_rows(table, 0, 1, 4, 1))  # single rows
    assert drawer.draw("epoch 1", opened, options) is again, "a good draw is kept"
    drawer.close()
