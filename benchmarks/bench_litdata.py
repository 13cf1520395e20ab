"""LanceDataModule against LitData's StreamingDataset on the same rows, on local disk.

    python benchmarks/bench_litdata.py [--rounds 3] [--tables light,heavy] [--step-ms 0]
        [--json benchmarks/results/bench_litdata.json]

LitData is not a dependency of the package, and its requirements pull a torch other than
the CPU build this project pins (through torchvision, which its streaming path does not
use), so install it beside the test extra without them:

    pip install --no-deps litdata==0.2.76 && pip install tifffile obstore

Both tables (light: ``--rows`` rows of an id, 16 floats and a label; heavy:
``--heavy-rows`` rows of about 22 KB, see ``lightning_stream.lance.synthetic``) are written
once as a LanceDB table and, row for row, as a LitData dataset (``litdata.optimize``,
64 MB chunks; the heavy table's nulls written as -1, its ragged ``tokens`` as arrays).
Each configuration reads two shuffled epochs in a fresh process, batch 256, the
configurations interleaved, ``--rounds`` rounds. ``--step-ms`` follows every batch with a
wait of that many ms in the consumer (a training step that leaves the cores to the reader,
as a step on a GPU does; default 0: none):

- ``ours``: ``LanceDataModule`` at its defaults (32 splits, rows shuffled in clumps: 1,562
  rows of the light table, 195 of the heavy one, see ``lightning_stream.lance.order``);
- ``ours-rows``: the same with ``shuffle_clump_size=1`` (single rows shuffled);
- ``litdata``: ``StreamingDataset(shuffle=True)`` (its default order: chunks shuffled,
  then items within a window of chunks) through ``StreamingDataLoader``, whose collate
  stacks the numeric columns into tensors and keeps strings and bytes as lists (torch's
  default collate refuses bytes), as ours hands them.

Reported per table and worker count (0 and 2): rows/s after the first batch (median and
range), ours over LitData paired by round (after the first batch, over the whole epoch,
and over the next epoch in the same process), the first batch's wait, and the mixing figure
of each, ``blocks/64``: the mean count of distinct 1,024-row storage blocks among 64
consecutive rows as the batches deliver them (``id // 1024``; both stores hold the rows in
``id`` order).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fresh import hand_back, run_fresh
from lance_s3 import blocks_per_rows
from measure import rates, shown, spread
from record import save

ROOT = Path(__file__).resolve().parents[1]
NUM_SPLITS = 32
CHUNK_ROWS = 10_000  # rows per optimize input
BLOB_BYTES = 20_000  # the heavy table's default


def items(spec: tuple[str, int, int, int]):
    """LitData items of rows ``start .. start + count`` of a table of ``total`` rows:
    the same values ``bench_lance.make_table`` (light) and ``heavy_rows`` (heavy) write."""
    import numpy as np

    kind, start, count, total = spec
    if kind == "light":
        from lightning_stream.lance.synthetic import light_rows

        rows = light_rows(0, total).slice(start, count)  # make_table writes rows 0 .. total
        vec = rows["vec"].combine_chunks().flatten().to_numpy().reshape(-1, 16)
        for i, label in enumerate(rows["label"].to_numpy()):
            yield {"id": start + i, "vec": vec[i], "label": float(label)}
        return
    from lightning_stream.lance.synthetic import heavy_rows

    for row in heavy_rows(start, count, BLOB_BYTES).to_pylist():
        yield {
            "id": row["id"],
            "caption": row["caption"],
            "jpeg": row["jpeg"],
            "label": -1 if row["label"] is None else row["label"],
            "rare": -1 if row["rare"] is None else row["rare"],
            "tokens": np.asarray(row["tokens"] or [], dtype=np.float32),
            "embedding": np.asarray(row["embedding"], dtype=np.float32),
        }


def collate(items: list[dict]) -> dict:
    """Numeric columns stacked into tensors; strings, bytes and ragged arrays as lists.
    LitData hands binary values as memoryviews of its chunk: they become ``bytes``, as ours
    are (a memoryview cannot cross from a worker, and a batch must outlive the chunk)."""
    import numpy as np
    import torch

    batch = {}
    for key in items[0]:
        values = [item[key] for item in items]
        first = values[0]
        if isinstance(first, memoryview):
            batch[key] = [bytes(v) for v in values]
        elif isinstance(first, (bytes, str)):
            batch[key] = values
        elif isinstance(first, np.ndarray):
            shapes = {v.shape for v in values}
            batch[key] = torch.from_numpy(np.stack(values)) if len(shapes) == 1 else values
        else:
            batch[key] = torch.tensor(values)
    return batch


def epoch(
    config: str, lance_uri: str, litdata_dir: str, batch_size: int, step_ms: float = 0
) -> dict:
    """Two epochs of ``reader:workers`` in this (fresh) process, each batch followed by a
    wait of ``step_ms``."""
    sys.path.insert(0, str(ROOT))
    reader, workers = config.split(":")
    workers = int(workers)
    if reader.startswith("ours"):
        from lightning_stream import LanceDataModule

        name = "heavy" if Path(lance_uri).name == "heavy" else "bench"
        order = {"shuffle_clump_size": 1} if reader == "ours-rows" else {}
        dm = LanceDataModule(
            lance_uri,
            name,
            num_splits=NUM_SPLITS,
            batch_size=batch_size,
            num_workers=workers,
            **order,
        )
        dm.setup("fit")
        loader = dm.train_dataloader()
    else:
        from litdata import StreamingDataLoader, StreamingDataset

        dataset = StreamingDataset(litdata_dir, shuffle=True, seed=0)
        loader = StreamingDataLoader(
            dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate
        )
    start, stamps, ids = one_pass(loader, step_ms)
    again_start, again, again_ids = one_pass(loader, step_ms)  # the next epoch, warm
    if reader.startswith("ours"):
        dm.teardown("fit")
    return {
        **rates(start, stamps),
        "first_batch_s": stamps[0][0] - start,
        "rows": len(ids),
        "distinct_rows": len(set(ids)),
        "blocks_per_64": blocks_per_rows(ids),
        "second_epoch": rates(again_start, again)["rows_per_s"],
        "second_epoch_rows": len(set(again_ids)),
    }


def one_pass(loader, step_ms: float) -> tuple[float, list[tuple[float, int]], list[int]]:
    """One epoch of ``loader``: its start, each batch's (arrival, rows), the ids served."""
    start = time.perf_counter()
    stamps, ids = [], []
    for batch in loader:
        stamps.append((time.perf_counter(), len(batch["id"])))
        ids.extend(int(i) for i in batch["id"])
        if step_ms:
            time.sleep(step_ms / 1000)
    return start, stamps, ids


