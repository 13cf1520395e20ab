"""VideoEpisodeDataModule's loader next to a naive per-window PyAV loader, in one run.

    python benchmarks/bench_video.py

One synthetic LeRobot v3 dataset (24 episodes of 40-120 frames, two 96x96 h264 cameras
with B-frames and a GOP of 30, four episodes per MP4) and windows of the front camera's
frames at -0.1 s and 0 s plus the wrist camera's anchor frame (3 frames per window).

- ``module``: one epoch of ``VideoEpisodeDataModule(...).train_dataloader()``.
- ``naive``: what a loader without an index does: per window and camera, open the MP4
  with PyAV, seek to the keyframe before the window and decode up to its last frame; run
  on the first ``--naive-windows`` anchors of the module's own order.

Reported: windows/s of each and their ratio, decoded frames per delivered frame, bytes
read per epoch over the dataset's total video bytes, and the module's peak RSS (process
tree) next to its byte budget.

    python benchmarks/bench_video.py --workers [--worker-counts 0,2,4] [--step-ms 20]
        [--json benchmarks/results/bench_video_workers.json]

``--workers`` uses a LeRobot-shaped dataset (24 episodes of 150-280 frames, two 96x96
cameras with camera-like texture, x264 with B-frames, GOP 30) and LeRobot-style windows:
the front camera at -2/30, -1/30 and 0 s, the wrist camera at 0 s and 8 future actions;
``num_splits=24``, batch 16. Each worker count runs in a fresh process, the counts
interleaved, ``--rounds`` times (default 3): ``setup`` then ``--epochs`` epochs (default 3),
each batch followed by a training step of ``--step-ms`` (default none). Reported per count:
``setup``, then per epoch the time to its first batch, the epoch's wall time and its
windows/s (all of the epoch, its first batch included); then per epoch each count's
windows/s over the first count's, paired by round, and for epoch 0 the difference of
``setup`` plus the epoch's wall time. Every figure is a median over rounds, with its range.

    python benchmarks/bench_video.py --memory

``--memory`` bounds memory by the byte budget on the same LeRobot-shaped dataset (about
290 MB of decoded frames) and windows, with ``byte_budget_gb=0.05``, at 0 and at 2 workers,
each in a fresh process. Per configuration: the process tree's RSS after ``setup`` and
after the workers have started (the baseline), its peak over one epoch above that, next
to ``1.5 x budget + 60 MB`` and to the largest ``loader/resident_bytes`` (decoded frames
held, summed over the workers); the epoch's exactness (every anchor once) and decoded
frames per delivered frame.

    python benchmarks/bench_video.py --scale [--sizes 1000,10000,100000]

``--scale``: setup, first batch, windows/s and memory on LeRobot-layout datasets of 1k to
100k episodes (``benchmarks/video_scale.py`` says how).

    python benchmarks/bench_video.py --s3 [--latency-ms 20]
        [--json benchmarks/results/bench_video_s3.json]

``--s3`` starts an S3-protocol server on 127.0.0.1 (moto, ``tests/s3_server.py``) that
answers each request after ``--latency-ms`` (default 20, a real store's time to first
byte), uploads the LeRobot-shaped dataset of ``--workers`` to a bucket, and runs one epoch
of the module (its LeRobot-style windows, ``byte_budget_gb=0.25``) from local disk and one
from S3 in this process, alternating, ``--rounds`` times (sidecars built at setup, not
timed). It reports windows/s of each and S3 / local paired by round, and the
bytes the server sent during the epoch (response bodies of every GET, counted on the
server side) over the dataset's MP4 bytes, as medians with their range.

``--json PATH`` (``--workers``, ``--s3``) also keeps the figures in the results file
``PATH``, as the run named by its step (``--workers``) or latency (``--s3``):
``benchmarks/record.py``.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
from fresh import hand_back, run_fresh
from measure import PeakRss, spread, tree_rss_mb
from record import save

FRONT, WRIST = "observation.images.front", "observation.images.wrist"
DELTAS = {FRONT: [-0.1, 0.0]}
BUDGET_GB = 0.25


class CountingFile:
    """A file object that counts the bytes PyAV reads through it."""

    def __init__(self, path: Path) -> None:
        self.file = path.open("rb")
        self.bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.bytes += len(data)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.file.seek(offset, whence)

    def tell(self) -> int:
        return self.file.tell()

    def close(self) -> None:
        self.file.close()


def naive_window(path: Path, seconds: list[float], fps: float) -> tuple[int, int, int]:
    """(frames delivered, frames decoded, bytes read) for one camera of one window."""
    handle = CountingFile(path)
    with av.open(handle) as container:
        stream = container.streams.video[0]
        first, last = min(seconds), max(seconds)
        container.seek(int(first / stream.time_base), stream=stream, backward=True)
        decoded, delivered = 0, 0
        wanted = {round(s * fps) for s in seconds}
        for frame in container.decode(stream):
            decoded += 1
            index = round(float(frame.pts * stream.time_base) * fps)
            if index in wanted:
                frame.to_ndarray(format="rgb24")
                delivered += 1
            if frame.pts * stream.time_base >= last - 0.5 / fps:
                break
    handle.close()
    return delivered, decoded, handle.bytes


def run(root: Path, naive_windows: int) -> None:
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    sidecars = root.parent / "sidecars"
    dm = VideoEpisodeDataModule(
        str(root),
        delta_timestamps=DELTAS,
        num_splits=24,
        batch_size=16,
        sidecar_dir=str(sidecars),
        byte_budget_gb=BUDGET_GB,
    )
    dm.setup("fit")  # builds the sidecars (not timed: once per dataset)
    video_bytes = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    baseline = tree_rss_mb()
    with PeakRss() as rss:
        start = time.perf_counter()
        windows, anchors = 0, []
        for batch in dm.train_dataloader():
            windows += len(batch["index"])
            anchors += list(
                zip(batch["episode_index"].tolist(), batch["frame_index"].tolist(), strict=True)
            )
        module_time = time.perf_counter() - start
    counters = dm.stream.counters()
    delivered = windows * 3
    dataset = dm.stream.source.reader.dataset
    fps = dataset.fps
    episodes = dataset.episodes
    slot_of = {int(index): slot for slot, index in enumerate(episodes.index)}
    start = time.perf_counter()
    naive_delivered = naive_decoded = naive_bytes = 0
    for episode_index, frame in anchors[:naive_windows]:
        slot = slot_of[episode_index]
        for camera, offsets in ((FRONT, [-3, 0]), (WRIST, [0])):
            relative, from_timestamp = episodes.video(slot, camera)
            last = int(episodes.length[slot]) - 1
            frames = [min(max(frame + o, 0), last) for o in offsets]
            seconds = [from_timestamp + f / fps for f in frames]
            got, decoded, read = naive_window(root / relative, seconds, fps)
            naive_delivered += got
            naive_decoded += decoded
            naive_bytes += read
    naive_time = time.perf_counter() - start
    module_rate = windows / module_time
    naive_rate = min(naive_windows, len(anchors)) / naive_time
    print(
        f"dataset: {len(episodes)} episodes, {int(episodes.length.sum())} frames,"
        f" 2 cameras, {video_bytes} bytes of MP4"
    )
    print(f"module: {windows} windows in {module_time:.2f} s = {module_rate:.0f} windows/s")
    print(
        f"naive:  {min(naive_windows, len(anchors))} windows in {naive_time:.2f} s"
        f" = {naive_rate:.0f} windows/s"
    )
    naive_count = min(naive_windows, len(anchors))
    module_decoded = counters["frames_decoded"] / delivered
    naive_decoded_ratio = naive_decoded / max(1, naive_delivered)
    naive_epoch_bytes = naive_bytes * len(anchors) / max(1, naive_count)
    print(f"windows/s, module / naive: {module_rate / naive_rate:.1f}x")
    print(
        f"decoded frames per delivered frame: module {module_decoded:.2f}, naive"
        f" {naive_decoded_ratio:.2f}"
    )
    module_bytes = counters["bytes_loaded"] / video_bytes
    print(
        f"bytes read per epoch / video bytes: module {module_bytes:.2f}, naive"
        f" (extrapolated) {naive_epoch_bytes / video_bytes:.1f}"
    )
    print(
        f"peak RSS (process tree): {rss.peak:.0f} MB, {rss.peak - baseline:.0f} MB above the"
        f" process before the epoch; byte budget {BUDGET_GB * 1024:.0f} MB"
    )


def epoch_windows_per_s(root: str, sidecars: Path, s3=None) -> tuple[float, int]:
    """windows/s of one epoch of the module, and the bytes S3 sent for it (after setup)."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        root,
        delta_timestamps=LEROBOT_DELTAS,
        num_splits=24,
        batch_size=16,
        sidecar_dir=str(sidecars),
        byte_budget_gb=BUDGET_GB,
        storage_options=s3.storage_options() if s3 else None,
    )
    dm.setup("fit")
    if s3:
        s3.bytes_served(reset=True)
    start = time.perf_counter()
    windows = sum(len(batch["index"]) for batch in dm.train_dataloader())
    elapsed = time.perf_counter() - start
    return windows / elapsed, s3.bytes_served() if s3 else 0


