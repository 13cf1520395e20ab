"""Train a small latent dynamics model on trajectory windows streamed from LanceDB.

The first run writes a synthetic dataset into an embedded LanceDB table: latent states
of many episodes evolving as ``z[t+1] = 0.8 z[t] + 0.2 a[t] M + noise`` under random
actions, cut into overlapping windows (one table row per window). The model learns the
one-step dynamics ``(z, a) -> z_next``; a torchmetrics MSE is logged.

    python examples/train_world_model.py fit --config configs/world_model.yaml
    python examples/train_world_model.py fit --config configs/world_model.yaml \
        --trainer.strategy=ddp --trainer.devices=2
    python examples/train_world_model.py fit --config configs/world_model.yaml \
        --ckpt_path runs/world_model/checkpoints/last.ckpt
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import torch
import torchmetrics
from lightning.pytorch.cli import LightningCLI
from torch import nn

from lightning_stream import LanceDataModule


def synthetic_windows(
    episodes: int, steps: int, window: int, latent: int = 16, action: int = 2, seed: int = 0
) -> pa.Table:
    """Windows of ``window`` transitions from simulated episodes of ``steps`` transitions."""
    rng = np.random.default_rng(seed)
    actions = rng.standard_normal((episodes, steps, action), dtype=np.float32)
    mixing = rng.normal(scale=0.5, size=(action, latent)).astype(np.float32)
    states = np.empty((episodes, steps + 1, latent), dtype=np.float32)
    states[:, 0] = rng.standard_normal((episodes, latent))
    noise = rng.normal(scale=0.02, size=(episodes, steps, latent)).astype(np.float32)
    for t in range(steps):
        states[:, t + 1] = 0.8 * states[:, t] + 0.2 * actions[:, t] @ mixing + noise[:, t]
    starts = np.arange(steps - window + 1)
    episode = np.repeat(np.arange(episodes), len(starts))
    start = np.tile(starts, episodes)
    offsets = start[:, None] + np.arange(window)
    z = states[episode[:, None], offsets]
    a = actions[episode[:, None], offsets]
    z_next = states[episode[:, None], offsets + 1]

    def windows(values: np.ndarray) -> pa.Array:
        # Flat fixed-size lists (window * dim floats): lance 0.40 cannot read back a
        # fixed-size list nested in another. The model unflattens them.
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values[0].size)

    return pa.table(
        {
            "id": np.arange(len(episode), dtype=np.int64),
            "episode": episode.astype(np.int64),
            "start": start.astype(np.int64),
            "z": windows(z),
            "action": windows(a),
            "z_next": windows(z_next),
        }
    )


class TrajectoryDataModule(LanceDataModule):
    """LanceDataModule that writes the synthetic trajectory table on first use.

    Args:
        episodes: simulated episodes written on first run.
        episode_steps: transitions per episode.
        window: transitions per training window (one table row).
        **kwargs: everything :class:`~lightning_stream.LanceDataModule` takes.
    """

    def __init__(
        self,
        uri: str = "data/world_model.lance",
        table: str = "windows",
        *,
        episodes: int = 256,
        episode_steps: int = 32,
        window: int = 8,
        **kwargs,
    ) -> None:
        super().__init__(uri, table, **kwargs)
        self.episodes = episodes
        self.episode_steps = episode_steps
        self.window = window

    def prepare_data(self) -> None:
        db = lancedb.connect(self.uri)
        if self.table not in db.table_names():
            Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
            data = synthetic_windows(self.episodes, self.episode_steps, self.window)
            db.create_table(self.table, data)


class LatentDynamics(pl.LightningModule):
    """Predicts the next latent state from the current one and the action.

    Args:
        latent_dim: size of a latent state.
        action_dim: size of an action.
        hidden: width of the two hidden layers.
        lr: AdamW learning rate.
    """

    def __init__(
        self, latent_dim: int = 16, action_dim: int = 2, hidden: int = 64, lr: float = 1e-3
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(
            nn.Linear(latent_dim + action_dim, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, latent_dim),
        )
        self.train_mse = torchmetrics.MeanSquaredError()

    def forward(self, z: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, action], dim=-1))

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        z, z_next, action = (
            batch[key].unflatten(-1, (-1, dim))
            for key, dim in (
                ("z", self.hparams.latent_dim),
                ("z_next", self.hparams.latent_dim),
                ("action", self.hparams.action_dim),
            )
        )
        prediction = self(z, action)
        loss = nn.functional.mse_loss(prediction, z_next)
        self.train_mse(prediction, z_next)
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/mse", self.train_mse, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    LightningCLI(LatentDynamics, TrajectoryDataModule)
    # Lightning leaves a DDP process group alive; gloo's threads can abort the exit
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
