"""``bench_lance.py --heavy``: memory and speed on a table shaped like real training data.

The table (written by the benchmark, ``--heavy-rows`` rows, about 22 KB each): a string,
a 20 KB binary ``jpeg``, two nullable ints, a variable-length float list and a 512-float
embedding (``lightning_stream.lance.synthetic``). Batch 64, 48 splits. Every
configuration runs in a fresh process; the machines are shared and noisy, so the report
is ratios of figures measured side by side in one run.

1. Memory: ``Trainer.fit`` for one epoch with a 20 ms ``training_step`` (slower than the
   reads), at 0 and 2 workers and the default ``read_ahead_bytes``. The process tree's
   memory is sampled every 100 ms, as RSS (shared pages counted in every process that
   maps them, so each worker's imported libraries count again) and as PSS (shared pages
   split between the processes that map them). Reported: the table's size, the memory
   after the first batch, at 10/50/90% of the epoch and at its peak, and the peak of the
   loader's ``resident_bytes`` counter (summed over the workers).
2. Speed: two epochs as fast as the loader goes (the first includes starting the
   workers, which the module keeps for the second): ``LanceDataModule`` at 0 and 2 workers
   next to raw ``lancedb.streaming.StreamingDataLoader`` at its defaults (rows as Python
   dicts; batches are the list of rows, since torch's default collate fails on the
   nulls) at 0 and 2 workers. The clock starts after the imports (a script's own) when
   the loader is built, so opening the table and starting workers count. Rows/s of each
   epoch over the whole epoch, after its first batch and over its second half;
   ``--rounds`` interleaved rounds (default 3), each ratio taken within a round and
   reported as the median and range over the rounds. ``module-warm`` is the module at 2
   workers in a process whose forkserver already runs (an earlier data module started
   and stopped its workers before the clock): the first epoch without the workers'
   start-up, which is almost all the forkserver importing lancedb. ``fit``: the module
   under ``Trainer.fit`` (two epochs, a no-op ``training_step``), the rows/s reaching
   the step, the clock started before the data module and the ``Trainer`` are built.
   Also the CPU seconds of the second epoch: the main process's and the module's
   reading workers' (from ``/proc``; not those of raw lancedb's workers).
3. Binary column under ``Trainer``: the median time of a step with a no-op
   ``training_step`` over 64 heavy rows (batch start to batch start, less the time spent
   waiting for the loader, so Lightning's own work: hooks, the device transfer), with
   and without the ``jpeg`` column.
"""

from __future__ import annotations

import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from measure import tree_memory_mb

NUM_SPLITS = 48
BATCH = 64
STEP_S = 0.02


def _module(uri: str, workers: int, **options):
    from lightning_stream import LanceDataModule

    return LanceDataModule(
        uri, "heavy", num_splits=NUM_SPLITS, batch_size=BATCH, num_workers=workers, **options
    )


def _trainer(**options):
    import lightning.pytorch as pl

    options = {"max_epochs": 1, **options}
    return pl.Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, **options,
    )  # fmt: skip


def memory(uri: str, workers: int) -> dict:
    import threading

    import lightning.pytorch as pl
    import torch

    dm = _module(uri, workers)
    samples: list[tuple[int, float, float, float]] = []  # step, rss, pss, resident_bytes
    state = {"step": 0, "done": False}

    def sample() -> None:
        while not state["done"]:
            rss, pss = tree_memory_mb()
            counters = dm.stream.counters() if dm.stream is not None else {}
            samples.append((state["step"], rss, pss, counters.get("resident_bytes", 0.0)))
            time.sleep(0.1)

    class Slow(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch, batch_idx):
            state["step"] = batch_idx + 1
            time.sleep(STEP_S)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    trainer = _trainer()
    trainer.fit(Slow(), datamodule=dm)
    state["done"] = True
    sampler.join()
    steps = trainer.num_training_batches
    after_first = [s for s in samples if s[0] >= 1]

    def at(fraction: float) -> tuple[float, float]:
        point = next(s for s in after_first if s[0] >= fraction * steps)
        return point[1], point[2]

    return {
        "steps": steps,
        "first_batch": after_first[0][1:3],
        "p10": at(0.1),
        "p50": at(0.5),
        "p90": at(0.9),
        "peak": (max(s[1] for s in after_first), max(s[2] for s in after_first)),
        "resident_mb": max(s[3] for s in samples) / 2**20,
    }


def raw_collate(rows: list[dict]) -> dict:
    """The rows as lancedb hands them over (torch's default collate fails on nulls)."""
    return {"id": [row["id"] for row in rows], "rows": rows}


