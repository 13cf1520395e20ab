"""Resident memory of a reading process epoch after epoch, with the package's allocator
settings and with glibc's defaults.

    python benchmarks/memory_over_epochs.py [--rows 2000000] [--heavy] [--epochs 8]
        [--rounds 2] [--json benchmarks/results/memory_over_epochs.json]

writes one table (light rows as ``bench_lance.py`` writes them, or ``--heavy``: 25k rows
of 22 KB), then reads ``--epochs`` epochs of it at 0 workers in a
fresh process per setting (``package``: :mod:`lightning_stream.allocator`'s settings;
``thresholds``: its thresholds alone, given as ``GLIBC_TUNABLES`` so that the package
leaves glibc's arenas as they are; ``glibc``: ``LIGHTNING_STREAM_MALLOC=0``), the settings
interleaved over ``--rounds``.
Reported per run: rows/s of each epoch, the resident memory at each epoch's end and the
peak. A reader whose memory is bounded ends its last epoch about where it ended its
first. ``--json PATH`` also keeps every run's figures in the results file ``PATH``, as the
run ``light table`` or ``heavy table`` (``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fresh import hand_back, run_fresh
from measure import tree_rss_mb
from record import save

from lightning_stream.allocator import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES

SETTINGS = {
    "package": {},
    "thresholds": {
        "GLIBC_TUNABLES": f"glibc.malloc.mmap_threshold={MMAP_THRESHOLD_BYTES}"
        f":glibc.malloc.trim_threshold={TRIM_THRESHOLD_BYTES}"
    },
    "glibc": {"LIGHTNING_STREAM_MALLOC": "0"},
}


def epochs(uri: str, name: str, count: int) -> dict:
    """``count`` epochs of the table at 0 workers in this process."""
    from lightning_stream import LanceDataModule

    dm = LanceDataModule(uri, name, num_splits=32, batch_size=256, num_workers=0)
    dm.setup("fit")
    rates, ends = [], []
    for _ in range(count):
        rows, start = 0, time.perf_counter()
        for batch in dm.train_dataloader():
            rows += len(batch["id"])
        rates.append(round(rows / (time.perf_counter() - start)))
        ends.append(round(tree_rss_mb()))  # 0 workers: this process alone
    dm.teardown("fit")
    peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return {"rows_per_s": rates, "end_rss_mb": ends, "peak_rss_mb": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--heavy", action="store_true")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path, metavar="PATH", help="also keep the figures there")
    parser.add_argument("--run", nargs=2, help=argparse.SUPPRESS)  # uri, name: one run
    args = parser.parse_args()
    if args.run:
        hand_back(epochs(*args.run, args.epochs))
        return
    with tempfile.TemporaryDirectory() as tmp:
        uri = str(Path(tmp) / "db")
        if args.heavy:
            from lightning_stream.lance.synthetic import make_heavy_table

            make_heavy_table(uri, 25_000)
            name = "heavy"
        else:
            from bench_lance import make_table

            make_table(uri, args.rows)
            name = "bench"
        rows = 25_000 if args.heavy else args.rows
        print(f"{name} table, {args.epochs} epochs at 0 workers, one fresh process a run")
        runs = []
        for round_ in range(args.rounds):
            for setting, env in SETTINGS.items():
                for variable in ("LIGHTNING_STREAM_MALLOC", "GLIBC_TUNABLES"):
                    os.environ.pop(variable, None)
                os.environ.update(env)
                result = run_fresh(
                    [__file__, "--epochs", str(args.epochs), "--run", uri, name],
                    f"round {round_} {setting:10}",
                )
                runs.append({"round": round_, "setting": setting, **result})
    if args.json:
        kind = "heavy" if args.heavy else "light"
        figures = {"rows": rows, "epochs": args.epochs, "rounds": args.rounds, "runs": runs}
        save(args.json, f"{kind} table", figures)


if __name__ == "__main__":
    main()
