"""Decoded-frame residency: a chunk's frames, decoded lazily, a group of pictures at a time.

A resident chunk holds, per camera, the compressed packets of the frames its windows
need (one byte-range read, when its first anchor is served) and the frames decoded so
far. A window decodes only the groups of pictures (a keyframe and the frames after it in
decode order, up to the next keyframe) it touches and that are not decoded yet; each
group is decoded once per chunk, and its frames stay until the chunk's last anchor is
served. So the first batch of an epoch waits for the groups its own windows touch, not
for whole chunks, and the frames a rank holds grow to at most what the byte budget sizes
the chunks for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lightning_stream.video.decode import (
    DamagedVideoError,
    Packets,
    decode_packets,
    decode_range,
)
from lightning_stream.video.mp4 import ReadAt, VideoTrack

_PENDING, _READY, _LOST = 0, 1, -1


class CameraFrames:
    """One camera's frames ``first_frame ..`` of a chunk, by their decode indices.

    Args:
        read_at: reads a byte range of the camera's MP4 file.
        track: the file's video track.
        decode_indices: decode index of each of the chunk's frames, in frame order.
        name: the file, for error messages.
        threads: FFmpeg threads per decode.
    """

    def __init__(
        self,
        read_at: ReadAt,
        track: VideoTrack,
        decode_indices: np.ndarray,
        name: str,
        threads: int,
    ) -> None:
        first, last = decode_range(track, decode_indices)
        self.packets = Packets(read_at, track, first, last)
        keyframes = first + np.flatnonzero(track.keyframe[first : last + 1])
        self.group = keyframes[np.searchsorted(keyframes, decode_indices, side="right") - 1]
        self.decode_indices = decode_indices
        self.name, self.threads = name, threads
        self.images = np.empty((len(decode_indices), track.height, track.width, 3), np.uint8)
        self.state = np.full(len(decode_indices), _PENDING, np.int8)
        self.errors: dict[int, DamagedVideoError] = {}
        self.packets_decoded = 0

    def frames(self, local: np.ndarray) -> np.ndarray:
        """``[len(local), H, W, 3]`` frames at the chunk's ``local`` positions; raises the
        :class:`DamagedVideoError` of a group whose damage cost one of them."""
        pending = local[self.state[local] == _PENDING]
        for group in np.unique(self.group[pending]).tolist():
            self._decode(group)
        lost = local[self.state[local] == _LOST]
        if len(lost):
            raise self.errors[int(self.group[lost[0]])]
        return self.images[local]

    def _decode(self, group: int) -> None:
        members = np.flatnonzero(self.group == group)
        wanted = self.decode_indices[members]
        last = int(wanted.max())
        decoded, error = decode_packets(self.packets, group, last, wanted, self.name, self.threads)
        self.packets_decoded += last - group + 1
        for member, index in zip(members.tolist(), wanted.tolist(), strict=True):
            image = decoded.get(index)
            if image is None:
                self.state[member] = _LOST
            else:
                self.images[member] = image
                self.state[member] = _READY
        if error is not None:
            self.errors[group] = error

    @property
    def decoded_bytes(self) -> int:
        return int((self.state == _READY).sum()) * self.images[0].nbytes

    @property
    def payload_bytes(self) -> int:
        return len(self.packets.data)


@dataclass
class ResidentChunk:
    """A chunk of one split whose anchors are being served: per camera, its frames
    (``first[camera]`` is the episode frame at local position 0), and the per-frame
    Parquet rows its windows take (from episode frame ``row_first``)."""

    last: int  # the split position of the chunk's last anchor
    row_first: int
    rows: dict[str, np.ndarray]
    cameras: dict[str, CameraFrames] = field(default_factory=dict)
    first: dict[str, int] = field(default_factory=dict)

    def row(self, column: str, frames: np.ndarray | int) -> np.ndarray:
        """``column``'s values at episode frames ``frames``."""
        return self.rows[column][np.asarray(frames) - self.row_first]

    def window(self, camera: str, frames: np.ndarray) -> np.ndarray:
        """``[T, H, W, 3]`` frames of ``camera`` at episode frames ``frames``."""
        return self.cameras[camera].frames(frames - self.first[camera])

    @property
    def decoded_bytes(self) -> int:
        return sum(c.decoded_bytes for c in self.cameras.values())

    @property
    def payload_bytes(self) -> int:
        return sum(c.payload_bytes for c in self.cameras.values())
