"""Measurement helpers shared by the benchmarks."""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import threading


def _tree() -> list[int]:
    """This process and all its descendants."""
    found, pending = [], [os.getpid()]
    while pending:
        pid = pending.pop()
        found.append(pid)
        try:
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def _field_kb(path: str, field: str) -> int:
    try:
        with open(path) as lines:
            for line in lines:
                if line.startswith(field):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def tree_rss_mb() -> float:
    """Resident memory of this process and all its descendants, from /proc."""
    return sum(_field_kb(f"/proc/{pid}/status", "VmRSS:") for pid in _tree()) / 1024


def tree_memory_mb() -> tuple[float, float]:
    """RSS and PSS of the process tree. RSS counts a shared page in every process that
    maps it (each worker's copy of torch's libraries, say); PSS splits it between them."""
    pids = _tree()
    rss = sum(_field_kb(f"/proc/{pid}/status", "VmRSS:") for pid in pids)
    pss = sum(_field_kb(f"/proc/{pid}/smaps_rollup", "Pss:") for pid in pids)
    return rss / 1024, pss / 1024


def host_busy_cpu_s() -> float:
    """CPU seconds every core of this host has spent busy since boot, from /proc/stat:
    every process's (the test store's and the reading workers' included) and the kernel's
    interrupts; not idle, waiting on I/O, or stolen by the hypervisor."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq = map(int, stat.readline().split()[1:8])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


class PeakRss:
    def __enter__(self) -> PeakRss:
        self.peak = tree_rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, tree_rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def rates(start: float, stamps: list[tuple[float, int]]) -> dict[str, float]:
    """Rows/s from ``start`` and each batch's (arrival time, rows): over the whole epoch,
    after its first batch, and over its second half."""
    times = [start] + [t for t, _ in stamps]
    rows = [0, *itertools.accumulate(n for _, n in stamps)]

    def rate(begin: int) -> float:
        return (rows[-1] - rows[begin]) / (times[-1] - times[begin])

    return {"rows_per_s": rate(0), "after_first": rate(1), "second_half": rate(len(stamps) // 2)}


def spread(values: list[float]) -> dict[str, float]:
    """Median and range of a figure over the rounds."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def size_summary(runs: dict, sizes: list[int], ratios: tuple[str, ...]) -> dict:
    """Per configuration (``"<size>:<workers>"``), the :func:`spread` of each float figure
    over the rounds; then per worker count (0 and 2), the largest size's median of each of
    ``ratios`` over the smallest size's."""
    figures = {}
    for config, results in runs.items():
        figures[config] = {
            key: spread([r[key] for r in results])
            for key in results[0]
            if isinstance(results[0][key], float)
        }
    smallest, largest = min(sizes), max(sizes)
    for workers in (0, 2):
        small, large = runs[f"{smallest}:{workers}"], runs[f"{largest}:{workers}"]
        figures[f"{largest} over {smallest}, {workers} workers"] = {
            key: statistics.median(r[key] for r in large) / statistics.median(r[key] for r in small)
            for key in ratios
        }
    return figures


def shown(figure: dict[str, float]) -> str:
    """A :func:`spread` as ``median (min-max)``."""
    return f"{figure['median']:.2f} ({figure['min']:.2f}-{figure['max']:.2f})"


def add_store_options(parser: argparse.ArgumentParser) -> None:
    """``--latency-ms``, ``--store-cores`` and ``--moto-ranges``: the test S3 server a
    benchmark's ``--s3`` reads from (see :func:`cores_for_store`)."""
    parser.add_argument(
        "--latency-ms", type=float, default=20.0, help="--s3: wait of each request (0: none)"
    )
    parser.add_argument(
        "--store-cores",
        type=int,
        default=0,
        help="--s3: cores the S3 server runs on alone, readers on the rest (default 0: shared)",
    )
    parser.add_argument(
        "--moto-ranges",
        action="store_true",
        help="--s3: moto's own server answers the range reads (default: the test store's front)",
    )


def cores_for_store(store_cores: int) -> set[int] | None:
    """Keeps this process (and the processes it starts from now on) off the last
    ``store_cores`` of its cores and returns those, for the test store (``None`` when 0).

    The test store runs on the reader's host; a real store's CPU is elsewhere. Giving it
    cores of its own measures a reader as it would run against a real store, with the
    same cores for its local runs."""
    if store_cores <= 0:
        return None
    cores = sorted(os.sched_getaffinity(0))
    if store_cores >= len(cores):
        raise SystemExit(f"--store-cores {store_cores}: this host has {len(cores)} cores")
    os.sched_setaffinity(0, cores[:-store_cores])
    return set(cores[-store_cores:])
