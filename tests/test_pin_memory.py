"""``pin_memory`` on both data modules, as ``DataLoader`` has it.

On a host without an accelerator: one warning over a fit (validation included) and the
very batches of a run without it. With an accelerator (skipped here when there is none):
every tensor of every batch handed to Lightning is in page-locked memory.
"""

import warnings

import lightning.pytorch as pl
import pytest
import torch

from lightning_stream import LanceDataModule, StreamStateCallback, VideoEpisodeDataModule, ledger
from lightning_stream.demo import LedgerModel
from lightning_stream.pinning import pinning_device
from lightning_stream.video.synthetic import write_dataset

from .conftest import ROWS

PINNABLE = pinning_device() not in (None, "mps")
NO_EFFECT = "(pin_memory=True) has no effect: no accelerator is found"
VIDEO_FRAMES = [20, 14, 26, 20, 18, 22]  # 120 frames


class Validated(LedgerModel):
    def validation_step(self, batch, batch_idx):
        self.log("val_batches", float(batch_idx), batch_size=len(batch[self.id_key]))


def _fit(dm, ledger_dir, model_class=LedgerModel, **model_options):
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[StreamStateCallback()],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(model_class(str(ledger_dir), **model_options), datamodule=dm)
    return [str(w.message) for w in caught if "pin_memory" in str(w.message)]


def _lance(table_dir, **options):
    settings = {"num_splits": 12, "batch_size": 8, "val_filter": "id < 40", **options}
    return LanceDataModule(str(table_dir / "db"), "samples", **settings)


@pytest.mark.skipif(PINNABLE, reason="an accelerator is present: pin_memory pins")
def test_lance_pin_memory_without_an_accelerator_warns_once_and_trains_the_same(
    table_dir, tmp_path
):
    plain = _fit(_lance(table_dir), tmp_path / "plain", Validated)
    pinned = _fit(_lance(table_dir, pin_memory=True), tmp_path / "pinned", Validated)
    assert plain == []
    assert len(pinned) == 1 and NO_EFFECT in pinned[0], pinned
    assert pinned[0].startswith("LanceDataModule(pin_memory=True)")
    entries = ledger.read(tmp_path / "pinned")
    assert entries == ledger.read(tmp_path / "plain")  # the same ids at every step
    report = ledger.coverage(entries, ROWS)
    assert [c.epoch for c in report] == [0, 1] and all(c.exact() for c in report), report


@pytest.fixture(scope="module")
def video_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("pin-video")
    write_dataset(root / "data", VIDEO_FRAMES, codec="h264")
    return root


def _video(root, **options):
    return VideoEpisodeDataModule(
        str(root / "data"),
        delta_timestamps={"observation.images.front": [-2 / 30, 0.0]},
        num_splits=12,
        batch_size=8,
        sidecar_dir=str(root / "sidecars"),
        **options,
    )


@pytest.mark.skipif(PINNABLE, reason="an accelerator is present: pin_memory pins")
def test_video_pin_memory_without_an_accelerator_warns_once_and_trains_the_same(
    video_root, tmp_path
):
    plain = _fit(_video(video_root), tmp_path / "plain", data="video")
    pinned = _fit(_video(video_root, pin_memory=True), tmp_path / "pinned", data="video")
    assert plain == []
    assert len(pinned) == 1 and NO_EFFECT in pinned[0], pinned
    assert pinned[0].startswith("VideoEpisodeDataModule(pin_memory=True)")
    entries = ledger.read(tmp_path / "pinned")
    assert entries == ledger.read(tmp_path / "plain")
    report = ledger.coverage(entries, sum(VIDEO_FRAMES))
    assert [c.epoch for c in report] == [0, 1] and all(c.exact() for c in report), report


def test_pin_memory_takes_a_bool(table_dir):
    with pytest.raises(TypeError, match="pin_memory must be True or False, got 'yes'"):
        _lance(table_dir, pin_memory="yes")


def _tensors(batch):
    return [value for value in batch.values() if isinstance(value, torch.Tensor)]


@pytest.mark.skipif(not PINNABLE, reason="no accelerator to pin memory for")
def test_with_an_accelerator_every_batch_arrives_pinned(table_dir, video_root):
    dm = _lance(table_dir, pin_memory=True, test_filter="id % 2 = 0")
    dm.setup("fit")
    dm.setup("test")
    for loader in (dm.train_dataloader(), dm.val_dataloader(), dm.test_dataloader()):
        batches = list(loader)
        assert batches and all(t.is_pinned() for b in batches for t in _tensors(b))
    video = _video(video_root, pin_memory=True)
    video.setup("fit")
    batches = list(video.train_dataloader())
    assert batches and all(t.is_pinned() for b in batches for t in _tensors(b))
    plain = _lance(table_dir)
    plain.setup("fit")
    assert not any(t.is_pinned() for t in _tensors(next(iter(plain.train_dataloader()))))
