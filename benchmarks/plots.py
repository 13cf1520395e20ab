"""The documentation's benchmark plots, drawn from the benchmarks' results files.

    python benchmarks/plots.py [--results benchmarks/results] [--out docs/img]

Needs matplotlib (the ``bench`` extra). Draws, from ``bench_video_workers.json``
(``bench_video.py --workers --json``), one PNG per run (per training step): per epoch and
worker count, windows/s and the time to the first batch, medians over the rounds with
their range. ``benchmarks/report.py`` shows each next to its table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure
from report import video_workers_image

HERE = Path(__file__).resolve().parent


def plot_video_workers(figures: dict, path: Path) -> None:
    """``bench_video.py --workers``: windows/s and first-batch time per epoch."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    rate_ax, first_ax = fig.subplots(1, 2)
    for count in figures["counts"]:
        runs = figures["runs"][str(count)]
        epochs = range(len(runs[0]["epochs"]))
        rates = [
            [r["epochs"][e]["windows"] / r["epochs"][e]["epoch_s"] for r in runs] for e in epochs
        ]
        firsts = [[r["epochs"][e]["first_batch_s"] for r in runs] for e in epochs]
        label = f"{count} workers"
        for ax, values in ((rate_ax, rates), (first_ax, firsts)):
            medians = [statistics.median(v) for v in values]
            spread = [
                [m - min(v) for m, v in zip(medians, values, strict=True)],
                [max(v) - m for m, v in zip(medians, values, strict=True)],
            ]
            ax.errorbar(list(epochs), medians, yerr=spread, marker="o", capsize=4, label=label)
    for ax, title in (
        (rate_ax, "windows/s per epoch (its first batch included)"),
        (first_ax, "time to the epoch's first batch (s)"),
    ):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("epoch")
        ax.set_xticks(list(epochs))
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"bench_video.py --workers: step {figures['step_ms']:g} ms; median of"
        f" {figures['rounds']} rounds, bars: their range; at {figures['commit']}"
        f" ({figures['date']})",
        fontsize=11,
    )
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    source = args.results / "bench_video_workers.json"
    if not source.exists():
        print(f"{source}: not there, nothing drawn")
        return
    for run in json.loads(source.read_text()).values():
        image = args.out / video_workers_image(run)
        plot_video_workers(run, image)
        print(f"{source} -> {image}")


if __name__ == "__main__":
    main()
