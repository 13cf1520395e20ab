"""LanceDataModule on light tables of 1M to 64M rows: setup, first batch, speed, memory.

    python benchmarks/scale.py [--sizes 1000000,16000000,64000000] [--rounds 3]
        [--data-dir DIR] [--json benchmarks/results/scale.json]
    python benchmarks/scale.py --plan-only --rows 1000000000 --splits 4096 --world 512
        --workers 2 [--json benchmarks/results/scale.json]

The light tables (an int64 ``id``, 16 float32 ``vec``, a float32 ``label``: 76 bytes a
row, ``lightning_stream.lance.synthetic.light_rows``) are written once under
``--data-dir``, 1M rows a write, and kept for later runs. Each configuration runs in a
fresh process, configurations interleaved, ``--rounds`` rounds; at the defaults
(``num_splits=64``, batch 256), 0 and 2 workers, per size:

- ``setup + first batch``: from before ``dm.setup("fit")`` to the first batch in hand;
- ``rows/s``: after the first batch, to the end of the epoch;
- ``next first batch``: the wait for the next epoch's first batch;
- ``peak above start``: the process tree's peak RSS (workers included) above its RSS
  before setup, sampled every 20 ms;
- ``blocks/64``: the mean count of distinct 1,024-row storage blocks among 64
  consecutive rows as the batches deliver them.

Then the largest table with ``filter="label < 0.5"`` (a whole epoch) and with
``shuffle_clump_size=1`` (single rows, ``--single-seconds`` of reading): figures only.

``--plan-only`` computes one rank's epoch plan for a table that does not exist (the
last rank of ``--world``, every storage offset its ``--workers`` readers serve, window by
window as they read) and prints its time and the peak of Python's allocations.

``--json PATH`` keeps the figures as the run ``tables`` (or ``plan only``) of the results
file ``PATH`` (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from fresh import hand_back, run_fresh
from lance_s3 import blocks_per_rows
from measure import PeakRss, shown, size_summary, tree_rss_mb
from record import save

ROOT = Path(__file__).resolve().parents[1]
NUM_SPLITS = 64
BATCH = 256
WRITE_ROWS = 1_000_000
MIX_SAMPLE = 200_000  # rows whose mixing is measured


def table_uri(data_dir: Path, rows: int) -> str:
    """The light table of ``rows`` rows under ``data_dir``, written if missing."""
    sys.path.insert(0, str(ROOT))
    from lightning_stream.lance.synthetic import make_light_table

    uri = data_dir / f"light-{rows}"
    done = uri / "written"
    if not done.exists():
        make_light_table(str(uri), rows, chunk=WRITE_ROWS)
        done.touch()
    return str(uri)


def one(uri: str, workers: int, options: dict, seconds: float | None) -> dict:
    """One configuration in this (fresh) process."""
    sys.path.insert(0, str(ROOT))
    from lightning_stream import LanceDataModule

    before = tree_rss_mb()
    ids: list = []
    with PeakRss() as peak:
        started = time.perf_counter()
        dm = LanceDataModule(
            uri, "light", num_splits=NUM_SPLITS, batch_size=BATCH, num_workers=workers, **options
        )
        dm.setup("fit")
        setup = time.perf_counter() - started
        batches = iter(dm.train_dataloader())
        batch = next(batches)
        first = time.perf_counter() - started
        after_first = time.perf_counter()
        rows = 0
        ids.append(batch["id"].numpy())
        for batch in batches:
            rows += len(batch["id"])
            if sum(map(len, ids)) < MIX_SAMPLE:
                ids.append(batch["id"].numpy())
            if seconds is not None and time.perf_counter() - after_first > seconds:
                break
        rate = rows / (time.perf_counter() - after_first)
        result = {"setup_s": setup, "first_batch_s": first, "rows_per_s": rate, "rows": rows}
        if seconds is None:  # the epoch ended: the next one's first batch
            waited = time.perf_counter()
            next(iter(dm.train_dataloader()))
            result["next_first_batch_s"] = time.perf_counter() - waited
    dm.teardown("fit")
    import numpy as np

    result["peak_above_start_gb"] = (peak.peak - before) / 1024
    result["blocks_per_64"] = blocks_per_rows(np.concatenate(ids))
    result["rank_share_gb"] = dm.stream.source.rows * 8 / 2**30  # 8 bytes a row
    return result


def plan_only(rows: int, splits: int, world: int, workers: int, batch: int) -> dict:
    """One rank's epoch plan of a ``rows``-row table: every offset its readers serve."""
    import tracemalloc

    sys.path.insert(0, str(ROOT))
    from lightning_stream.lance.order import ReaderRows, TableOrder, clump_rows
    from lightning_stream.plan import RankEpochPlan, ReaderOrder, check_topology

    tracemalloc.start()
    started = time.perf_counter()
    check_topology(splits, world, workers)
    order = TableOrder(rows, splits, clump_rows(None, rows, splits), True, 0, 1)
    rank = world - 1
    plan = RankEpochPlan((0,) * splits, order.split_len, world, rank, workers, batch)
    served = 0
    for worker in range(max(1, workers)):
        reader = ReaderRows(order, ReaderOrder.of_worker(plan, worker))
        for start in range(0, len(reader), 2**16):  # a reader's window of reads at most
            served += len(reader(start, min(start + 2**16, len(reader))))
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    return {
        "rows": rows,
        "splits": splits,
        "world": world,
        "workers": workers,
        "rank": rank,
        "rank_rows": served,
        "steps": plan.steps,
        "seconds": seconds,
        "peak_mb": peak / 2**20,
        "clump": order.clump,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,16000000,64000000")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "ls-scale")
    parser.add_argument("--single-seconds", type=float, default=20.0)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also keep the figures there")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--rows", type=int, default=10**9)
    parser.add_argument("--splits", type=int, default=4096)
    parser.add_argument("--world", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.plan_only:
        result = plan_only(args.rows, args.splits, args.world, args.workers, BATCH)
        print(json.dumps(result))
        print(
            f"one rank's plan of {args.rows:,} rows: {result['seconds']:.2f} s,"
            f" {result['peak_mb']:.1f} MB at most"
        )
        if args.json:
            save(args.json, "plan only", result)
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    args.data_dir.mkdir(parents=True, exist_ok=True)
    uris = {rows: table_uri(args.data_dir, rows) for rows in sizes}
    runs: dict[str, list] = {}
    for round_ in range(args.rounds):
        for rows in sizes:
            for workers in (0, 2):
                config = f"{rows}:{workers}"
                arguments = [__file__, "--one", uris[rows], str(workers), "{}", "-"]
                label = f"round {round_} {config:<12}"
                runs.setdefault(config, []).append(run_fresh(arguments, label))
    largest = max(sizes)
    extra = {
        "filter": ({"filter": "label < 0.5"}, "-"),
        "single rows": ({"shuffle_clump_size": 1}, str(args.single_seconds)),
    }
    for name, (options, seconds) in extra.items():
        arguments = [__file__, "--one", uris[largest], "0", json.dumps(options), seconds]
        runs[f"{largest}:0 {name}"] = [run_fresh(arguments, f"{largest}:0 {name}")]
    figures = size_summary(runs, sizes, ("first_batch_s", "rows_per_s"))
    report(figures)
    if args.json:
        result = {
            "rounds": args.rounds,
            "num_splits": NUM_SPLITS,
            "batch_size": BATCH,
            "runs": runs,
            "figures": figures,
        }
        save(args.json, "tables", result)


def report(figures: dict) -> None:
    print(
        f"\n{'configuration':<22} {'setup + first batch s':>22} {'rows/s':>26}"
        f" {'next first batch s':>19} {'peak above start GB':>20} {'blocks/64':>9}"
    )
    for config, f in figures.items():
        if " over " in config:
            print(
                f"{config:<22} 64M/1M: setup + first batch {f['first_batch_s']:.2f}x,"
                f" rows/s {f['rows_per_s']:.2f}x"
            )
            continue
        following = shown(f["next_first_batch_s"]) if "next_first_batch_s" in f else "-"
        rate = f["rows_per_s"]
        print(
            f"{config:<22} {shown(f['first_batch_s']):>22}"
            f" {rate['median']:>10.0f} ({rate['min']:.0f}-{rate['max']:.0f})"
            f" {following:>19} {shown(f['peak_above_start_gb']):>20}"
            f" {f['blocks_per_64']['median']:>9.1f}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        uri, workers, options, seconds = sys.argv[2:6]
        limit = None if seconds == "-" else float(seconds)
        hand_back(one(uri, int(workers), json.loads(options), limit))
    else:
        main()
