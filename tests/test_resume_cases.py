"""Resume cases of the core issue, each a real Trainer run on one process."""

import pytest
import torch

from lightning_stream import LanceDataModule, StreamStateCallback, ledger
from lightning_stream.demo import arguments, run

from .conftest import ROWS, assert_exact


def fit(table_dir, name, *args):
    out = table_dir / name
    argv = ["--uri", str(table_dir / "db"), "--ledger-dir", str(out / "ledger")]
    trainer = run(arguments().parse_args([*argv, "--ckpt-dir", str(out / "ckpt"), *args]))
    return out, trainer


def resumed_entries(table_dir, name, step, *args):
    first, _ = fit(table_dir, f"{name}-first", "--save-at", str(step), *args)
    ckpt = first / "ckpt" / f"step={step}.ckpt"
    second, _ = fit(table_dir, f"{name}-second", "--ckpt-path", str(ckpt), *args)
    before = ledger.read(first / "ledger")
    return ledger.kept(before, step, ledger.read(second / "ledger"))


def test_prefetched_batches_are_not_counted_as_consumed(table_dir):
    dm = LanceDataModule(str(table_dir / "db"), "samples", num_splits=12, batch_size=5)
    dm.setup("fit")
    dm.stream.tracking = True
    batches = iter(dm.train_dataloader())
    fetched = [next(batches) for _ in range(3)]  # the loader runs 2 batches ahead
    dm.stream.commit_batch(last_batch=False)
    consumed = dm.stream.state.consumed
    assert sum(consumed) == len(fetched[0]["id"]) == 5
    assert consumed == [1] * 5 + [0] * 7  # one round-robin row from each of splits 0-4


@pytest.mark.parametrize("step", [5, 10])  # mid-epoch, and the last batch of epoch 0
def test_limit_train_batches(table_dir, step):
    entries = resumed_entries(
        table_dir, f"limit{step}", step, "--limit-train-batches", "10", "--max-epochs", "3"
    )
    report = ledger.coverage(entries, 30)
    assert [(c.epoch, c.samples, c.repeated) for c in report] == [(e, 30, 0) for e in range(3)]


def test_reload_dataloaders_every_epoch(table_dir):
    entries = resumed_entries(table_dir, "reload", 33, "--reload-every-epoch", "--max-epochs", "3")
    assert_exact(entries, epochs=3)


def test_configure_optimizers_reading_estimated_stepping_batches(table_dir):
    # Lightning issue 20550: the loader is built before loop state is restored.
    entries = resumed_entries(table_dir, "estimated", 21, "--estimated-steps")
    assert_exact(entries, epochs=2)


def test_explicit_callback_with_workers(table_dir):
    entries = resumed_entries(table_dir, "explicit", 9, "--explicit-callback", "--workers", "2")
    assert_exact(entries, epochs=2)


def test_missing_callback_is_added_before_checkpoint_callbacks(table_dir):
    _, trainer = fit(table_dir, "autoadd", "--max-epochs", "1")
    names = [type(c).__name__ for c in trainer.callbacks]
    assert names.count("StreamStateCallback") == 1
    assert names.index("StreamStateCallback") < names.index("SaveAtSteps")


@pytest.fixture(scope="module")
def checkpoint(table_dir):
    out, _ = fit(table_dir, "mismatch-source", "--save-at", "4", "--max-epochs", "1")
    return out / "ckpt" / "step=4.ckpt"


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("shuffle_seed", 1),
        ("num_splits", 6),
        ("filter", "id >= 0"),
        ("columns", ["id", "vec", "label"]),
        ("shuffle", False),
    ],
)
def test_resume_with_other_settings_is_refused(table_dir, checkpoint, argument, value):
    options = {"num_splits": 12, "batch_size": 3, argument: value}
    dm = LanceDataModule(str(table_dir / "db"), "samples", **options)
    with pytest.raises(ValueError, match=f"saved with {argument}="):
        _fit_module(dm, checkpoint)


def test_a_checkpoint_of_the_previous_format_names_the_release_to_finish_it(
    table_dir, checkpoint, tmp_path
):
    # lightning-stream 0.1 wrote stream-state format 1 (lancedb's order of the rows)
    saved = torch.load(checkpoint, weights_only=False)
    for state in saved["callbacks"].values():
        if "identity" in state:
            state["format"] = 1
            state["provenance"]["versions"]["lightning-stream"] = "0.1.0"
    old = tmp_path / "written-by-0.1.ckpt"
    torch.save(saved, old)
    dm = LanceDataModule(str(table_dir / "db"), "samples", num_splits=12, batch_size=3)
    asked = r"written by lightning-stream 0\.1\.0 .*pip install 'lightning-stream==0\.1\.0'"
    with pytest.raises(ValueError, match=asked):
        _fit_module(dm, old)


def test_resume_with_another_clump_size_names_the_default(table_dir, checkpoint):
    dm = LanceDataModule(
        str(table_dir / "db"), "samples", num_splits=12, batch_size=3, shuffle_clump_size=1
    )
    with pytest.raises(ValueError, match="Pass shuffle_clump_size=None to resume"):
        _fit_module(dm, checkpoint)


def test_resume_on_another_table_is_refused(table_dir, checkpoint):
    from lightning_stream.demo import make_table

    make_table(str(table_dir / "db"), ROWS, table="other")
    dm = LanceDataModule(str(table_dir / "db"), "other", num_splits=12, batch_size=3)
    with pytest.raises(ValueError, match="saved with table='samples'"):
        _fit_module(dm, checkpoint)


def test_resume_reads_the_pinned_version_after_rows_are_added(table_dir, checkpoint):
    from lightning_stream.demo import make_table

    make_table(str(table_dir / "db"), ROWS, table="growing")
    first, _ = fit(table_dir, "pin-first", "--table", "growing", "--save-at", "8")
    import lancedb

    table = lancedb.connect(str(table_dir / "db")).open_table("growing")
    table.add(table.to_arrow().slice(0, 12).set_column(0, "id", [list(range(ROWS, ROWS + 12))]))
    ckpt = first / "ckpt" / "step=8.ckpt"
    second, _ = fit(table_dir, "pin-second", "--table", "growing", "--ckpt-path", str(ckpt))
    entries = ledger.kept(ledger.read(first / "ledger"), 8, ledger.read(second / "ledger"))
    assert max(i for e in entries for i in e["ids"]) < ROWS
    assert_exact(entries, epochs=2)


def _fit_module(dm, ckpt):
    import lightning.pytorch as pl

    from lightning_stream.demo import LedgerModel

    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[StreamStateCallback()],
    )
    model = LedgerModel(str(ckpt.parent / "unused-ledger"))
    trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt))
    return torch


def test_a_checkpoint_written_by_one_rank_alone_refuses_to_resume(table_dir):
    from lightning_stream.state import StreamState

    dm = LanceDataModule(str(table_dir / "db"), "samples", num_splits=12, batch_size=3)
    dm.setup("fit")
    partial = StreamState(identity=dm.stream.source.identity, consumed=[1] * 12, complete=False)
    with pytest.raises(ValueError, match="written by one rank alone"):
        dm.stream.load(partial)