def compare_s3(root: Path, rounds: int, latency_ms: float, json_path: Path | None) -> None:
    """One epoch from local disk and from S3 (moto on 127.0.0.1, each request answered
    after ``latency_ms``), side by side, ``rounds`` times; the figures also kept in the
    results file ``json_path``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3_server import S3Server

    video_bytes = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    with S3Server(root.parent / "moto.log", latency_ms=latency_ms) as s3:
        s3.create_bucket("bench")
        s3.upload(root, "s3://bench/dataset")
        local, remote, served = [], [], []
        for _ in range(rounds):
            local.append(epoch_windows_per_s(str(root), root.parent / "local")[0])
            rate, sent = epoch_windows_per_s("s3://bench/dataset", root.parent / "s3", s3)
            remote.append(rate)
            served.append(sent / video_bytes)
    ratios = [r / loc for r, loc in zip(remote, local, strict=True)]
    print(
        f"dataset: {video_bytes} bytes of MP4; S3 answers after {latency_ms:g} ms;"
        f" medians of {rounds} rounds (range)"
    )
    print(
        f"windows/s: local {_spread(local, 0)}, S3 {_spread(remote, 0)};"
        f" S3 / local (paired by round) {_spread(ratios)}"
    )
    print(f"bytes served by S3 per epoch / video bytes: {_spread(served)}")
    if json_path:
        figures = {
            "local_windows_per_s": spread(local),
            "s3_windows_per_s": spread(remote),
            "s3_over_local": spread(ratios),
            "bytes_over_video": spread(served),
        }
        rounds_run = [
            {"local_windows_per_s": a, "s3_windows_per_s": b, "bytes_over_video": c}
            for a, b, c in zip(local, remote, served, strict=True)
        ]
        result = {
            "latency_ms": latency_ms,
            "rounds": rounds,
            "video_bytes": video_bytes,
            "byte_budget_gb": BUDGET_GB,
            "num_workers": 0,
            "figures": figures,
            "runs": rounds_run,
        }
        save(json_path, f"{latency_ms:g} ms", result)


LEROBOT_DELTAS = {
    FRONT: [-2 / 30, -1 / 30, 0.0],
    WRIST: [0.0],
    "action": [i / 30 for i in range(8)],
}


def workers_run(root: str, sidecars: str, workers: int, epochs: int, step_ms: float) -> dict:
    """``setup``, then ``epochs`` epochs at ``workers`` workers (run in a fresh process),
    with a training step of ``step_ms`` per batch (0: none)."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        root,
        delta_timestamps=LEROBOT_DELTAS,
        num_splits=24,
        batch_size=16,
        sidecar_dir=sidecars,
        num_workers=workers,
    )
    start = time.perf_counter()
    dm.setup("fit")
    setup_s = time.perf_counter() - start
    results = []
    for _ in range(epochs):
        start, first, windows = time.perf_counter(), None, 0
        for batch in dm.train_dataloader():
            first = time.perf_counter() - start if first is None else first
            windows += len(batch["index"])
            if step_ms:
                time.sleep(step_ms / 1000)
        elapsed = time.perf_counter() - start
        results.append({"first_batch_s": first, "epoch_s": elapsed, "windows": windows})
    dm.teardown("fit")
    return {"setup_s": setup_s, "epochs": results}


