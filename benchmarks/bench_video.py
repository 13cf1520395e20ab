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

    python benchmarks/bench_video.py --workers

``--workers`` runs the module at 0 and at 2 workers, each in a fresh process, alternating,
``--rounds`` times: ``setup`` then three epochs. Reported per configuration (the best
round): the time from the start of ``setup`` to the first batch, then per epoch the time
to its first batch and windows/s over the epoch after its first batch; then 2 workers /
0 workers over the epochs after the first (the workers persist: started once the first
batch is out, they serve every epoch), and the median over rounds of the time from
``setup`` to the first batch.

    python benchmarks/bench_video.py --memory

``--memory`` bounds memory by the byte budget on a larger dataset (24 episodes of 150-280
frames, about 290 MB of decoded frames): ``num_splits=24``, windows of the front camera at
-2/30, -1/30 and 0 s, the wrist camera at 0 s and 8 future actions, ``byte_budget_gb=0.05``,
at 0 and at 2 workers, each in a fresh process. Per configuration: the process tree's RSS
after ``setup`` and the workers' start-up (the baseline: ``wait_for_workers`` starts them
before the epoch), its peak over one epoch above that, next to ``1.5 x budget + 60 MB``
and to the largest ``loader/resident_bytes`` (decoded frames held, summed over the
workers); the epoch's exactness (every anchor once) and decoded frames per delivered
frame. A third run leaves the workers to start once the first batch is out (the default):
the main process serves their batches until they are ready, and its own RSS above its RSS
after ``setup`` is reported.

    python benchmarks/bench_video.py --s3

``--s3`` starts an S3-protocol server on 127.0.0.1 (moto, ``tests/s3_server.py``),
uploads the same dataset to a bucket, and runs one epoch of the module from local disk
and one from S3 in this process, alternating, ``--rounds`` times (sidecars built at setup,
not timed). It reports S3 windows/s over local windows/s, and the bytes the server sent
during the epoch (response bodies of every GET, counted on the server side) over the
dataset's MP4 bytes.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import av
import numpy as np
import pyarrow.parquet as pq
from measure import PeakRss, process_rss_mb, tree_rss_mb

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
        str(root), delta_timestamps=DELTAS, num_splits=24, batch_size=16,
        sidecar_dir=str(sidecars), byte_budget_gb=BUDGET_GB,
    )  # fmt: skip
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
    episodes = {e.index: e for e in dataset.episodes}
    start = time.perf_counter()
    naive_delivered = naive_decoded = naive_bytes = 0
    for episode_index, frame in anchors[:naive_windows]:
        episode = episodes[episode_index]
        for camera, offsets in ((FRONT, [-3, 0]), (WRIST, [0])):
            relative, from_timestamp = episode.videos[camera]
            frames = [min(max(frame + o, 0), episode.length - 1) for o in offsets]
            seconds = [from_timestamp + f / fps for f in frames]
            got, decoded, read = naive_window(root / relative, seconds, fps)
            naive_delivered += got
            naive_decoded += decoded
            naive_bytes += read
    naive_time = time.perf_counter() - start
    module_rate = windows / module_time
    naive_rate = min(naive_windows, len(anchors)) / naive_time
    print(f"dataset: {len(episodes)} episodes, {sum(e.length for e in episodes.values())} frames,"
          f" 2 cameras, {video_bytes} bytes of MP4")  # fmt: skip
    print(f"module: {windows} windows in {module_time:.2f} s = {module_rate:.0f} windows/s")
    print(f"naive:  {min(naive_windows, len(anchors))} windows in {naive_time:.2f} s"
          f" = {naive_rate:.0f} windows/s")  # fmt: skip
    naive_count = min(naive_windows, len(anchors))
    module_decoded = counters["frames_decoded"] / delivered
    naive_decoded_ratio = naive_decoded / max(1, naive_delivered)
    naive_epoch_bytes = naive_bytes * len(anchors) / max(1, naive_count)
    print(f"windows/s, module / naive: {module_rate / naive_rate:.1f}x")
    print(f"decoded frames per delivered frame: module {module_decoded:.2f}, naive"
          f" {naive_decoded_ratio:.2f}")  # fmt: skip
    module_bytes = counters["bytes_loaded"] / video_bytes
    print(f"bytes read per epoch / video bytes: module {module_bytes:.2f}, naive"
          f" (extrapolated) {naive_epoch_bytes / video_bytes:.1f}")  # fmt: skip
    print(
        f"peak RSS (process tree): {rss.peak:.0f} MB, {rss.peak - baseline:.0f} MB above the"
        f" process before the epoch; byte budget {BUDGET_GB * 1024:.0f} MB"
    )


