"""Train a small policy on camera windows streamed from a LeRobot v3 dataset.

The first run writes a synthetic dataset in the LeRobot v3 layout (episodes of different
lengths, two cameras as h264 MP4s with B-frames, several episodes per file, actions and
state in Parquet). The policy sees the last frames of the front camera and the state, and
predicts the action.

    python examples/train_video_policy.py fit --config configs/video_policy.yaml
    python examples/train_video_policy.py fit --config configs/video_policy.yaml \\
        --trainer.strategy=ddp --trainer.devices=2
    python examples/train_video_policy.py fit --config configs/video_policy.yaml \\
        --ckpt_path runs/video_policy/checkpoints/last.ckpt
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch
import torchmetrics
from lightning.pytorch.cli import LightningCLI
from torch import nn

from lightning_stream.video.datamodule import VideoEpisodeDataModule
from lightning_stream.video.synthetic import write_dataset

FRONT = "observation.images.front"


class SyntheticVideoDataModule(VideoEpisodeDataModule):
    """VideoEpisodeDataModule that writes a synthetic LeRobot v3 dataset on first use.

    Args:
        root: where the dataset is (written if ``meta/info.json`` is missing).
        episodes_to_write: episodes of the synthetic dataset.
        **kwargs: everything :class:`~lightning_stream.video.datamodule.VideoEpisodeDataModule`
            takes.
    """

    def __init__(self, root: str = "data/video_policy", episodes_to_write: int = 24, **kwargs):
        super().__init__(root, **kwargs)
        self.episodes_to_write = episodes_to_write

    def prepare_data(self) -> None:
        if not (Path(self.root) / "meta" / "info.json").exists():
            lengths = np.random.default_rng(0).integers(30, 90, self.episodes_to_write)
            write_dataset(Path(self.root), lengths.tolist())


class WindowPolicy(pl.LightningModule):
    """A small CNN over the front camera's window, plus the state, predicting the action.

    Args:
        frames: frames in the front camera's window.
        lr: AdamW learning rate.
    """

    def __init__(self, frames: int = 2, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.vision = nn.Sequential(
            nn.Conv2d(3 * frames, 16, 5, stride=4), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Linear(32 + 3, 64), nn.ReLU(), nn.Linear(64, 2))
        self.train_mae = torchmetrics.MeanAbsoluteError()

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        images = batch[FRONT].float().div(255).flatten(1, 2)  # [B, T*C, H, W]
        state = batch["observation.state"].float() / 100
        prediction = self.head(torch.cat([self.vision(images), state], dim=-1))
        target = batch["action"].float() / 100
        loss = nn.functional.mse_loss(prediction, target)
        self.train_mae(prediction, target)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/mae", self.train_mae, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    LightningCLI(WindowPolicy, SyntheticVideoDataModule)


if __name__ == "__main__":
    main()
