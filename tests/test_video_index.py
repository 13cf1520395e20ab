"""MP4 sample tables parsed from byte ranges, and frames decoded from their packets."""

import av
import numpy as np
import pytest

from lightning_stream.video.decode import FrameLookupError, decode, frames_at
from lightning_stream.video.mp4 import Mp4Error, _presentation_shift, read_video_track
from lightning_stream.video.synthetic import frame_index, write_video

EPISODES = [20, 35, 40]  # frames of three episodes concatenated in one file
FRAMES = sum(EPISODES)
FPS = 30


class Reader:
    """Byte-range reads of a local file, recording what was read."""

    def __init__(self, path):
        self.data = path.read_bytes()
        self.reads = []

    def __call__(self, offset, size):
        self.reads.append((offset, size))
        return self.data[offset : offset + size]


@pytest.fixture(scope="module", params=["h264", "h264-faststart", "av1"])
def video(request, tmp_path_factory):
    codec = request.param.split("-")[0]
    path = tmp_path_factory.mktemp("video") / f"{request.param}.mp4"
    write_video(path, codec, range(FRAMES), FPS, faststart=request.param.endswith("faststart"))
    reader = Reader(path)
    return path, reader, read_video_track(reader, len(reader.data), str(path))


def test_index_matches_the_pyav_demuxer(video):
    path, _, track = video
    with av.open(str(path)) as container:
        packets = [p for p in container.demux(container.streams.video[0]) if p.size]
    assert len(packets) == len(track.pts) == FRAMES
    assert [p.pts for p in packets] == track.pts.tolist()
    assert [p.dts for p in packets] == track.dts.tolist()
    assert [p.pos for p in packets] == track.offset.tolist()
    assert [p.size for p in packets] == track.size.tolist()
    assert [p.is_keyframe for p in packets] == track.keyframe.tolist()
    assert (track.width, track.height) == (96, 96) and track.extradata


def test_h264_files_have_b_frames(video):
    _, _, track = video
    if track.codec == "h264":
        assert not np.all(np.diff(track.pts) > 0), "presentation order differs from decode order"


@pytest.mark.parametrize(
    "window",
    [range(0, 4), range(17, 24), range(53, 58), range(88, FRAMES), range(29, 33), [5, 5, 5, 6]],
)
def test_decoded_frames_are_the_frames_they_claim(video, window):
    path, reader, track = video
    seconds = np.asarray(list(window)) / FPS
    wanted = frames_at(track, seconds, str(path), tolerance=0.5 / FPS)
    reader.reads.clear()
    images = decode(reader, track, wanted, str(path))
    assert [frame_index(image) for image in images] == list(window)
    ((offset, size),) = reader.reads  # one range read, from the keyframe before the window
    keyframe = np.flatnonzero(track.keyframe[: wanted.min() + 1])[-1]
    assert offset == track.offset[keyframe]
    assert size <= (track.offset + track.size)[: wanted.max() + 1].max() - offset


def test_random_windows_across_episode_boundaries(video):
    path, reader, track = video
    rng = np.random.default_rng(0)
    for _ in range(10):
        start = int(rng.integers(0, FRAMES - 6))
        window = list(range(start, start + 6))
        wanted = frames_at(track, np.asarray(window) / FPS, str(path), tolerance=0.5 / FPS)
        assert [frame_index(i) for i in decode(reader, track, wanted, str(path))] == window


def test_a_time_without_a_frame_fails_loudly(video):
    path, _, track = video
    with pytest.raises(FrameLookupError, match=r"no frame within 16\.7 ms of 10\.0000 s"):
        frames_at(track, np.asarray([10.0]), str(path), tolerance=0.5 / FPS)


def test_edit_lists_that_would_shift_frames_are_rejected():
    with pytest.raises(Mp4Error, match=r"cam\.mp4: its edit list"):
        _presentation_shift([(10, 0, 1, 0), (10, 512, 1, 0)], 1000, 15360, "cam.mp4")
    with pytest.raises(Mp4Error, match="rate other than 1"):
        _presentation_shift([(10, 0, 2, 0)], 1000, 15360, "cam.mp4")
    assert _presentation_shift([(1000, -1, 1, 0), (5000, 1024, 1, 0)], 1000, 15360, "x") == 14336


def test_truncated_and_corrupt_files_name_the_file(video):
    _, reader, _ = video
    for name, data in (
        ("truncated.mp4", reader.data[: len(reader.data) // 2]),
        ("noise.mp4", np.random.default_rng(1).bytes(50_000)),
    ):
        with pytest.raises(Mp4Error, match=name):
            read_video_track(lambda o, s, d=data: d[o : o + s], len(data), name)
