"""SIGTERM agreement under DDP: one collective per training step, and a signal that only
one rank received stops every rank at the same step with a checkpoint that resumes exactly.

Real 2-process DDP runs (gloo, CPU) of ``tests/sigterm_run.py``, which wraps
``torch.distributed``'s collectives in every process and records who called them.
"""

import json
import subprocess

from lightning_stream import ledger
from lightning_stream.inspect import read_stream_record

from .conftest import ENV, ROOT, assert_exact, train_command

# rank 1 signals itself in on_train_batch_end of the batch that makes global step 6 (the
# 6th batch, ledger step 5); the recorder's hook runs before StreamStateCallback's, whose
# agreement in that same hook stops every rank after that batch
SIGTERM_AT_STEP = 6
LAST_STEP = SIGTERM_AT_STEP - 1
AGREEMENT = "preemption.py:agree:all_reduce"


def _run(command):
    return subprocess.run(command, env=ENV, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_one_collective_per_step_and_a_sigterm_on_one_rank_stops_every_rank(table_dir):
    record_dir = str(table_dir / "sigterm-one-rank" / "record")
    arguments = ("--devices", "2", "--batch-size", "8", "--record-dir", record_dir)
    out, command = train_command(
        table_dir, "sigterm-one-rank", *arguments, module="tests.sigterm_run"
    )
    first = _run([*command, "--sigterm-rank", "1", "--sigterm-at-step", str(SIGTERM_AT_STEP)])
    records = [json.loads((out / "record" / f"rank{r}.json").read_text()) for r in (0, 1)]

    # every step's collectives: the agreement's one all_reduce, nothing else (Lightning's
    # own per-step SIGTERM broadcast does not run beside it)
    for rank, record in enumerate(records):
        calls = {int(step): callers for step, callers in record["calls"].items()}
        assert sorted(calls) == list(range(LAST_STEP + 1)), (rank, calls)
        for step, callers in calls.items():
            assert callers == [AGREEMENT], (rank, step, callers)
        # the data module wrapped the user's checkpoint IO plugin, on DDP too
        assert record["checkpoint_io"] == ["NamedLoadErrors", "AtomicCheckpointIO"]

    # rank 1 alone was signalled; both ranks trained their last batch at the same step
    before = _per_rank(out / "ledger")
    last = {rank: max(e["step"] for e in entries) for rank, entries in before.items()}
    assert last == {0: LAST_STEP, 1: LAST_STEP}, first.stderr[-4000:]
    saved = out / "ckpt" / "on_exception.ckpt"
    record = read_stream_record(saved)
    assert record["complete"], record
    assert record["global_step"] == SIGTERM_AT_STEP

    # the same command again resumes from that checkpoint; every sample once per epoch
    second = _run(command)
    assert second.returncode == 0, second.stderr[-4000:]
    assert f"Restored all states from the checkpoint at {saved}" in second.stderr
    after = _per_rank(out / "ledger")
    first_run = [e for entries in before.values() for e in entries]
    resumed = [e for rank, entries in after.items() for e in entries[len(before[rank]) :]]
    assert_exact(ledger.kept(first_run, record["global_step"], resumed), epochs=2)


def _per_rank(ledger_dir):
    """Each rank's ledger entries, in the order it wrote them."""
    return {
        rank: [json.loads(line) for line in (ledger_dir / f"rank{rank}.jsonl").open() if line]
        for rank in (0, 1)
    }
