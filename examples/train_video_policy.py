"""Train a small policy on camera windows streamed from a LeRobot v3 dataset.

The first run writes a synthetic dataset in the LeRobot v3 layout (episodes of different
lengths, two cameras as h264 MP4s with B-frames, several episodes per file, actions and
state in Parquet, ``meta/stats.json``, two tasks). The policy sees the last frames of the
front camera, the state and the task string, and predicts the action, normalised with
the dataset's statistics as a LeRobot policy does.

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
NORMALISED = ("observation.state", "action")


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
    """A small CNN over the front camera's window, the state and the task, predicting the action.

    The glue a LeRobot training loop needs, and nothing more: state and action are
    normalised with the dataset's ``meta/stats.json`` (``dm.stats``, the mean/std mapping a
    LeRobot normaliser takes), uint8 images are scaled on the device, and the task strings
    of the batch (``batch["task"]``) condition the policy through a byte-level bag of
    embeddings standing in for a language model's tokenizer.

    Args:
        frames: frames in the front camera's window.
        lr: AdamW learning rate.
    """

    def __init__(self, frames: int = 2, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.vision = nn.Sequential(
            nn.Conv2d(3 * frames, 16, 5, stride=4),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.task = nn.EmbeddingBag(256, 8)
        self.head = nn.Sequential(nn.Linear(32 + 3 + 8, 64), nn.ReLU(), nn.Linear(64, 2))
        self.train_mae = torchmetrics.MeanAbsoluteError()
        for key in NORMALISED:  # filled from dm.stats in setup; saved with the checkpoint
            self.register_buffer(f"{key.replace('.', '_')}_mean", torch.zeros(0))
            self.register_buffer(f"{key.replace('.', '_')}_std", torch.ones(0))

    def setup(self, stage: str) -> None:
        stats = self.trainer.datamodule.stats  # meta/stats.json, read by the data module's setup
        if stats is None:
            raise ValueError("the dataset has no meta/stats.json to normalise with")
        for key in NORMALISED:
            name = key.replace(".", "_")
            setattr(self, f"{name}_mean", stats[key]["mean"].to(self.device))
            setattr(self, f"{name}_std", stats[key]["std"].clamp_min(1e-8).to(self.device))

    def normalise(self, key: str, values: torch.Tensor) -> torch.Tensor:
        name = key.replace(".", "_")
        return (values.float() - getattr(self, f"{name}_mean")) / getattr(self, f"{name}_std")

    def embed_tasks(self, tasks: list[str]) -> torch.Tensor:
        codes = [torch.tensor(list(task.encode()), device=self.device) for task in tasks]
        offsets = torch.tensor([0, *[len(c) for c in codes[:-1]]], device=self.device).cumsum(0)
        return self.task(torch.cat(codes), offsets)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        images = batch[FRONT].float().div(255).flatten(1, 2)  # uint8 [B, T, C, H, W] on device
        state = self.normalise("observation.state", batch["observation.state"])
        features = [self.vision(images), state, self.embed_tasks(batch["task"])]
        prediction = self.head(torch.cat(features, dim=-1))
        target = self.normalise("action", batch["action"])
        loss = nn.functional.mse_loss(prediction, target)
        self.train_mae(prediction, target)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/mae", self.train_mae, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    LightningCLI(WindowPolicy, SyntheticVideoDataModule)
    # Lightning leaves a DDP process group alive; gloo's threads can abort the exit
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
