"""Real processes killed with SIGKILL; every resume must keep the samples ledger exact."""

import os
import random
import signal
import subprocess
import time
from datetime import timedelta

import lancedb
import pytest
import torch

from lightning_stream import ledger
from lightning_stream.atomic import PARTIAL_SUFFIX

from .conftest import ENV, ROOT, assert_exact, train, train_command

STEPS_PER_EPOCH = 40  # 240 rows, 2 processes, batch 3


def checkpoint_step(path):
    return torch.load(path, map_location="cpu", mmap=True, weights_only=False)["global_step"]


def last_step(ledger_dir):
    try:
        return max(entry["step"] for entry in ledger.read(ledger_dir))
    except (ValueError, FileNotFoundError):
        return -1


def train_and_kill(table_dir, name, kill_after):
    """A 2-process DDP run checkpointing every 4 steps, SIGKILLed (all processes) mid-run."""
    out, command = train_command(table_dir, name, "--devices", "2", "--save-every", "4")
    job = subprocess.Popen(
        command,
        env=ENV,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while job.poll() is None and time.monotonic() < deadline:
        if last_step(out / "ledger") >= kill_after:
            os.killpg(job.pid, signal.SIGKILL)
            break
        time.sleep(0.02)
    assert job.wait() == -signal.SIGKILL, "the job was killed, not finished"
    return out


@pytest.mark.parametrize("seed", range(10))
def test_ddp_run_killed_at_a_random_step_resumes_exactly(table_dir, seed):
    kill_after = random.Random(seed).randint(6, 2 * STEPS_PER_EPOCH - 5)
    devices = (1, 2, 3)[seed % 3]
    first = train_and_kill(table_dir, f"kill{seed}", kill_after)
    last = first / "ckpt" / "last.ckpt"
    step = checkpoint_step(last)
    resumed, _ = train(
        table_dir, f"kill{seed}-resume", "--devices", str(devices), "--ckpt-path", str(last)
    )
    entries = ledger.kept(ledger.read(first / "ledger"), step, ledger.read(resumed / "ledger"))
    assert_exact(entries, epochs=2)


def test_killed_while_writing_a_checkpoint(table_dir):
    # The 3rd save is epoch=0-step=8.ckpt (each ModelCheckpoint save also writes last.ckpt).
    args = ["--save-every", "4", "--kill-during-save", "3"]
    first, result = train(
        table_dir, "kill-in-save", *args, module="tests.fault_run", expect_failure=True
    )
    ckpt_dir = first / "ckpt"
    assert result.returncode == -signal.SIGKILL
    assert list(ckpt_dir.glob(f".*{PARTIAL_SUFFIX}")), "the kill landed during the write"
    finals = sorted(p.name for p in ckpt_dir.glob("*.ckpt"))
    assert finals == ["epoch=0-step=4.ckpt", "last.ckpt"]
    for name in finals:  # no partial file under a final name: every one loads
        assert checkpoint_step(ckpt_dir / name) == 4
    resumed, _ = train(table_dir, "kill-in-save-resume", "--ckpt-path", str(ckpt_dir / "last.ckpt"))
    entries = ledger.kept(ledger.read(first / "ledger"), 4, ledger.read(resumed / "ledger"))
    assert_exact(entries, epochs=2)


def test_killed_dataloader_worker(table_dir):
    args = ["--workers", "2", "--save-every", "4", "--kill-worker-after", "10"]
    first, result = train(
        table_dir, "kill-worker", *args, module="tests.fault_run", expect_failure=True
    )
    assert "a reading worker of rank 0 died while reading table 'samples'" in result.stderr
    assert "resume with trainer.fit(..., ckpt_path=" in result.stderr
    last = first / "ckpt" / "last.ckpt"
    step = checkpoint_step(last)
    resumed, _ = train(table_dir, "kill-worker-resume", "--workers", "2", "--ckpt-path", str(last))
    entries = ledger.kept(ledger.read(first / "ledger"), step, ledger.read(resumed / "ledger"))
    assert_exact(entries, epochs=2)


def test_resume_after_the_pinned_version_was_deleted_is_refused(table_dir):
    from lightning_stream.demo import make_table

    make_table(str(table_dir / "db"), 240, table="rewritten")
    first, _ = train(table_dir, "deleted", "--table", "rewritten", "--save-at", "5")
    table = lancedb.connect(str(table_dir / "db")).open_table("rewritten")
    table.add(table.to_arrow().slice(0, 12))
    with pytest.warns(UserWarning):
        table.optimize(cleanup_older_than=timedelta(0), delete_unverified=True)
    args = ["--table", "rewritten", "--ckpt-path", str(first / "ckpt" / "step=5.ckpt")]
    _, result = train(table_dir, "deleted-resume", *args, expect_failure=True)
    assert "version=1 of table 'rewritten'" in result.stderr
    assert "cannot be opened" in result.stderr
