"""VideoEpisodeDataModule on LeRobot-layout datasets of 1k to 100k episodes.

    python benchmarks/bench_video.py --scale [--sizes 1000,10000,100000] [--rounds 2]
        [--data-dir DIR] [--windows 65536] [--json benchmarks/results/video_scale.json]

The datasets (``lightning_stream.video.synthetic.write_dataset``: two 96x96 h264 cameras,
12 frames an episode, 500 episodes a file, one Parquet row group per episode; 1.2M frames
at 100k episodes) are written once under ``--data-dir`` and kept. Every MP4's sidecar is
built in a process of its own into an empty directory (the build's time per MP4 is
reported), then into ``DIR/sidecars`` if missing there: the runs find them built. Then
each configuration runs in a fresh process, configurations interleaved, ``--rounds``
rounds, at the data module's defaults (``byte_budget_gb=1``, ``episode_pool_size=2``)
with ``num_splits=64``, batch 32, the front camera's frames at -1/30 s and 0 s and the
wrist camera's anchor frame, at 0 and 2 workers, epoch after epoch:

- ``setup + first batch``: from before ``dm.setup("fit")`` to the first batch in hand;
- ``first windows/s``: the ``--windows`` windows after the first batch (the same count at
  every size; they include the ramp of the per-frame rows' read-ahead, which reads from
  every data file each time it grows);
- ``windows/s``: the ``--windows`` windows after those (steady; compared across sizes);
- ``peak above start``: the process tree's peak RSS (workers included) above its RSS
  before setup, sampled every 20 ms, next to the bound of 0.3 GB plus the byte budget.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from fresh import hand_back, run_fresh
from measure import PeakRss, shown, size_summary, tree_rss_mb
from record import save

ROOT = Path(__file__).resolve().parents[1]
FRAMES = 12  # an episode's
PER_FILE = 500  # episodes a file
NUM_SPLITS, BATCH, BUDGET_GB = 64, 32, 1.0
FRONT = "observation.images.front"
DELTAS = {FRONT: [-1 / 30, 0.0]}


def dataset_root(data_dir: Path, episodes: int) -> Path:
    """The dataset of ``episodes`` episodes under ``data_dir``, written if missing."""
    sys.path.insert(0, str(ROOT))
    from lightning_stream.video.synthetic import write_dataset

    root = data_dir / f"video-{episodes}"
    done = root / "written"
    if not done.exists():
        write_dataset(root, [FRAMES] * episodes, episodes_per_file=PER_FILE)
        done.touch()
    return root


def build_sidecars(root: str, sidecars: str) -> dict:
    """Every MP4's sidecar of ``root`` built (or found built), timed per file."""
    sys.path.insert(0, str(ROOT))
    from lightning_stream.video.lerobot import open_dataset
    from lightning_stream.video.sidecar import VideoFile, load_or_build

    dataset = open_dataset(root)
    built, seconds = 0, []
    for files in dataset.episodes.video_files.values():
        for relative in files:
            started = time.perf_counter()
            _, fresh = load_or_build(
                VideoFile(dataset.fs, dataset.path(relative)), Path(sidecars), root
            )
            if fresh:
                built += 1
                seconds.append(time.perf_counter() - started)
    return {
        "files": sum(map(len, dataset.episodes.video_files.values())),
        "built": built,
        "build_s_per_file": statistics.mean(seconds) if seconds else None,
    }


def across_epochs(dm) -> Iterator[dict]:
    """The data module's batches, epoch after epoch (a small dataset's epoch is shorter than
    the windows measured)."""
    while True:
        yield from dm.train_dataloader()


def one(root: str, sidecars: str, workers: int, windows: int) -> dict:
    """One configuration in this (fresh) process."""
    sys.path.insert(0, str(ROOT))
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    before = tree_rss_mb()
    with PeakRss() as peak:
        started = time.perf_counter()
        dm = VideoEpisodeDataModule(
            root,
            delta_timestamps=DELTAS,
            num_splits=NUM_SPLITS,
            batch_size=BATCH,
            num_workers=workers,
            sidecar_dir=sidecars,
        )
        dm.setup("fit")
        setup = time.perf_counter() - started
        batches = across_epochs(dm)
        next(batches)
        first = time.perf_counter() - started
        rates = []
        for _ in range(2):  # the first windows, then as many more
            started, served = time.perf_counter(), 0
            for batch in batches:
                served += len(batch["index"])
                if served >= windows:
                    break
            rates.append(served / (time.perf_counter() - started))
    dm.teardown("fit")
    return {
        "setup_s": setup,
        "first_batch_s": first,
        "first_windows_per_s": rates[0],
        "windows_per_s": rates[1],
        "peak_above_start_gb": (peak.peak - before) / 1024,
    }


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        root, sidecars, workers, windows = argv[1:5]
        hand_back(one(root, sidecars, int(workers), int(windows)))
        return
    if argv[:1] == ["--sidecars"]:
        hand_back(build_sidecars(*argv[1:3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--windows", type=int, default=65536)
    parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "ls-video-scale")
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also keep the figures there (run 'datasets')"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    args.data_dir.mkdir(parents=True, exist_ok=True)
    sidecars = str(args.data_dir / "sidecars")
    roots = {episodes: str(dataset_root(args.data_dir, episodes)) for episodes in sizes}
    builds = {}
    for episodes in sizes:
        with tempfile.TemporaryDirectory() as scratch:  # a build from nothing, timed
            builds[episodes] = run_fresh(
                [__file__, "--sidecars", roots[episodes], scratch],
                f"sidecars of {episodes} episodes:",
            )
        run_fresh([__file__, "--sidecars", roots[episodes], sidecars], "  and in the cache:")
    runs: dict[str, list] = {}
    for round_ in range(args.rounds):
        for episodes in sizes:
            for workers in (0, 2):
                config = f"{episodes}:{workers}"
                arguments = [
                    __file__,
                    "--one",
                    roots[episodes],
                    sidecars,
                    str(workers),
                    str(args.windows),
                ]
                runs.setdefault(config, []).append(
                    run_fresh(arguments, f"round {round_} {config:<10}")
                )
    figures = size_summary(runs, sizes, ("first_windows_per_s", "windows_per_s"))
    report(figures)
    if args.json:
        result = {
            "rounds": args.rounds,
            "num_splits": NUM_SPLITS,
            "batch_size": BATCH,
            "byte_budget_gb": BUDGET_GB,
            "frames_per_episode": FRAMES,
            "sidecars": builds,
            "runs": runs,
            "figures": figures,
        }
        save(args.json, "datasets", result)


def report(figures: dict) -> None:
    bound = 0.3 + BUDGET_GB
    print(
        f"\n{'episodes:workers':<18} {'setup s':>18} {'setup + first batch s':>22}"
        f" {'first windows/s':>22} {'windows/s':>22} {'peak above start GB':>20}"
        f"   (bound {bound:.2f} GB)"
    )
    for config, f in figures.items():
        if " over " in config:
            print(
                f"{config}: windows/s {f['windows_per_s']:.2f}x"
                f" (first windows {f['first_windows_per_s']:.2f}x)"
            )
            continue
        print(
            f"{config:<18} {shown(f['setup_s']):>18} {shown(f['first_batch_s']):>22}"
            f" {shown(f['first_windows_per_s']):>22} {shown(f['windows_per_s']):>22}"
            f" {shown(f['peak_above_start_gb']):>20}"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
