"""The data modules wrap the strategy's checkpoint IO to name a checkpoint that fails to
load; a strategy that does not let them is refused at setup, naming it and what works.

(The wrap under 2-process DDP is checked by ``tests/test_sigterm_collectives.py``.)
"""

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import SingleDeviceStrategy

from lightning_stream import AtomicCheckpointIO, LanceDataModule, StreamStateCallback
from lightning_stream.checkpoint_load import NamedLoadErrors, is_complete
from lightning_stream.demo import LedgerModel
from lightning_stream.inspect import read_stream_record
from lightning_stream.state import STATE_KEY


class OwnCheckpointIO(TorchCheckpointIO):
    """The only checkpoint IO :class:`OwnIOStrategy` takes."""


class OwnIOStrategy(SingleDeviceStrategy):
    """A single-device strategy whose ``checkpoint_io`` setter takes its own plugin only,
    as Lightning's XLA strategies take ``XLACheckpointIO`` only."""

    @property
    def checkpoint_io(self):
        if self._checkpoint_io is None:
            self._checkpoint_io = OwnCheckpointIO()
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, io):
        if io is not None and not isinstance(io, OwnCheckpointIO):
            raise TypeError(f"OwnIOStrategy can only work with OwnCheckpointIO, found {io}")
        self._checkpoint_io = io


def _module(table_dir):
    return LanceDataModule(str(table_dir / "db"), "samples", num_splits=12, batch_size=8)


def _trainer(**options):
    settings = {
        "accelerator": "cpu",
        "max_steps": 3,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "callbacks": [StreamStateCallback()],
        **options,
    }
    return pl.Trainer(**settings)


def test_a_strategy_whose_checkpoint_io_cannot_be_wrapped_is_refused(table_dir, tmp_path):
    trainer = _trainer(strategy=OwnIOStrategy(device=torch.device("cpu")))
    with pytest.raises(TypeError) as error:
        trainer.fit(LedgerModel(str(tmp_path)), datamodule=_module(table_dir))
    message = str(error.value)
    assert message.startswith(
        "LanceDataModule cannot train with Trainer(strategy=OwnIOStrategy(...)): its"
        " checkpoint_io cannot be wrapped (TypeError: OwnIOStrategy can only work with"
        " OwnCheckpointIO"
    ), message
    assert '"ddp" / "ddp_spawn" / "ddp_fork" (DDPStrategy)' in message
    assert not (tmp_path / "rank0.jsonl").exists()  # refused before the first step


def test_single_device_wraps_the_plugin_and_a_bad_checkpoint_is_named(table_dir, tmp_path):
    trainer = _trainer(plugins=[AtomicCheckpointIO()])
    trainer.fit(LedgerModel(str(tmp_path / "ledger")), datamodule=_module(table_dir))
    io = trainer.strategy.checkpoint_io
    assert isinstance(io, NamedLoadErrors) and isinstance(io.inner, AtomicCheckpointIO)
    good = tmp_path / "ckpt" / "good.ckpt"
    trainer.save_checkpoint(good)
    # the one state key: where the callback's record lands, where inspect and the scan
    # for a complete checkpoint read it
    assert STATE_KEY in torch.load(good, weights_only=False)["callbacks"]
    assert is_complete(good) and read_stream_record(good)["complete"]
    corrupt = tmp_path / "ckpt" / "corrupt.ckpt"
    corrupt.write_bytes(good.read_bytes()[:1000])
    resumed = _trainer(plugins=[AtomicCheckpointIO()], max_steps=6)
    model = LedgerModel(str(tmp_path / "ledger"))
    with pytest.raises(ValueError, match="cannot be read") as error:
        resumed.fit(model, datamodule=_module(table_dir), ckpt_path=str(corrupt))
    assert f"checkpoint {str(corrupt)!r} cannot be read" in str(error.value)
    assert f"beside it, newest first: [{str(good)!r}]" in str(error.value)