def epoch_windows_per_s(root: str, sidecars: Path, s3=None) -> tuple[float, int]:
    """windows/s of one epoch of the module, and the bytes S3 sent for it (after setup)."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        root, delta_timestamps=DELTAS, num_splits=24, batch_size=16, sidecar_dir=str(sidecars),
        byte_budget_gb=BUDGET_GB, storage_options=s3.storage_options() if s3 else None,
    )  # fmt: skip
    dm.setup("fit")
    if s3:
        s3.bytes_served(reset=True)
    start = time.perf_counter()
    windows = sum(len(batch["index"]) for batch in dm.train_dataloader())
    elapsed = time.perf_counter() - start
    return windows / elapsed, s3.bytes_served() if s3 else 0


def compare_s3(root: Path, rounds: int) -> None:
    """One epoch from local disk and from S3 (moto on 127.0.0.1), side by side."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests.s3_server import S3Server

    video_bytes = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    with S3Server(root.parent / "moto.log") as s3:
        s3.create_bucket("bench")
        s3.upload(root, "s3://bench/dataset")
        local_rate = s3_rate = 0.0
        served = []
        for _ in range(rounds):
            local_rate = max(local_rate, epoch_windows_per_s(str(root), root.parent / "local")[0])
            rate, sent = epoch_windows_per_s("s3://bench/dataset", root.parent / "s3", s3)
            s3_rate = max(s3_rate, rate)
            served.append(sent)
    print(f"dataset: {video_bytes} bytes of MP4")
    print(f"windows/s: local {local_rate:.0f}, S3 {s3_rate:.0f}; S3 / local"
          f" {s3_rate / local_rate:.2f}")  # fmt: skip
    print(f"bytes served by S3 per epoch / video bytes: {min(served) / video_bytes:.2f}")


