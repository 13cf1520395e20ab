"""LanceDataModule's loader next to hand-written lancedb loaders, measured in one run.

    python benchmarks/bench_lance.py          # 200k rows x (16 float32 + int64 label + id)
    python benchmarks/bench_lance.py --heavy  # 50k rows of ~22 KB: see lance_heavy.py

Each configuration runs in a fresh process that has imported Lightning (as a training
process has), on the same table, ``--rounds`` times interleaved (default 2); the best
round counts (``--heavy``: 3 rounds, medians; see ``lance_heavy.py``). The machines are
shared and noisy, so the report is ratios of figures measured side by side.
Configurations (batch 256, 32 splits, shuffled):

- ``raw-default``: ``lancedb.streaming.StreamingDataLoader`` at lancedb's defaults (rows as
  Python dicts, the default collate).
- ``raw-best``: the best hand-written raw loader found here: a transform that turns each
  Arrow record batch into per-row tensor views once, the default collate,
  ``read_batch_size=256``.
- ``module``: ``LanceDataModule`` with its defaults; ``module-resumed`` the same after
  loading a mid-epoch state with uneven split counts (as a 2-worker run leaves at an
  odd step); ``module-clump`` with ``shuffle_clump_size=1024``.
- ``fit``: ``Trainer.fit`` for one epoch of a model whose ``training_step`` does nothing.

    python benchmarks/bench_lance.py --s3 [--heavy] [--latency-ms 20]

``--s3`` reads one table from local disk and from an S3-protocol server on 127.0.0.1
whose every request waits ``--latency-ms`` (default 20): see ``lance_s3.py``.

Reported: rows/s over the whole epoch and after the first batch, time to the first
batch (from the loader's creation), peak RSS of the process tree (the process and its
DataLoader workers, sampled every 20 ms), and for the shuffle the mean number of distinct
1,000-row storage blocks in a batch (higher is better mixed).

``--json PATH`` also keeps the reported figures (and every round's, or every
configuration's, results they come from) in the results file ``PATH``, as the run named
by its options (``benchmarks/record.py``): ``benchmarks/results/bench_lance.json``, or
with ``--s3`` ``benchmarks/results/bench_lance_s3.json``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from fresh import hand_back, run_fresh
from measure import PeakRss, add_store_options, rates
from record import save

NUM_SPLITS = 32
ROWS_PER_BLOCK = 1000


def make_table(uri: str, rows: int, storage_options: dict[str, str] | None = None) -> None:
    """The light table ``bench``, written in one ``create_table`` call."""
    from lightning_stream.lance.synthetic import make_light_table

    make_light_table(uri, rows, name="bench", chunk=rows, storage_options=storage_options)


def tensor_rows(batch):
    """raw-best transform: columns to tensors once per record batch, rows as views."""
    import torch

    vec = torch.from_numpy(batch.column("vec").flatten().to_numpy().reshape(-1, 16))
    label = torch.from_numpy(batch.column("label").to_numpy())
    ids = torch.from_numpy(batch.column("id").to_numpy())
    return [{"vec": vec[i], "label": label[i], "id": ids[i]} for i in range(batch.num_rows)]


def _module(uri: str, batch_size: int, **options):
    from lightning_stream import LanceDataModule

    return LanceDataModule(uri, "bench", num_splits=NUM_SPLITS, batch_size=batch_size, **options)


def build_loader(kind: str, uri: str, workers: int, batch_size: int):
    if kind.startswith("raw"):
        import lancedb
        from lancedb.streaming import StreamingDataLoader, StreamingDataset

        table = lancedb.connect(uri).open_table("bench")
        options = {"transform": tensor_rows, "read_batch_size": 256} if kind == "raw-best" else {}
        dataset = StreamingDataset(table, num_splits=NUM_SPLITS, shuffle_seed=0, **options)
        return StreamingDataLoader(
            dataset,
            batch_size=batch_size,
            num_workers=workers,
            multiprocessing_context="forkserver" if workers else None,
        )
    from lightning_stream.state import StreamState

    options = {"shuffle_clump_size": 1024} if kind == "module-clump" else {}
    dm = _module(uri, batch_size, num_workers=workers, **options)
    dm.setup("fit")
    if kind == "module-resumed":
        split_len = dm.stream.source.split_len
        consumed = [split_len // 2 + (split % 2) for split in range(NUM_SPLITS)]
        dm.stream.load(StreamState(identity=dm.stream.source.identity, consumed=consumed))
    return dm.train_dataloader()


def measure_loader(kind: str, uri: str, workers: int, batch_size: int) -> dict:
    with PeakRss() as rss:
        start = time.perf_counter()
        loader = build_loader(kind, uri, workers, batch_size)
        stamps, blocks = [], []
        for batch in loader:
            ids = batch["id"]
            stamps.append((time.perf_counter(), len(ids)))
            blocks.append(len({int(i) // ROWS_PER_BLOCK for i in ids}))
    speed = rates(start, stamps)
    return {
        "rows_per_s": speed["rows_per_s"],
        "steady_rows_per_s": speed["after_first"],
        "first_batch_s": stamps[0][0] - start,
        "peak_rss_mb": rss.peak,
        "blocks_per_batch": sum(blocks) / len(blocks),
        "rows": sum(n for _, n in stamps),
    }


def measure_fit(uri: str, batch_size: int) -> dict:
    from lightning_parts import NoOpModel, quiet_trainer

    model = NoOpModel()
    quiet_trainer().fit(model, datamodule=_module(uri, batch_size))
    (stamps,) = model.stamps
    return {"steady_rows_per_s": rates(stamps[0][0], stamps)["after_first"]}


def run_one(config: str, uri: str, batch_size: int) -> None:
    import lightning.pytorch  # noqa: F401  (a training process has Lightning imported)

    kind, workers = config.rsplit(":", 1)
    if kind == "fit":
        result = measure_fit(uri, batch_size)
    else:
        result = measure_loader(kind, uri, int(workers), batch_size)
    hand_back(result)


CONFIGS = [
    f"{kind}:{workers}"
    for workers in (0, 2)
    for kind in ("raw-default", "raw-best", "module", "module-resumed")
] + ["module-clump:0", "fit:0"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument(
        "--rounds",
        type=int,
        help="rounds of each timed configuration (default 2; --heavy, --s3: 3)",
    )
    parser.add_argument(
        "--heavy", action="store_true", help="memory and speed on a >= 1 GB table of heavy rows"
    )
    parser.add_argument(
        "--heavy-rows", type=int, help="rows of the heavy table (default 50,000; --s3: 25,000)"
    )
    parser.add_argument("--s3", action="store_true", help="local disk next to S3 (moto)")
    add_store_options(parser)
    parser.add_argument(
        "--before",
        type=Path,
        metavar="CHECKOUT",
        help="--s3: also read S3 with the code of this checkout, interleaved (see lance_s3.py)",
    )
    parser.add_argument(
        "--bandwidth-mb-s", type=float, help="--s3: cap on each response's MB/s (default none)"
    )
    parser.add_argument(
        "--settings", help="--s3: comma-separated shuffle settings of lance_s3.SETTINGS (all)"
    )
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="--s3: wait after each batch (a training step)"
    )
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also keep the reported figures there"
    )
    parser.add_argument(
        "--trainer", action="store_true", help="--s3: every epoch inside Trainer.fit"
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--uri", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 3 if args.heavy or args.s3 else 2
    elif args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.one:
        run_one(args.one, args.uri, args.batch_size)
        return
    if args.s3:
        import lance_s3

        kind, rows = ("heavy", args.heavy_rows or 25_000) if args.heavy else ("light", args.rows)
        settings = args.settings.split(",") if args.settings else None
        figures = {
            "run": "s3",
            **lance_s3.main(
                kind,
                rows,
                args.batch_size,
                args.rounds,
                args.latency_ms,
                args.bandwidth_mb_s,
                args.before,
                settings,
                args.step_ms,
                args.store_cores,
                args.trainer,
                args.moto_ranges,
            ),
        }
    elif args.heavy:
        import lance_heavy

        rows = args.heavy_rows or 50_000
        with tempfile.TemporaryDirectory() as tmp:
            figures = {"run": "heavy", **lance_heavy.main(rows, Path(tmp), args.rounds)}
    else:
        figures = {"run": "light", **light(args.rows, args.batch_size, args.rounds)}
    if args.json:
        if args.s3:
            import lance_s3

            save(args.json, lance_s3.run_name(figures), figures)
        else:
            save(args.json, f"{figures['run']} table", figures)


def light(rows: int, batch_size: int, rounds: int) -> dict:
    """Every configuration in ``CONFIGS``, ``rounds`` times interleaved; prints the report
    and returns its figures."""
    runs: list[dict[str, dict]] = []
    best: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        uri = str(Path(tmp) / "db")
        make_table(uri, rows)
        for round_ in range(rounds):
            runs.append({})
            for config in CONFIGS:
                arguments = [__file__, "--one", config, "--uri", uri]
                arguments += ["--batch-size", str(batch_size)]
                result = run_fresh(arguments, f"round {round_} {config:<18}")
                runs[-1][config] = result
                kept = best.setdefault(config, dict(result))
                for key, value in result.items():
                    better = min if key in ("first_batch_s", "peak_rss_mb") else max
                    kept[key] = better(kept[key], value)
    figures = {"ratios": ratios(best)}
    report(best, figures["ratios"])
    return {
        "rows": rows,
        "batch_size": batch_size,
        "rounds": rounds,
        "runs": runs,
        "best": best,
        **figures,
    }


def ratios(best: dict[str, dict]) -> dict:
    """The report's ratios between the best figures of the configurations."""
    found: dict = {}
    for workers in (0, 2):
        module, default = best[f"module:{workers}"], best[f"raw-default:{workers}"]
        raw_best, resumed = best[f"raw-best:{workers}"], best[f"module-resumed:{workers}"]
        found[f"{workers} workers"] = {
            "module / raw-default rows/s": module["rows_per_s"] / default["rows_per_s"],
            "module / raw-default RSS": module["peak_rss_mb"] / default["peak_rss_mb"],
            "module / raw-best rows/s": module["rows_per_s"] / raw_best["rows_per_s"],
            "first batch resumed / fresh": resumed["first_batch_s"] / module["first_batch_s"],
        }
    fit, loop, clump = best["fit:0"], best["module:0"], best["module-clump:0"]
    found["fit / bare loop after the 1st batch"] = (
        fit["steady_rows_per_s"] / loop["steady_rows_per_s"]
    )
    found["clump rows/s / default"] = clump["rows_per_s"] / loop["rows_per_s"]
    return found


