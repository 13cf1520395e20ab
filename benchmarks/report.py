"""docs/benchmarks.md, rendered from the benchmarks' results files.

    python benchmarks/report.py            # writes docs/benchmarks.md
    python benchmarks/report.py --check    # exits 1 when the page is not what it renders

The page's prose (what each benchmark measures, the command that runs it, how to read
it) lives here; every figure on the page comes from a results file of
``benchmarks/results`` (one per benchmark, written by the benchmarks' ``--json``, see
``record.py``), and each table names the commit its figures measured and that commit's
date. ``tests/test_docs.py`` checks that the page is what this renders, so the page
changes only with the results files or this script.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "benchmarks.md"
IMAGES = ROOT / "docs" / "img"

Runs = dict[str, dict]


# ---- how figures are shown ----------------------------------------------------------


def _number(value: float, digits: int) -> str:
    return f"{value:,.{digits}f}"


def rate(value: float) -> str:
    """Rows or windows per second: ``934k``, ``1.08M``, ``3,004``."""
    if value >= 10**6:
        return f"{value / 10**6:.2f}M"
    if value >= 10**5:
        return f"{value / 10**3:.0f}k"
    return _number(value, 0)


def spread(figure: dict, shown: Callable[[float], str] = lambda v: f"{v:.2f}") -> str:
    """A median with its range, ``0.94 (0.91-1.00)``; the median alone where the range
    shows the same."""
    median, low, high = (shown(figure[key]) for key in ("median", "min", "max"))
    return median if low == median == high else f"{median} ({low}-{high})"


def low_high(values: list[float], shown: Callable[[float], str] = str) -> str:
    """The lowest and highest of ``values``, ``943-1,021``; one value where they are one."""
    low, high = shown(min(values)), shown(max(values))
    return low if low == high else f"{low}-{high}"


def measured(run: dict) -> str:
    """Which code a run measured: ``measured at `2278277` (2026-12-07)``."""
    text = f"measured at `{run['commit']}` ({run['date']})"
    if run.get("uncommitted"):
        text += " with changes not committed then"
    if "cores" in run:
        text += f" on {run['cores']} cores"
    return text


def command(run: dict) -> str:
    return f"`{run['command']}`"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def size(count: int) -> str:
    """``1000000`` as ``1M``, ``100000`` as ``100k``."""
    for unit, name in ((10**9, "G"), (10**6, "M"), (10**3, "k")):
        if count >= unit and count % unit == 0:
            return f"{count // unit}{name}"
    return f"{count:,}"


def cores(count: int) -> str:
    return "a core" if count == 1 else f"{count} cores"


def only(runs: Runs, name: str) -> dict:
    """The run ``name`` of a results file: the one each section renders."""
    if name not in runs:
        raise KeyError(f"no run {name!r} (runs: {sorted(runs)})")
    return runs[name]


def no_results(path: str) -> str:
    return (
        f"No result of this benchmark is kept: its `--json {path}` keeps one, and"
        " `python benchmarks/report.py` shows it here."
    )


# ---- the sections ----------------------------------------------------------------------

NO_RUN = (
    "<!-- no-run: reads the repository's benchmarks/ directory;"
    " test_docs.py::test_benchmarks_page_is_what_the_results_render checks the page -->"
)
INTRO = f"""\
# Benchmarks

