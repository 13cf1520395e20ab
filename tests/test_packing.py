"""Packed token blocks: every token of an epoch once across kills and resumes on other
topologies, and the arrays of every block right against the documents it holds.

The table holds 50,000 documents of 1 to 20,000 tokens (a heavy tail,
:func:`~lightning_stream.lance.synthetic.document_lengths`) whose tokens name their
document and position, so a block's tokens say where each came from.
"""

from __future__ import annotations

import math
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_stream import LanceDataModule, TokenPacking
from lightning_stream.lance.synthetic import MAX_DOCUMENT, document_lengths, make_token_table
from lightning_stream.packing.blocks import BlockBuilder, cut_blocks
from lightning_stream.packing.layout import ReaderBlocks, TokenLayout
from lightning_stream.packing.option import IGNORE_INDEX
from lightning_stream.placement import ClumpLayout, epoch_permutation
from lightning_stream.plan import RankEpochPlan, ReaderOrder

from . import pack_run
from .conftest import train

DOCUMENTS = 50_000
SPLITS = 12
BATCH = 8
EOS, PAD = pack_run.EOS_ID, pack_run.PAD_ID


@pytest.fixture(scope="module")
def token_dir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("tokens")
    lengths = make_token_table(str(workdir / "db"), DOCUMENTS)
    return workdir, lengths


def every_token(lengths: np.ndarray) -> np.ndarray:
    """The tokens of every document, sorted (end-of-document tokens aside)."""
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    within = np.arange(lengths.sum()) - starts
    return np.repeat(np.arange(len(lengths)), lengths) * MAX_DOCUMENT + within


def assert_every_token_once(tokens: np.ndarray, lengths: np.ndarray) -> None:
    assert (tokens == EOS).sum() == len(lengths), "one end-of-document token a document"
    tokens = np.sort(tokens[tokens != EOS].astype(np.int64))
    expected = every_token(lengths)
    assert len(tokens) == len(expected)
    assert np.array_equal(tokens, expected), "a token was lost or repeated"


