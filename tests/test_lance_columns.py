"""One Python type per column, decided from the schema, on a table shaped like real data."""

import lancedb
import lightning.pytorch as pl
import numpy as np
import pyarrow as pa
import pytest
import torch

from lightning_stream import LanceDataModule
from lightning_stream.lance.arrow import held_bytes
from lightning_stream.lance.reader import BudgetedReader, LanceReads, ReadCounters
from lightning_stream.workers.slots import plain

from .conftest import HEAVY_ROWS, Rows

NUM_SPLITS = 12  # 100 rows per split: no surplus
EXPECTED = {
    "id": torch.Tensor,
    "caption": list,
    "jpeg": np.ndarray,
    "label": torch.Tensor,
    "label_valid": torch.Tensor,
    "rare": torch.Tensor,
    "rare_valid": torch.Tensor,
    "tokens": list,
    "tokens_valid": torch.Tensor,
    "embedding": torch.Tensor,
}


def epoch_batches(uri, num_workers, **options):
    dm = LanceDataModule(
        uri, "heavy", num_splits=NUM_SPLITS, batch_size=32, num_workers=num_workers, **options
    )
    dm.setup("fit")
    return list(dm.train_dataloader())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_batch_has_one_type_per_column(heavy_uri, num_workers):
    batches = epoch_batches(heavy_uri, num_workers)
    for batch in batches:
        assert {name: type(value) for name, value in batch.items()} == EXPECTED
    ids = torch.cat([b["id"] for b in batches])
    assert sorted(ids.tolist()) == list(range(HEAVY_ROWS))
    stored = lancedb.connect(heavy_uri).open_table("heavy").to_arrow()
    blobs = dict(zip(stored["id"].to_pylist(), stored["jpeg"].to_pylist(), strict=True))
    for batch in batches:  # each value with its own row, whoever read it
        assert list(batch["jpeg"]) == [blobs[i] for i in batch["id"].tolist()]

    batch = batches[0]
    ids = batch["id"]
    assert batch["label_valid"].dtype == torch.bool
    assert batch["label_valid"].tolist() == (ids % 10 != 0).tolist()
    assert batch["label"].tolist() == torch.where(ids % 10 != 0, ids % 7, 0).tolist()
    assert batch["embedding"].shape == (len(ids), 512)
    assert batch["embedding"].dtype == torch.float32
    assert batch["caption"] == [f"row {i}" for i in ids.tolist()]
    assert batch["jpeg"].dtype == object
    assert [len(blob) for blob in batch["jpeg"]] == [2_000] * len(ids)
    null_tokens = (ids % 50 == 1).tolist()
    assert batch["tokens_valid"].tolist() == [not null for null in null_tokens]
    for i, values, null in zip(ids.tolist(), batch["tokens"], null_tokens, strict=True):
        assert values.dtype == torch.float32
        assert len(values) == (0 if null else i % 16)


def test_a_column_with_two_nulls_keeps_its_type_in_every_batch(heavy_uri):
    batches = epoch_batches(heavy_uri, 0, columns=["id", "rare"])
    assert all(set(b) == {"id", "rare", "rare_valid"} for b in batches)
    ids = torch.cat([b["id"] for b in batches])
    valid = torch.cat([b["rare_valid"] for b in batches])
    invalid = ids[~valid].tolist()
    assert sorted(invalid) == [3, 7]


def test_a_column_without_nulls_has_no_mask(heavy_uri):
    (batch, *_) = epoch_batches(heavy_uri, 0, columns=["id", "embedding"])
    assert set(batch) == {"id", "embedding"}


class BatchTypes(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[dict] = []

    def training_step(self, batch, batch_idx):
        self.seen.append({name: type(value) for name, value in batch.items()})
        return self.layer(batch["label"].float()[:, None]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_binary_column_reaches_training_step_as_one_numpy_array(heavy_uri, tmp_path):
    dm = LanceDataModule(heavy_uri, "heavy", num_splits=NUM_SPLITS, batch_size=64)
    model = BatchTypes()
    trainer = pl.Trainer(
        max_steps=5,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, datamodule=dm)
    assert model.seen and all(seen == EXPECTED for seen in model.seen)


def test_rows_come_back_in_the_order_asked_with_their_nulls(tmp_path):
    # binary and string values are reordered by their views, not copied; 3,000 rows come
    # from lance as three chunks that share their binary data
    ids = np.arange(3000)
    names = [None if i % 7 == 0 else f"name {i}" for i in ids]
    blobs = [None if i % 5 == 0 else bytes([i % 256]) * (i % 300 + 13) for i in ids]
    table = lancedb.connect(str(tmp_path)).create_table(
        "t", pa.table({"id": ids, "name": names, "blob": pa.array(blobs, pa.binary())})
    )
    row_ids = np.random.default_rng(0).permutation(3000)  # storage offsets
    reader = BudgetedReader(LanceReads(table, None), Rows(row_ids), 2**30, ReadCounters())
    reader.window_rows = 3000  # one window
    (rows,) = reader.tables()
    assert rows.schema.field("blob").type == pa.binary_view()  # views over lance's buffers
    assert rows["id"].to_pylist() == row_ids.tolist()
    assert rows["name"].to_pylist() == [names[i] for i in row_ids]
    assert rows["blob"].to_pylist() == [blobs[i] for i in row_ids]
    crossed = plain(rows)  # as a worker's batch crosses to the main process
    assert crossed.schema.field("blob").type == pa.binary()
    assert crossed["blob"].to_pylist() == [blobs[i] for i in row_ids]
    # lance's shared data buffer counts once: the blob column holds its values, 16 bytes of
    # view a row and its validity bits
    blob = rows.select(["blob"])
    values = sum(len(b) for b in blobs if b is not None)
    assert values <= held_bytes(blob) <= values + 16 * len(row_ids) + len(row_ids) // 8 + 64
