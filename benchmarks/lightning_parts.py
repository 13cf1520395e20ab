"""The Lightning side of the Lance benchmarks: a quiet ``Trainer`` and a model that
trains nothing but records when each batch reached its ``training_step``."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch


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