def speed(uri: str, kind: str, workers: int) -> dict:
    # the clock starts after the imports (a training script's own) and before the
    # loader is built: opening the table and starting any workers count
    import lancedb
    from lancedb.streaming import StreamingDataLoader, StreamingDataset

    import lightning_stream.lance.datamodule  # noqa: F401

    if kind == "module-warm":
        earlier = _module(uri, workers)
        earlier.setup("fit")
        next(iter(earlier.train_dataloader()))
        earlier.teardown("fit")
    start = time.perf_counter()
    if kind == "raw":
        dm = None  # lancedb's DataLoader workers: their CPU is not read
        table = lancedb.connect(uri).open_table("heavy")

        def loader():
            # one pass per loader: a new one per epoch, as lancedb's own examples do
            return StreamingDataLoader(
                StreamingDataset(table, num_splits=NUM_SPLITS, shuffle_seed=0),
                batch_size=BATCH,
                num_workers=workers,
                collate_fn=raw_collate,
                multiprocessing_context="forkserver" if workers else None,
            )
    else:
        dm = _module(uri, workers)
        dm.setup("fit")
        loader = dm.train_dataloader
    epochs = []
    for _ in range(2):
        cpu = _cpu_seconds(dm)
        stamps = [(time.perf_counter(), len(batch["id"])) for batch in loader()]
        epochs.append(_rates(start, stamps))
        start = time.perf_counter()
    epochs[1]["cpu_s"] = (_cpu_seconds(dm) - cpu).tolist()
    return {"first": epochs[0], "second": epochs[1]}


def _cpu_seconds(dm) -> np.ndarray:
    """CPU seconds so far of this process and of ``dm``'s reading workers (Linux)."""
    main = sum(os.times()[:2])
    pool = dm.stream.source.pool if dm is not None else None
    started = [process for process in pool.processes if process] if pool is not None else []
    workers = 0.0
    for process in started:
        with open(f"/proc/{process.pid}/stat") as stat:
            # utime and stime, after the command name (which may hold spaces)
            fields = stat.read().rsplit(")", 1)[1].split()
        workers += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return np.array([main, workers])


def _rates(start: float, stamps: list[tuple[float, int]]) -> dict:
    """Rows/s over the epoch, after its first batch and over its second half."""
    times = [start] + [t for t, _ in stamps]
    rows = [0, *itertools.accumulate(n for _, n in stamps)]

    def rate(begin: int) -> float:
        return (rows[-1] - rows[begin]) / (times[-1] - times[begin])

    return {"rows_per_s": rate(0), "after_first": rate(1), "second_half": rate(len(stamps) // 2)}


def binary_step(uri: str, with_jpeg: bool) -> dict:
    import lightning.pytorch as pl
    import torch

    columns = ["id", "caption", "label", "rare", "tokens", "embedding"]
    dm = _module(uri, 0, columns=[*columns, "jpeg"] if with_jpeg else columns)
    times: list[float] = []

    class NoOp(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))
            self.last = None

        def on_train_batch_start(self, batch, batch_idx):
            # the step's own time: from one batch to the next, less the loader's wait
            now = time.perf_counter()
            if self.last is not None:
                times.append(now - self.last - dm.stream.last_wait)
            self.last = now

        def training_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    _trainer(max_steps=200).fit(NoOp(), datamodule=dm)
    return {"median_step_ms": statistics.median(times) * 1000}


def fit(uri: str, workers: int) -> dict:
    """Two epochs of ``Trainer.fit`` with a no-op ``training_step``: the rows/s that reach
    the step, the clock as in ``speed``."""
    import lightning.pytorch as pl
    import torch

    import lightning_stream.lance.datamodule  # noqa: F401

    epochs: list[list[tuple[float, int]]] = [[], []]
    cpu: list[np.ndarray] = []

    class NoOp(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))

        def on_train_epoch_end(self) -> None:
            cpu.append(_cpu_seconds(dm))

        def training_step(self, batch, batch_idx):
            epochs[self.current_epoch].append((time.perf_counter(), len(batch["id"])))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    start = time.perf_counter()
    dm = _module(uri, workers)
    _trainer(max_epochs=2).fit(NoOp(), datamodule=dm)
    second = _rates(epochs[0][-1][0], epochs[1])
    second["cpu_s"] = (cpu[1] - cpu[0]).tolist()
    return {"first": _rates(start, epochs[0]), "second": second}


def run_one(config: str, uri: str) -> dict:
    import lightning.pytorch  # noqa: F401  (a training process has Lightning imported)

    what, *rest = config.split(":")
    if what == "memory":
        return memory(uri, int(rest[0]))
    if what == "speed":
        return speed(uri, rest[0], int(rest[1]))
    if what == "fit":
        return fit(uri, int(rest[0]))
    return binary_step(uri, rest[0] == "jpeg")


ONCE = ["memory:0", "memory:2", "binary:jpeg", "binary:none"]
# run --rounds times, interleaved; a ratio is taken within each round
SPEED = [
    "speed:module:0",
    "speed:raw:0",
    "speed:module:2",
    "speed:raw:2",
    "speed:module-warm:2",
    "fit:0",
    "fit:2",
]
SPANS = {
    "whole epoch": "rows_per_s",
    "after the 1st batch": "after_first",
    "2nd half": "second_half",
}


