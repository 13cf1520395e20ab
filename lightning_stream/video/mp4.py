"""The sample table of an MP4 video track, parsed from byte ranges (ISO/IEC 14496-12).

Only the box headers of the top level and the ``moov`` box are read, wherever ``moov``
is (before or after ``mdat``); sample payloads are never touched. Per sample, in decode
order: decode and presentation timestamps (composition offsets from ``ctts`` and the
edit list from ``elst`` applied), duration, byte offset, size and keyframe flag.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

ReadAt = Callable[[int, int], bytes]  # (offset, size) -> bytes

CODECS = {b"avc1": "h264", b"avc3": "h264", b"av01": "av1", b"hvc1": "hevc", b"hev1": "hevc"}
CONFIG_BOXES = {b"avcC", b"av1C", b"hvcC"}
CONTAINERS = {b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts"}
VISUAL_SAMPLE_ENTRY = 78  # bytes of a VisualSampleEntry after its box header


class Mp4Error(ValueError):
    """The file is not an MP4 whose video track this package can index."""


@dataclass(frozen=True)
class VideoTrack:
    """The first video track of an MP4 file.

    Timestamps are in units of ``1 / timescale`` seconds; ``pts`` is the presentation
    time on the movie timeline (the edit list applied), so the frame shown at second
    ``t`` has ``pts == round(t * timescale)``.
    """

    codec: str
    extradata: bytes
    timescale: int
    width: int
    height: int
    dts: np.ndarray
    pts: np.ndarray
    duration: np.ndarray
    offset: np.ndarray
    size: np.ndarray
    keyframe: np.ndarray


def _boxes(data: bytes, start: int = 0, end: int | None = None) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, box end) of each box in ``data[start:end]``."""
    end = len(data) if end is None else end
    position = start
    while position + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, position)
        header = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, position + 8)
            header = 16
        elif size == 0:
            size = end - position
        if size < header or position + size > end:
            raise Mp4Error(f"box {kind!r} at byte {position} overruns its parent")
        yield kind, position + header, position + size
        position += size


def _find_moov(read_at: ReadAt, file_size: int, name: str) -> bytes:
    position = 0
    while position + 8 <= file_size:
        header = read_at(position, min(16, file_size - position))
        size, kind = struct.unpack_from(">I4s", header)
        if size == 1:
            (size,) = struct.unpack_from(">Q", header, 8)
        elif size == 0:
            size = file_size - position
        if size < 8 or position + size > file_size:
            raise Mp4Error(
                f"{name}: box {kind!r} at byte {position} runs past the end of the file"
                " (truncated?)"
            )
        if kind == b"moof":
            raise Mp4Error(
                f"{name}: fragmented MP4 (moof boxes) is not supported; remux it, e.g."
                " ffmpeg -i in.mp4 -c copy -movflags +faststart out.mp4"
            )
        if kind == b"moov":
            return read_at(position, size)
        position += size
    raise Mp4Error(f"{name}: no moov box (not an MP4 file, or truncated)")


def _full_box(data: bytes, start: int) -> tuple[int, int]:
    """(version, payload start after version and flags)."""
    return data[start], start + 4


def _table(data: bytes, start: int, fields: str) -> np.ndarray:
    """The entry table of a full box whose payload is ``entry_count`` then entries."""
    (count,) = struct.unpack_from(">I", data, start)
    dtype = np.dtype([(f"f{i}", ">" + f) for i, f in enumerate(fields)])
    return np.frombuffer(data, dtype=dtype, count=count, offset=start + 4)


@dataclass
class _Track:
    handler: bytes = b""
    timescale: int = 0
    width: int = 0
    height: int = 0
    codec: str = ""
    extradata: bytes = b""
    boxes: dict | None = None
    edits: list | None = None


def _parse_trak(data: bytes, start: int, end: int) -> _Track:
    track = _Track(boxes={}, edits=[])

    def walk(begin: int, stop: int) -> None:
        for kind, payload, box_end in _boxes(data, begin, stop):
            if kind in CONTAINERS:
                walk(payload, box_end)
            elif kind == b"tkhd":
                version, body = _full_box(data, payload)
                skip = 32 if version == 1 else 20
                width, height = struct.unpack_from(">II", data, body + skip + 52)
                track.width, track.height = width >> 16, height >> 16
            elif kind == b"mdhd":
                version, body = _full_box(data, payload)
                (track.timescale,) = struct.unpack_from(
                    ">I", data, body + (16 if version == 1 else 8)
                )
            elif kind == b"hdlr":
                _, body = _full_box(data, payload)
                track.handler = data[body + 4 : body + 8]
            elif kind == b"stsd":
                _, body = _full_box(data, payload)
                for entry, entry_payload, entry_end in _boxes(data, body + 4, box_end):
                    track.codec = CODECS.get(entry, entry.decode("latin-1"))
                    children = entry_payload + VISUAL_SAMPLE_ENTRY
                    for child, child_payload, child_end in _boxes(data, children, entry_end):
                        if child in CONFIG_BOXES:
                            track.extradata = data[child_payload:child_end]
                    break
            elif kind == b"elst":
                version, body = _full_box(data, payload)
                fields = "QqhH" if version == 1 else "IihH"
                track.edits = [tuple(int(v) for v in row) for row in _table(data, body, fields)]
            elif kind in (b"stts", b"ctts", b"stss", b"stsz", b"stsc", b"stco", b"co64", b"stz2"):
                track.boxes[kind] = (payload, box_end)

    walk(start, end)
    return track


