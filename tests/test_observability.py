"""Provenance in checkpoints (lightning-stream inspect) and the loader's data-wait metrics."""

import csv
import json
import subprocess
import sys

import lightning_stream

from .conftest import train


def test_inspect_prints_the_provenance_of_a_ddp_checkpoint(table_dir):
    out, _ = train(table_dir, "inspect", "--devices", "2", "--save-at", "5", "--max-epochs", "1")
    ckpt = out / "ckpt" / "step=5.ckpt"
    command = [sys.executable, "-m", "lightning_stream.cli", "inspect", str(ckpt)]
    text = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    for line in (
        "global step           5",
        f"data uri              {table_dir / 'db'}",
        "data table            samples",
        "data version          1",
        "data num_splits       12",
        "data shuffle_seed     0",
        "samples consumed      30 in all, 2..3 per split",
        "saved by world_size   2",
        "saved by num_workers  0",
        f"version lightning-stream  {lightning_stream.__version__}",
    ):
        assert " ".join(line.split()) in " ".join(text.split())
    record = json.loads(
        subprocess.run([*command, "--json"], capture_output=True, text=True, check=True).stdout
    )
    assert record["complete"] and record["consumed"] and record["provenance"]["versions"]["torch"]
    assert set(record["provenance"]["code"]) == {"commit", "dirty"}


def test_inspect_names_a_file_that_is_not_a_checkpoint(tmp_path):
    bogus = tmp_path / "bogus.ckpt"
    bogus.write_bytes(b"not a checkpoint")
    command = [sys.executable, "-m", "lightning_stream.cli", "inspect", str(bogus)]
    result = subprocess.run(command, capture_output=True, text=True)
    assert result.returncode == 1
    assert f"{bogus} is not a readable torch checkpoint" in result.stderr


def test_data_wait_share_reaches_the_csv_logger(table_dir):
    out, _ = train(table_dir, "monitor", "--monitor", "--max-epochs", "1")
    (metrics,) = (out / "ckpt" / "logs").glob("version_*/metrics.csv")
    with metrics.open() as rows:
        logged = [row for row in csv.DictReader(rows) if row.get("loader/wait_share")]
    assert len(logged) == 80  # every step of the epoch (240 rows, batch 3)
    shares = [float(row["loader/wait_share"]) for row in logged]
    assert all(0.0 <= share <= 1.0 for share in shares)
    assert all(float(row["loader/samples_per_s"]) > 0 for row in logged)
    assert float(logged[-1]["loader/bytes_loaded"]) > 0