def main(rows: int, workdir: Path, rounds: int) -> None:
    from lightning_stream.lance.synthetic import make_heavy_table

    uri = str(workdir / "db")
    started = time.perf_counter()
    make_heavy_table(uri, rows)
    size = sum(f.stat().st_size for f in Path(uri).rglob("*") if f.is_file()) / 1e9
    print(
        f"heavy table: {rows} rows, {size:.2f} GB on disk ({time.perf_counter() - started:.0f} s)"
    )
    results = {config: _run(config, uri) for config in ONCE}
    speeds = [{config: _run(config, uri) for config in SPEED} for _ in range(rounds)]
    report(results, speeds)


def _run(config: str, uri: str) -> dict:
    command = [sys.executable, __file__, config, uri]
    output = subprocess.run(command, capture_output=True, text=True, check=False)
    line = next((x for x in output.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise RuntimeError(f"{config} failed:\n{output.stderr[-4000:]}")
    result = json.loads(line.removeprefix("RESULT "))
    print(f"{config:<20} {json.dumps(result)}", flush=True)
    return result


def report(results: dict, speeds: list[dict]) -> None:
    print("\nmemory, one epoch with a 20 ms step (MB of the process tree, RSS / PSS)")
    for workers in (0, 2):
        r = results[f"memory:{workers}"]
        base_rss, base_pss = r["first_batch"]
        curve = "  ".join(f"{p} {r[p][0]:.0f}/{r[p][1]:.0f}" for p in ("p10", "p50", "p90"))
        print(
            f"  {workers} workers: after 1st batch {base_rss:.0f}/{base_pss:.0f}  {curve}"
            f"  peak {r['peak'][0]:.0f}/{r['peak'][1]:.0f}"
        )
        print(
            f"    peak above the 1st batch: RSS {(r['peak'][0] - base_rss) / 1024:.2f} GB,"
            f" PSS {(r['peak'][1] - base_pss) / 1024:.2f} GB; 90% / 10%:"
            f" RSS {r['p90'][0] / r['p10'][0]:.2f}, PSS {r['p90'][1] / r['p10'][1]:.2f};"
            f" resident_bytes counter peak {r['resident_mb']:.0f} MB"
        )
    print(
        f"\nspeed ('fit': a no-op training_step under Trainer.fit; the rest: a bare loop),"
        f" {len(speeds)} interleaved rounds: median rows/s (whole epoch / after its 1st"
        " batch / its 2nd half); the clock starts when the loader is built, so the first"
        " epoch includes opening the table and starting the workers"
    )
    names = {
        "module 0w": "speed:module:0",
        "raw 0w": "speed:raw:0",
        "module 2w": "speed:module:2",
        "raw 2w": "speed:raw:2",
        "module 2w, warm": "speed:module-warm:2",
        "fit 0w": "fit:0",
        "fit 2w": "fit:2",
    }
    for epoch in ("first", "second"):
        print(f" {epoch} epoch")
        for name, config in names.items():
            rates = [_median(speeds, config, epoch, key) for key in SPANS.values()]
            print(f"  {name:<16}" + "".join(f" {rate:>8.0f}" for rate in rates))
        pairs = {
            "module 2w / module 0w": ("speed:module:2", "speed:module:0"),
            "module 2w / raw 2w": ("speed:module:2", "speed:raw:2"),
            "module 0w / raw 0w": ("speed:module:0", "speed:raw:0"),
            "fit 2w / fit 0w": ("fit:2", "fit:0"),
        }
        if epoch == "first":
            # the workers' start-up taken out: this process's forkserver already ran
            pairs["module 2w, warm / module 0w"] = ("speed:module-warm:2", "speed:module:0")
        for label, key in SPANS.items():
            ratios = "; ".join(
                f"{name} {_ratio(speeds, *configs, epoch, key)}" for name, configs in pairs.items()
            )
            print(f"  {label}: {ratios}")
    print(" CPU seconds of the 2nd epoch, main process + workers (median over the rounds)")
    for name, config in names.items():
        if config == "speed:raw:2":
            continue  # lancedb's DataLoader workers are not this process's to read
        cpu = [r[config]["second"]["cpu_s"] for r in speeds]
        main, workers, total = (
            statistics.median(part) for part in zip(*[(m, w, m + w) for m, w in cpu], strict=True)
        )
        print(f"  {name:<16} {main:.2f} + {workers:.2f}, total {total:.2f}")
    jpeg, none = results["binary:jpeg"]["median_step_ms"], results["binary:none"]["median_step_ms"]
    print(
        f"\nno-op Trainer step, 64 heavy rows: {jpeg:.2f} ms with jpeg, {none:.2f} ms without"
        f" ({jpeg - none:+.2f} ms)"
    )


def _median(speeds: list[dict], config: str, epoch: str, key: str) -> float:
    return statistics.median(round_[config][epoch][key] for round_ in speeds)


def _ratio(speeds: list[dict], top: str, bottom: str, epoch: str, key: str) -> str:
    """The median of the per-round ratios, and their range."""
    ratios = [r[top][epoch][key] / r[bottom][epoch][key] for r in speeds]
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


if __name__ == "__main__":
    print("RESULT " + json.dumps(run_one(sys.argv[1], sys.argv[2])))