def _presentation_shift(edits: list, movie_timescale: int, media_timescale: int, name: str) -> int:
    """Media-time units to add to composition times for the movie timeline."""
    if not edits:
        return 0
    empty = 0
    normal = []
    for segment, media_time, rate, fraction in edits:
        if media_time == -1:
            if normal:
                raise Mp4Error(f"{name}: an empty edit after the media starts is not supported")
            empty += segment
        else:
            normal.append((segment, media_time, rate, fraction))
    if len(normal) > 1 or any((rate, fraction) != (1, 0) for _, _, rate, fraction in normal):
        raise Mp4Error(
            f"{name}: its edit list ({edits}) has several media segments or a rate other than 1;"
            " frames would be shifted, so it is rejected. Remux the file without edits"
            " (ffmpeg -i in.mp4 -c copy -map 0:v out.mp4)"
        )
    media_time = normal[0][1] if normal else 0
    return round(empty * media_timescale / movie_timescale) - media_time


def read_video_track(read_at: ReadAt, file_size: int, name: str) -> VideoTrack:
    """Index the first video track of the MP4 readable through ``read_at``."""
    moov = _find_moov(read_at, file_size, name)
    movie_timescale = 0
    tracks = []
    for kind, payload, end in _boxes(moov, 8):
        if kind == b"mvhd":
            version, body = _full_box(moov, payload)
            (movie_timescale,) = struct.unpack_from(">I", moov, body + (16 if version == 1 else 8))
        elif kind == b"trak":
            tracks.append(_parse_trak(moov, payload, end))
    video = next((t for t in tracks if t.handler == b"vide"), None)
    if video is None:
        raise Mp4Error(f"{name}: no video track")
    boxes = video.boxes
    for required in (b"stts", b"stsz", b"stsc"):
        if required not in boxes:
            raise Mp4Error(f"{name}: video track has no {required.decode()} box")
    if b"stz2" in boxes:
        raise Mp4Error(f"{name}: compact sample sizes (stz2) are not supported")
    if b"stco" not in boxes and b"co64" not in boxes:
        raise Mp4Error(f"{name}: video track has no chunk offsets (stco/co64)")

    def body(kind: bytes) -> int:
        return _full_box(moov, boxes[kind][0])[1]

    stts = _table(moov, body(b"stts"), "II")
    durations = np.repeat(stts["f1"].astype(np.int64), stts["f0"].astype(np.int64))
    count = len(durations)
    dts = np.concatenate([[0], np.cumsum(durations)[:-1]]).astype(np.int64)

    size_body = body(b"stsz")
    fixed, size_count = struct.unpack_from(">II", moov, size_body)
    if size_count != count:
        raise Mp4Error(f"{name}: stsz lists {size_count} samples, stts {count}")
    if fixed:
        sizes = np.full(count, fixed, dtype=np.int64)
    else:
        sizes = np.frombuffer(moov, ">u4", count, size_body + 8).astype(np.int64)

    composition = np.zeros(count, dtype=np.int64)
    if b"ctts" in boxes:
        version, ctts_body = _full_box(moov, boxes[b"ctts"][0])
        ctts = _table(moov, ctts_body, "Ii" if version == 1 else "II")
        offsets = ctts["f1"].astype(np.int64)
        if version == 0:  # unsigned on paper; writers store negative offsets this way too
            offsets = np.where(offsets >= 2**31, offsets - 2**32, offsets)
        composition = np.repeat(offsets, ctts["f0"].astype(np.int64))
        if len(composition) != count:
            raise Mp4Error(f"{name}: ctts covers {len(composition)} samples, stts {count}")

    shift = _presentation_shift(
        video.edits, movie_timescale or video.timescale, video.timescale, name
    )
    dts = dts + shift
    pts = dts + composition

    keyframe = np.ones(count, dtype=bool)
    if b"stss" in boxes:
        keyframe[:] = False
        keyframe[_table(moov, body(b"stss"), "I")["f0"].astype(np.int64) - 1] = True

    if b"co64" in boxes:
        chunk_offsets = _table(moov, body(b"co64"), "Q")["f0"].astype(np.int64)
    else:
        chunk_offsets = _table(moov, body(b"stco"), "I")["f0"].astype(np.int64)
    stsc = _table(moov, body(b"stsc"), "III")
    first_chunk = stsc["f0"].astype(np.int64) - 1
    runs = np.diff(np.concatenate([first_chunk, [len(chunk_offsets)]]))
    per_chunk = np.repeat(stsc["f1"].astype(np.int64), runs)
    if per_chunk.sum() != count:
        raise Mp4Error(f"{name}: stsc places {per_chunk.sum()} samples, stts counts {count}")
    chunk_of_sample = np.repeat(np.arange(len(chunk_offsets)), per_chunk)
    ends = np.cumsum(sizes)
    chunk_start = np.concatenate([[0], np.cumsum(per_chunk)[:-1]])
    before_in_chunk = ends - sizes - (ends - sizes)[chunk_start][chunk_of_sample]
    offsets = chunk_offsets[chunk_of_sample] + before_in_chunk
    if count and int((offsets + sizes).max()) > file_size:
        raise Mp4Error(f"{name}: sample data runs past the end of the file (truncated?)")
    if not video.extradata and video.codec in ("h264", "av1", "hevc"):
        raise Mp4Error(f"{name}: the {video.codec} track has no codec configuration box")
    samples = dict(dts=dts, pts=pts, duration=durations, offset=offsets, size=sizes)
    header = (video.codec, video.extradata, video.timescale, video.width, video.height)
    return VideoTrack(*header, **samples, keyframe=keyframe)
