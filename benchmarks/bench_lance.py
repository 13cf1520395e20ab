"""Rows/s of LanceDataModule's loader next to a hand-written lancedb loader, in one run.

    python benchmarks/bench_lance.py            # 200k rows x (16 float32 + int64), batch 256

Every configuration runs ``--rounds`` times, interleaved (A B A B ...), on the same table,
and the best round of each is compared: the machines are shared and noisy, so the report
is ratios of figures measured side by side, not absolute times.

- ``raw``: ``lancedb.streaming.StreamingDataLoader`` written by hand with the best
  settings found here: a transform that turns each Arrow record batch into per-row tensor
  views once (not lancedb's row-by-row Python dicts), the default collate, the same
  ``read_batch_size`` and ``num_splits`` as the data module.
- ``module``: ``LanceDataModule(...).train_dataloader()``, one epoch.
- ``fit``: ``Trainer.fit`` for one epoch of a model whose ``training_step`` does nothing,
  timed from the first to the last batch, next to the bare loader loop after its first
  batch (``num_workers=0``).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import lancedb
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import torch
from lancedb.streaming import StreamingDataLoader, StreamingDataset

from lightning_stream import LanceDataModule

NUM_SPLITS = 32  # the global batch of 256 is a multiple
READ_BATCH = 256


def make_table(uri: str, rows: int) -> None:
    rng = np.random.default_rng(0)
    vec = rng.standard_normal((rows, 16), dtype=np.float32)
    data = pa.table(
        {
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 16),
            "label": rng.integers(0, 10, rows),
        }
    )
    lancedb.connect(uri).create_table("bench", data, mode="overwrite")


def tensor_rows(batch: pa.RecordBatch) -> list[dict]:
    """Hand-written best raw transform: columns to tensors once, rows as views."""
    vec = torch.from_numpy(batch.column("vec").flatten().to_numpy().reshape(-1, 16))
    label = torch.from_numpy(batch.column("label").to_numpy())
    return [{"vec": vec[i], "label": label[i]} for i in range(batch.num_rows)]


def epoch_rate(batches) -> tuple[float, float, int]:
    """(rows/s over the whole epoch, rows/s after the first batch, rows)."""
    start = time.perf_counter()
    first = None
    rows = first_rows = 0
    for batch in batches:
        rows += len(batch["label"])
        if first is None:
            first, first_rows = time.perf_counter(), rows
    end = time.perf_counter()
    return rows / (end - start), (rows - first_rows) / (end - first), rows


def raw_loader(uri: str, batch_size: int, workers: int):
    table = lancedb.connect(uri).open_table("bench")
    dataset = StreamingDataset(
        table, num_splits=NUM_SPLITS, shuffle_seed=0, read_batch_size=READ_BATCH,
        transform=tensor_rows,
    )  # fmt: skip
    return StreamingDataLoader(
        dataset,
        batch_size=batch_size,
        num_workers=workers,
        multiprocessing_context="forkserver" if workers else None,
    )


def module_loader(uri: str, batch_size: int, workers: int):
    dm = LanceDataModule(
        uri, "bench", num_splits=NUM_SPLITS, batch_size=batch_size, num_workers=workers,
        read_batch_size=READ_BATCH,
    )  # fmt: skip
    dm.setup("fit")
    return dm.train_dataloader()


class NoOp(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.rows = 0
        self.first = self.last = None

    def training_step(self, batch, batch_idx):
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last  # rows/s after the first batch, like the bare loop
        else:
            self.rows += len(batch["label"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_rate(uri: str, batch_size: int) -> float:
    dm = LanceDataModule(
        uri, "bench", num_splits=NUM_SPLITS, batch_size=batch_size, read_batch_size=READ_BATCH
    )
    model = NoOp()
    trainer = pl.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(model, datamodule=dm)
    return model.rows / (model.last - model.first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        uri = str(Path(tmp) / "db")
        make_table(uri, args.rows)
        best: dict[str, float] = {}
        for round_ in range(args.rounds):
            for workers in (0, 2):
                for name, build in (("raw", raw_loader), ("module", module_loader)):
                    rate, steady, rows = epoch_rate(build(uri, args.batch_size, workers))
                    key = f"{name} K={workers}"
                    best[key] = max(best.get(key, 0.0), rate)
                    best[key + " steady"] = max(best.get(key + " steady", 0.0), steady)
                    print(
                        f"round {round_} {key:<11} {rate:>9.0f} rows/s epoch,"
                        f" {steady:>9.0f} after the first batch ({rows} rows)"
                    )
            rate = fit_rate(uri, args.batch_size)
            best["fit"] = max(best.get("fit", 0.0), rate)
            print(f"round {round_} fit         {rate:>9.0f} rows/s after the first batch")
        print("\nbest of", args.rounds, "rounds, rows/s")
        for workers in (0, 2):
            for suffix in ("", " steady"):
                raw, module = best[f"raw K={workers}{suffix}"], best[f"module K={workers}{suffix}"]
                what = "whole epoch" if not suffix else "after the first batch"
                print(
                    f"num_workers={workers} {what:<21}: raw {raw:>7.0f}  LanceDataModule"
                    f" {module:>7.0f}  ratio {module / raw:.2f}"
                )
        print(
            f"no-op fit epoch {best['fit']:.0f} vs bare loader loop (after the first batch)"
            f" {best['module K=0 steady']:.0f}: ratio {best['fit'] / best['module K=0 steady']:.2f}"
        )


if __name__ == "__main__":
    main()
