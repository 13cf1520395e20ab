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
   reported as the median and range over the rounds. ``fit``: the module
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

import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from fresh import hand_back, run_fresh
from lance_heavy_report import SPEED, report, summary
from measure import rates, tree_memory_mb

NUM_SPLITS = 48
BATCH = 64
STEP_S = 0.02


def _module(uri: str, workers: int, **options):
    from lightning_stream import LanceDataModule

    return LanceDataModule(
        uri, "heavy", num_splits=NUM_SPLITS, batch_size=BATCH, num_workers=workers, **options
    )


def memory(uri: str, workers: int) -> dict:
    import threading

    from lightning_parts import NoOpModel, quiet_trainer

    dm = _module(uri, workers)
    samples: list[tuple[int, float, float, float]] = []  # step, rss, pss, resident_bytes
    state = {"step": 0, "done": False}

    def sample() -> None:
        while not state["done"]:
            rss, pss = tree_memory_mb()
            counters = dm.stream.counters() if dm.stream is not None else {}
            samples.append((state["step"], rss, pss, counters.get("resident_bytes", 0.0)))
            time.sleep(0.1)

    class Slow(NoOpModel):
        def training_step(self, batch, batch_idx):
            state["step"] = batch_idx + 1
            time.sleep(STEP_S)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    trainer = quiet_trainer()
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
        epochs.append(rates(start, stamps))
        start = time.perf_counter()
    epochs[1]["cpu_s"] = (_cpu_seconds(dm) - cpu).tolist()
    return {"first": epochs[0], "second": epochs[1]}


def _cpu_seconds(dm) -> np.ndarray:
    """CPU seconds so far of this process and of ``dm``'s reading workers (Linux)."""
    main = sum(os.times()[:2])
    pool = dm.stream.source.pool if dm is not None else None
    started = [pid for pid in pool.pids if pid] if pool is not None else []
    workers = 0.0
    for pid in started:
        with open(f"/proc/{pid}/stat") as stat:
            # utime and stime, after the command name (which may hold spaces)
            fields = stat.read().rsplit(")", 1)[1].split()
        workers += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return np.array([main, workers])


def binary_step(uri: str, with_jpeg: bool) -> dict:
    from lightning_parts import NoOpModel, quiet_trainer

    columns = ["id", "caption", "label", "rare", "tokens", "embedding"]
    dm = _module(uri, 0, columns=[*columns, "jpeg"] if with_jpeg else columns)
    times: list[float] = []

    class StepTimes(NoOpModel):
        last = None

        def on_train_batch_start(self, batch, batch_idx):
            # the step's own time: from one batch to the next, less the loader's wait
            now = time.perf_counter()
            if self.last is not None:
                times.append(now - self.last - dm.stream.last_wait)
            self.last = now

    quiet_trainer(max_steps=200).fit(StepTimes(), datamodule=dm)
    return {"median_step_ms": statistics.median(times) * 1000}


def fit(uri: str, workers: int) -> dict:
    """Two epochs of ``Trainer.fit`` with a no-op ``training_step``: the rows/s that reach
    the step, the clock as in ``speed``."""
    from lightning_parts import NoOpModel, quiet_trainer

    import lightning_stream.lance.datamodule  # noqa: F401

    cpu: list[np.ndarray] = []

    class CpuAtEpochEnd(NoOpModel):
        def on_train_epoch_end(self) -> None:
            cpu.append(_cpu_seconds(dm))

    start = time.perf_counter()
    dm = _module(uri, workers)
    model = CpuAtEpochEnd()
    quiet_trainer(max_epochs=2).fit(model, datamodule=dm)
    epochs = model.stamps
    second = rates(epochs[0][-1][0], epochs[1])
    second["cpu_s"] = (cpu[1] - cpu[0]).tolist()
    return {"first": rates(start, epochs[0]), "second": second}


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


def main(rows: int, workdir: Path, rounds: int) -> dict:
    """Runs every configuration, prints the report, and returns its figures."""
    from lightning_stream.lance.synthetic import make_heavy_table

    uri = str(workdir / "db")
    started = time.perf_counter()
    make_heavy_table(uri, rows)
    size = sum(f.stat().st_size for f in Path(uri).rglob("*") if f.is_file()) / 1e9
    print(
        f"heavy table: {rows} rows, {size:.2f} GB on disk ({time.perf_counter() - started:.0f} s)"
    )

    def run(config: str) -> dict:
        return run_fresh([__file__, config, uri], f"{config:<20}")

    results = {config: run(config) for config in ONCE}
    speeds = [{config: run(config) for config in SPEED.values()} for _ in range(rounds)]
    figures = summary(results, speeds)
    report(figures)
    return {"rows": rows, "table_gb": size, "rounds": rounds, **figures}


if __name__ == "__main__":
    hand_back(run_one(sys.argv[1], sys.argv[2]))
