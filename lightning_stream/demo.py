"""A small real training run that records every sample id reaching ``training_step``.

``python -m lightning_stream.demo ...`` trains a one-layer model on a LanceDB table with
Lightning (DDP when ``--devices`` > 1, whose launcher starts the other ranks as real
processes) and appends each batch's ids to a per-rank ledger file. The demo command and
the tests read those ledgers (:mod:`lightning_stream.ledger`) to check that every sample
of every epoch was trained on exactly once across kills and resumes.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, Checkpoint, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from typing_extensions import override

from lightning_stream import AtomicCheckpointIO, LanceDataModule, LoaderMonitor, StreamStateCallback
from lightning_stream.lance.synthetic import make_light_table

# (sample id, input feature, its width) of the two kinds of data module
INPUTS = {"lance": ("id", "vec", 16), "video": ("index", "observation.state", 3)}


class LedgerModel(pl.LightningModule):
    """A one-layer model that writes the ids of each training batch to a per-rank file."""

    def __init__(
        self, ledger_dir: str, use_estimated_steps: bool = False, data: str = "lance"
    ) -> None:
        super().__init__()
        self.id_key, self.feature, width = INPUTS[data]
        self.layer = torch.nn.Linear(width, 1)
        self.ledger_dir = Path(ledger_dir)
        self.use_estimated_steps = use_estimated_steps
        self._ledger = None

    def on_fit_start(self) -> None:
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        path = self.ledger_dir / f"rank{self.global_rank}.jsonl"
        self._ledger = path.open("a", buffering=1)

    def teardown(self, stage: str) -> None:
        # closed here rather than when the model is collected, which may be during a
        # later fit (whose warnings a test may be recording)
        if self._ledger is not None:
            self._ledger.close()
            self._ledger = None

    def training_step(self, batch, batch_idx):
        stream = self.trainer.datamodule.stream
        entry = {
            "epoch": self.current_epoch,
            "stream_epoch": stream.state.epoch,
            "step": self.global_step,
            "ids": batch[self.id_key].tolist(),
        }
        self._ledger.write(json.dumps(entry) + "\n")
        inputs = batch[self.feature].float()
        prediction = self.layer(inputs).squeeze(-1)
        return torch.nn.functional.mse_loss(prediction, inputs.sum(-1))

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        if not self.use_estimated_steps:
            return optimizer
        total = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.LinearLR(optimizer, total_iters=max(1, total))
        return {"optimizer": optimizer, "lr_scheduler": scheduler}


class SaveAtSteps(Checkpoint):
    """Save ``step=<global step>.ckpt`` after the given global steps.

    A :class:`~lightning.pytorch.callbacks.Checkpoint`, so Lightning runs it after
    StreamStateCallback has counted the batch.
    """

    def __init__(self, dirpath: str, steps: list[int]) -> None:
        self.dirpath = dirpath.rstrip("/")  # a local path or an fsspec URL
        self.steps = set(steps)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step in self.steps:
            trainer.save_checkpoint(f"{self.dirpath}/step={trainer.global_step}.ckpt")


def make_table(
    uri: str, rows: int, table: str = "samples", storage_options: dict[str, str] | None = None
) -> None:
    """A table of ``rows`` samples: ``id``, a 16-float ``vec`` and a float ``label``."""
    make_light_table(uri, rows, name=table, storage_options=storage_options)


def arguments() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uri", required=True)
    parser.add_argument("--table", default="samples")
    parser.add_argument("--ledger-dir", required=True)
    parser.add_argument("--ckpt-dir", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=3)
    parser.add_argument("--num-splits", type=int, default=12)
    parser.add_argument("--max-epochs", type=int, default=2)
    parser.add_argument("--save-at", type=int, nargs="*", default=[])
    parser.add_argument("--ckpt-path")
    parser.add_argument("--limit-train-batches", type=int)
    parser.add_argument("--reload-every-epoch", action="store_true")
    parser.add_argument("--estimated-steps", action="store_true")
    parser.add_argument("--shuffle-seed", type=int, default=0)
    parser.add_argument("--explicit-callback", action="store_true")
    parser.add_argument("--save-every", type=int, help="ModelCheckpoint every n steps + last")
    parser.add_argument("--monitor", action="store_true", help="LoaderMonitor + CSV logger")
    parser.add_argument("--video", action="store_true", help="--uri is a LeRobot v3 dataset")
    parser.add_argument("--sidecar-dir")
    parser.add_argument("--on-decode-error", default="raise", help="video: 'raise' or 'skip'")
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument(
        "--storage-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="object-store option of the data module (checkpoints: AWS_* variables)",
    )
    return parser


def main() -> None:
    run(arguments().parse_args())


def datamodule(args: argparse.Namespace) -> pl.LightningDataModule:
    storage_options = dict(o.split("=", 1) for o in args.storage_option) or None
    shape = dict(num_splits=args.num_splits, batch_size=args.batch_size, num_workers=args.workers)
    common = dict(shape, shuffle_seed=args.shuffle_seed, storage_options=storage_options)
    if args.video:
        from lightning_stream.video.datamodule import VideoEpisodeDataModule

        return VideoEpisodeDataModule(
            args.uri,
            delta_timestamps={"observation.images.front": [-2 / 30, 0.0]},
            sidecar_dir=args.sidecar_dir,
            on_decode_error=args.on_decode_error,
            **common,
        )
    return LanceDataModule(args.uri, args.table, **common)


def run(args: argparse.Namespace, extra_callbacks: tuple[Callback, ...] = ()) -> pl.Trainer:
    callbacks = [SaveAtSteps(args.ckpt_dir, args.save_at), *extra_callbacks]
    if args.explicit_callback:
        callbacks.insert(0, StreamStateCallback())
    if args.save_every:
        callbacks.append(
            ModelCheckpoint(
                dirpath=args.ckpt_dir,
                every_n_train_steps=args.save_every,
                save_last=True,
                save_top_k=-1,
            )
        )
    logger = False
    if args.monitor:
        callbacks.append(LoaderMonitor())
        logger = CSVLogger(args.ckpt_dir, name="logs")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy="ddp" if args.devices * args.num_nodes > 1 else "auto",
        max_epochs=args.max_epochs,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        plugins=[AtomicCheckpointIO()],
        default_root_dir=args.ckpt_dir,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_train_batches=args.limit_train_batches,
        reload_dataloaders_every_n_epochs=1 if args.reload_every_epoch else 0,
    )
    model = LedgerModel(args.ledger_dir, args.estimated_steps, "video" if args.video else "lance")
    trainer.fit(model, datamodule=datamodule(args), ckpt_path=args.ckpt_path)
    release_process_group()
    return trainer


def release_process_group() -> None:
    """End this process's part of the DDP process group, if it has one.

    Lightning leaves the group alive when ``fit`` returns. Gloo's threads then outlive the
    interpreter's shutdown, and a 2-process run that had finished aborted at exit
    ("terminate called without an active exception", SIGABRT) once in a CI run: its exit
    status said it failed. Ending the group while the interpreter is whole avoids that.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