def write_tables(tmp: Path, tables: dict[str, int]) -> dict:
    """The tables (``{"light" or "heavy": rows}``) in both formats under ``tmp``; returns
    their paths per table."""
    import litdata
    from bench_lance import make_table

    from lightning_stream.lance.synthetic import make_heavy_table

    if "light" in tables:
        make_table(str(tmp / "light"), tables["light"])
    if "heavy" in tables:
        make_heavy_table(str(tmp / "heavy"), tables["heavy"], blob_bytes=BLOB_BYTES)
    paths = {}
    for kind, rows in tables.items():
        out = tmp / f"litdata-{kind}"
        specs = [(kind, s, min(CHUNK_ROWS, rows - s), rows) for s in range(0, rows, CHUNK_ROWS)]
        litdata.optimize(
            fn=items,
            inputs=specs,
            output_dir=str(out),
            chunk_bytes="64MB",
            num_workers=1,
            mode="overwrite",
        )
        paths[kind] = (str(tmp / kind), str(out))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="light rows (200,000)")
    parser.add_argument("--heavy-rows", type=int, default=25_000, help="heavy rows (25,000)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tables", default="light,heavy", help="light,heavy (both)")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="wait after each batch (a training step)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also keep the figures there")
    args = parser.parse_args()
    configs = [f"{reader}:{w}" for w in (0, 2) for reader in ("ours", "ours-rows", "litdata")]
    with tempfile.TemporaryDirectory() as tmp:
        sizes = {"light": args.rows, "heavy": args.heavy_rows}
        paths = write_tables(Path(tmp), {kind: sizes[kind] for kind in args.tables.split(",")})
        runs = {kind: [] for kind in paths}
        for round_ in range(args.rounds):
            for kind, (lance_uri, litdata_dir) in paths.items():
                runs[kind].append({})
                for config in configs:
                    arguments = [
                        __file__,
                        "--one",
                        config,
                        lance_uri,
                        litdata_dir,
                        str(args.batch_size),
                        str(args.step_ms),
                    ]
                    label = f"round {round_} {kind} {config:<10}"
                    runs[kind][-1][config] = run_fresh(arguments, label)
    figures = summary(runs)
    report(figures)
    if args.json:
        result = {
            "rounds": args.rounds,
            "batch_size": args.batch_size,
            "rows": args.rows,
            "heavy_rows": args.heavy_rows,
            "step_ms": args.step_ms,
            "runs": runs,
            "figures": figures,
        }
        tables = " and ".join(args.tables.split(","))
        save(args.json, f"{tables} tables, step {args.step_ms:g} ms", result)


