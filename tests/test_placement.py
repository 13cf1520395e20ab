"""The placement of an epoch's rows: pure arithmetic, checked without files."""

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_stream.lance.order import ReaderRows, TableOrder
from lightning_stream.lance.selection import Selection
from lightning_stream.placement import (
    ClumpLayout,
    LengthLayout,
    Permutation,
    epoch_permutation,
    split_pieces,
)
from lightning_stream.plan import RankEpochPlan, ReaderOrder

TOPOLOGIES = [(1, 0), (1, 2), (2, 0), (2, 3), (3, 2), (6, 1)]  # (world size, workers)


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 5000), key=st.integers(0, 2**64 - 1))
def test_a_permutation_is_a_bijection_with_its_inverse(size, key):
    permutation = Permutation(size, key)
    items = permutation(np.arange(size))
    assert sorted(items.tolist()) == list(range(size))
    np.testing.assert_array_equal(permutation.inverse(items), np.arange(size))


def served_rows(order: TableOrder, consumed: tuple, world: int, workers: int) -> list:
    """Every reader's rows of an epoch resumed from ``consumed`` on a topology, by split:
    ``(split, positions, offsets)``."""
    served = []
    for rank in range(world):
        plan = RankEpochPlan(consumed, order.split_len, world, rank, workers, 7)
        if workers > 1:  # the head first, in the main process, then each worker's block
            readers = [ReaderOrder(plan, range(0), head=True)]
            readers += [ReaderOrder.of_worker(plan, worker) for worker in range(workers)]
        else:
            readers = [ReaderOrder.of_worker(plan, 0)]
        for reader in readers:
            rows = ReaderRows(order, reader)
            # computed in uneven windows, as a reader's reads grow
            bounds = [0, *sorted({min(len(rows), 3**k) for k in range(15)})]
            offsets = np.concatenate([rows(a, b) for a, b in itertools.pairwise(bounds)])
            splits, positions = reader.positions()
            for split in np.unique(splits):
                mine = splits == split
                served.append((int(split), positions[mine], offsets[mine]))
    return served


@settings(max_examples=80, deadline=None)
@given(
    rows=st.integers(12, 3000),
    num_splits=st.sampled_from([6, 12]),
    clump=st.integers(1, 70),
    shuffle=st.booleans(),
    seed=st.integers(0, 2**31),
    epoch=st.integers(0, 100),
    filtered=st.booleans(),
    data=st.data(),
)
def test_splits_are_equal_disjoint_and_the_same_on_every_topology(
    rows, num_splits, clump, shuffle, seed, epoch, filtered, data
):
    selection = None
    selected = np.arange(rows)
    if filtered:  # a filter selects part of a larger table
        keep = np.random.default_rng(seed).random(rows * 2) < 0.5
        keep[:num_splits] = True
        selection = Selection(np.packbits(keep, bitorder="little"), len(keep))
        selected = np.flatnonzero(keep)
    order = TableOrder(len(selected), num_splits, clump, shuffle, seed, epoch, selection)
    split_len = len(selected) // num_splits
    expected = [order.offsets(split, np.arange(split_len)) for split in range(num_splits)]
    every = np.concatenate(expected)
    assert all(len(split) == split_len for split in expected)
    assert len(np.unique(every)) == len(every)  # disjoint
    assert set(every.tolist()) <= set(selected.tolist())
    assert len(selected) - len(every) == len(selected) % num_splits  # the surplus
    world, workers = data.draw(st.sampled_from(TOPOLOGIES))
    consumed = tuple(
        data.draw(st.lists(st.integers(0, split_len), min_size=num_splits, max_size=num_splits))
    )
    if data.draw(st.booleans()):  # a fresh epoch
        consumed = (0,) * num_splits
    try:
        served = served_rows(order, consumed, world, workers)
    except ValueError:  # a remainder that this world size cannot share out evenly
        return
    by_split = {}
    for split, positions, offsets in served:
        by_split.setdefault(split, []).append((positions, offsets))
    for split, want in enumerate(expected):
        positions = np.concatenate([p for p, _ in by_split.get(split, [])] or [[]])
        offsets = np.concatenate([o for _, o in by_split.get(split, [])] or [[]])
        # each split's remaining rows, in its own order, whoever serves them
        np.testing.assert_array_equal(positions, np.arange(consumed[split], split_len))
        np.testing.assert_array_equal(offsets, want[consumed[split] :])
    if not shuffle:  # storage order, split after split
        np.testing.assert_array_equal(every, selected[: len(every)])


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    num_splits=st.integers(1, 12),
    seed=st.integers(0, 99),
    epoch=st.integers(0, 9),
)
def test_episodes_of_any_length_are_cut_into_equal_splits(lengths, num_splits, seed, epoch):
    total = sum(lengths)
    if total < num_splits:
        return
    layout = LengthLayout(tuple(lengths), epoch_permutation(len(lengths), seed, epoch, True))
    split_len = total // num_splits
    frames = []
    for split in range(num_splits):
        pieces = split_pieces(layout, split, split_len)
        assert sum(stop - start for _, start, stop in pieces) == split_len
        frames += [(episode, f) for episode, start, stop in pieces for f in range(start, stop)]
        assert all(0 <= start < stop <= lengths[e] for e, start, stop in pieces)
    assert len(set(frames)) == len(frames) == num_splits * split_len


@settings(max_examples=40, deadline=None)
@given(total=st.integers(1, 10**6), size=st.integers(1, 5000), seed=st.integers(0, 9))
def test_clumps_are_located_by_arithmetic(total, size, seed):
    count = -(-total // size)
    layout = ClumpLayout(total, size, epoch_permutation(count, seed, 0, True))
    offsets = np.unique(np.random.default_rng(seed).integers(0, total, 200))
    positions, within = layout.locate(offsets)
    starts = layout.start(positions)
    np.testing.assert_array_equal(starts + within, offsets)
    lengths = layout.start(positions + 1) - starts
    items = layout.item(positions)
    np.testing.assert_array_equal(
        lengths, np.where(items == count - 1, total - size * (count - 1), size)
    )
    assert np.all((within >= 0) & (within < lengths))


def test_a_billion_rows_cost_nothing_per_row():
    # the last split of a billion rows, without anything the size of the table
    order = TableOrder(10**9, 4096, 4096, True, 0, 3)
    rows = order.offsets(4095, np.arange(order.split_len - 1000, order.split_len))
    assert len(np.unique(rows)) == 1000 and rows.max() < 10**9
    single = TableOrder(10**9, 4096, 1, True, 0, 3)  # single rows: a bijection per index
    assert len(np.unique(single.offsets(7, np.arange(10_000)))) == 10_000
