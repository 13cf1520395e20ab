"""Training and evaluation runs for ``tests/test_loop.py``, as real (DDP) processes.

``python -m tests.loop_run <demo arguments> [--step-delay S]`` is
``lightning_stream.demo`` with an ``OnExceptionCheckpoint`` and slowed-down steps: a
preemption test sends SIGTERM to the whole job while it trains, then runs the same
command again, and Lightning resumes from the newest checkpoint by itself
(``fit(ckpt_path=None)`` becomes ``"last"`` when ``OnExceptionCheckpoint`` is present).

``python -m tests.loop_run --evaluate --uri DB --ledger-dir DIR --ckpt-dir DIR --devices N``
runs ``trainer.test`` and ``trainer.predict`` with the data module and writes the ids
each rank saw to ``DIR/test-rank<r>.json`` and ``DIR/predict-rank<r>.json``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint

from lightning_stream import LanceDataModule
from lightning_stream.demo import arguments, release_process_group, run

TEST_FILTER = "id % 7 != 0"


class SlowSteps(Callback):
    """Sleep after every training batch, so a signal lands in the middle of an epoch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


class IdsPerRank(pl.LightningModule):
    """Writes the ids of every test and predict batch of this rank."""

    def __init__(self, out_dir: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)
        self.out_dir = Path(out_dir)
        self.ids: list[int] = []

    def test_step(self, batch, batch_idx):
        self.ids.extend(batch["id"].tolist())

    def predict_step(self, batch, batch_idx):
        self.ids.extend(batch["id"].tolist())
        return self.layer(batch["vec"])

    def _write(self, stage: str) -> None:
        self.out_dir.mkdir(parents=True, exist_ok=True)
        path = self.out_dir / f"{stage}-rank{self.global_rank}.json"
        path.write_text(json.dumps(self.ids))
        self.ids = []

    def on_test_end(self) -> None:
        self._write("test")

    def on_predict_end(self) -> None:
        self._write("predict")


def evaluate(args) -> None:
    dm = LanceDataModule(
        args.uri,
        args.table,
        num_splits=args.num_splits,
        batch_size=args.batch_size,
        test_filter=TEST_FILTER,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = IdsPerRank(args.ledger_dir)
    trainer.test(model, datamodule=dm)
    trainer.predict(model, datamodule=dm, return_predictions=False)
    release_process_group()


def main() -> None:
    parser = arguments()
    parser.add_argument("--step-delay", type=float, default=0.0)
    parser.add_argument("--evaluate", action="store_true")
    args = parser.parse_args()
    if args.evaluate:
        evaluate(args)
        return
    run(args, (OnExceptionCheckpoint(args.ckpt_dir), SlowSteps(args.step_delay)))


if __name__ == "__main__":
    main()