def summary(runs: dict) -> dict:
    figures = {}
    for kind, rounds in runs.items():
        for workers in (0, 2):
            ours = [r[f"ours:{workers}"] for r in rounds]
            rows = [r[f"ours-rows:{workers}"] for r in rounds]
            theirs = [r[f"litdata:{workers}"] for r in rounds]
            figures[f"{kind}, {workers} workers"] = {
                "ours_rows_per_s": spread([r["after_first"] for r in ours]),
                "litdata_rows_per_s": spread([r["after_first"] for r in theirs]),
                "ours_over_litdata": spread(
                    [a["after_first"] / b["after_first"] for a, b in zip(ours, theirs, strict=True)]
                ),
                "ours_over_litdata_whole_epoch": spread(
                    [a["rows_per_s"] / b["rows_per_s"] for a, b in zip(ours, theirs, strict=True)]
                ),
                "ours_over_litdata_second_epoch": spread(
                    [
                        a["second_epoch"] / b["second_epoch"]
                        for a, b in zip(ours, theirs, strict=True)
                    ]
                ),
                "rows_over_litdata": spread(
                    [a["after_first"] / b["after_first"] for a, b in zip(rows, theirs, strict=True)]
                ),
                "rows_blocks_per_64": statistics.median(r["blocks_per_64"] for r in rows),
                "ours_first_batch_s": statistics.median(r["first_batch_s"] for r in ours),
                "litdata_first_batch_s": statistics.median(r["first_batch_s"] for r in theirs),
                "ours_blocks_per_64": statistics.median(r["blocks_per_64"] for r in ours),
                "litdata_blocks_per_64": statistics.median(r["blocks_per_64"] for r in theirs),
                "rows": [ours[0]["rows"], theirs[0]["rows"]],
            }
    return figures


def report(figures: dict) -> None:
    print(
        f"\n{'configuration':<18} {'ours rows/s':>11} {'LitData rows/s':>14}"
        f" {'ours/LitData (range)':>21} {'whole epoch':>18} {'epoch 2':>18}"
        f" {'first batch s':>15}"
        f" {'blocks/64 ours':>14} {'LitData':>8} {'rows/LitData':>20}"
        f" {'blocks/64':>9}"
    )
    for name, f in figures.items():
        print(
            f"{name:<18} {f['ours_rows_per_s']['median']:>11.0f}"
            f" {f['litdata_rows_per_s']['median']:>14.0f}"
            f" {shown(f['ours_over_litdata']):>21}"
            f" {shown(f['ours_over_litdata_whole_epoch']):>18}"
            f" {shown(f['ours_over_litdata_second_epoch']):>18}"
            f" {f['ours_first_batch_s']:>7.2f} / {f['litdata_first_batch_s']:<5.2f}"
            f" {f['ours_blocks_per_64']:>14.1f} {f['litdata_blocks_per_64']:>8.1f}"
            f" {shown(f['rows_over_litdata']):>20}"
            f" {f['rows_blocks_per_64']:>9.1f}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        config, lance_uri, litdata_dir, batch, step_ms = sys.argv[2:7]
        hand_back(epoch(config, lance_uri, litdata_dir, int(batch), float(step_ms)))
    else:
        main()
