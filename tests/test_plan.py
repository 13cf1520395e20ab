"""The planning arithmetic, checked exhaustively against a direct simulation."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_stream.plan import (
    BatchSizes,
    RankEpochPlan,
    catch_up_order,
    check_topology,
    rank_splits,
    worker_rows,
)


def simulate_rank_stream(start, split_len, num_workers, batch_size):
    """Split index of every row a rank delivers, by walking lancedb's order row by row."""
    counts = list(start)
    order = []
    level = max(counts)
    while min(counts) < level:  # lagging splits first, lowest count then lowest index
        index = min(range(len(counts)), key=lambda i: (counts[i], i))
        counts[index] += 1
        order.append(index)
    workers = max(1, num_workers)
    per_worker = len(counts) // workers
    streams = []
    for worker in range(workers):
        rows = []
        for _ in range(split_len - level):
            rows.extend(range(worker * per_worker, (worker + 1) * per_worker))
        streams.append([rows[i : i + batch_size] for i in range(0, len(rows), batch_size)])
    for round_ in range(max(len(s) for s in streams)):
        for stream in streams:
            if round_ < len(stream):
                order.extend(stream[round_])
    return order


topologies = st.sampled_from(
    [(12, 1, 0), (12, 2, 2), (12, 3, 2), (12, 4, 0), (12, 2, 3), (8, 2, 4)]
)


@settings(max_examples=200, deadline=None)
@given(
    topology=topologies,
    split_len=st.integers(1, 9),
    batch_size=st.integers(1, 7),
    data=st.data(),
)
def test_counts_after_matches_row_by_row_simulation(topology, split_len, batch_size, data):
    num_splits, world_size, num_workers = topology
    consumed = data.draw(
        st.lists(st.integers(0, split_len), min_size=num_splits, max_size=num_splits)
    )
    for rank in range(world_size):
        plan = RankEpochPlan(tuple(consumed), split_len, world_size, rank, num_workers, batch_size)
        order = simulate_rank_stream(plan.start, split_len, num_workers, batch_size)
        assert len(order) == plan.rows
        counts = list(plan.start)
        for rows, index in enumerate(order, start=1):
            counts[index] += 1
            assert plan.counts_after(rows) == counts


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 500), batch_size=st.integers(1, 64), data=st.data())
def test_batch_sizes_cover_rows_in_the_requested_steps(rows, batch_size, data):
    steps = data.draw(st.integers(math.ceil(rows / batch_size), rows))
    sizes = BatchSizes(rows, steps, batch_size)
    assert len(sizes) == steps and sum(sizes) == rows
    assert all(1 <= size <= batch_size for size in sizes)
    assert list(sizes) == [sizes[step] for step in range(steps)]
    # full batches first: each step takes all it can while a row is left for each later one
    left, greedy = rows, []
    for step in range(steps):
        greedy.append(min(batch_size, left - (steps - step - 1)))
        left -= greedy[-1]
    assert list(sizes) == greedy


def test_every_rank_takes_the_same_steps_after_an_uneven_resume():
    # DESIGN.md's example: 2 ranks x 2 workers saved after step 7, resumed on 4 ranks.
    consumed = [4, 4, 4, 3, 3, 3, 4, 4, 4, 3, 3, 3]
    plans = [RankEpochPlan(tuple(consumed), 20, 4, r, 0, 3) for r in range(4)]
    assert [p.rows for p in plans] == [48, 51, 48, 51]
    assert {len(p.sizes) for p in plans} == {17}
    assert [sum(p.sizes) for p in plans] == [48, 51, 48, 51]


def test_a_resume_that_leaves_a_rank_without_samples_is_refused():
    consumed = [20, 20, 20, 19, 19, 19]
    with pytest.raises(ValueError, match="same 1 steps"):
        _ = RankEpochPlan(tuple(consumed), 20, 2, 0, 0, 3).steps


def test_rank_and_worker_blocks_are_contiguous_and_disjoint():
    assert [list(rank_splits(12, 3, r)) for r in range(3)] == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
    ]
    assert worker_rows(10, 2, 3, 6) == [6, 4]
    assert catch_up_order([2, 1, 0]) == [2, 1, 2]


def test_topology_error_names_the_rule_and_a_fix():
    with pytest.raises(ValueError, match=r"num_splits=10 is not divisible .* 2 \* 3 = 6"):
        check_topology(10, 2, 3)
    check_topology(12, 2, 3)
