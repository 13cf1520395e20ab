"""The Lightning loop around the stream: tuner, epochs, preemption, test/predict.

Each test is a real ``Trainer`` run on the 240-row table (12 splits of 20 rows), judged by
the samples ledger: the ids that reached ``training_step``, per epoch.
"""

import json
import logging
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.tuner import Tuner

from lightning_stream import LanceDataModule, StreamStateCallback, ledger
from lightning_stream.demo import LedgerModel
from lightning_stream.inspect import read_stream_record

from .conftest import ENV, ROOT, ROWS, assert_exact, last_step, train_command


def module(table_dir, **options):
    settings = {"num_splits": 12, "batch_size": 8, **options}
    return LanceDataModule(str(table_dir / "db"), "samples", **settings)


def trainer(**options):
    settings = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "num_sanity_val_steps": 0,
        "callbacks": [StreamStateCallback()],
        **options,
    }
    return pl.Trainer(**settings)


class SizeRecorder(pl.LightningModule):
    """Records, per training step, the batch size the finder had set and the one served."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.sizes = []

    def training_step(self, batch, batch_idx):
        self.sizes.append((self.trainer.datamodule.batch_size, len(batch["id"])))
        return self.layer(batch["vec"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Messages(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_batch_size_finder_trials_run_at_the_sizes_they_report(table_dir, tmp_path):
    dm, model = module(table_dir, batch_size=2), SizeRecorder()
    messages = Messages()
    lightning_log = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    lightning_log.addHandler(messages)
    try:
        found = Tuner(trainer(max_epochs=1, default_root_dir=str(tmp_path))).scale_batch_size(
            model, datamodule=dm, mode="power", steps_per_trial=2, init_val=2, max_trials=3
        )
    finally:
        lightning_log.removeHandler(messages)
    # "Batch size 2 succeeded, trying batch size 4", then 4 -> 8; the third trial is the last
    text = "\n".join(messages.lines)
    pairs = re.findall(r"Batch size (\d+) succeeded, trying batch size (\d+)", text)
    assert {int(n) for pair in pairs for n in pair} == {2, 4, 8}, text
    assert found == dm.batch_size == 8
    assert all(set_size == served for set_size, served in model.sizes), model.sizes
    assert [served for _, served in model.sizes] == [2, 2, 4, 4, 8, 8]


def test_a_second_fit_on_the_same_trainer_is_the_next_epoch(table_dir, tmp_path):
    dm, model = module(table_dir), LedgerModel(str(tmp_path / "ledger"))
    run = trainer(max_epochs=1)
    run.fit(model, datamodule=dm)
    run.fit_loop.max_epochs = 2
    run.fit(model, datamodule=dm)
    entries = ledger.read(tmp_path / "ledger")
    assert_exact(entries, epochs=2)
    first = [e["ids"] for e in entries if e["epoch"] == 0]
    second = [e["ids"] for e in entries if e["epoch"] == 1]
    assert first != second, "epoch 1 must be shuffled anew, not replay epoch 0"
    continuous = tmp_path / "continuous"
    trainer(max_epochs=2).fit(LedgerModel(str(continuous)), datamodule=module(table_dir))
    expected = [e["ids"] for e in ledger.read(continuous) if e["epoch"] == 1]
    assert second == expected, "the second fit serves what a 2-epoch run serves as epoch 1"


def test_no_epoch_is_begun_after_max_epochs(table_dir, tmp_path):
    """The reading thread begins the epoch that follows once one is read, except after the
    run's last: those reads (requests, egress) would never be used. What the stream asks
    of its source's serving engine says so: each epoch is asked for with the epoch to
    begin next (``upcoming``), the last one with none; and once ``fit`` is over (the
    reading thread stopped and joined at teardown) the rows read are the two epochs'."""
    dm, model = module(table_dir), LedgerModel(str(tmp_path / "ledger"))
    asked = []  # (epoch served, epoch the engine is told to begin next)

    class Asked(pl.Callback):
        def on_fit_start(self, trainer, pl_module):
            engine = trainer.datamodule.stream.source.engine
            serve = engine.serve

            def recorded(epoch, plan, upcoming=None):
                asked.append((epoch, upcoming and upcoming[0]))
                return serve(epoch, plan, upcoming)

            engine.serve = recorded

    trainer(max_epochs=2, callbacks=[StreamStateCallback(), Asked()]).fit(model, datamodule=dm)
    assert_exact(ledger.read(tmp_path / "ledger"), epochs=2)
    assert asked == [(0, 1), (1, None)]
    assert dm.stream.source.counters()["rows_read"] == 2 * ROWS


def test_max_steps_stop_then_resume_with_max_epochs_trains_whole_epochs(table_dir, tmp_path):
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    stopped = trainer(max_steps=17)
    stopped.fit(LedgerModel(str(first_dir)), datamodule=module(table_dir))
    ckpt = tmp_path / "stopped.ckpt"
    stopped.save_checkpoint(ckpt)
    resumed = trainer(max_epochs=2)
    resumed.fit(LedgerModel(str(second_dir)), datamodule=module(table_dir), ckpt_path=str(ckpt))
    entries = ledger.kept(ledger.read(first_dir), 17, ledger.read(second_dir))
    assert_exact(entries, epochs=2)
    assert resumed.current_epoch == 2


def _rank_lines(ledger_dir):
    return {p.name: p.read_text().splitlines() for p in sorted(ledger_dir.glob("rank*.jsonl"))}


