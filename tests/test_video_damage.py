"""Damaged and incomplete LeRobot datasets: errors that name what is wrong, or skipped windows."""

import collections
import csv
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

from lightning_stream import ledger
from lightning_stream.video.datamodule import VideoEpisodeDataModule
from lightning_stream.video.decode import DamagedVideoError, DamagedVideoWarning
from lightning_stream.video.sidecar import VideoFile, load_or_build
from lightning_stream.video.synthetic import frame_index, write_dataset

from .conftest import train
from .test_video_datamodule import LENGTHS, STARTS

FRONT, WRIST = "observation.images.front", "observation.images.wrist"
FPS = 30
# File 0 holds episodes 0-3 (25, 14, 31, 18 frames): its frame 45 is frame 6 of episode 2.
DAMAGED_FRAME, EPISODE, EPISODE_FRAME = 45, 2, 6


def damage_packet(mp4, frame: int, scratch) -> None:
    """Overwrite the NAL length prefix of the packet showing ``frame``, inside ``mdat``.

    The packet is located through the sidecar's sample table (its byte offset in the file).
    """
    track, _ = load_or_build(VideoFile.open(str(mp4)), scratch, "locate")
    shown = np.round(track.pts / track.timescale * FPS).astype(int)
    packet = int(np.flatnonzero(shown == frame)[0])
    data = bytearray(mp4.read_bytes())
    offset = int(track.offset[packet])
    data[offset : offset + 4] = b"\xff\xff\xff\xff"
    mp4.write_bytes(bytes(data))


def write_damaged(workdir, codec: str):
    write_dataset(workdir / "db", LENGTHS, codec=codec)
    mp4 = workdir / "db" / "videos" / FRONT / "chunk-000" / "file-000.mp4"
    damage_packet(mp4, DAMAGED_FRAME, workdir / "scratch")
    return workdir, mp4


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    return write_damaged(tmp_path_factory.mktemp("damaged"), "h264")


def make(root, workdir, **options):
    settings = {
        "delta_timestamps": {FRONT: [-1 / FPS, 0.0]},
        "num_splits": 12,
        "batch_size": 5,
        **options,
    }
    return VideoEpisodeDataModule(str(root), sidecar_dir=str(workdir / "sidecars"), **settings)


def names_damage(message: str, mp4) -> bool:
    expected = (
        f"episode {EPISODE}, camera '{FRONT}', frame {EPISODE_FRAME} at"
        f" {EPISODE_FRAME / FPS:.3f} s of the episode ({DAMAGED_FRAME / FPS:.3f} s in the file)"
    )
    return str(mp4) in message and expected in message


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_a_damaged_packet_raises_naming_file_episode_and_time(damaged, tmp_path, codec):
    # h264: the decoder rejects the packet; AV1 (libdav1d): it gives no frame for it
    workdir, mp4 = damaged if codec == "h264" else write_damaged(tmp_path, codec)
    dm = make(workdir / "db", workdir)
    dm.setup("fit")
    with pytest.raises(DamagedVideoError) as caught:
        for _ in dm.train_dataloader():
            pass
    assert names_damage(str(caught.value), mp4), caught.value
    assert "on_decode_error='skip'" in str(caught.value)


def test_skip_mode_warns_counts_and_serves_the_rest_of_the_epoch_intact(damaged):
    workdir, mp4 = damaged
    dm = make(workdir / "db", workdir, on_decode_error="skip")
    dm.setup("fit")
    anchors = collections.Counter()
    with pytest.warns(DamagedVideoWarning) as warned:
        for batch in dm.train_dataloader():
            assert "_skip_reason" not in batch
            for i, index in enumerate(batch["index"].tolist()):
                anchors[index] += 1
                images = batch[FRONT][i]
                episode, frame = int(batch["episode_index"][i]), int(batch["frame_index"][i])
                expected = STARTS[episode] + np.clip([frame - 1, frame], 0, LENGTHS[episode] - 1)
                assert [frame_index(im.permute(1, 2, 0).numpy()) for im in images] == list(expected)
    skipped = sorted(set(range(sum(LENGTHS))) - set(anchors))
    assert set(anchors.values()) == {1}
    assert skipped and DAMAGED_FRAME in skipped and len(skipped) <= 30  # at most a GOP
    assert all(STARTS[EPISODE] <= s < STARTS[EPISODE] + LENGTHS[EPISODE] for s in skipped)
    assert dm.stream.counters()["skipped_windows"] == len(skipped) == len(warned)
    frames = sorted(int(re.search(r"at frame (\d+) ", str(w.message))[1]) for w in warned)
    assert [STARTS[EPISODE] + f for f in frames] == skipped
    assert all(names_damage(str(w.message), mp4) for w in warned)


def test_a_batch_whose_every_window_is_skipped_is_not_handed_out(damaged):
    workdir, _ = damaged
    dm = make(workdir / "db", workdir, on_decode_error="skip", batch_size=1)
    dm.setup("fit")
    with pytest.warns(DamagedVideoWarning):
        sizes = [len(batch["index"]) for batch in dm.train_dataloader()]
    assert set(sizes) == {1}
    assert len(sizes) == sum(LENGTHS) - dm.stream.counters()["skipped_windows"]


def test_skipped_windows_stay_consumed_across_a_resume_and_reach_the_logger(damaged):
    workdir, _ = damaged
    flags = ["--video", "--sidecar-dir", str(workdir / "sidecars"), "--on-decode-error", "skip"]
    flags += ["--max-epochs", "1"]
    saved, _ = train(workdir, "skip-save", *flags, "--save-at", "30", "--monitor")
    resumed, _ = train(
        workdir, "skip-resume", *flags, "--ckpt-path", str(saved / "ckpt" / "step=30.ckpt")
    )
    entries = ledger.kept(ledger.read(saved / "ledger"), 30, ledger.read(resumed / "ledger"))
    per_epoch = collections.defaultdict(collections.Counter)
    for entry in entries:
        per_epoch[entry["epoch"]].update(entry["ids"])
    assert sorted(per_epoch) == [0]
    for counts in per_epoch.values():
        missing = set(range(sum(LENGTHS))) - set(counts)
        assert set(counts.values()) == {1}, "no window twice, skipped ones never"
        assert 0 < len(missing) <= 30 and all(
            STARTS[EPISODE] <= m < STARTS[EPISODE] + LENGTHS[EPISODE] for m in missing
        )
    (metrics,) = (saved / "ckpt" / "logs").glob("*/metrics.csv")
    with metrics.open() as rows:
        logged = {
            int(row["step"]): float(row["loader/skipped_windows"])
            for row in csv.DictReader(rows)
            if row.get("loader/skipped_windows")
        }
    assert logged[29] > 0, "windows were skipped before the checkpoint, so it counts them"


def test_a_camera_without_its_episode_columns_fails_at_setup(tmp_path):
    root = write_dataset(tmp_path / "db", [12, 9])
    path = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(
        table.drop([c for c in table.column_names if c.startswith(f"videos/{WRIST}/")]), path
    )
    with pytest.raises(ValueError, match=rf"camera '{WRIST}' is a video feature of meta/info.json"):
        make(root, tmp_path, num_splits=3).setup("fit")


def test_a_missing_video_file_fails_at_setup_naming_camera_and_file(tmp_path):
    root = write_dataset(tmp_path / "db", [12, 9])
    mp4 = root / "videos" / WRIST / "chunk-000" / "file-000.mp4"
    mp4.unlink()
    with pytest.raises(FileNotFoundError, match=rf"video file {mp4} of camera '{WRIST}'"):
        make(root, tmp_path, num_splits=3).setup("fit")
