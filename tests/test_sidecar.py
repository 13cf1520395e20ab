"""Sidecar indexes: one build under contention, atomic install, rebuilt on replacement."""

import multiprocessing
import os
import signal
import struct
import time

import numpy as np
import pytest

from lightning_stream.video import sidecar
from lightning_stream.video.mp4 import Mp4Error
from lightning_stream.video.sidecar import VideoFile, load_or_build, sidecar_path
from lightning_stream.video.synthetic import write_video


def held_build(path, cache, arrived, builders):
    """Child process: say it arrived, then build; the one that builds holds its parser
    until every builder arrived, so the others ask for the sidecar while it is built."""
    parse = sidecar.read_video_track

    def held(*args):
        deadline = time.monotonic() + 120  # a hang guard only
        while len(arrived) < builders and time.monotonic() < deadline:
            time.sleep(0.01)
        return parse(*args)

    sidecar.read_video_track = held
    arrived.append(os.getpid())
    track, built = load_or_build(VideoFile.open(str(path)), cache, "dataset")
    return built, track.pts.tolist()


def killed_build(path, cache):
    """Child process: SIGKILL itself just before installing the sidecar it wrote."""
    os.replace = lambda *args: os.kill(os.getpid(), signal.SIGKILL)
    load_or_build(VideoFile.open(str(path)), cache, "dataset")


def run_in_children(target, *argument_lists):
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(argument_lists)) as pool:
        return pool.starmap(target, argument_lists)


@pytest.fixture
def mp4(tmp_path):
    return write_video(tmp_path / "videos" / "cam" / "file-000.mp4", "h264", range(60))


def test_four_concurrent_processes_build_once_and_agree(mp4, tmp_path):
    cache = tmp_path / "cache"
    with multiprocessing.get_context("spawn").Manager() as manager:
        arrived = manager.list()
        results = run_in_children(held_build, *[(mp4, cache, arrived, 4)] * 4)
        assert len(arrived) == 4
    assert sorted(built for built, _ in results) == [False, False, False, True]
    assert len({tuple(pts) for _, pts in results}) == 1
    track, built = load_or_build(VideoFile.open(str(mp4)), cache, "dataset")
    assert not built and track.pts.tolist() == results[0][1]


def test_a_build_killed_midway_leaves_the_previous_sidecar(mp4, tmp_path):
    cache = tmp_path / "cache"
    video = VideoFile.open(str(mp4))
    first, built = load_or_build(video, cache, "dataset")
    assert built
    installed = sidecar_path(cache, "dataset", video)
    before = installed.read_bytes()
    write_video(mp4, "h264", range(100, 160))  # replaced: the next open must rebuild
    context = multiprocessing.get_context("spawn")
    child = context.Process(target=killed_build, args=(mp4, cache))
    child.start()
    child.join(60)
    assert child.exitcode == -signal.SIGKILL
    assert installed.read_bytes() == before, "the previous sidecar is untouched"
    rebuilt, built = load_or_build(video, cache, "dataset")
    assert built and rebuilt.size.tolist() != first.size.tolist()


def test_a_replaced_mp4_of_the_same_size_is_reindexed(mp4, tmp_path):
    cache = tmp_path / "cache"
    video = VideoFile.open(str(mp4))
    original, _ = load_or_build(video, cache, "dataset")
    size = mp4.stat().st_size
    replacement = write_video(tmp_path / "other.mp4", "h264", range(1000, 1060))
    data = replacement.read_bytes()
    assert len(data) + 8 <= size, "the replacement is smaller, then padded to the same size"
    padding = size - len(data)
    data += struct.pack(">I4s", padding, b"free") + bytes(padding - 8)  # a valid 'free' box
    mp4.write_bytes(data)
    assert mp4.stat().st_size == size
    track, built = load_or_build(video, cache, "dataset")
    assert built and not np.array_equal(track.size, original.size)


def test_truncated_or_corrupt_mp4_names_the_file(mp4, tmp_path):
    data = mp4.read_bytes()
    mp4.write_bytes(data[: len(data) // 2])
    with pytest.raises(Mp4Error, match=f"{mp4}: .*truncated"):
        load_or_build(VideoFile.open(str(mp4)), tmp_path / "cache", "dataset")
    missing = tmp_path / "missing.mp4"
    with pytest.raises(FileNotFoundError, match=f"video file {missing} cannot be opened"):
        load_or_build(VideoFile.open(str(missing)), tmp_path / "cache", "dataset")


def test_build_sidecar_command_indexes_every_video_once(tmp_path):
    import subprocess
    import sys

    from lightning_stream.video.synthetic import write_dataset

    root = write_dataset(tmp_path / "dataset", [12, 9, 15], episodes_per_file=2)
    command = [sys.executable, "-m", "lightning_stream.cli", "build-sidecar", str(root)]
    command += ["--cache-dir", str(tmp_path / "cache")]
    first = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    second = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    assert first.count(", built") == 4 and second.count("up to date") == 4  # 2 cameras x 2 files
