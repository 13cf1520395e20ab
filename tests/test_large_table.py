"""A table of millions of rows: the size at which lancedb's own shuffle gave out."""

import numpy as np

from lightning_stream import LanceDataModule
from lightning_stream.lance.synthetic import make_light_table

ROWS = 4_000_000


def test_an_epoch_of_4m_rows_at_2_workers_serves_every_id_once(tmp_path):
    make_light_table(str(tmp_path), ROWS, chunk=1_000_000)
    dm = LanceDataModule(str(tmp_path), "light", num_splits=64, batch_size=256, num_workers=2)
    dm.setup("fit")
    try:
        ids = np.concatenate([batch["id"].numpy() for batch in dm.train_dataloader()])
    finally:
        dm.teardown("fit")
    assert len(ids) == ROWS  # 64 splits of 62,500 rows: no surplus
    assert np.array_equal(np.sort(ids), np.arange(ROWS))
