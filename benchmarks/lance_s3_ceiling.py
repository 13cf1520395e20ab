"""How fast lance's own reads of a table go from S3 on this host, with nothing else running.

``python benchmarks/lance_s3_ceiling.py [--heavy-rows 25000] [--latency-ms 20] [--threads 4]
[--store-cores 1] [--json benchmarks/results/lance_s3_ceiling.json]``

The heavy table of ``bench_lance.py --s3 --heavy`` is read whole with lance's take by
storage offset (``LanceReads.take``, the call the data module's reads make), in clumps
of storage-order rows of the data module's default size taken in a shuffled order,
``--read-rows`` rows a read, ``--threads`` reads at once, from local disk and from the
test S3 server (moto behind an asyncio front, every request answered after
``--latency-ms``), interleaved, ``--rounds`` rounds. Nothing consumes the rows: no
batches, no training step, no workers. Whole clumps in one run are friendlier to S3 than
the module's reads, which cycle over 32 splits and so fetch each clump in a few pieces.

Reported, median (range) over the rounds: the wall time and the reading process's user
and system CPU seconds (lance's threads included) of local and S3 reads, S3/local as a
rate, the S3 server's CPU and the GETs of object bytes it served.
The rate is what lance's own reads give, with nothing else to do. A loader adds work of
its own (batches, the hand-over from its workers) that costs the same from S3 as from
local disk. Where the reads wait on the store, the loader's S3/local rate stays below this
one; where the host's cores are the limit (0 ms on 2 cores, the S3 reads' extra CPU the
only difference), the loader's rate is its CPU an epoch, local over S3, between this rate
and 1: the more of its own work a row, the nearer 1. The server shares the reader's cores
(2 here); a real store's CPU is elsewhere: ``--store-cores N`` runs it on the host's last
N cores alone and the reads, local and S3, on the rest.

``--json PATH`` also keeps every round's figures and their medians (range) in the results
file ``PATH``, as the run named by its latency, reads at once and store cores
(``benchmarks/record.py``).
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from lance_s3 import cores  # noqa: E402
from measure import cores_for_store, shown, spread  # noqa: E402
from record import save  # noqa: E402

NUM_SPLITS = 32


def read_all(table, clumps: list, threads: int, read_rows: int) -> tuple[float, float, float]:
    """Wall, user CPU and system CPU seconds of reading every row of ``clumps`` (arrays of
    storage offsets, in order)."""
    import numpy as np

    from lightning_stream.lance.reader import LanceReads

    ids = np.concatenate(clumps)
    reads = [np.sort(ids[i : i + read_rows]) for i in range(0, len(ids), read_rows)]
    read = LanceReads(table, None).take
    read(reads[0][:16])  # the table's files opened, as by the module's first small read
    wall, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    with ThreadPoolExecutor(threads) as pool:
        rows = sum(t.num_rows for t in pool.map(read, reads))
    assert rows == len(ids)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return (
        time.perf_counter() - wall,
        after.ru_utime - before.ru_utime,
        after.ru_stime - before.ru_stime,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heavy-rows", type=int, default=25_000)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument(
        "--store-cores",
        type=int,
        default=0,
        help="cores the S3 server runs on alone, the reads on the rest (default 0: shared)",
    )
    parser.add_argument(
        "--read-rows",
        type=int,
        default=1500,
        help="rows a read (32 MiB of the heavy table)",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also keep the figures there")
    args = parser.parse_args()
    store_cpus = cores_for_store(args.store_cores)  # before lance starts its threads
    sys.path.insert(0, str(ROOT))
    import lancedb
    import numpy as np

    from lightning_stream.allocator import keep_read_buffers
    from lightning_stream.lance.order import clump_rows
    from lightning_stream.lance.synthetic import make_heavy_table
    from tests.s3_server import S3Server, cpu_seconds, storage_options

    keep_read_buffers()  # as every reading process of the module does
    server = S3Server(latency_ms=args.latency_ms, cpus=store_cpus)
    with tempfile.TemporaryDirectory() as tmp, server as s3:
        local = Path(tmp) / "heavy"
        make_heavy_table(str(local), args.heavy_rows)
        s3.create_bucket("bench")
        s3.upload(local, "s3://bench/heavy")
        tables = {
            "local": lancedb.connect(str(local)).open_table("heavy"),
            "s3": lancedb.connect(
                "s3://bench/heavy", storage_options=storage_options(s3.endpoint)
            ).open_table("heavy"),
        }
        row_ids = np.arange(tables["local"].count_rows())  # storage offsets
        size = clump_rows(None, len(row_ids), NUM_SPLITS)
        clumps = [row_ids[i : i + size] for i in range(0, len(row_ids), size)]
        print(
            f"{len(row_ids)} rows in clumps of {size}; reads of {args.read_rows} rows,"
            f" {args.threads} at once; S3 latency {args.latency_ms:g} ms;"
            f" store cores {sorted(store_cpus or [])}",
            flush=True,
        )
        runs: dict[str, list[float]] = {}
        for round_ in range(args.rounds):
            order = np.random.default_rng(round_).permutation(len(clumps))
            ordered = [clumps[i] for i in order]
            store_cpu = cpu_seconds(s3.endpoint)
            s3.bytes_served(reset=True)  # and the request log
            for store, table in tables.items():
                wall, user, system = read_all(table, ordered, args.threads, args.read_rows)
                runs.setdefault(f"{store} wall s", []).append(wall)
                runs.setdefault(f"{store} user s", []).append(user)
                runs.setdefault(f"{store} sys s", []).append(system)
            runs.setdefault("store cpu s", []).append(cpu_seconds(s3.endpoint) - store_cpu)
            runs.setdefault("S3 GETs", []).append(len(s3.requests()))
            runs.setdefault("S3/local", []).append(runs["local wall s"][-1] / runs["s3 wall s"][-1])
            print(f"round {round_}", {k: round(v[-1], 3) for k, v in runs.items()}, flush=True)
        for name, values in runs.items():
            print(f"{name:14} {shown(spread(values))}")
    if args.json:
        result = {
            "heavy_rows": len(row_ids),
            "clump": size,
            "read_rows": args.read_rows,
            "threads": args.threads,
            "latency_ms": args.latency_ms,
            "store_cores": args.store_cores,
            "rounds": args.rounds,
            "runs": runs,
            "figures": {name: spread(values) for name, values in runs.items()},
        }
        name = f"{args.latency_ms:g} ms, {args.threads} reads at once"
        name += f", the store on {cores(args.store_cores)} of its own" if args.store_cores else ""
        save(args.json, name, result)


if __name__ == "__main__":
    main()