def _entries(lines):
    return [json.loads(line) for line in lines if line.strip()]


def test_sigterm_on_2_ddp_processes_then_a_plain_rerun_resumes_exactly(table_dir):
    out, command = train_command(
        table_dir, "sigterm", "--devices", "2", "--step-delay", "0.05", module="tests.loop_run"
    )
    _, stderr = _run_job(command, sigterm_after_step=12)
    saved = out / "ckpt" / "on_exception.ckpt"
    assert saved.is_file(), stderr[-4000:]
    record = read_stream_record(saved)
    assert record["complete"], record
    before = _rank_lines(out / "ledger")

    code, stderr = _run_job(command)  # the same command: Lightning picks on_exception.ckpt
    assert code == 0, stderr[-4000:]
    assert f"Restored all states from the checkpoint at {saved}" in stderr, stderr[-4000:]
    after = _rank_lines(out / "ledger")
    first = [e for name, lines in before.items() for e in _entries(lines)]
    second = [e for name, lines in after.items() for e in _entries(lines[len(before[name]) :])]
    assert_exact(ledger.kept(first, record["global_step"], second), epochs=2)


def _run_job(command, sigterm_after_step=None, timeout=180):
    """Run a training command as its own process group; SIGTERM the group after a step."""
    ledger_dir = Path(command[command.index("--ledger-dir") + 1])
    job = subprocess.Popen(
        command,
        env=ENV,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if sigterm_after_step is not None:
            deadline = time.monotonic() + timeout
            while job.poll() is None and time.monotonic() < deadline:
                if last_step(ledger_dir) >= sigterm_after_step:
                    os.killpg(job.pid, signal.SIGTERM)  # every rank, as a scheduler does
                    break
                time.sleep(0.02)
        _, stderr = job.communicate(timeout=timeout)
        return job.returncode, stderr
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate(timeout=30)


def _rank_lines(ledger_dir):
    return {p.name: p.read_text().splitlines() for p in sorted(ledger_dir.glob("rank*.jsonl"))}


def _entries(lines):
    return [json.loads(line) for line in lines if line.strip()]


def test_test_and_predict_over_2_processes_read_each_row_once(table_dir):
    out, command = train_command(
        table_dir, "evaluate", "--devices", "2", "--evaluate", module="tests.loop_run"
    )
    code, stderr = _run_job(command)
    assert code == 0, stderr[-4000:]
    expected = {"test": [i for i in range(ROWS) if i % 7], "predict": list(range(ROWS))}
    for stage, rows in expected.items():
        parts = [json.loads((out / "ledger" / f"{stage}-rank{r}.json").read_text()) for r in (0, 1)]
        assert parts[0] + parts[1] == rows, stage  # contiguous parts, storage order, no padding
        assert abs(len(parts[0]) - len(parts[1])) <= 1


def test_overfit_batches_serves_the_same_batches_every_epoch(table_dir, tmp_path):
    with pytest.warns(UserWarning, match="same order every epoch"):
        trainer(overfit_batches=3, max_epochs=3).fit(
            LedgerModel(str(tmp_path)), datamodule=module(table_dir)
        )
    entries = ledger.read(tmp_path)
    ledger.coverage(entries, ROWS)  # Lightning's epoch and the stream's agree
    per_epoch = [[e["ids"] for e in entries if e["epoch"] == epoch] for epoch in range(3)]
    assert len(per_epoch[0]) == 3
    assert per_epoch[0] == per_epoch[1] == per_epoch[2]


class Validating(LedgerModel):
    def __init__(self, ledger_dir):
        super().__init__(ledger_dir)
        self.val_batches = 0

    def validation_step(self, batch, batch_idx):
        self.val_batches += 1


def test_validation_loader_has_a_length(table_dir, tmp_path):
    dm = module(table_dir, val_filter="id < 120")  # 120 rows: 15 batches of 8
    model = Validating(str(tmp_path))
    trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0.5).fit(model, datamodule=dm)
    assert len(dm.val_dataloader()) == sum(1 for _ in dm.val_dataloader()) == 15
    assert model.val_batches == 7


def test_validation_without_a_source_warns(table_dir, tmp_path):
    with pytest.warns(UserWarning, match="no validation rows: pass val_filter or val_table"):
        trainer(max_epochs=1, limit_train_batches=2).fit(
            Validating(str(tmp_path)), datamodule=module(table_dir)
        )


def test_a_checkpoint_one_rank_wrote_alone_names_the_complete_one_beside_it(table_dir, tmp_path):
    run = trainer(max_steps=5)
    run.fit(LedgerModel(str(tmp_path / "ledger")), datamodule=module(table_dir))
    complete = tmp_path / "ckpt" / "epoch=0-step=5.ckpt"
    run.save_checkpoint(complete)
    checkpoint = torch.load(complete, weights_only=False)
    checkpoint["callbacks"]["StreamStateCallback"]["complete"] = False
    alone = tmp_path / "ckpt" / "on_exception.ckpt"
    torch.save(checkpoint, alone)
    resumed = trainer(max_epochs=1)
    with pytest.raises(ValueError, match="written by one rank alone") as error:
        resumed.fit(
            LedgerModel(str(tmp_path / "ledger")),
            datamodule=module(table_dir),
            ckpt_path=str(alone),
        )
    assert str(alone) in str(error.value)
    assert f"resume with ckpt_path={str(complete)!r}" in str(error.value)
