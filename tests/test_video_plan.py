"""The video planner: coverage, balance and determinism, whatever the topology."""

import collections

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_stream.plan import RankEpochPlan, ReaderOrder
from lightning_stream.video.plan import (
    Piece,
    anchor_order,
    chunk_frames,
    cut_chunks,
    cut_splits,
    window,
)
from lightning_stream.video.task import reader_positions

lengths_st = st.lists(st.integers(1, 40), min_size=1, max_size=15)


@settings(max_examples=150, deadline=None)
@given(
    lengths=lengths_st,
    num_splits=st.sampled_from([1, 2, 4, 6, 12]),
    seed=st.integers(0, 9),
    epoch=st.integers(0, 3),
    pool=st.integers(1, 4),
    chunk=st.integers(1, 50),
)
def test_every_selected_frame_is_an_anchor_once_in_balanced_splits(
    lengths, num_splits, seed, epoch, pool, chunk
):
    if sum(lengths) < num_splits:
        return
    splits, split_len = cut_splits(lengths, num_splits, seed, epoch)
    assert split_len == sum(lengths) // num_splits
    assert [sum(len(p) for p in pieces) for pieces in splits] == [split_len] * num_splits
    anchors = collections.Counter()
    for split, pieces in enumerate(splits):
        chunks = cut_chunks(pieces, chunk)
        assert max(len(c) for c in chunks) <= chunk and min(len(c) for c in chunks) > 0
        assert sum(len(c) for c in chunks) == split_len
        piece, frame = anchor_order(chunks, pool, seed, epoch, split)
        assert len(frame) == split_len
        for p, f in zip(piece.tolist(), frame.tolist(), strict=True):
            assert chunks[p].start <= f < chunks[p].stop
            anchors[chunks[p].episode, f] += 1
    assert set(anchors.values()) <= {1}
    assert len(anchors) == sum(lengths) - sum(lengths) % num_splits


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, seed=st.integers(0, 9), data=st.data())
def test_the_epoch_is_the_same_on_every_topology(lengths, seed, data):
    num_splits = 12
    if sum(lengths) < num_splits:
        return
    split_len = sum(lengths) // num_splits
    consumed = [0] * num_splits
    served = None
    for world, workers in [(1, 0), (2, 2), (3, 2), (4, 3), (6, 0)]:
        rows = []
        for rank in range(world):
            plan = RankEpochPlan(tuple(consumed), split_len, world, rank, workers, 5)
            if workers > 1:  # the head on the main process, then each worker's block
                rows += list(reader_positions(ReaderOrder(plan, range(0), head=True)))
            for worker in range(max(1, workers)):
                rows += list(reader_positions(ReaderOrder.of_worker(plan, worker)))
        assert len(rows) == len(set(rows)) == num_splits * split_len
        served = served or sorted(rows)
        assert sorted(rows) == served
    assert cut_splits(lengths, num_splits, seed, 1) == cut_splits(lengths, num_splits, seed, 1)


def test_windows_clamp_to_the_episode_and_flag_padding():
    frames, pad = window(1, 10, np.asarray([-3, 0, 2]))
    assert frames.tolist() == [0, 1, 3] and pad.tolist() == [True, False, False]
    frames, pad = window(9, 10, np.asarray([0, 1]))
    assert frames.tolist() == [9, 9] and pad.tolist() == [False, True]


def test_chunks_fill_the_budget_with_their_margins():
    # two cameras of 100-byte frames, one with windows spanning 4 frames beyond the anchor
    cameras = [(100, 4), (100, 0)]
    assert chunk_frames(10 * (7 * 200 + 400), 10, cameras) == 7
    assert chunk_frames(10 * (7 * 200 + 400) - 1, 10, cameras) == 6
    assert chunk_frames(10 * 599, 10, cameras) == 0
    chunks = cut_chunks([Piece(3, 10, 20)], 4)
    assert chunks == [Piece(3, 10, 13), Piece(3, 13, 16), Piece(3, 16, 20)]
