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

from fractions import Fraction
from functools import cache

import av
import numpy as np

from lightning_stream.video.mp4 import ReadAt, VideoTrack

# FFmpeg's native "av1" decoder needs a hardware accelerator; libdav1d decodes on the CPU.
DECODERS = {"av1": ("libdav1d", "libaom-av1", "av1")}


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


def decode(
    read_at: ReadAt, track: VideoTrack, wanted: np.ndarray, name: str, threads: int = 0
) -> list[np.ndarray]:
    """RGB frames (H, W, 3) uint8 for the decode indices ``wanted``, in that order.

    A decode index may repeat (a window clamped at an episode's edge); it is decoded once.
    Reads one byte range, the packets of :func:`decode_range`. ``threads``: the decoder's
    threads (0: FFmpeg's choice, one per core).
    """
    first, last = decode_range(track, wanted)
    start = int(track.offset[first])
    stop = int((track.offset[first : last + 1] + track.size[first : last + 1]).max())
    payload = read_at(start, stop - start)
    context = av.CodecContext.create(decoder_name(track.codec), "r")
    context.thread_count = threads
    if track.extradata:
        context.extradata = track.extradata
    time_base = Fraction(1, track.timescale)
    needed: dict[int, list[int]] = {}
    for position, i in enumerate(wanted.tolist()):
        needed.setdefault(int(track.pts[i]), []).append(position)
    frames: list[np.ndarray | None] = [None] * len(wanted)

    def keep(decoded) -> None:
        for frame in decoded:
            positions = needed.get(frame.pts)
            if positions:
                image = frame.to_ndarray(format="rgb24")
                for position in positions:
                    frames[position] = image

    for i in range(first, last + 1):
        begin = int(track.offset[i]) - start
        packet = av.Packet(payload[begin : begin + int(track.size[i])])
        packet.pts, packet.dts, packet.time_base = int(track.pts[i]), int(track.dts[i]), time_base
        try:
            keep(context.decode(packet))
        except av.error.FFmpegError as exc:
            raise DamagedVideoError(
                f"{name}: packet {i} (bytes {int(track.offset[i])}+{int(track.size[i])}) cannot"
                f" be decoded: {exc}",
                seconds=float(track.pts[i]) / track.timescale,
            ) from exc
    keep(context.decode(None))
    missing = [int(track.pts[wanted[i]]) for i, f in enumerate(frames) if f is None]
    if missing:
        raise DamagedVideoError(
            f"{name}: decoding packets {first}..{last} gave no frame for pts {missing[:5]}",
            seconds=min(missing) / track.timescale,
        )
    return frames