def _spread(values: list[float], digits: int = 2) -> str:
    """A median with its range, for a line of the report."""
    low, high = min(values), max(values)
    return f"{statistics.median(values):.{digits}f} ({low:.{digits}f}-{high:.{digits}f})"


def compare_workers(
    root: Path,
    rounds: int,
    counts: list[int],
    epochs: int,
    step_ms: float,
    json_path: Path | None,
) -> None:
    """Each worker count in a fresh process, interleaved, ``rounds`` times; every round's
    figures also kept in the results file ``json_path`` (``benchmarks/plots.py`` draws
    them)."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    sidecars = root.parent / "sidecars"
    VideoEpisodeDataModule(
        str(root),
        delta_timestamps=LEROBOT_DELTAS,
        num_splits=24,
        batch_size=16,
        sidecar_dir=str(sidecars),
    ).setup("fit")  # builds the sidecars, not timed
    runs: dict[int, list[dict]] = {count: [] for count in counts}
    for _ in range(rounds):
        for count in counts:
            arguments = [
                __file__,
                "--one",
                str(count),
                str(root),
                str(sidecars),
                str(epochs),
                str(step_ms),
            ]
            runs[count].append(run_fresh(arguments, f"{count} workers:"))
    frames = sum(pq.read_metadata(p).num_rows for p in sorted((root / "data").rglob("*.parquet")))
    print(
        f"dataset: 24 episodes, {frames} frames, 2 cameras of 96x96 (h264, B-frames, GOP 30);"
        f" batch 16, num_splits 24; step {step_ms:g} ms;"
        f" medians of {rounds} rounds (range)"
    )
    for count in counts:
        print(f"{count} workers: setup {_spread([r['setup_s'] for r in runs[count]])} s")
        for epoch in range(epochs):
            done = [r["epochs"][epoch] for r in runs[count]]
            rates = [e["windows"] / e["epoch_s"] for e in done]
            print(
                f"  epoch {epoch}: first batch {_spread([e['first_batch_s'] for e in done])} s,"
                f" epoch {_spread([e['epoch_s'] for e in done])} s,"
                f" {_spread(rates, 0)} windows/s"
            )
    base = counts[0]
    for count in counts[1:]:
        for epoch in range(epochs):
            pairs = list(zip(runs[count], runs[base], strict=True))
            # the same windows in each epoch: the ratio of windows/s is that of times
            ratio = [
                b["epochs"][epoch]["epoch_s"] / a["epochs"][epoch]["epoch_s"] for a, b in pairs
            ]
            extra = [
                a["setup_s"] + a["epochs"][0]["epoch_s"] - b["setup_s"] - b["epochs"][0]["epoch_s"]
                for a, b in pairs
            ]
            note = f"; setup + epoch 0, {count} - {base}: {_spread(extra)} s" if epoch == 0 else ""
            print(f"epoch {epoch} windows/s, {count} workers / {base}: {_spread(ratio)}{note}")
    if json_path:
        figures = {"rounds": rounds, "step_ms": step_ms, "counts": counts, "runs": runs}
        save(json_path, f"step {step_ms:g} ms", figures)


MEMORY_BUDGET_GB = 0.05


def memory_run(root: str, sidecars: str, workers: int) -> dict:
    """One epoch under ``MEMORY_BUDGET_GB`` at ``workers`` workers (in a fresh process),
    the workers started before it."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        root,
        delta_timestamps=LEROBOT_DELTAS,
        num_splits=24,
        batch_size=16,
        sidecar_dir=sidecars,
        byte_budget_gb=MEMORY_BUDGET_GB,
        num_workers=workers,
    )
    dm.setup("fit")
    after_setup = tree_rss_mb()
    source = dm.stream.source
    if workers:
        pool = source.start_workers(workers, dm.batch_size)
        deadline = time.monotonic() + 120
        while not pool.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not start within 120 s")
            time.sleep(0.01)
    baseline = tree_rss_mb()
    anchors: collections.Counter = collections.Counter()
    curve, held = [], []
    with PeakRss() as rss:
        for batch in dm.train_dataloader():
            anchors.update(batch["index"].tolist())
            curve.append(tree_rss_mb())
            held.append(dm.stream.counters()["resident_bytes"])
    counters = dm.stream.counters()
    dm.teardown("fit")
    expected = source.split_len * source.num_splits
    return {
        "after_setup": after_setup,
        "baseline": baseline,
        "peak": rss.peak,
        "curve": [curve[int(q * (len(curve) - 1))] for q in (0.1, 0.5, 0.9)],
        "resident_peak_mb": max(held) / 2**20,
        "exact": len(anchors) == expected and set(anchors.values()) == {1},
        "decoded_per_delivered": counters["frames_decoded"] / (4 * sum(anchors.values())),
    }


