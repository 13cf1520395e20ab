"""``bench_lance.py --s3``: one table on local disk and on an S3 server with latency.

The table (light: ``--rows`` rows of 16 floats, a label and an id; ``--heavy``:
``--heavy-rows`` rows of about 22 KB, see ``lance_heavy.py``) is written once to local
disk and uploaded as it is to a bucket of ``tests/s3_server.py`` (moto on 127.0.0.1,
every request answered after ``--latency-ms``, default 20; a body's rate capped by
``--bandwidth-mb-s``). Each configuration (a shuffle setting, 0 or 2 workers, local or
S3) reads two epochs with ``LanceDataModule`` (32 splits) in a fresh process, the
configurations interleaved, ``--rounds`` rounds (default 3). ``--step-ms`` follows every
batch with a wait of that many ms in the consumer: a training step slower than the reads
that leaves the host's cores to the reader, as a step on a GPU does (default 0: none).
``--store-cores N`` runs the S3 server on the host's last N cores alone and every reader,
local and S3, on the rest: the store's CPU off the reader's cores, as a real store's is
(default 0: the server shares every core with the reader).

Reported per shuffle setting and worker count, over the rounds (median and range):

- rows/s S3/local: each round's S3 rows/s over the same round's local rows/s, rows/s
  taken after the first batch (the workers' start-up is out), and over the whole epoch
  from the loader's first ``next`` (the reads that bring the first batch in); next epoch:
  the same after the second epoch's first batch (lance's file metadata cached, the
  process's heaps grown: its first epoch touches every page of memory its reads will use
  afresh). Every other figure is the first epoch's;
- bytes/table: the response bodies of every GET the server sent from after ``setup``
  (with ``--trainer``, from before it) to the epoch's end (counted on the server side)
  over the table's bytes; next: the
  same from the first epoch's end to the second's. The two epochs are a run's last
  (the stream's ``last_epoch`` set as ``max_epochs=2`` sets it), so the readers begin
  the second epoch during the first, and those reads count in the first, but read
  nothing of a third: per epoch, both epochs' bytes over two, is every byte the run
  read for each epoch;
- GETs of object bytes in the epoch, their median size, and the reads in flight on the
  server on average (the GETs' summed durations, latency included, over the epoch);
- store CPU: the S3 server's CPU seconds during the S3 epoch over the same round's local
  epoch in seconds. The server shares this host's cores with the reader, which a real
  object store does not: near or above 1, the store alone takes a whole local epoch's
  time of one core.
- host CPU: the CPU seconds every core of the host spent busy after the first batch
  (/proc/stat: the reader, its workers, the server and anything else) in the S3 epoch over
  the local one's, same round; reader CPU: the same less the server's CPU over that time.
  cores local/S3: each epoch's host CPU after the first batch over its wall time. rows/s
  S3/local is S3's cores over local's, over host CPU S3/local; with the S3 epoch's cores
  near the host's (2 here) it ran as fast as the host's CPU allowed, and the server's
  share of that CPU is the test rig's, not the reader's (a real store's CPU is not on the
  reader's host; see ``--store-cores``).
- RSS+ MB: the process tree's peak resident memory over both epochs above its resident
  memory at the first batch.
- blocks/64: the mixing figure, the mean count of distinct 1,024-row storage blocks
  among 64 consecutive rows as the batches deliver them. A row's storage block is its
  ``id // 1024``: both tables are written with ``id`` counting up in storage order
  (row offset in the table), so the ids the batches carry give the blocks.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fresh import run_fresh
from measure import PeakRss, cores_for_store, host_busy_cpu_s, rates, shown, spread

ROOT = Path(__file__).resolve().parents[1]
NUM_SPLITS = 32
BLOCK_ROWS = 1024
MIX_ROWS = 64
# ``default``: the package's default order (clumps of up to 4,096 rows, at least 4 per
# split); ``rows``: single rows; ``clumps-N``: clumps of N rows. Each the same on both sides.
SETTINGS = {
    "default": {},
    "rows": {"shuffle_clump_size": 1},
    **{f"clumps-{n}": {"shuffle_clump_size": n} for n in (1024, 4096, 16384)},
    "storage-order": {"shuffle": False},
}
TABLES = {"db": "bench", "heavy": "heavy"}  # directory: table name


def blocks_per_rows(ids, rows: int = MIX_ROWS, block: int = BLOCK_ROWS) -> float:
    """Mean count of distinct ``block``-row storage blocks among each ``rows`` ids in a row."""
    import numpy as np

    ids = np.asarray(ids, dtype=np.int64)
    groups = [ids[i : i + rows] // block for i in range(0, len(ids) - rows + 1, rows)]
    return float(np.mean([len(np.unique(g)) for g in groups]))


def _epoch(dm, step_ms: float, at_first_batch) -> tuple[float, list, list]:
    """One epoch of ``dm``: its start, each batch's (arrival time, rows), and the ids it
    served; ``at_first_batch()`` runs when the first batch is in."""
    start = time.perf_counter()
    stamps, ids = [], []
    for batch in dm.train_dataloader():
        stamps.append((time.perf_counter(), len(batch["id"])))
        if len(stamps) == 1:
            at_first_batch()
        ids.extend(batch["id"].tolist())
        time.sleep(step_ms / 1000)
    return start, stamps, ids


def epoch(
    config: str, uri: str, endpoint: str, batch_size: int, step_ms: float = 0, trainer: bool = False
) -> dict:
    """Two epochs of configuration ``setting:workers:store``, in this (fresh) process,
    each batch followed by a wait of ``step_ms``: the first measured in full, the next for
    its rows/s. ``trainer``: inside ``Trainer.fit`` (``max_epochs=2``), the batches timed
    as they reach ``training_step``; otherwise a loop over the loader."""
    sys.path.insert(0, str(ROOT))
    from lightning_stream import LanceDataModule
    from tests.s3_server import storage_options

    setting, workers, store = config.split(":")
    name = TABLES[Path(uri).name]
    options = None
    if store == "s3":
        options = storage_options(endpoint)
        uri = f"s3://bench/{Path(uri).name}"
    dm = LanceDataModule(
        uri,
        name,
        num_splits=NUM_SPLITS,
        batch_size=batch_size,
        num_workers=int(workers),
        storage_options=options,
        **SETTINGS[setting],
    )
    probe = _Probe(endpoint if options else None)
    with PeakRss() as rss:
        probe.rss = rss
        result = _fit(dm, probe, step_ms) if trainer else _loop(dm, probe, step_ms)
    result["peak_rss_mb"] = rss.peak
    result["peak_above_first_mb"] = rss.peak - probe.at_first["rss"]
    dm.teardown("fit")
    return result


class _Probe:
    """What the store and the host have done: noted at an epoch's start, at its first batch
    and at its end (``endpoint``: the S3 server's; ``None``: a local run)."""

    def __init__(self, endpoint: str | None) -> None:
        self.endpoint = endpoint
        self.rss = None
        self.at_first: dict[str, float] = {}
        self.result: dict = {}

    def epoch_started(self, reset_bytes: bool = True) -> None:
        from tests.s3_server import bytes_served, cpu_seconds

        self.cpu = time.process_time()
        if self.endpoint:
            if reset_bytes:
                bytes_served(self.endpoint, reset=True)
            self.store_cpu = cpu_seconds(self.endpoint)

    def first_batch(self) -> None:
        from tests.s3_server import cpu_seconds

        self.at_first = {
            "rss": self.rss.peak,
            "host_cpu": host_busy_cpu_s(),
            "store_cpu": cpu_seconds(self.endpoint) if self.endpoint else 0.0,
        }

    def epoch_ended(self, start: float, stamps: list, ids: list) -> dict:
        """The first epoch's figures."""
        from tests.s3_server import bytes_served, cpu_seconds, requests_served

        elapsed = time.perf_counter() - start
        result = {
            **rates(start, stamps),
            "first_batch_s": stamps[0][0] - start,
            "rows": len(ids),
            "blocks_per_64": blocks_per_rows(ids),
            "cpu_s": time.process_time() - self.cpu,
            "host_cpu_after_first_s": host_busy_cpu_s() - self.at_first["host_cpu"],
            "wall_after_first_s": stamps[-1][0] - stamps[0][0],
        }
        if self.endpoint:
            store_cpu_now = cpu_seconds(self.endpoint)
            result["store_cpu_s"] = store_cpu_now - self.store_cpu
            result["store_cpu_after_first_s"] = store_cpu_now - self.at_first["store_cpu"]
            gets = requests_served(self.endpoint)
            result["bytes"] = bytes_served(self.endpoint)
            result["gets"] = len(gets)
            result["median_get_kb"] = statistics.median(g[2] for g in gets) / 1024 if gets else 0
            result["in_flight"] = sum(g[1] for g in gets) / elapsed
        return result

    def next_epoch(self, start: float, stamps: list, first: dict) -> dict:
        from tests.s3_server import bytes_served

        figures = rates(start, stamps)
        if self.endpoint:
            figures["bytes"] = bytes_served(self.endpoint) - first["bytes"]
        return figures


def _loop(dm, probe: _Probe, step_ms: float) -> dict:
    dm.setup("fit")
    dm.stream.last_epoch = 1  # two epochs, as under Trainer(max_epochs=2)
    probe.epoch_started()
    start, stamps, ids = _epoch(dm, step_ms, probe.first_batch)
    result = probe.epoch_ended(start, stamps, ids)
    start, stamps, _ = _epoch(dm, step_ms, lambda: None)
    result["next_epoch"] = probe.next_epoch(start, stamps, result)
    return result


def _fit(dm, probe: _Probe, step_ms: float) -> dict:
    import lightning.pytorch as pl
    from lightning_parts import NoOpModel, quiet_trainer

    class Probing(pl.Callback):
        def on_train_epoch_start(self, trainer, module) -> None:
            if trainer.current_epoch == 0:
                probe.epoch_started(reset_bytes=False)  # setup's reads count too

        def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
            if trainer.current_epoch == 0 and batch_idx == 0:
                probe.first_batch()

        def on_train_epoch_end(self, trainer, module) -> None:
            epoch = trainer.current_epoch
            if epoch == 0:
                probe.result = probe.epoch_ended(module.starts[0], module.stamps[0], module.ids[0])
            else:
                probe.result["next_epoch"] = probe.next_epoch(
                    module.starts[1], module.stamps[1], probe.result
                )

    model = NoOpModel(step_ms)
    if probe.endpoint:
        from tests.s3_server import bytes_served

        bytes_served(probe.endpoint, reset=True)
    quiet_trainer(max_epochs=2, callbacks=[Probing()]).fit(model, datamodule=dm)
    return probe.result


def main(
    kind: str,
    rows: int,
    batch_size: int,
    rounds: int,
    latency_ms: float,
    bandwidth_mb_s: float | None,
    before: Path | None = None,
    settings: list[str] | None = None,
    step_ms: float = 0,
    store_cores: int = 0,
    trainer: bool = False,
    moto_ranges: bool = False,
) -> dict:
    """Runs every configuration, prints the report, and returns its figures.

    ``settings``: names of ``SETTINGS`` to run (default: all).

    ``trainer``: every epoch inside ``Trainer.fit``; ``moto_ranges``: moto's own server
    answers the range reads (the test store's front passes them on), as it answers every
    other request.

    ``store_cores``: cores of this host given to the S3 server alone; every reader, local
    or S3, runs on the others (0: all share every core).

    ``before``: a checkout of this repository at an earlier commit; its S3 reads run
    too (store ``s3-before``, its ``lance_s3.py`` and its package, this server),
    interleaved with the others, and are reported as ``(before)`` next to the same
    rounds' local figures.
    """
    sys.path.insert(0, str(ROOT))
    from tests.s3_server import S3Server

    store_cpus = cores_for_store(store_cores)
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / ("heavy" if kind == "heavy" else "db")
        if kind == "heavy":
            from lightning_stream.lance.synthetic import make_heavy_table

            make_heavy_table(str(local), rows)
        else:
            from bench_lance import make_table

            make_table(str(local), rows)  # one create_table call
        table_bytes = sum(f.stat().st_size for f in local.rglob("*") if f.is_file())
        server = S3Server(
            Path(tmp) / "moto.log",
            latency_ms=latency_ms,
            bandwidth_mb_s=bandwidth_mb_s,
            cpus=store_cpus,
            moto_ranges=moto_ranges,
        )
        with server:
            server.create_bucket("bench")
            server.upload(local, f"s3://bench/{local.name}")
            print(
                f"{kind} table: {rows} rows, {table_bytes / 1e6:.1f} MB; batch {batch_size};"
                f" S3 latency {latency_ms:g} ms, bandwidth cap {bandwidth_mb_s} MB/s;"
                f" step {step_ms:g} ms; store cores {sorted(store_cpus or [])};"
                f" {'inside Trainer.fit' if trainer else 'a loop over the loader'};"
                f" range reads answered by {'moto' if moto_ranges else 'the front'}",
                flush=True,
            )
            stores = ("local", "s3", "s3-before") if before else ("local", "s3")
            settings = settings or list(SETTINGS)
            configs = [f"{s}:{w}:{store}" for s in settings for w in (0, 2) for store in stores]
            runs = []
            for round_ in range(rounds):
                runs.append({})
                for config in configs:
                    script, asked = __file__, config
                    if config.endswith(":s3-before"):
                        script = str(before / "benchmarks" / "lance_s3.py")
                        asked = config.removesuffix("-before")
                    arguments = [
                        script,
                        asked,
                        str(local),
                        server.endpoint,
                        str(batch_size),
                        str(step_ms),
                        "trainer" if trainer else "loop",
                    ]
                    runs[-1][config] = run_fresh(arguments, f"round {round_} {config:<34}")
    figures = summary(runs, table_bytes)
    report(figures)
    return {
        "table": kind,
        "rows": rows,
        "table_bytes": table_bytes,
        "batch_size": batch_size,
        "latency_ms": latency_ms,
        "bandwidth_mb_s": bandwidth_mb_s,
        "rounds": rounds,
        "step_ms": step_ms,
        "store_cores": store_cores,
        "trainer": trainer,
        "moto_ranges": moto_ranges,
        "before": str(before) if before else None,
        "runs": runs,
        "figures": figures,
    }


def cores(count: int) -> str:
    return "a core" if count == 1 else f"{count} cores"


def run_name(figures: dict) -> str:
    """The name of a run in its results file: the options that set what it measured."""
    store = figures["store_cores"]
    parts = [
        f"{figures['table']} table",
        f"{figures['latency_ms']:g} ms",
        "inside Trainer.fit" if figures["trainer"] else "a loop over the loader",
        f"the store on {cores(store)} of its own" if store else "the store on shared cores",
        f"step {figures['step_ms']:g} ms",
        f"range reads answered by {'moto' if figures['moto_ranges'] else 'the front'}",
    ]
    if figures["bandwidth_mb_s"]:
        parts.append(f"{figures['bandwidth_mb_s']:g} MB/s a response")
    return ", ".join(parts)


def summary(runs: list[dict], table_bytes: int) -> dict:
    figures = {}
    stores = {"s3": ""}
    if any(config.endswith(":s3-before") for config in runs[0]):
        stores["s3-before"] = " (before)"
    settings = dict.fromkeys(config.split(":")[0] for config in runs[0])
    for setting in settings:
        for workers in (0, 2):
            for store, suffix in stores.items():
                local = [r[f"{setting}:{workers}:local"] for r in runs]
                s3 = [r[f"{setting}:{workers}:{store}"] for r in runs]
                figures[f"{setting}, {workers} workers{suffix}"] = {
                    "local_rows_per_s": spread([r["after_first"] for r in local]),
                    "s3_rows_per_s": spread([r["after_first"] for r in s3]),
                    "s3_over_local": spread(
                        [
                            b["after_first"] / a["after_first"]
                            for a, b in zip(local, s3, strict=True)
                        ]
                    ),
                    "s3_over_local_next_epoch": spread(
                        [
                            b["next_epoch"]["after_first"] / a["next_epoch"]["after_first"]
                            for a, b in zip(local, s3, strict=True)
                        ]
                    ),
                    "s3_over_local_whole_epoch": spread(
                        [b["rows_per_s"] / a["rows_per_s"] for a, b in zip(local, s3, strict=True)]
                    ),
                    "bytes_over_table": spread([r["bytes"] / table_bytes for r in s3]),
                    "next_epoch_bytes_over_table": spread(
                        [r["next_epoch"]["bytes"] / table_bytes for r in s3]
                    ),
                    "bytes_per_epoch_over_table": spread(
                        [(r["bytes"] + r["next_epoch"]["bytes"]) / 2 / table_bytes for r in s3]
                    ),
                    "store_cpu_over_local_epoch": statistics.median(
                        b.get("store_cpu_s", math.nan) / (a["rows"] / a["rows_per_s"])
                        for a, b in zip(local, s3, strict=True)
                    ),
                    "host_cores_busy_local": statistics.median(map(_cores_busy, local)),
                    "host_cores_busy_s3": statistics.median(map(_cores_busy, s3)),
                    "host_cpu_s3_over_local": statistics.median(
                        b["host_cpu_after_first_s"] / a["host_cpu_after_first_s"]
                        for a, b in zip(local, s3, strict=True)
                    ),
                    "reader_cpu_s3_over_local": statistics.median(
                        (b["host_cpu_after_first_s"] - b["store_cpu_after_first_s"])
                        / a["host_cpu_after_first_s"]
                        for a, b in zip(local, s3, strict=True)
                    ),
                    "blocks_per_64": statistics.median(r["blocks_per_64"] for r in s3),
                    "gets": statistics.median(r["gets"] for r in s3),
                    "median_get_kb": statistics.median(r["median_get_kb"] for r in s3),
                    "in_flight": statistics.median(r["in_flight"] for r in s3),
                    "s3_peak_above_first_mb": statistics.median(
                        r["peak_above_first_mb"] for r in s3
                    ),
                }
    return figures


def _cores_busy(run: dict) -> float:
    return run["host_cpu_after_first_s"] / run["wall_after_first_s"]


def report(figures: dict) -> None:
    print(
        f"\n{'configuration':<46} {'local rows/s':>12} {'S3 rows/s':>10}"
        f" {'S3/local (range)':>18} {'whole epoch':>18} {'next epoch':>18}"
        f" {'bytes/table':>11} {'next':>5} {'per epoch':>9} {'blocks/64':>9} {'GETs':>7}"
        f" {'GET KB':>7} {'in flight':>9}"
        f" {'RSS+ MB':>7} {'store CPU':>9} {'host CPU':>8} {'reader CPU':>10}"
        f" {'cores local/S3':>14}"
    )
    for name, f in figures.items():
        ratio, whole = shown(f["s3_over_local"]), shown(f["s3_over_local_whole_epoch"])
        following = shown(f["s3_over_local_next_epoch"])
        print(
            f"{name:<46} {f['local_rows_per_s']['median']:>12.0f}"
            f" {f['s3_rows_per_s']['median']:>10.0f} {ratio:>18} {whole:>18} {following:>18}"
            f" {f['bytes_over_table']['median']:>11.2f}"
            f" {f['next_epoch_bytes_over_table']['median']:>5.2f}"
            f" {f['bytes_per_epoch_over_table']['median']:>9.2f} {f['blocks_per_64']:>9.1f}"
            f" {f['gets']:>7.0f} {f['median_get_kb']:>7.1f} {f['in_flight']:>9.1f}"
            f" {f['s3_peak_above_first_mb']:>7.0f}"
            f" {f['store_cpu_over_local_epoch']:>9.2f} {f['host_cpu_s3_over_local']:>8.2f}"
            f" {f['reader_cpu_s3_over_local']:>10.2f}"
            f" {f['host_cores_busy_local']:>6.2f}/{f['host_cores_busy_s3']:<7.2f}"
        )


if __name__ == "__main__":
    from fresh import hand_back

    config, uri, endpoint, batch, step_ms, mode = sys.argv[1:7]
    hand_back(epoch(config, uri, endpoint, int(batch), float(step_ms), mode == "trainer"))
