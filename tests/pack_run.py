"""Packed training runs for ``tests/test_packing.py``, as real (DDP) processes.

``python -m tests.pack_run <demo arguments>`` trains on the blocks of a token table
(:func:`lightning_stream.lance.synthetic.make_token_table`) and appends, per training
batch of each rank, the tokens that reached ``training_step`` to ``<ledger>/rank<r>.bin``:
a header ``(epoch, stream epoch, step, count)`` of int64, then ``count`` int32 tokens
(padding left out).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import torch

from lightning_stream import LanceDataModule, TokenPacking
from lightning_stream.demo import SaveAtSteps, arguments, release_process_group

BLOCK_SIZE = 2048
EOS_ID = 2**31 - 1
PAD_ID = 2**31 - 2


class TokenLedger(pl.LightningModule):
    def __init__(self, ledger_dir: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.ledger_dir = Path(ledger_dir)

    def on_fit_start(self) -> None:
        self.ledger_dir.mkdir(parents=True, exist_ok=True)
        self._ledger = (self.ledger_dir / f"rank{self.global_rank}.bin").open("ab")

    def training_step(self, batch, batch_idx):
        tokens = batch["input_ids"][batch["document_ids"] >= 0].numpy().astype(np.int32)
        epoch = self.trainer.datamodule.stream.state.epoch
        header = [self.current_epoch, epoch, self.global_step, len(tokens)]
        self._ledger.write(np.asarray(header, dtype=np.int64).tobytes() + tokens.tobytes())
        self._ledger.flush()
        positions = batch["position_ids"].float().unsqueeze(-1)
        return self.layer(positions / BLOCK_SIZE).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def read(ledger_dir: Path) -> list[tuple[int, int, int, np.ndarray]]:
    """Every rank's ``(epoch, stream epoch, step, tokens)`` entries."""
    entries = []
    for path in sorted(Path(ledger_dir).glob("rank*.bin")):
        data = path.read_bytes()
        at = 0
        while at < len(data):
            epoch, stream_epoch, step, count = np.frombuffer(data, np.int64, 4, at).tolist()
            at += 32
            entries.append((epoch, stream_epoch, step, np.frombuffer(data, np.int32, count, at)))
            at += 4 * count
    return entries


def main() -> None:
    parser = arguments()
    parser.add_argument("--cache-dir", required=True)
    parser.add_argument("--local-copy", action="store_true")
    args = parser.parse_args()
    packing = TokenPacking("tokens", BLOCK_SIZE, EOS_ID, PAD_ID, args.cache_dir, args.local_copy)
    dm = LanceDataModule(
        args.uri,
        "documents",
        num_splits=args.num_splits,
        batch_size=args.batch_size,
        num_workers=args.workers,
        pack=packing,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        max_epochs=args.max_epochs,
        callbacks=[SaveAtSteps(args.ckpt_dir, args.save_at)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(TokenLedger(args.ledger_dir), datamodule=dm, ckpt_path=args.ckpt_path)
    release_process_group()


if __name__ == "__main__":
    main()