def check_block(block: dict[str, np.ndarray], lengths: np.ndarray) -> None:
    """One block's arrays against the documents its tokens name."""
    ids, labels = block["input_ids"], block["labels"]
    positions, segment = block["position_ids"], block["document_ids"]
    cu = block["cu_seqlens"]
    size = len(ids)
    assert cu[0] == 0 and cu[-1] == size and (np.diff(cu) >= 0).all()
    ends = [int(e) for e in np.unique(cu[1:])]
    starts = [0, *ends[:-1]]
    assert block["max_seqlen"] == max(e - s for s, e in zip(starts, ends, strict=True))
    padded = ids == PAD
    assert (labels[padded] == IGNORE_INDEX).all() and (segment[padded] == -1).all()
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        span = slice(start, end)
        assert np.array_equal(positions[span], np.arange(end - start))
        if padded[start]:
            assert padded[span].all() and end == size, "padding is the last segment"
            continue
        assert (segment[span] == index).all()
        real = ids[span][ids[span] != EOS]
        documents = np.unique(real // MAX_DOCUMENT)
        assert len(documents) <= 1, "a segment holds one document"
        if len(real):
            within = real % MAX_DOCUMENT
            assert np.array_equal(within, np.arange(within[0], within[0] + len(real)))
            if ids[end - 1] == EOS:
                assert within[-1] == lengths[documents[0]] - 1, "EOS ends its document"
        assert np.array_equal(labels[start : end - 1], ids[start + 1 : end])
        last = int(ids[end - 1])
        if last == EOS:
            assert labels[end - 1] == IGNORE_INDEX
        elif last % MAX_DOCUMENT + 1 < lengths[last // MAX_DOCUMENT]:
            assert labels[end - 1] == last + 1, "a document that goes on: its next token"
        else:
            assert labels[end - 1] == EOS


def causal_mask(cu_seqlens: np.ndarray, size: int) -> np.ndarray:
    """Which position attends to which, from a block's segment boundaries."""
    segment = np.searchsorted(cu_seqlens[1:], np.arange(size), side="right")
    return (segment[:, None] == segment[None, :]) & np.tri(size, dtype=bool)


def document_of_each_position(ids: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The document each position holds, from the tokens alone: an end-of-document
    token belongs to the document before it (or, opening the block, to the one the
    previous block ended); padding is -1."""
    documents = np.where(ids == PAD, -1, ids // MAX_DOCUMENT)
    for position in np.flatnonzero(ids == EOS):
        documents[position] = documents[position - 1] if position else -2
    return documents


@pytest.mark.parametrize("local_copy", [False, True], ids=["lance", "local-copy"])
def test_one_epoch_every_block_against_its_documents_every_token_once(
    token_dir, tmp_path, local_copy
):
    workdir, lengths = token_dir
    packing = TokenPacking("tokens", 2048, EOS, PAD, str(tmp_path / "cache"), local_copy)
    dm = LanceDataModule(
        str(workdir / "db"), "documents", num_splits=SPLITS, batch_size=BATCH, pack=packing
    )
    dm.setup("fit")
    tokens, padding, masks = [], 0, 0
    for batch in dm.train_dataloader():
        assert batch["input_ids"].dtype == torch.int64 and batch["cu_seqlens"].dtype == torch.int32
        arrays = {name: value.numpy() for name, value in batch.items()}
        for row in range(len(arrays["input_ids"])):
            block = {name: value[row] for name, value in arrays.items()}
            check_block(block, lengths)
            documents = document_of_each_position(block["input_ids"], lengths)
            # the masks agree when segments and documents cut the block at the same places
            # and no document comes back after another one (checked on every block)
            segments = np.searchsorted(block["cu_seqlens"][1:], np.arange(2048), side="right")
            cuts = documents[1:] != documents[:-1]
            assert np.array_equal(segments[1:] != segments[:-1], cuts)
            assert cuts.sum() + 1 == len(np.unique(documents))
            if len(np.unique(block["cu_seqlens"])) > 3:  # and whole masks where it matters
                masks += 1
                truth = (documents[:, None] == documents[None, :]) & np.tri(2048, dtype=bool)
                assert np.array_equal(causal_mask(block["cu_seqlens"], 2048), truth)
        tokens.append(arrays["input_ids"][arrays["document_ids"] >= 0])
        padding += int((arrays["document_ids"] < 0).sum())
    assert masks > 100
    # at 0 workers the copy's blocks are made when asked for; the table's on a thread
    reading_thread = any(thread.name == "inline-reader" for thread in threading.enumerate())
    assert reading_thread != local_copy
    tokens = np.concatenate(tokens)
    assert_every_token_once(tokens, lengths)
    assert padding / (padding + len(tokens)) < 0.01
    assert dm.stream.counters()["padding_tokens"] >= padding
    dm.teardown("fit")


@pytest.fixture(scope="module")
def saved_packed_run(token_dir):
    workdir, lengths = token_dir
    total = int(lengths.sum()) + DOCUMENTS
    blocks = math.ceil(total / (SPLITS * 2048))
    last_of_epoch = math.ceil(blocks * SPLITS // 2 / BATCH)
    steps = ("37", str(last_of_epoch))
    out, _ = packed_train(
        workdir, "save-w2k2", "--devices", "2", "--workers", "2", *("--save-at", *steps)
    )
    return out, int(steps[0]), last_of_epoch


def packed_train(workdir, name, *args):
    return train(
        workdir,
        name,
        "--batch-size",
        str(BATCH),
        "--num-splits",
        str(SPLITS),
        "--cache-dir",
        str(workdir / "cache"),
        *args,
        module="tests.pack_run",
    )


def assert_exact_epochs(entries, lengths, epochs: int) -> None:
    for epoch in range(epochs):
        mine = [e for e in entries if e[0] == epoch]
        assert all(e[1] == epoch for e in mine), "Lightning's epoch is the stream's"
        assert_every_token_once(np.concatenate([e[3] for e in mine]), lengths)
    assert {e[0] for e in entries} == set(range(epochs))


def test_the_saving_packed_run_is_exact(token_dir, saved_packed_run):
    out, _, _ = saved_packed_run
    assert_exact_epochs(pack_run.read(out / "ledger"), token_dir[1], epochs=2)


@pytest.mark.parametrize("at_end", [False, True], ids=["mid-epoch", "last-block"])
@pytest.mark.parametrize(
    ("devices", "workers", "local_copy"), [(1, 0, False), (3, 2, True)], ids=["1x0", "3x2-local"]
)
def test_packed_resume_on_another_topology_is_exact(
    token_dir, saved_packed_run, at_end, devices, workers, local_copy
):
    """The run saved reading the table resumes exactly, reading it or its local copy."""
    workdir, lengths = token_dir
    out, mid, last = saved_packed_run
    step = last if at_end else mid
    resumed, _ = packed_train(
        workdir,
        f"resume-{step}-w{devices}k{workers}",
        *("--devices", str(devices), "--workers", str(workers)),
        *("--ckpt-path", str(out / "ckpt" / f"step={step}.ckpt")),
        *(["--local-copy"] if local_copy else []),
    )
    before = [e for e in pack_run.read(out / "ledger") if e[2] < step]
    after = pack_run.read(resumed / "ledger")
    if at_end:
        assert {e[0] for e in after} == {1}, "a last-block checkpoint resumes at epoch 1"
    assert_exact_epochs(before + after, lengths, epochs=2)


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=8, max_size=60),
    block_size=st.integers(1, 16),
    clump=st.integers(1, 5),
    eos=st.booleans(),
    topology=st.sampled_from([(1, 0), (2, 2), (4, 1), (1, 4)]),
    lag=st.lists(st.integers(0, 3), min_size=4, max_size=4),
)
def test_every_topology_and_resume_point_packs_the_same_blocks(
    lengths, block_size, clump, eos, topology, lag
):
    """Pure arithmetic: the blocks of every split, read by the readers of any topology
    from any consumed counts, are the same blocks, every token of the epoch once."""
    num_splits, (world, workers) = 4, topology
    counts = np.asarray(lengths, dtype=np.int64) + eos
    rows = len(lengths)
    clumps = ClumpLayout(rows, clump, epoch_permutation(-(-rows // clump), 3, 1, True))
    sums = np.add.reduceat(counts, np.arange(0, rows, clump))
    layout = TokenLayout(clumps, sums, lambda c: counts[c * clump : (c + 1) * clump], 4, block_size)
    packing = TokenPacking("tokens", block_size, 7 if eos else None, 99)
    # each document with its end-of-document token, as the reader gives them
    documents = [np.arange(n + eos) + 100 * row for row, n in enumerate(lengths)]

    def blocks(consumed, world, workers):
        served = {}
        for rank in range(world):
            plan = RankEpochPlan(tuple(consumed), layout.blocks, world, rank, workers, 3)
            orders = [ReaderOrder(plan, range(0), head=True)] if workers > 1 else []
            orders += [ReaderOrder.of_worker(plan, w) for w in range(max(1, workers))]
            for order in orders:
                reader = ReaderBlocks(layout, order)
                builder = BlockBuilder(packing, layout.total)
                needs = reader.needs(0, len(reader))
                assert len(needs.laid) == reader.row_count
                rows_read = iter(layout.selected(needs.laid).tolist())
                positions = order.positions(0, len(order))[1].tolist()
                for split, block, start, count, offset in zip(
                    needs.splits.tolist(),
                    positions,
                    needs.starts.tolist(),
                    needs.rows.tolist(),
                    needs.offsets.tolist(),
                    strict=True,
                ):
                    docs = [documents[next(rows_read)] for _ in range(count)]
                    tokens = np.concatenate([np.zeros(0, np.int64), *docs])
                    ends = np.cumsum([len(doc) for doc in docs], dtype=np.int64)
                    needs_one = np.asarray([[split, start, count, offset]], dtype=np.int64)
                    served[(split, block)] = builder.batch(needs_one, tokens, ends)
        return served

    whole = blocks([0] * num_splits, 1, 0)
    assert sorted(whole) == [(s, b) for s in range(num_splits) for b in range(layout.blocks)]
    consumed = [min(layout.blocks, x) for x in lag]
    rest = blocks(consumed, world, workers)
    expected = {k: v for k, v in whole.items() if k[1] >= consumed[k[0]]}
    assert sorted(rest) == sorted(expected)
    for key, block in rest.items():
        for name, value in block.items():
            assert np.array_equal(value, expected[key][name]), (key, name)
    tokens = np.concatenate([b["input_ids"][b["document_ids"] >= 0] for b in whole.values()])
    assert np.array_equal(np.sort(tokens), np.sort(np.concatenate(documents)))
    assert len(tokens) == counts.sum()


def read(flat: np.ndarray, cuts, start: int, stop: int) -> np.ndarray:
    """Blocks ``[start, stop)`` of ``cuts`` as a reader reads them, from ``flat``."""
    read = np.full((stop - start, cuts.block_size + 1), -7, dtype=flat.dtype)
    for block, landed, source, length in cuts.pieces_of(start, stop).tolist():
        read[block, landed : landed + length] = flat[source : source + length]
    return read


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 40), min_size=8, max_size=60),
    block_size=st.integers(1, 16),
    clump=st.integers(1, 5),
    eos=st.sampled_from([None, 7, 99]),
    gaps=st.lists(st.integers(0, 3), min_size=60, max_size=60),
    workers=st.sampled_from([0, 3]),
    batch=st.integers(1, 7),
)
def test_blocks_cut_from_a_flat_copy_equal_the_blocks_built_from_read_documents(
    lengths, block_size, clump, eos, gaps, workers, batch
):
    """Pure arithmetic: a reader that cuts each block from a flat array of the documents
    (the local copy: rows in storage order, here with unread tokens between some rows,
    as rows a selection leaves out) gives the blocks of one that reads each document once
    and carries it across blocks: same arrays, same pad_id count (eos_id 99 = pad_id)."""
    packing = TokenPacking("tokens", block_size, eos, 99)
    documents = [np.arange(n) + 100 * (row + 1) for row, n in enumerate(lengths)]
    if eos is not None:
        documents = [np.append(doc, eos) for doc in documents]
    counts = np.asarray([len(doc) for doc in documents], dtype=np.int64)
    rows = len(lengths)
    clumps = ClumpLayout(rows, clump, epoch_permutation(-(-rows // clump), 5, 2, True))
    sums = np.add.reduceat(counts, np.arange(0, rows, clump))
    layout = TokenLayout(clumps, sums, lambda c: counts[c * clump : (c + 1) * clump], 3, block_size)
    unread = [np.full(gap, -1) for gap in gaps[:rows]]
    parts = [part for pair in zip(unread, documents, strict=True) for part in pair]
    flat = np.concatenate([np.zeros(0, np.int64), *parts])
    sources = np.cumsum(gaps[:rows]) + np.concatenate([[0], np.cumsum(counts)[:-1]])
    plan = RankEpochPlan((0, 0, 0), layout.blocks, 1, 0, workers, batch)
    for order in [ReaderOrder.of_worker(plan, w) for w in range(max(1, workers))]:
        reader = ReaderBlocks(layout, order)
        built = BlockBuilder(packing, layout.total)
        needs = reader.needs(0, len(reader))
        rows_read = iter(layout.selected(needs.laid).tolist())
        covered = reader.needs(0, len(reader), carried=False)
        laid = layout.selected(covered.laid)
        cuts = cut_blocks(covered, layout.total, block_size, sources[laid], counts[laid])
        one_by_one = []
        for block, (split, start, count, offset) in enumerate(
            zip(needs.splits, needs.starts, needs.rows, needs.offsets, strict=True)
        ):
            docs = [documents[next(rows_read)] for _ in range(count)]
            tokens = np.concatenate([np.zeros(0, np.int64), *docs])
            ends = np.cumsum([len(doc) for doc in docs], dtype=np.int64)
            one = np.asarray([[split, start, count, offset]], dtype=np.int64)
            expected = built.batch(one, tokens, ends)
            arrays, found = cuts.arrays(
                read(flat, cuts, block, block + 1), block, block + 1, packing
            )
            assert found == 0, "eos_id = pad_id is not counted as a pad_id in the data"
            for name, value in expected.items():
                assert np.array_equal(arrays[name], value), (block, name)
            one_by_one.append(arrays)
        if one_by_one:  # several blocks at once are the blocks one at a time
            together, _ = cuts.arrays(read(flat, cuts, 0, len(cuts)), 0, len(cuts), packing)
            for name, value in together.items():
                assert np.array_equal(value, np.concatenate([a[name] for a in one_by_one]))


@pytest.fixture(scope="module")
def small_token_uri(tmp_path_factory) -> str:
    uri = str(tmp_path_factory.mktemp("small-tokens") / "db")
    make_token_table(uri, 300)
    return uri


def test_block_size_below_one_is_refused():
    with pytest.raises(ValueError, match=r"TokenPacking\(block_size=0\)"):
        TokenPacking("tokens", 0)


def test_a_local_copy_that_is_not_a_choice_is_refused():
    with pytest.raises(ValueError, match=r"TokenPacking\(local_copy='yes'\).*True.*False.*None"):
        TokenPacking("tokens", 64, local_copy="yes")


def test_a_column_that_is_not_a_list_of_integers_is_named(small_token_uri, tmp_path):
    packing = TokenPacking("id", 64, cache_dir=str(tmp_path))
    dm = LanceDataModule(small_token_uri, "documents", num_splits=4, batch_size=2, pack=packing)
    with pytest.raises(ValueError, match=r"TokenPacking\(column='id'\) has type int64"):
        dm.setup("fit")


def test_columns_beside_pack_are_refused(small_token_uri):
    with pytest.raises(ValueError, match=r"columns=\['id'\] with pack"):
        LanceDataModule(
            small_token_uri,
            "documents",
            num_splits=4,
            batch_size=2,
            columns=["id"],
            pack=TokenPacking("tokens", 64),
        )


@pytest.mark.parametrize(("workers", "local_copy"), [(0, False), (2, True)])
def test_a_pad_id_that_is_a_token_of_the_data_is_named(
    small_token_uri, tmp_path, workers, local_copy
):
    used = 3 * MAX_DOCUMENT  # document 3's first token
    packing = TokenPacking(
        "tokens", 64, pad_id=used, cache_dir=str(tmp_path), local_copy=local_copy
    )
    dm = LanceDataModule(
        small_token_uri, "documents", num_splits=4, batch_size=2, num_workers=workers, pack=packing
    )
    dm.setup("fit")
    try:
        with pytest.raises(ValueError, match=rf"TokenPacking\(pad_id={used}\) is a token"):
            for _ in dm.train_dataloader():
                pass
    finally:
        dm.teardown("fit")


@pytest.mark.parametrize("local_copy", [False, True], ids=["lance", "local-copy"])
def test_validation_blocks_hold_every_selected_token_once_over_the_ranks(
    small_token_uri, tmp_path, local_copy
):
    packing = TokenPacking("tokens", 64, EOS, PAD, str(tmp_path), local_copy)
    dm = LanceDataModule(
        small_token_uri,
        "documents",
        num_splits=4,
        batch_size=3,
        pack=packing,
        val_filter="id % 3 = 0",
    )
    dm.setup("validate")
    source, tokens, steps = dm._val, [], set()
    for rank in range(2):
        job = source.storage_job(rank, 2, 3)
        batches = list(source.read_here(job))
        steps.add(len(batches))
        for batch in batches:
            tokens.append(batch["input_ids"][batch["document_ids"] >= 0].numpy())
    assert len(steps) == 1, "every rank takes the same number of validation steps"
    lengths = document_lengths(300)
    tokens = np.concatenate(tokens)
    chosen = np.arange(300) % 3 == 0
    assert (tokens == EOS).sum() == chosen.sum()
    expected = every_token(np.where(chosen, lengths, 0))
    assert np.array_equal(np.sort(tokens[tokens != EOS]), expected)


def test_the_default_copies_the_column_where_it_fits_and_reads_the_table_where_not(
    small_token_uri, tmp_path, monkeypatch, caplog
):
    """``local_copy=None``: a copy where half the free disk holds it; elsewhere a warning,
    no copy left behind, a mark so no process of the machine tries again, and the same
    blocks read from the table."""
    from lightning_stream.lance import token_cache

    def epoch(cache_dir, local_copy=None):
        packing = TokenPacking("tokens", 64, EOS, PAD, str(cache_dir), local_copy)
        dm = LanceDataModule(small_token_uri, "documents", num_splits=4, batch_size=2, pack=packing)
        dm.setup("fit")
        try:
            return [batch["input_ids"] for batch in dm.train_dataloader()]
        finally:
            dm.teardown("fit")

    def files(cache_dir):
        return sorted(path.suffix for path in cache_dir.iterdir() if path.suffix != ".lock")

    roomy = epoch(tmp_path / "roomy")
    assert files(tmp_path / "roomy") == [".npy", ".starts", ".tokens"]
    monkeypatch.setattr(token_cache, "COPY_SHARE_OF_FREE_DISK", 1e-12)
    with caplog.at_level("INFO", logger=token_cache.__name__):
        cramped = epoch(tmp_path / "cramped")  # found out during the scan
        again = epoch(tmp_path / "cramped")
    assert caplog.text.count("counting the tokens") == 1, "the mark spares a second scan"
    assert "local copy of the token column would take" in caplog.text
    assert files(tmp_path / "cramped") == [".declined", ".npy"]
    caplog.clear()
    with caplog.at_level("INFO", logger=token_cache.__name__):
        epoch(tmp_path / "counted", local_copy=False)
        counted = epoch(tmp_path / "counted")  # found out from the counts, no scan
    assert caplog.text.count("counting the tokens") == 1
    assert files(tmp_path / "counted") == [".declined", ".npy"]
    assert len(roomy) == len(cramped) == len(again) == len(counted)
    for read in (cramped, again, counted):
        assert all(map(torch.equal, roomy, read)), "the same blocks, copied or not"


@pytest.mark.parametrize(("local_copy", "imported"), [(False, ["lancedb"]), (True, [])])
def test_a_packing_worker_imports_what_it_reads_with_only(
    small_token_uri, tmp_path, local_copy, imported
):
    """What a worker imports (its task's pickle and imports, then a packed job) holds
    neither torch nor lightning (each worker imported torch before its first block), nor
    lancedb where the blocks are cut from a local copy: imports are most of a worker's
    start."""
    import pickle
    import subprocess
    import sys

    from lightning_stream.workers.checks import pickled_modules

    packing = TokenPacking("tokens", 64, EOS, PAD, str(tmp_path), local_copy)
    dm = LanceDataModule(small_token_uri, "documents", num_splits=4, batch_size=2, pack=packing)
    source = dm._source("documents", None, True, None)
    plan = RankEpochPlan((0,) * 4, source.split_len, 1, 0, 2, 2)
    job = source.job(0, ReaderOrder.of_worker(plan, 1), pooled=True)
    task = source.pool(2, 2).task
    modules = pickled_modules(pickle.dumps(task)) | set(task.imports)
    imports = "; ".join(f"import {module}" for module in sorted(modules))
    (tmp_path / "job").write_bytes(pickle.dumps(job))
    unpickle = f"import pickle; pickle.loads(open({str(tmp_path / 'job')!r}, 'rb').read())"
    heavy = "{'torch', 'lightning', 'lancedb'}"
    check = f"import sys; print(sorted({{m.split('.')[0] for m in sys.modules}} & {heavy}))"
    found = subprocess.run(
        [sys.executable, "-c", f"{imports}; {unpickle}; {check}"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert found.stdout.strip() == str(imported)


@pytest.mark.parametrize(("local_copy", "workers"), [(False, 0), (True, 2)])
def test_documents_of_hundreds_of_thousands_of_tokens_are_split_never_cut(
    tmp_path, local_copy, workers
):
    """Rows far heavier than the heavy tail above (up to 300,000 tokens, 146 blocks):
    every token once, and within and across blocks each label is its document's next
    token (token ``p`` of document ``d`` is ``d * 1,000,000 + p``)."""
    import lancedb
    import pyarrow as pa

    step = 1_000_000
    lengths = np.array([300_000, 1, 70_001, 2048, 2049, 5, 123_457, 9, 250_000, 3])
    values = [np.arange(length, dtype=np.int32) + d * step for d, length in enumerate(lengths)]
    rows = pa.table({"tokens": pa.array(values, type=pa.list_(pa.int32()))})
    lancedb.connect(str(tmp_path / "db")).create_table("long", rows)
    packing = TokenPacking("tokens", 2048, EOS, PAD, str(tmp_path / "cache"), local_copy)
    dm = LanceDataModule(
        str(tmp_path / "db"), "long", num_splits=4, batch_size=3, num_workers=workers, pack=packing
    )
    dm.setup("fit")
    try:
        batches = list(dm.train_dataloader())
    finally:
        dm.teardown("fit")
    ids = torch.cat([b["input_ids"] for b in batches]).numpy()
    labels = torch.cat([b["labels"] for b in batches]).numpy()
    real = (ids != EOS) & (ids != PAD)
    assert np.array_equal(np.sort(ids[real]), np.sort(np.concatenate(values)))
    assert (ids == EOS).sum() == len(lengths)
    ends_document = real & (ids % step == lengths[np.minimum(ids // step, 9)] - 1)
    assert (labels[real & ~ends_document] == ids[real & ~ends_document] + 1).all()
    assert (labels[ends_document] == EOS).all() and (labels[~real] == IGNORE_INDEX).all()


def test_a_local_copy_cut_short_is_named_with_what_to_do(small_token_uri, tmp_path):
    packing = TokenPacking("tokens", 64, EOS, PAD, str(tmp_path), local_copy=True)
    dm = LanceDataModule(small_token_uri, "documents", num_splits=4, batch_size=2, pack=packing)
    dm.setup("fit")
    (copy,) = tmp_path.glob("*.tokens")
    with copy.open("r+b") as cut:
        cut.truncate(copy.stat().st_size // 2)
    try:
        with pytest.raises(RuntimeError, match=rf"{copy}.*does not match.*delete both files"):
            for _ in dm.train_dataloader():
                pass
    finally:
        dm.teardown("fit")


def test_token_counts_are_read_in_parts_of_the_counts_file(tmp_path, monkeypatch):
    """The counts of a filtered table's clumps, read a few rows of the file at a time
    (nothing mapped), are its rows' counts, whichever parts a clump's rows span."""
    from lightning_stream.lance import packed
    from lightning_stream.lance.selection import Selection

    monkeypatch.setattr(packed, "COUNT_ROWS", 64)
    lengths = np.random.default_rng(0).integers(0, 1000, 5000, dtype=np.int32)
    np.save(tmp_path / "counts.npy", lengths)
    keep = np.random.default_rng(1).random(5000) < 0.3
    selection = Selection(np.packbits(keep, bitorder="little"), len(keep))
    chosen = lengths[keep].astype(np.int64) + 1
    counts = packed.TokenCounts(str(tmp_path / "counts.npy"), len(chosen), 100, 1, selection)
    clumps = [chosen[start : start + 100] for start in range(0, len(chosen), 100)]
    assert counts.clump_tokens.tolist() == [int(clump.sum()) for clump in clumps]
    for index in (0, 3, len(clumps) - 1):
        assert counts.row_tokens(index).tolist() == clumps[index].tolist()
