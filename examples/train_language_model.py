"""Train a tiny causal language model on packed token blocks streamed from LanceDB.

The first run writes a synthetic corpus into an embedded LanceDB table: documents of 4 to
600 tokens (a few long, most short) drawn from a small vocabulary, one ``list<int32>``
row each. ``LanceDataModule(pack=...)`` packs them into blocks of ``block_size`` tokens;
the model attends within each document only (a mask from ``document_ids``) and is
trained on the already-shifted ``labels``.

    python examples/train_language_model.py fit --config configs/language_model.yaml
    python examples/train_language_model.py fit --config configs/language_model.yaml \
        --trainer.strategy=ddp --trainer.devices=2
    python examples/train_language_model.py fit --config configs/language_model.yaml \
        --ckpt_path runs/language_model/checkpoints/last.ckpt
"""

from __future__ import annotations

from pathlib import Path

import lancedb
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import torch
from lightning.pytorch.cli import LightningCLI
from torch import nn

from lightning_stream import LanceDataModule
from lightning_stream.packing.option import IGNORE_INDEX


def synthetic_corpus(documents: int, vocab: int, seed: int = 0) -> pa.Table:
    """``documents`` rows of token ids in ``[2, vocab)`` (0 and 1 are padding and EOS):
    each document repeats a short random phrase, so there is something to learn."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(4 + rng.pareto(1.5, documents) * 40, 600).astype(np.int64)
    rows = []
    for length in lengths.tolist():
        phrase = rng.integers(2, vocab, size=rng.integers(2, 8))
        rows.append(np.resize(phrase, length).astype(np.int32))
    return pa.table(
        {
            "id": np.arange(documents, dtype=np.int64),
            "tokens": pa.array(rows, type=pa.list_(pa.int32())),
        }
    )


class CorpusDataModule(LanceDataModule):
    """LanceDataModule that writes the synthetic corpus on first use.

    Args:
        documents: documents written on first run.
        vocab: vocabulary size of the written documents.
        **kwargs: everything :class:`~lightning_stream.LanceDataModule` takes.
    """

    def __init__(
        self,
        uri: str = "data/corpus.lance",
        table: str = "documents",
        *,
        documents: int = 4000,
        vocab: int = 64,
        **kwargs,
    ) -> None:
        super().__init__(uri, table, **kwargs)
        self.documents = documents
        self.vocab = vocab

    def prepare_data(self) -> None:
        db = lancedb.connect(self.uri)
        if self.table not in db.table_names():
            Path(self.uri).parent.mkdir(parents=True, exist_ok=True)
            db.create_table(self.table, synthetic_corpus(self.documents, self.vocab))


class TinyCausalLM(pl.LightningModule):
    """One transformer layer whose attention stays within each document of a block.

    Args:
        vocab: vocabulary size.
        width: model width.
        block_size: the longest position (the packing's ``block_size``).
        lr: AdamW learning rate.
    """

    def __init__(
        self, vocab: int = 64, width: int = 32, block_size: int = 128, lr: float = 3e-3
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(block_size, width)
        self.layer = nn.TransformerEncoderLayer(width, 2, 2 * width, 0.0, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        documents = batch["document_ids"]
        same = documents[:, :, None] == documents[:, None, :]
        causal = torch.ones_like(same[0]).tril()
        blocked = ~(same & causal)  # True: may not attend
        heads = self.layer.self_attn.num_heads
        mask = blocked.repeat_interleave(heads, dim=0)
        hidden = self.tokens(batch["input_ids"]) + self.positions(batch["position_ids"])
        return self.head(self.layer(hidden, src_mask=mask))

    def training_step(self, batch, batch_idx):
        logits = self(batch)
        loss = nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=IGNORE_INDEX
        )
        self.log("train/loss", loss, prog_bar=True, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    LightningCLI(TinyCausalLM, CorpusDataModule, save_config_kwargs={"overwrite": True})


if __name__ == "__main__":
    main()
