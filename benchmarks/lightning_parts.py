"""The Lightning side of the Lance benchmarks: a quiet ``Trainer`` and models that train
nothing but record when each batch reached their ``training_step``."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from measure import tree_rss_mb


def quiet_trainer(**options: Any) -> pl.Trainer:
    """A CPU ``Trainer`` for one epoch (unless ``options`` say otherwise) that writes
    nothing: no logger, checkpoints, progress bar or model summary."""
    options = {"max_epochs": 1, **options}
    return pl.Trainer(
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **options,
    )


class NoOpModel(pl.LightningModule):
    """One parameter for the optimizer and a ``training_step`` that only notes, per epoch,
    when it began (``starts[epoch]``), when each batch arrived and how many rows it held
    (``stamps[epoch]``), and the batches' ids (``ids[epoch]``), then waits ``step_ms``."""

    def __init__(self, step_ms: float = 0.0) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.step_ms = step_ms
        self.starts: list[float] = []
        self.stamps: list[list[tuple[float, int]]] = []
        self.ids: list[list[int]] = []

    def on_train_epoch_start(self) -> None:
        self.starts.append(time.perf_counter())
        self.stamps.append([])
        self.ids.append([])

    def training_step(self, batch: dict, batch_idx: int) -> None:
        self.stamps[-1].append((time.perf_counter(), len(batch["id"])))
        self.ids[-1].extend(batch["id"].tolist())
        if self.step_ms:
            time.sleep(self.step_ms / 1000)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class TokenModel(pl.LightningModule):
    """For token blocks: ``training_step`` notes, per epoch, when it began
    (``starts[epoch]``) and when each batch arrived with how many tokens it held
    (``stamps[epoch]``; a batch is a tensor of blocks or a dict with ``input_ids``), and
    the process tree's resident memory once ``readers`` batches had arrived
    (``first_rss_mb``), then waits ``step_ms``."""

    def __init__(self, readers: int, step_ms: float = 0.0) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.readers, self.step_ms = readers, step_ms
        self.starts: list[float] = []
        self.stamps: list[list[tuple[float, int]]] = []
        self.first_rss_mb = 0.0

    def on_train_epoch_start(self) -> None:
        self.starts.append(time.perf_counter())
        self.stamps.append([])

    def training_step(self, batch: Any, batch_idx: int) -> None:
        ids = batch["input_ids"] if isinstance(batch, dict) else batch
        self.stamps[-1].append((time.perf_counter(), ids.numel()))
        if len(self.stamps) == 1 and len(self.stamps[0]) == self.readers:
            self.first_rss_mb = tree_rss_mb()
        if self.step_ms:
            time.sleep(self.step_ms / 1000)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)