def compare_memory(root: Path) -> None:
    """0 and 2 workers under a small byte budget, each in a fresh process."""
    sidecars = root.parent / "sidecars"
    frames = sum(pq.read_metadata(p).num_rows for p in sorted((root / "data").rglob("*.parquet")))
    budget_mb = MEMORY_BUDGET_GB * 1024
    print(
        f"dataset: 24 episodes, {frames} frames, 2 cameras of 96x96:"
        f" {frames * 2 * 3 * 96 * 96 / 2**20:.0f} MB of decoded frames;"
        f" byte budget {budget_mb:.1f} MB, bound 1.5 x budget + 60 MB ="
        f" {1.5 * budget_mb + 60:.0f} MB"
    )
    for workers in (0, 2):
        arguments = [__file__, "--memory-one", str(workers), str(root), str(sidecars)]
        r = run_fresh(arguments, f"{workers} workers:")
        above = r["peak"] - r["baseline"]
        print(
            f"{workers} workers: RSS after setup {r['after_setup']:.0f} MB, after the"
            f" workers' start-up {r['baseline']:.0f} MB; over the epoch 10/50/90%"
            f" {' / '.join(f'{x:.0f}' for x in r['curve'])} MB, peak {r['peak']:.0f} MB:"
            f" {above:.0f} MB above the baseline ({above / budget_mb:.2f}x the budget,"
            f" {'within' if above <= 1.5 * budget_mb + 60 else 'OVER'} the bound);"
            f" resident_bytes at most {r['resident_peak_mb']:.1f} MB;"
            f" epoch exact: {r['exact']}; decoded frames per delivered frame"
            f" {r['decoded_per_delivered']:.2f}"
        )


