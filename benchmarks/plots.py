"""The documentation's benchmark plots, drawn from the benchmarks' own JSON output.

    python benchmarks/plots.py [--results benchmarks/results] [--out docs/img]

Reads each results file that exists and writes its PNG (needs matplotlib: the ``bench``
extra):

- ``bench_lance.json`` (``bench_lance.py --json``, the light run) -> ``bench_lance.png``:
  per configuration at 0 and 2 workers, rows/s over the epoch and after its first batch,
  time to the first batch and peak RSS; bars the best round (as the report prints),
  dots every round.
- ``bench_video_workers.json`` (``bench_video.py --workers``) ->
  ``bench_video_workers.png``: per epoch and worker count, windows/s and time to the
  first batch, medians over the rounds with their range.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).resolve().parent
# the light run's loader configurations, in the report's order
LANCE_KINDS = ["raw-default", "raw-best", "module", "module-resumed", "module-clump", "fit"]
LANCE_NOTES = {"module-resumed": "module-resumed\n(half an epoch)", "fit": "fit\n(no-op step)"}
LANCE_PANELS = {
    "rows_per_s": "rows/s, whole epoch",
    "steady_rows_per_s": "rows/s after the first batch",
    "first_batch_s": "time to the first batch (s)",
    "peak_rss_mb": "peak RSS of the process tree (MB)",
}


def plot_lance(figures: dict, path: Path) -> None:
    """``bench_lance.py --json`` (light run): one panel per reported figure."""
    if figures.get("run") != "light":
        raise ValueError(f"{path.name} is drawn from the light run, not --{figures.get('run')}")
    # a Figure of its own, not pyplot's: no display backend, nothing to close
    fig = Figure(figsize=(11, 7), layout="constrained")
    axes = fig.subplots(2, 2)
    width = 0.38
    for ax, (key, title) in zip(axes.flat, LANCE_PANELS.items(), strict=True):
        kinds = [k for k in LANCE_KINDS if any(key in figures["best"].get(f"{k}:{w}", {})
                                                for w in (0, 2))]  # fmt: skip
        for offset, workers in ((-width / 2, 0), (width / 2, 2)):
            xs, best, rounds_x, rounds_y = [], [], [], []
            for x, kind in enumerate(kinds):
                config = f"{kind}:{workers}"
                if key not in figures["best"].get(config, {}):
                    continue
                xs.append(x + offset)
                best.append(figures["best"][config][key])
                for round_ in figures["runs"]:
                    rounds_x.append(x + offset)
                    rounds_y.append(round_[config][key])
            bars = ax.bar(xs, best, width, label=f"{workers} workers")
            ax.plot(rounds_x, rounds_y, ".", color="black", markersize=4)
            ax.bar_label(bars, [_short(value) for value in best], fontsize=7)
        names = [LANCE_NOTES.get(kind, kind) for kind in kinds]
        ax.set_xticks(range(len(kinds)), names, fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.15)
    fig.legend(*axes.flat[0].get_legend_handles_labels(), loc="outside lower center", ncols=2)
    fig.suptitle(
        f"bench_lance.py: {figures['rows']:,} rows, batch {figures['batch_size']}; bars: best"
        f" of {figures['rounds']} rounds, dots: each round",
        fontsize=11,
    )
    fig.savefig(path, dpi=110)


def _short(value: float) -> str:
    """A bar's label, short enough not to run into its neighbour's."""
    if value >= 10_000:
        return f"{value / 1000:.0f}k"
    return f"{value:,.0f}" if value >= 100 else f"{value:.2f}"


def plot_video_workers(figures: dict, path: Path) -> None:
    """``bench_video.py --workers``: windows/s and first-batch time per epoch."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    rate_ax, first_ax = fig.subplots(1, 2)
    for count in figures["counts"]:
        runs = figures["runs"][str(count)]
        epochs = range(len(runs[0]["epochs"]))
        rates = [[r["epochs"][e]["windows"] / r["epochs"][e]["epoch_s"] for r in runs]
                 for e in epochs]  # fmt: skip
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
        f" {figures['rounds']} rounds, bars: their range",
        fontsize=11,
    )
    fig.savefig(path, dpi=110)


PLOTS: dict[str, tuple[Callable[[dict, Path], None], str]] = {
    "bench_lance.json": (plot_lance, "bench_lance.png"),
    "bench_video_workers.json": (plot_video_workers, "bench_video_workers.png"),
    # the same with a training step slower than the reads (--step-ms 20)
    "bench_video_workers_step20.json": (plot_video_workers, "bench_video_workers_step20.png"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=HERE / "results")
    parser.add_argument("--out", type=Path, default=HERE.parent / "docs" / "img")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (plot, image) in PLOTS.items():
        source = args.results / name
        if not source.exists():
            print(f"{source}: not there, {image} not drawn")
            continue
        plot(json.loads(source.read_text()), args.out / image)
        print(f"{source} -> {args.out / image}")


if __name__ == "__main__":
    main()