def report(best: dict[str, dict], found: dict) -> None:
    print("\nbest of all rounds")
    header = f"{'config':<18} {'rows/s':>8} {'after 1st':>9} {'1st batch s':>11} {'RSS MB':>7}"
    print(header + f" {'blocks/batch':>12}")
    for config, r in best.items():
        if "rows_per_s" not in r:
            continue
        print(
            f"{config:<18} {r['rows_per_s']:>8.0f} {r['steady_rows_per_s']:>9.0f}"
            f" {r['first_batch_s']:>11.2f} {r['peak_rss_mb']:>7.0f} {r['blocks_per_batch']:>12.1f}"
        )
    print("\nratios")
    for workers in (0, 2):
        r = found[f"{workers} workers"]
        print(
            f"num_workers={workers}: module / raw-default rows/s"
            f" {r['module / raw-default rows/s']:.2f},"
            f" RSS {r['module / raw-default RSS']:.2f};"
            f" module / raw-best rows/s {r['module / raw-best rows/s']:.2f};"
            f" first batch resumed / fresh {r['first batch resumed / fresh']:.2f}"
        )
    print(
        f"no-op Trainer.fit / bare loader loop (after the first batch):"
        f" {found['fit / bare loop after the 1st batch']:.2f}"
    )
    print(
        f"shuffle_clump_size=1024: rows/s {found['clump rows/s / default']:.2f}x the default,"
        f" {best['module-clump:0']['blocks_per_batch']:.1f} distinct 1,000-row blocks per"
        f" batch against {best['module:0']['blocks_per_batch']:.1f}"
    )


if __name__ == "__main__":
    main()