def main() -> None:
    if sys.argv[1:2] == ["--scale"]:
        import video_scale

        video_scale.main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["--one"]:
        workers, root, sidecars, epochs, step_ms = sys.argv[2:7]
        hand_back(workers_run(root, sidecars, int(workers), int(epochs), float(step_ms)))
        return
    if sys.argv[1:2] == ["--memory-one"]:
        workers, root, sidecars = sys.argv[2:5]
        hand_back(memory_run(root, sidecars, int(workers)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--naive-windows", type=int, default=400)
    parser.add_argument("--s3", action="store_true", help="local disk next to S3 (moto)")
    parser.add_argument(
        "--latency-ms", type=float, default=20.0, help="--s3: the store's time to first byte"
    )
    parser.add_argument("--workers", action="store_true", help="0 workers next to 2")
    parser.add_argument(
        "--worker-counts", default="0,2", help="--workers: the counts compared, first the base"
    )
    parser.add_argument("--epochs", type=int, default=3, help="--workers: epochs per process")
    parser.add_argument("--step-ms", type=float, default=0.0, help="--workers: step per batch")
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="--workers, --s3: also keep the figures there"
    )
    parser.add_argument("--memory", action="store_true", help="memory under a small budget")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    args = parser.parse_args()
    from lightning_stream.video.synthetic import write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dataset"
        lerobot = args.memory or args.workers or args.s3
        low, high = (150, 281) if lerobot else (40, 121)
        lengths = np.random.default_rng(0).integers(low, high, args.episodes).tolist()
        # a LeRobot-shaped dataset: camera-like texture and x264's B-frame settings
        options = {"codec": "h264-camera", "texture": True} if lerobot else {}
        write_dataset(root, lengths, **options)
        if args.memory:
            compare_memory(root)
        elif args.s3:
            compare_s3(root, args.rounds, args.latency_ms, args.json)
        elif args.workers:
            counts = [int(c) for c in args.worker_counts.split(",")]
            compare_workers(root, args.rounds, counts, args.epochs, args.step_ms, args.json)
        else:
            run(root, args.naive_windows)


if __name__ == "__main__":
    main()
