"""Decode chosen frames of an MP4 track from the byte range of their packets, with PyAV.

Only the packets from the keyframe at or before the first needed frame (in decode order)
through the last needed one are read, in one range read, and fed to a codec context
configured with the track's codec configuration (avcC, av1C); flushing the decoder at the
end releases the frames B-frame reordering held back. Every returned frame is checked
against the presentation timestamp it was asked for. Damaged packets surface as
:class:`DamagedVideoError` carrying the time (in the file) of the first frame they cost:
the decoder rejects the packet (h264: a broken NAL length), or gives no frame for it
(AV1). Damage the decoder conceals (wrong pixels, no error) cannot be detected here.
"""

from __future__ import annotations

import contextlib
import threading
from fractions import Fraction
from functools import cache

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from lightning_stream.video.mp4 import ReadAt, VideoTrack

# FFmpeg's native "av1" decoder needs a hardware accelerator; libdav1d decodes on the CPU.
DECODERS = {"av1": ("libdav1d", "libaom-av1", "av1")}
# One converter per thread: it keeps its scaler between frames, where each frame's own
# to_ndarray builds one, most of the cost of converting a small frame (the pixels are the
# same). FFmpeg's scaler must not be shared by threads: two threads converting with one
# scaler at once can hang.
_CONVERTERS = threading.local()


def _rgb(frame: av.VideoFrame) -> np.ndarray:
    converter = getattr(_CONVERTERS, "rgb", None)
    if converter is None:
        converter = _CONVERTERS.rgb = VideoReformatter()
    return converter.reformat(frame, format="rgb24").to_ndarray()


@cache
def decoder_name(codec: str) -> str:
    """The first FFmpeg decoder of ``codec`` this PyAV build has."""
    for name in DECODERS.get(codec, (codec,)):
        try:
            av.codec.Codec(name, "r")
        except (ValueError, av.error.FFmpegError):
            continue
        return name
    raise ValueError(f"this PyAV build has no decoder for {codec!r} (tried {DECODERS.get(codec)})")


class FrameLookupError(ValueError):
    """A requested time has no frame within the tolerance."""


class DamagedVideoWarning(UserWarning):
    """A window was skipped because its frames could not be decoded."""


class DamagedVideoError(RuntimeError):
    """Packets of a video cannot be decoded into the frames asked for.

    Args:
        message: what failed, naming the file.
        seconds: time in the file of the first frame lost; ``None`` once the message
            says it (the error crosses DataLoader workers as its message only).
    """

    def __init__(self, message: str, seconds: float | None = None) -> None:
        super().__init__(message)
        self.seconds = seconds


def presentation_order(track: VideoTrack) -> np.ndarray:
    """Decode index of each frame, in presentation order."""
    return np.argsort(track.pts, kind="stable")


def frames_at(track: VideoTrack, seconds: np.ndarray, name: str, tolerance: float) -> np.ndarray:
    """Decode indices of the frames shown at ``seconds``; fail past ``tolerance`` seconds."""
    order = presentation_order(track)
    shown = track.pts[order]
    wanted = np.round(np.asarray(seconds, dtype=np.float64) * track.timescale).astype(np.int64)
    nearest = np.clip(np.searchsorted(shown, wanted), 1, len(shown) - 1)
    before = shown[nearest - 1]
    pick = np.where(
        np.abs(wanted - before) <= np.abs(shown[nearest] - wanted), nearest - 1, nearest
    )
    error = np.abs(shown[pick] - wanted) / track.timescale
    if len(error) and error.max() > tolerance:
        worst = int(np.argmax(error))
        raise FrameLookupError(
            f"{name}: no frame within {tolerance * 1000:.1f} ms of {float(seconds[worst]):.4f} s"
            f" (nearest at {shown[pick[worst]] / track.timescale:.4f} s); the episode's"
            " timestamps and the video do not agree"
        )
    return order[pick]