def workers_run(root: str, sidecars: str, workers: int) -> dict:
    """setup, then three epochs, at ``workers`` workers (run in a fresh process)."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        root, delta_timestamps=DELTAS, num_splits=24, batch_size=16, sidecar_dir=sidecars,
        byte_budget_gb=BUDGET_GB, num_workers=workers,
    )  # fmt: skip
    start = time.perf_counter()
    dm.setup("fit")
    epochs = []
    for _ in range(3):
        stamps = [(time.perf_counter(), len(batch["index"])) for batch in dm.train_dataloader()]
        after = sum(n for _, n in stamps[1:]) / (stamps[-1][0] - stamps[0][0])
        epochs.append({"first_batch_s": stamps[0][0] - start, "windows_per_s": after})
        if len(epochs) == 1:
            epochs[0]["from_setup_s"] = epochs[0]["first_batch_s"]
        start = time.perf_counter()
    dm.teardown("fit")
    return {"epochs": epochs}


def compare_workers(root: Path, rounds: int) -> None:
    """0 and 2 workers, each in a fresh process, alternating."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    sidecars = root.parent / "sidecars"
    VideoEpisodeDataModule(
        str(root), delta_timestamps=DELTAS, num_splits=24, batch_size=16, sidecar_dir=str(sidecars)
    ).setup("fit")  # builds the sidecars, not timed
    best: dict[int, dict] = {}
    firsts: dict[int, list[float]] = {0: [], 2: []}  # setup to the first batch, every round
    for _ in range(rounds):
        for workers in (0, 2):
            command = [sys.executable, __file__, "--one", str(workers), str(root), str(sidecars)]
            output = subprocess.run(command, capture_output=True, text=True, check=False)
            line = next((x for x in output.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{workers} workers failed:\n{output.stderr[-4000:]}")
            result = json.loads(line.removeprefix("RESULT "))
            firsts[workers].append(result["epochs"][0]["from_setup_s"])
            rate = statistics.mean(e["windows_per_s"] for e in result["epochs"][1:])
            if workers not in best or rate > best[workers]["rate"]:
                best[workers] = {**result, "rate": rate}
    for workers, result in best.items():
        epochs = result["epochs"]
        print(f"{workers} workers: setup to 1st batch {epochs[0]['from_setup_s']:.2f} s")
        for number, epoch in enumerate(epochs):
            print(f"  epoch {number}: 1st batch after {epoch['first_batch_s']:.2f} s,"
                  f" {epoch['windows_per_s']:.0f} windows/s after it")  # fmt: skip
    later = [statistics.mean(best[w]["epochs"][e]["first_batch_s"] for e in (1, 2)) for w in (0, 2)]
    print(f"windows/s after the first epoch, 2 workers / 0 workers:"
          f" {best[2]['rate'] / best[0]['rate']:.2f}")  # fmt: skip
    first = {w: statistics.median(times) for w, times in firsts.items()}
    print(f"first batch of epochs 1-2, 2 workers / 0 workers: {later[1] / later[0]:.2f};"
          f" of epoch 0 (from setup, median of {rounds} rounds): {first[2]:.2f} s"
          f" / {first[0]:.2f} s = {first[2] / first[0]:.2f}")  # fmt: skip


MEMORY_BUDGET_GB = 0.05
MEMORY_DELTAS = {
    FRONT: [-2 / 30, -1 / 30, 0.0],
    WRIST: [0.0],
    "action": [i / 30 for i in range(8)],
}


def memory_run(root: str, sidecars: str, workers: int, wait: bool) -> dict:
    """One epoch under ``MEMORY_BUDGET_GB`` at ``workers`` workers (in a fresh process);
    ``wait``: for the workers to start before the epoch (else they start once its first
    batch is out, and the main process serves their batches until they are ready)."""
    from lightning_stream.video.datamodule import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        root, delta_timestamps=MEMORY_DELTAS, num_splits=24, batch_size=16,
        sidecar_dir=sidecars, byte_budget_gb=MEMORY_BUDGET_GB, num_workers=workers,
    )  # fmt: skip
    dm.setup("fit")
    after_setup, main_after_setup = tree_rss_mb(), process_rss_mb()
    source = dm.stream.source
    if wait and not source.wait_for_workers(120):
        raise RuntimeError("the workers did not start within 120 s")
    baseline = tree_rss_mb()
    anchors: collections.Counter = collections.Counter()
    curve, held, main = [], [], []
    with PeakRss() as rss:
        for batch in dm.train_dataloader():
            anchors.update(batch["index"].tolist())
            curve.append(tree_rss_mb())
            main.append(process_rss_mb())
            held.append(dm.stream.counters()["resident_bytes"])
    counters = dm.stream.counters()
    dm.teardown("fit")
    expected = source.split_len * source.num_splits
    return {
        "after_setup": after_setup, "baseline": baseline, "peak": rss.peak,
        "main_above_setup": max(main) - main_after_setup,
        "main_end_above_setup": main[-1] - main_after_setup,
        "main_frames_decoded": source.reader.frames_decoded,
        "curve": [curve[int(q * (len(curve) - 1))] for q in (0.1, 0.5, 0.9)],
        "resident_peak_mb": max(held) / 2**20,
        "exact": len(anchors) == expected and set(anchors.values()) == {1},
        "decoded_per_delivered": counters["frames_decoded"] / (4 * sum(anchors.values())),
    }  # fmt: skip


def compare_memory(root: Path) -> None:
    """0 and 2 workers under a small byte budget, each in a fresh process."""
    sidecars = root.parent / "sidecars"
    frames = sum(pq.read_metadata(p).num_rows for p in sorted((root / "data").rglob("*.parquet")))
    budget_mb = MEMORY_BUDGET_GB * 1024
    print(f"dataset: 24 episodes, {frames} frames, 2 cameras of 96x96:"
          f" {frames * 2 * 3 * 96 * 96 / 2**20:.0f} MB of decoded frames;"
          f" byte budget {budget_mb:.1f} MB, bound 1.5 x budget + 60 MB ="
          f" {1.5 * budget_mb + 60:.0f} MB")  # fmt: skip
    for workers, wait in ((0, True), (2, True), (2, False)):
        command = [sys.executable, __file__, "--memory-one", str(workers), str(root),
                   str(sidecars), "wait" if wait else "handoff"]  # fmt: skip
        output = subprocess.run(command, capture_output=True, text=True, check=False)
        line = next((x for x in output.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"{workers} workers failed:\n{output.stderr[-4000:]}")
        r = json.loads(line.removeprefix("RESULT "))
        if not wait:
            print(f"{workers} workers started by the first batch: the main process decoded"
                  f" {r['main_frames_decoded']} frames for them, its RSS peaked"
                  f" {r['main_above_setup']:.0f} MB above its RSS after setup and ended"
                  f" {r['main_end_above_setup']:.0f} MB above it; resident_bytes at most"
                  f" {r['resident_peak_mb']:.1f} MB; epoch exact: {r['exact']}")  # fmt: skip
            continue
        above = r["peak"] - r["baseline"]
        print(f"{workers} workers: RSS after setup {r['after_setup']:.0f} MB, after the"
              f" workers' start-up {r['baseline']:.0f} MB; over the epoch 10/50/90%"
              f" {' / '.join(f'{x:.0f}' for x in r['curve'])} MB, peak {r['peak']:.0f} MB:"
              f" {above:.0f} MB above the baseline ({above / budget_mb:.2f}x the budget,"
              f" {'within' if above <= 1.5 * budget_mb + 60 else 'OVER'} the bound);"
              f" resident_bytes at most {r['resident_peak_mb']:.1f} MB;"
              f" epoch exact: {r['exact']}; decoded frames per delivered frame"
              f" {r['decoded_per_delivered']:.2f}")  # fmt: skip


def main() -> None:
    if sys.argv[1:2] == ["--one"]:
        workers, root, sidecars = sys.argv[2:5]
        print("RESULT " + json.dumps(workers_run(root, sidecars, int(workers))))
        return
    if sys.argv[1:2] == ["--memory-one"]:
        workers, root, sidecars, mode = sys.argv[2:6]
        result = memory_run(root, sidecars, int(workers), mode == "wait")
        print("RESULT " + json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--naive-windows", type=int, default=400)
    parser.add_argument("--s3", action="store_true", help="local disk next to S3 (moto)")
    parser.add_argument("--workers", action="store_true", help="0 workers next to 2")
    parser.add_argument("--memory", action="store_true", help="memory under a small budget")
    parser.add_argument("--rounds", type=int, default=2, help="rounds (best kept)")
    args = parser.parse_args()
    from lightning_stream.video.synthetic import write_dataset

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "dataset"
        low, high = (150, 281) if args.memory else (40, 121)
        lengths = np.random.default_rng(0).integers(low, high, args.episodes).tolist()
        write_dataset(root, lengths)
        if args.memory:
            compare_memory(root)
        elif args.s3:
            compare_s3(root, args.rounds)
        elif args.workers:
            compare_workers(root, args.rounds)
        else:
            run(root, args.naive_windows)


if __name__ == "__main__":
    main()