<!-- Rendered by benchmarks/report.py from benchmarks/results/*.json: edit those, not this page. -->

The scripts in `benchmarks/` measure the data modules next to what a user would write
without them, on the machine at hand. Machines are shared and noisy, so every script runs
its configurations side by side, each in a fresh process, interleaved over rounds, and
reports medians with their range (lowest-highest) and ratios taken within a round.

Every figure on this page comes from a results file in `benchmarks/results/`, one per
benchmark, and each table says which commit it measured, that commit's date and, where
recorded, the host's cores. A figure describes that commit's code on the host that ran it;
later code may read faster or slower. To measure your machine and your code, run a
section's command: its `--json` replaces the run of the same name in the results file, and
this page is rendered again from the files with

{NO_RUN}
```bash
python benchmarks/report.py
```

(`tests/test_docs.py` checks that the page is what it renders). `python benchmarks/plots.py`
draws the plots from the same files (it needs matplotlib, the `bench` extra). All
benchmarks are CPU-heavy; on a shared machine run one at a time.
"""


def scale_section(runs: Runs | None) -> str:
    text = """\
## Tables of any size: `benchmarks/scale.py`

`python benchmarks/scale.py --json benchmarks/results/scale.json` writes light tables (an
int64 `id`, 16 float32, a float32 `label`: 76 bytes a row) of 1M, 16M and 64M rows once,
1M rows a write, and reads each with `LanceDataModule` at 0 and 2 workers, a fresh process
per configuration, the configurations interleaved over rounds; then the largest table with
`filter="label < 0.5"` (a whole epoch) and with `shuffle_clump_size=1` (single rows, 20 s
of reading). Reported: the time from before `setup` to the first batch, rows/s after it
to the epoch's end, the wait for the next epoch's first batch, the peak resident memory of
the process tree (workers included) above its memory before `setup`, and `blocks/64`, the
mean count of distinct 1,024-row storage blocks among 64 consecutive rows served (how
mixed the batches are).
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/scale.json") + "\n"
    tables = only(runs, "tables")
    figures = tables["figures"]
    sizes = sorted({int(c.split(":")[0]) for c in figures if ":" in c})
    largest, smallest = sizes[-1], sizes[0]
    rows = []
    for config, f in figures.items():
        if " over " in config:
            continue
        count, rest = config.split(":", 1)
        workers, _, extra = rest.partition(" ")
        label = f"{size(int(count))}, {workers}"
        label += {"": "", "filter": ", `filter`", "single rows": ", single rows"}[extra]
        following = spread(f["next_first_batch_s"]) + " s" if "next_first_batch_s" in f else "-"
        rows.append(
            [
                label,
                spread(f["first_batch_s"]) + " s",
                spread(f["rows_per_s"], rate),
                following,
                spread(f["peak_above_start_gb"]) + " GB",
                spread(f["blocks_per_64"], lambda v: f"{v:.1f}"),
            ]
        )
    header = [
        "rows, workers",
        "setup + first batch",
        "rows/s after it",
        "next epoch's first batch",
        "peak memory above start",
        "blocks/64",
    ]
    ratio = {w: figures[f"{largest} over {smallest}, {w} workers"] for w in (0, 2)}
    text += f"""
At `num_splits={tables["num_splits"]}`, batch {tables["batch_size"]}, medians (range) of \
{tables["rounds"]} rounds, {measured(tables)}:

{table(header, rows)}

{size(largest)} rows over {size(smallest)}: setup + first batch \
{ratio[0]["first_batch_s"]:.2f}x at 0 workers and {ratio[2]["first_batch_s"]:.2f}x at 2; \
rows/s {ratio[0]["rows_per_s"]:.2f}x and {ratio[2]["rows_per_s"]:.2f}x. With 2 workers the
process tree holds the supervisor and two workers, each with lancedb and pyarrow imported.
A `filter` costs one scan of its columns before the first batch, and its rows are read by
offset, in scattered runs. Single rows plan at the cost of clumps (nothing per row of the
table is held) but read scattered rows.
"""
    if "plan only" in runs:
        plan = runs["plan only"]
        text += f"""
{command(plan)} computes one rank's epoch plan of a table of {plan["rows"]:,} rows that
does not exist: the last of {plan["world"]} ranks, {plan["splits"]:,} splits, every storage
offset its {plan["workers"]} readers serve, window by window. It took {plan["seconds"]:.2f} s \
and {plan["peak_mb"]:.1f} MB of peak Python allocations, {measured(plan)}.
"""
    return text


def bench_lance_section(runs: Runs | None) -> str:
    text = """\
## Tables: `benchmarks/bench_lance.py`

`python benchmarks/bench_lance.py --json benchmarks/results/bench_lance.json`: a table of
200k rows (a 16-float vector, an int label, an int id), batch 256, 32 splits, shuffled;
each configuration in a fresh process that has imported Lightning, as a training process
has, at 0 and 2 workers:

- `raw-default`: `lancedb.streaming.StreamingDataLoader` at lancedb's defaults (rows as
  Python dicts, the default collate).
- `raw-best`: the best hand-written raw loader found: a transform that turns each Arrow
  record batch into per-row tensor views once, the default collate, `read_batch_size=256`.
- `module`: `LanceDataModule` at its defaults; `module-resumed` the same after loading a
  mid-epoch state with uneven split counts; `module-clump` with `shuffle_clump_size=1024`.
- `fit`: `Trainer.fit` for one epoch of a model whose `training_step` does nothing.

Reported per configuration, the best of the rounds: rows/s over the epoch and after its
first batch, the time to the first batch, the process tree's peak resident memory, and
how mixed the batches are (distinct 1,000-row blocks of the table per batch).

`python benchmarks/bench_lance.py --heavy` measures memory and speed on a table shaped
like real training data (50k rows of about 22 KB: a string, a 20 KB binary `jpeg`, two
nullable ints, a variable-length float list and a 512-float embedding), batch 64, 48
splits (`benchmarks/lance_heavy.py` says exactly what): one epoch of `Trainer.fit` with a
20 ms `training_step` at 0 and 2 workers, the process tree's memory through the epoch
next to `loader/resident_bytes`; then two epochs as fast as the loader goes, next to raw
`StreamingDataLoader` and under `Trainer.fit`, with the CPU seconds of the main process
and the workers.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/bench_lance.json") + "\n"
    for name, run in runs.items():
        if run.get("run") != "light":
            raise ValueError(f"bench_lance.json: no rendering of run {name!r} here")
        header = ["configuration", "rows/s", "after the first batch", "first batch", "peak RSS"]
        rows = [
            [
                f"`{config}`",
                rate(r["rows_per_s"]),
                rate(r["steady_rows_per_s"]),
                f"{r['first_batch_s']:.2f} s" if "first_batch_s" in r else "-",
                f"{r['peak_rss_mb']:,.0f} MB" if "peak_rss_mb" in r else "-",
            ]
            if "rows_per_s" in r
            else [f"`{config}`", "-", rate(r["steady_rows_per_s"]), "-", "-"]
            for config, r in run["best"].items()
        ]
        ratios = run["ratios"]
        ratio_rows = [
            [
                workers,
                f"{r['module / raw-default rows/s']:.2f}",
                f"{r['module / raw-best rows/s']:.2f}",
                f"{r['module / raw-default RSS']:.2f}",
                f"{r['first batch resumed / fresh']:.2f}",
            ]
            for workers, r in ratios.items()
            if isinstance(r, dict)
        ]
        ratio_header = [
            "workers",
            "module / raw-default rows/s",
            "module / raw-best rows/s",
            "peak RSS, module / raw-default",
            "first batch, resumed / fresh",
        ]
        text += f"""
The best of {run["rounds"]} rounds, {measured(run)}:

{table(ratio_header, ratio_rows)}

`Trainer.fit` with a `training_step` that does nothing runs at
{ratios["fit / bare loop after the 1st batch"]:.2f} of the bare loader's rows/s after the
first batch; `shuffle_clump_size=1024` at {ratios["clump rows/s / default"]:.2f} of the
default's rows/s. Per configuration:

{table(header, rows)}
"""
    return text


SETTING_NAMES = {
    "package": "the package's settings",
    "thresholds": "its thresholds alone",
    "glibc": "glibc's defaults",
}


def memory_section(runs: Runs | None) -> str:
    text = """\
## Memory over epochs: `benchmarks/memory_over_epochs.py`

`python benchmarks/memory_over_epochs.py [--heavy] --json
benchmarks/results/memory_over_epochs.json`: a reading process's resident memory at the
end of each epoch, 0 workers, one fresh process a run, with the package's allocator
settings (`lightning_stream/allocator.py`), with its thresholds alone (as
`GLIBC_TUNABLES`, so glibc keeps its own arenas) and with glibc's defaults
(`LIGHTNING_STREAM_MALLOC=0`), the settings interleaved over rounds. A reader whose memory
is bounded ends its last epoch about where it ended its first. Each cell is the lowest and
highest over the rounds.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/memory_over_epochs.json") + "\n"
    kinds = {"light table": "light rows", "heavy table": "rows of 22 KB"}
    for name, run in runs.items():
        header = [
            "allocator",
            "memory at the first epoch's end",
            "at the last epoch's end",
            "at every epoch's end",
            "peak",
            "rows/s, every epoch",
        ]
        rows = []
        for setting in dict.fromkeys(r["setting"] for r in run["runs"]):
            mine = [r for r in run["runs"] if r["setting"] == setting]
            ends = [end for r in mine for end in r["end_rss_mb"]]
            rows.append(
                [
                    SETTING_NAMES.get(setting, setting),
                    low_high([r["end_rss_mb"][0] for r in mine], _mb) + " MB",
                    low_high([r["end_rss_mb"][-1] for r in mine], _mb) + " MB",
                    low_high(ends, _mb) + " MB",
                    low_high([r["peak_rss_mb"] for r in mine], _mb) + " MB",
                    low_high([v for r in mine for v in r["rows_per_s"]], rate),
                ]
            )
        text += f"""
{run["rows"]:,} {kinds.get(name, name)}, {run["epochs"]} epochs, {run["rounds"]} rounds, \
{measured(run)}:

{table(header, rows)}
"""
    return text


def _mb(value: float) -> str:
    return f"{value:,.0f}"


def litdata_section(runs: Runs | None) -> str:
    text = """\
## LitData: `benchmarks/bench_litdata.py`

`python benchmarks/bench_litdata.py --json benchmarks/results/bench_litdata.json` (LitData
installed as its docstring says) writes the light table (200k rows of an id, 16 floats and
a label) and the heavy one (25k rows of about 22 KB) both as LanceDB tables and, row for
row, as LitData datasets (64 MB chunks), and reads two shuffled epochs of each per fresh
process, batch 256, at 0 and 2 workers: `LanceDataModule` at its defaults (32 splits,
rows in clumps) and with `shuffle_clump_size=1` (single rows), against
`StreamingDataset(shuffle=True)` in `StreamingDataLoader`. Ratios are ours over LitData in
the same round: rows/s after the first batch, over the whole first epoch (at 2 workers it
includes the workers' start), and over the next epoch. `blocks/64` is the mean count of
distinct 1,024-row storage blocks among 64 consecutive rows served: how mixed the batches
are.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/bench_litdata.json") + "\n"
    header = [
        "table, workers",
        "ours / LitData",
        "whole epoch",
        "next epoch",
        "rows/s, ours / LitData",
        "blocks/64, ours / LitData",
        "single rows / LitData; blocks/64",
    ]
    for name, run in runs.items():
        rows = [
            [
                config.replace(" workers", ""),
                spread(f["ours_over_litdata"]),
                spread(f["ours_over_litdata_whole_epoch"]),
                spread(f["ours_over_litdata_second_epoch"]),
                ", ".join(
                    rate(f[key]["median"]) for key in ("ours_rows_per_s", "litdata_rows_per_s")
                ),
                f"{f['ours_blocks_per_64']:.1f} / {f['litdata_blocks_per_64']:.1f}",
                f"{spread(f['rows_over_litdata'])}; {f['rows_blocks_per_64']:.1f}",
            ]
            for config, f in run["figures"].items()
        ]
        step = f", a {run['step_ms']:g} ms step after each batch" if run["step_ms"] else ""
        text += f"""
{name.capitalize()}: medians (range) of {run["rounds"]} rounds{step}, {measured(run)}:

{table(header, rows)}
"""
    return text


def packing_section(runs: Runs | None) -> str:
    text = """\
## Token packing: `benchmarks/bench_packing.py`

`python benchmarks/bench_packing.py --json benchmarks/results/bench_packing.json` (LitData
installed as for `bench_litdata.py`) writes 200,000 documents of 1 to 20,000 tokens (a
heavy tail, about 18M tokens) as a LanceDB table and, each followed by its
end-of-document token, as a LitData token dataset, and reads two shuffled epochs per fresh
process, batches of 16 blocks of 2,048 tokens, at 0 and 2 workers (also on 2,000,000
documents, on 20,000,000 documents (1.8 billion tokens; one round: the data, about 7 GB
in each of the three forms, does not all stay in this machine's page cache), with a
training step after each batch, inside `Trainer.fit` (`--trainer`), and with both datasets
read from the test S3 server with 20 ms latency on a machine that has read nothing of them
yet (`--s3`: our setup counts and copies the token column from the store, LitData
downloads its chunks as it reads them)):
`LanceDataModule(pack=TokenPacking(...))` (32 splits; batches of `input_ids`, `labels`,
`position_ids`, `document_ids`, `cu_seqlens`, `max_seqlen`), reading the documents from
the table (`local_copy=False`) or from a local copy of the token column (`True`, what the
default does where the copy fits in half the free disk), against
`StreamingDataset(item_loader=TokensLoader(2048))`, raw (`input_ids` only) and with a
collate that derives the same fields from the end-of-document tokens (with the array
arithmetic ours uses), which is what a LitData user adds to train as ours trains. Ratios
are ours over LitData in the same round: tokens/s after the first batch, over the next
epoch, and from setup (the first epoch's tokens over the time from the loader's
construction, our `setup` included, to its last batch). Memory: ours' peak resident
memory of the process tree (workers included) above what it held once every reader had
handed out a batch, against `read_ahead_bytes`. At 0 workers, tables measured at `5b40521`
and later make the local copy's blocks on the thread that asks for them; earlier ones
made them on a reading thread. Tables dated 2026-12-08 ran on a slower host than earlier
ones: compare ratios across tables, not tokens/s.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/bench_packing.json") + "\n"
    header = [
        "workers",
        "ours reading",
        "/ LitData raw",
        "next epoch",
        "from setup",
        "/ LitData + fields",
        "next epoch",
        "tokens/s: ours, raw, + fields",
        "first batch s, ours / raw",
        "peak above first batches MB / read-ahead MB",
    ]
    for run in runs.values():
        rows = []
        for config, entry in run["figures"].items():
            theirs = [rate(entry[key]["tokens_per_s"]["median"]) for key in PACKING_LITDATA]
            for reader, label in PACKING_OURS.items():
                f = entry[reader]
                rows.append(
                    [
                        config.replace(" workers", ""),
                        label,
                        spread(f["over_litdata"]),
                        spread(f["over_litdata_second_epoch"]),
                        spread(f["over_litdata_from_setup"])
                        if "over_litdata_from_setup" in f
                        else "",
                        spread(f["over_litdata-fields"]),
                        spread(f["over_litdata-fields_second_epoch"]),
                        ", ".join([rate(f["tokens_per_s"]["median"]), *theirs]),
                        f"{f['first_batch_s']:.2f} / {entry['litdata']['first_batch_s']:.2f}",
                        f"{_mb(f['peak_above_first_mb'])} / {_mb(entry['read_ahead_mb'])}",
                    ]
                )
        step = f", a {run['step_ms']:g} ms step after each batch" if run.get("step_ms") else ""
        if run.get("trainer"):
            step += ", inside `Trainer.fit` (batches timed as they reach `training_step`)"
        if "s3_latency_ms" in run:
            step += (
                f", both read from the test S3 server (latency {run['s3_latency_ms']:g} ms,"
                f" store cores {run['store_cores']}"
                f"{', range reads answered by moto' if run.get('moto_ranges') else ''})"
                " with cold caches"
            )
        prepared = (
            f"Prepared once: LitData's `optimize` {run['litdata_optimize_s']:.1f} s; our token"
            f" counts and local copy {run['ours_scan_and_copy_s']:.1f} s."
        )
        rounds = f"Medians (range) of {run['rounds']} rounds" if run["rounds"] > 1 else "One round"
        ceiling = run["figures"]["0 workers"].get("lance-scan")
        if ceiling is not None and not run.get("step_ms"):  # a ceiling of reads alone
            prepared += (
                " The table's ceiling through lance at 0 workers (its token column scanned in"
                " storage order on lance's own threads, no shuffle, no blocks):"
                f" {rate(ceiling['tokens_per_s']['median'])} tokens/s,"
                f" {spread(ceiling['over_litdata'])} LitData raw."
            )
        text += f"""
{rounds}, {run["documents"]:,} documents, blocks of \
{run["block_size"]:,}{step}, {measured(run)}. {prepared}

{table(header, rows)}
"""
    return text


PACKING_OURS = {"ours": "the table", "ours-local": "its local copy (default)"}
PACKING_LITDATA = ("litdata", "litdata-fields")


def pin_memory_section(runs: Runs | None) -> str:
    """Shown once a result exists: the benchmark needs an accelerator."""
    if runs is None:
        return ""
    if "copy" in runs:  # one record, as the script writes it without benchmarks/record.py
        runs = {"": runs}
    text = """\
## Pinned memory: `benchmarks/pin_memory.py`

`python benchmarks/pin_memory.py --json benchmarks/results/pin_memory.json` needs an
accelerator that takes pinned memory (CUDA). It reads a table with `LanceDataModule`
with `pin_memory=True` and `False` and reports the share of the batches' tensors that
arrive in page-locked memory, per loader; then, per step, host work, a fresh batch
(pinned or not), a `non_blocking` copy to the device as Lightning makes it, and a
simulated step that reads the batch: the milliseconds per step, in `.to()`, and spent
pinning (medians).
"""
    for run in runs.values():
        when = measured(run) if "commit" in run else "the commit measured was not recorded"
        shares = [[key, f"{share:.2f}"] for key, share in run["arrival"].items()]
        copies = [
            [
                mode,
                f"{f['ms_per_step']:.2f} ms",
                f"{f['to_ms_median']:.3f} ms",
                f"{f['pin_ms_median']:.3f} ms",
            ]
            for mode, f in run["copy"].items()
        ]
        text += f"""
On {run["device"]}, torch {run["torch"]}; {when}:

{table(["tensors pinned", "share"], shares)}

{table(["batches", "per step", "in .to()", "pinning"], copies)}
"""
    return text


def video_workers_image(run: dict) -> str:
    """The plot ``benchmarks/plots.py`` draws of a ``bench_video.py --workers`` run."""
    step = run["step_ms"]
    return "bench_video_workers.png" if not step else f"bench_video_workers_step{step:g}.png"


def video_section(runs: Runs | None) -> str:
    text = """\
## Video: `benchmarks/bench_video.py`

`python benchmarks/bench_video.py`: a synthetic LeRobot v3 dataset (24 episodes, two 96x96
h264 cameras with B-frames, a GOP of 30, four episodes per MP4) and windows of the front
camera at -0.1 s and 0 s plus the wrist camera's anchor frame. `module` is one epoch of
`VideoEpisodeDataModule`; `naive` what a loader without an index does: per window and
camera, open the MP4 with PyAV, seek to the keyframe before the window and decode up to
its last frame. Reported: windows/s of each and their ratio, decoded frames per delivered
frame, bytes read per epoch over the dataset's video bytes, and the module's peak memory
next to its byte budget.

`python benchmarks/bench_video.py --memory`: the process tree's memory over an epoch under
a small `byte_budget_gb`, at 0 and 2 workers, next to the bound the budget sets, with the
largest `loader/resident_bytes`, and whether every anchor came once.

`python benchmarks/bench_video.py --workers [--step-ms 20] --json
benchmarks/results/bench_video_workers.json`: a LeRobot-shaped dataset (24 episodes of
150-280 frames, camera-like texture, x264 with B-frames) and LeRobot-style windows (the
front camera at -2/30, -1/30 and 0 s, the wrist camera at 0 s, 8 future actions),
`num_splits=24`, batch 16. Each worker count runs in a fresh process, the counts
interleaved over rounds: `setup`, then epoch after epoch, each batch followed by a training
step of `--step-ms`. Reported per count and epoch: the time to the first batch and the
epoch's windows/s (its first batch included).
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/bench_video_workers.json") + "\n"
    for run in runs.values():
        header = ["workers", "setup", "epoch", "first batch", "windows/s"]
        rows = []
        for count in run["counts"]:
            done = run["runs"][str(count)]
            setup = statistics.median(r["setup_s"] for r in done)
            for epoch in range(len(done[0]["epochs"])):
                epochs = [r["epochs"][epoch] for r in done]
                firsts = [e["first_batch_s"] for e in epochs]
                rates = [e["windows"] / e["epoch_s"] for e in epochs]
                rows.append(
                    [
                        str(count) if epoch == 0 else "",
                        f"{setup:.2f} s" if epoch == 0 else "",
                        str(epoch),
                        spread(_spread(firsts)) + " s",
                        spread(_spread(rates), rate),
                    ]
                )
        step = (
            f"a {run['step_ms']:g} ms training step after each batch"
            if run["step_ms"]
            else "no training step"
        )
        text += f"""
With {step}, medians (range) of {run["rounds"]} rounds, {measured(run)}:

{table(header, rows)}
"""
        image = video_workers_image(run)
        if (IMAGES / image).exists():
            text += f"""
![bench_video.py --workers, {step}: windows/s and first batch per epoch](img/{image})
"""
    return text


def _spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def video_scale_section(runs: Runs | None) -> str:
    text = """\
### Video datasets of any size

`python benchmarks/bench_video.py --scale --json benchmarks/results/video_scale.json`
writes LeRobot-layout datasets of 1k, 10k and 100k episodes once (`write_dataset`: two
96x96 h264 cameras, 500 episodes a file, a Parquet row group per episode), builds every
MP4's sidecar into an empty directory (timed), then reads each dataset at the data
module's defaults (`byte_budget_gb=1`, `episode_pool_size=2`) with the front camera at
-1/30 and 0 s and the wrist camera's anchor, at 0 and 2 workers, a fresh process per
configuration with the sidecars built, the configurations interleaved over rounds, epoch
after epoch. `first windows/s` is the first 65,536 windows after the first batch, which
include the ramp of the per-frame rows' read-ahead; `windows/s` the 65,536 after them
(steady). Memory is the process tree's peak above its memory before `setup`, next to the
bound of 0.3 GB plus the byte budget.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/video_scale.json") + "\n"
    run = only(runs, "datasets")
    figures = run["figures"]
    header = [
        "episodes, workers",
        "setup",
        "setup + first batch",
        "first windows/s",
        "windows/s",
        "peak memory above start",
    ]
    rows = []
    for config, f in figures.items():
        if " over " in config:
            continue
        episodes, workers = config.split(":")
        rows.append(
            [
                f"{size(int(episodes))}, {workers}",
                spread(f["setup_s"]) + " s",
                spread(f["first_batch_s"]) + " s",
                spread(f["first_windows_per_s"], rate),
                spread(f["windows_per_s"], rate),
                spread(f["peak_above_start_gb"]) + " GB",
            ]
        )
    sizes = sorted(int(e) for e in run["sidecars"])
    ratio = {w: figures[f"{sizes[-1]} over {sizes[0]}, {w} workers"] for w in (0, 2)}
    builds = ", ".join(
        f"{run['sidecars'][str(e)]['build_s_per_file'] * 1000:.1f} ms at {size(e)}" for e in sizes
    )
    return (
        text
        + f"""
{run["frames_per_episode"]} frames an episode, `num_splits={run["num_splits"]}`, batch \
{run["batch_size"]}, `byte_budget_gb={run["byte_budget_gb"]:g}`; medians (range) of \
{run["rounds"]} rounds, {measured(run)}:

{table(header, rows)}

{size(sizes[-1])} episodes over {size(sizes[0])}: windows/s \
{ratio[0]["windows_per_s"]:.2f}x at 0 workers and {ratio[2]["windows_per_s"]:.2f}x at 2 \
(the first windows: {ratio[0]["first_windows_per_s"]:.2f}x and \
{ratio[2]["first_windows_per_s"]:.2f}x). A sidecar build from nothing took, per MP4, \
{builds}. The 2-worker tree holds two workers with PyAV and pyarrow imported.
"""
    )


OBJECT_STORES = """\
## Object stores

Both object-store benchmarks start an S3-protocol server on 127.0.0.1
(`tests/s3_server.py`: moto's server on a thread, behind a plain asyncio front that
answers range reads itself) that answers every request after `--latency-ms` (default
20 ms, as a real store answers after 10-100 ms); `--bandwidth-mb-s` caps each response.
The server counts the bytes it sends, logs each object GET and reports its own CPU time.
It runs on the reader's host, where a real store's CPU is elsewhere: `--store-cores N`
runs it on the host's last N cores alone and every reader, local and S3, on the rest.
"""


def lance_s3_section(runs: Runs | None) -> str:
    text = """\
### Tables: `bench_lance.py --s3`

`python benchmarks/bench_lance.py --s3 [--rows N | --heavy] [--latency-ms 20] [--trainer]
[--store-cores N] [--step-ms N] [--moto-ranges] --json
benchmarks/results/bench_lance_s3.json` writes one table (light rows, or with `--heavy`
25k rows of 22 KB) to local disk, uploads the same files to a bucket, and reads two epochs
of it per fresh process at 0 and 2 workers, 32 splits, batch 256, local and S3 interleaved
over rounds; `--trainer` reads them inside `Trainer.fit` of a model whose step does
nothing, `--step-ms` waits that long after each batch, `--moto-ranges` lets moto's own
server answer the range reads. Reported per configuration: S3 rows/s after the first
batch over the same round's local rows/s, in the first epoch and the next; the bytes the
server sent per epoch (both epochs' over two, setup's reads included with `--trainer`)
over the table's bytes; and the CPU every core of the host spent after the first batch,
S3 over local (the server's included). Where the host's cores are the limit, S3/local
follows that CPU ratio; where the reads wait on the store, the round trips. moto's own
server reads the whole object for every range GET (`moto_ranges.py` below), so with it
the store's core is the bound; the bytes read do not depend on who answers.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/bench_lance_s3.json") + "\n"
    groups: dict[tuple, list[dict]] = {}
    for run in runs.values():
        key = (
            run["latency_ms"],
            run["trainer"],
            run["store_cores"],
            run["step_ms"],
            run["bandwidth_mb_s"],
            run["commit"],
            run["date"],
            run.get("uncommitted", False),
        )
        groups.setdefault(key, []).append(run)
    header = [
        "table, range reads answered by",
        "rounds",
        "S3/local, 0 workers",
        "2 workers",
        "next epoch, 0 / 2",
        "bytes per epoch / table, 0 / 2",
        "host CPU S3/local, 0 / 2",
    ]
    for group in groups.values():
        first = group[0]
        rows = []
        for run in group:
            kind = "light rows" if run["table"] == "light" else "rows of 22 KB"
            answered = "moto" if run["moto_ranges"] else "the front"
            for setting in dict.fromkeys(n.split(",")[0] for n in run["figures"]):
                zero, two = (run["figures"][f"{setting}, {w} workers"] for w in (0, 2))
                label = f"{size(run['rows'])} {kind} ({run['table_bytes'] / 1e6:,.0f} MB)"
                label += f", {answered}" + ("" if setting == "default" else f", `{setting}`")
                rows.append(
                    [
                        label,
                        str(run["rounds"]),
                        spread(zero["s3_over_local"]),
                        spread(two["s3_over_local"]),
                        f"{zero['s3_over_local_next_epoch']['median']:.2f} / "
                        f"{two['s3_over_local_next_epoch']['median']:.2f}",
                        f"{zero['bytes_per_epoch_over_table']['median']:.2f} / "
                        f"{two['bytes_per_epoch_over_table']['median']:.2f}",
                        f"{zero['host_cpu_s3_over_local']:.2f} / "
                        f"{two['host_cpu_s3_over_local']:.2f}",
                    ]
                )
        where = "inside `Trainer.fit`" if first["trainer"] else "a loop over the loader"
        store = (
            f"the store on {cores(first['store_cores'])} of its own and the readers on the rest"
            if first["store_cores"]
            else "the store and the readers sharing the cores"
        )
        step = f", a {first['step_ms']:g} ms step after each batch" if first["step_ms"] else ""
        cap = (
            f", responses capped at {first['bandwidth_mb_s']:g} MB/s"
            if first["bandwidth_mb_s"]
            else ""
        )
        text += f"""
Every request answered after {first["latency_ms"]:g} ms, {where}, {store}{step}{cap}; \
medians (range), {measured(first)}:

{table(header, rows)}
"""
    return text


def ceiling_section(runs: Runs | None) -> str:
    text = """\
### lance's own reads: `lance_s3_ceiling.py`

`python benchmarks/lance_s3_ceiling.py [--latency-ms 0] [--threads 8] [--store-cores N]
--json benchmarks/results/lance_s3_ceiling.json` reads every row of the heavy table with
lance's own take, in the default clumps taken whole, from local disk and from the store,
interleaved over rounds, with nothing consuming the rows: no batches, no training step, no
workers. Reported: S3/local as a rate, the reading process's user and system CPU seconds
(lance's threads included) on each side, the store's CPU and the GETs it served. A loader
adds work of its own that costs the same from either side: where the host's cores are the
limit, its S3/local lies between this rate and 1.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/lance_s3_ceiling.json") + "\n"
    header = [
        "configuration",
        "S3/local",
        "wall, local / S3",
        "user CPU, local / S3",
        "system CPU, local / S3",
        "store CPU",
        "GETs",
    ]
    rows = []
    for name, run in runs.items():
        f = run["figures"]
        rows.append(
            [
                f"{name}; {measured(run)}",
                spread(f["S3/local"]),
                f"{spread(f['local wall s'])} / {spread(f['s3 wall s'])} s",
                f"{spread(f['local user s'])} / {spread(f['s3 user s'])} s",
                f"{spread(f['local sys s'])} / {spread(f['s3 sys s'])} s",
                spread(f["store cpu s"]) + " s",
                spread(f["S3 GETs"], lambda v: f"{v:,.0f}"),
            ]
        )
    first = next(iter(runs.values()))
    return (
        text
        + f"""
{first["heavy_rows"]:,} rows in clumps of {first["clump"]}, reads of {first["read_rows"]:,} \
rows; medians (range) of the rounds:

{table(header, rows)}
"""
    )


def moto_section(runs: Runs | None) -> str:
    text = """\
### moto's range reads: `moto_ranges.py`

`python benchmarks/moto_ranges.py --json benchmarks/results/moto_ranges.json` writes an
object of each size to a fresh test server (no latency) and reads it in ranges at spread
offsets, once with the front answering the ranges and once with moto's own server
answering them; reported: the server's CPU and the wall time per GET.
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/moto_ranges.json") + "\n"
    for run in runs.values():
        rows = [
            [
                f"{r['object_mb']} MB",
                r["answered_by"],
                f"{r['store_cpu_ms_per_get']:.1f} ms",
                f"{r['wall_ms_per_get']:.1f} ms",
            ]
            for r in run["results"]
        ]
        header = ["object", "answered by", "store CPU a GET", "wall a GET"]
        text += f"""
{run["gets"]} GETs of {run["range_kib"]} KiB an object, {measured(run)}:

{table(header, rows)}
"""
    return text


def video_s3_section(runs: Runs | None) -> str:
    text = """\
### Video: `bench_video.py --s3`

`python benchmarks/bench_video.py --s3 --json benchmarks/results/bench_video_s3.json`
uploads the LeRobot-shaped dataset of `--workers` (24 episodes of 150-280 frames, two
96x96 cameras with camera-like texture, x264 with B-frames, GOP 30) and reads one epoch of
its LeRobot-style windows from local disk and one from the store, alternating, at 0
workers and `byte_budget_gb=0.25`, from after `setup`. Reported: windows/s of each, S3
over local paired by round, and the bytes the server sent in the epoch over the MP4s'
bytes. Those bytes include, besides the packets decoded: the sidecars the epoch loads
(each checked against its MP4 by sampled blocks, a larger share of a small file), the
per-frame rows of its chunks, and where an episode is cut between chunks or splits, the
packets from the keyframe before the cut, which both sides need (a reading process that
serves both fetches them once: `lightning_stream/video/shared.py`).
"""
    if runs is None:
        return text + "\n" + no_results("benchmarks/results/bench_video_s3.json") + "\n"
    header = ["latency", "windows/s, local", "S3", "S3/local", "bytes served / MP4 bytes"]
    rows = []
    for run in runs.values():
        f = run["figures"]
        rows.append(
            [
                f"{run['latency_ms']:g} ms",
                spread(f["local_windows_per_s"], rate),
                spread(f["s3_windows_per_s"], rate),
                spread(f["s3_over_local"]),
                spread(f["bytes_over_video"]),
            ]
        )
    first = next(iter(runs.values()))
    return (
        text
        + f"""
{first["video_bytes"] / 1e6:.1f} MB of MP4; medians (range) of {first["rounds"]} rounds, \
{measured(first)}:

{table(header, rows)}
"""
    )


# results file -> the section that renders it; the page in this order
SECTIONS: dict[str | None, Callable[[Runs | None], str]] = {
    None: lambda _: INTRO,
    "scale.json": scale_section,
    "bench_lance.json": bench_lance_section,
    "memory_over_epochs.json": memory_section,
    "bench_litdata.json": litdata_section,
    "bench_packing.json": packing_section,
    "pin_memory.json": pin_memory_section,
    "bench_video_workers.json": video_section,
    "video_scale.json": video_scale_section,
    "object stores": lambda _: OBJECT_STORES,
    "bench_lance_s3.json": lance_s3_section,
    "lance_s3_ceiling.json": ceiling_section,
    "moto_ranges.json": moto_section,
    "bench_video_s3.json": video_s3_section,
}


def load(results: Path = RESULTS) -> dict[str, Runs]:
    """Every results file, by name; a file no section renders is an error."""
    found = {path.name: json.loads(path.read_text()) for path in sorted(results.glob("*.json"))}
    unknown = sorted(set(found) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"no section of the page renders {unknown}: add one to {__file__}")
    return found


def render(results: dict[str, Runs]) -> str:
    """The page, from the results files' contents."""
    parts = [section(results.get(name) if name else None) for name, section in SECTIONS.items()]
    return "\n".join(part.rstrip("\n") + "\n" for part in parts if part)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that the page is current")
    args = parser.parse_args()
    page = render(load())
    if args.check:
        if PAGE.read_text(encoding="utf-8") != page:
            sys.exit(f"{PAGE} is not what the results render: run python benchmarks/report.py")
        return
    PAGE.write_text(page, encoding="utf-8")
    print(f"{PAGE.relative_to(ROOT)} rendered from {len(load())} results files")


if __name__ == "__main__":
    main()