def decode_range(track: VideoTrack, wanted: np.ndarray) -> tuple[int, int]:
    """Decode indices ``[first, last]`` of the packets needed for the ``wanted`` frames."""
    first_needed = int(wanted.min())
    keyframes = np.flatnonzero(track.keyframe[: first_needed + 1])
    if not len(keyframes):
        raise FrameLookupError("no keyframe before the requested frames")
    return int(keyframes[-1]), int(wanted.max())


def packet_range(track: VideoTrack, first: int, last: int) -> tuple[int, int]:
    """Byte offset and size of the range that holds packets ``[first, last]``."""
    start = int(track.offset[first])
    stop = int((track.offset[first : last + 1] + track.size[first : last + 1]).max())
    return start, stop - start


class Packets:
    """The bytes of packets ``[first, last]`` (decode order) of a track, read in one range."""

    def __init__(self, read_at: ReadAt, track: VideoTrack, first: int, last: int) -> None:
        self.track, self.first, self.last = track, first, last
        self.start, size = packet_range(track, first, last)
        self.data = memoryview(read_at(self.start, size))

    def packet(self, index: int) -> memoryview:
        begin = int(self.track.offset[index]) - self.start
        return self.data[begin : begin + int(self.track.size[index])]


def decode_packets(
    packets: Packets, first: int, last: int, keep: np.ndarray, name: str, threads: int = 1
) -> tuple[dict[int, np.ndarray], DamagedVideoError | None]:
    """RGB frames (H, W, 3) uint8 of the decode indices in ``keep``, from packets ``first``
    (a keyframe) through ``last``; and the damage, if any, that cost some of them.

    Every frame the decoder gives is kept, also after a packet it rejects (the frames
    before that packet, in decode order, are still good); the error then carries the time
    of the first frame the damage cost. ``threads``: the decoder's (0: FFmpeg's choice).
    """
    track = packets.track
    context = av.CodecContext.create(decoder_name(track.codec), "r")
    context.thread_count = threads
    if track.extradata:
        context.extradata = track.extradata
    time_base = Fraction(1, track.timescale)
    wanted = {int(track.pts[i]): int(i) for i in keep.tolist()}
    frames: dict[int, np.ndarray] = {}
    error = None

    def take(decoded) -> None:
        for frame in decoded:
            index = wanted.get(frame.pts)
            if index is not None:
                frames[index] = _rgb(frame)

    for i in range(first, last + 1):
        packet = av.Packet(packets.packet(i))
        packet.pts, packet.dts, packet.time_base = int(track.pts[i]), int(track.dts[i]), time_base
        try:
            take(context.decode(packet))
        except av.error.FFmpegError as exc:
            error = DamagedVideoError(
                f"{name}: packet {i} (bytes {int(track.offset[i])}+{int(track.size[i])}) cannot"
                f" be decoded: {exc}",
                seconds=float(track.pts[i]) / track.timescale,
            )
            break
    with contextlib.suppress(av.error.FFmpegError):
        take(context.decode(None))
    missing = sorted(pts for pts, index in wanted.items() if index not in frames)
    if missing and error is None:
        error = DamagedVideoError(
            f"{name}: decoding packets {first}..{last} gave no frame for pts {missing[:5]}",
            seconds=missing[0] / track.timescale,
        )
    return frames, error


def decode(
    read_at: ReadAt, track: VideoTrack, wanted: np.ndarray, name: str, threads: int = 1
) -> list[np.ndarray]:
    """RGB frames (H, W, 3) uint8 for the decode indices ``wanted``, in that order, from one
    byte range: the packets of :func:`decode_range`. A decode index may repeat (a window
    clamped at an episode's edge); it is decoded once. Damage raises
    :class:`DamagedVideoError`."""
    first, last = decode_range(track, wanted)
    frames, error = decode_packets(
        Packets(read_at, track, first, last), first, last, wanted, name, threads
    )
    if error is not None:
        raise error
    return [frames[int(i)] for i in wanted]
