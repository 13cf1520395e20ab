"""The report of ``bench_lance.py --heavy``: its figures from the configurations' results
(medians and per-round ratios over the speed rounds), and their printout."""

from __future__ import annotations

import statistics

# the speed configurations, run --rounds times interleaved (a ratio is taken within a
# round), by the names the report gives them
SPEED = {
    "module 0w": "speed:module:0",
    "raw 0w": "speed:raw:0",
    "module 2w": "speed:module:2",
    "raw 2w": "speed:raw:2",
    "fit 0w": "fit:0",
    "fit 2w": "fit:2",
}
SPANS = {
    "whole epoch": "rows_per_s",
    "after the 1st batch": "after_first",
    "2nd half": "second_half",
}
PAIRS = {
    "module 2w / module 0w": ("speed:module:2", "speed:module:0"),
    "module 2w / raw 2w": ("speed:module:2", "speed:raw:2"),
    "module 0w / raw 0w": ("speed:module:0", "speed:raw:0"),
    "fit 2w / fit 0w": ("fit:2", "fit:0"),
}


def summary(results: dict, speeds: list[dict]) -> dict:
    """The reported figures, from each configuration's results."""
    memory = {}
    for workers in ("0", "2"):
        r = results[f"memory:{workers}"]
        memory[workers] = {
            **r,
            "peak_above_first_gb": [(r["peak"][i] - r["first_batch"][i]) / 1024 for i in (0, 1)],
            "p90_over_p10": [r["p90"][i] / r["p10"][i] for i in (0, 1)],
        }
    medians, ratios = {}, {}
    for epoch in ("first", "second"):
        medians[epoch] = {
            name: {span: _median(speeds, config, epoch, key) for span, key in SPANS.items()}
            for name, config in SPEED.items()
        }
        ratios[epoch] = {
            span: {name: _ratio(speeds, *configs, epoch, key) for name, configs in PAIRS.items()}
            for span, key in SPANS.items()
        }
    cpu = {}
    for name, config in SPEED.items():
        if config == "speed:raw:2":
            continue  # lancedb's DataLoader workers are not this process's to read
        parts = [r[config]["second"]["cpu_s"] for r in speeds]
        main, workers, total = (
            statistics.median(part) for part in zip(*[(m, w, m + w) for m, w in parts], strict=True)
        )
        cpu[name] = {"main": main, "workers": workers, "total": total}
    steps = {kind: results[f"binary:{kind}"]["median_step_ms"] for kind in ("jpeg", "none")}
    return {
        "runs": {"once": results, "speed": speeds},
        "memory": memory,
        "speed_medians": medians,
        "speed_ratios": ratios,
        "cpu_s_second_epoch": cpu,
        "binary_step_ms": steps,
    }


def report(figures: dict) -> None:
    print("\nmemory, one epoch with a 20 ms step (MB of the process tree, RSS / PSS)")
    for workers, r in figures["memory"].items():
        base_rss, base_pss = r["first_batch"]
        curve = "  ".join(f"{p} {r[p][0]:.0f}/{r[p][1]:.0f}" for p in ("p10", "p50", "p90"))
        print(
            f"  {workers} workers: after 1st batch {base_rss:.0f}/{base_pss:.0f}  {curve}"
            f"  peak {r['peak'][0]:.0f}/{r['peak'][1]:.0f}"
        )
        above, growth = r["peak_above_first_gb"], r["p90_over_p10"]
        print(
            f"    peak above the 1st batch: RSS {above[0]:.2f} GB, PSS {above[1]:.2f} GB;"
            f" 90% / 10%: RSS {growth[0]:.2f}, PSS {growth[1]:.2f};"
            f" resident_bytes counter peak {r['resident_mb']:.0f} MB"
        )
    print(
        f"\nspeed ('fit': a no-op training_step under Trainer.fit; the rest: a bare loop),"
        f" {len(figures['runs']['speed'])} interleaved rounds: median rows/s (whole epoch /"
        " after its 1st batch / its 2nd half); the clock starts when the loader is built, so"
        " the first epoch includes opening the table and starting the workers"
    )
    for epoch, medians in figures["speed_medians"].items():
        print(f" {epoch} epoch")
        for name, spans in medians.items():
            print(f"  {name:<16}" + "".join(f" {rate:>8.0f}" for rate in spans.values()))
        for span, pairs in figures["speed_ratios"][epoch].items():
            ratios = "; ".join(
                f"{name} {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f})"
                for name, r in pairs.items()
            )
            print(f"  {span}: {ratios}")
    print(" CPU seconds of the 2nd epoch, main process + workers (median over the rounds)")
    for name, cpu in figures["cpu_s_second_epoch"].items():
        print(f"  {name:<16} {cpu['main']:.2f} + {cpu['workers']:.2f}, total {cpu['total']:.2f}")
    jpeg, none = figures["binary_step_ms"]["jpeg"], figures["binary_step_ms"]["none"]
    print(
        f"\nno-op Trainer step, 64 heavy rows: {jpeg:.2f} ms with jpeg, {none:.2f} ms without"
        f" ({jpeg - none:+.2f} ms)"
    )


def _median(speeds: list[dict], config: str, epoch: str, key: str) -> float:
    return statistics.median(round_[config][epoch][key] for round_ in speeds)


def _ratio(speeds: list[dict], top: str, bottom: str, epoch: str, key: str) -> dict:
    """The median of the per-round ratios, and their range."""
    ratios = [r[top][epoch][key] / r[bottom][epoch][key] for r in speeds]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
