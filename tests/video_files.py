"""MP4 files written with PyAV whose frames carry their own index in their pixels."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

SIZE = 96
GRID = 4  # 4 x 4 cells, one bit each: frame indices up to 65535

CODECS = {
    "h264": ("libx264", {"bf": "3", "g": "30", "crf": "12", "preset": "veryfast"}),
    "av1": ("libsvtav1", {"g": "30", "preset": "12", "crf": "20"}),
}


def frame_image(index: int) -> np.ndarray:
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    cell = SIZE // GRID
    for bit in range(GRID * GRID):
        if index >> bit & 1:
            row, column = divmod(bit, GRID)
            image[row * cell : (row + 1) * cell, column * cell : (column + 1) * cell] = 255
    return image


def frame_index(image: np.ndarray) -> int:
    """The index a decoded frame carries (each cell's mean brightness is one bit)."""
    cell = SIZE // GRID
    value = 0
    for bit in range(GRID * GRID):
        row, column = divmod(bit, GRID)
        block = image[
            row * cell + 4 : (row + 1) * cell - 4, column * cell + 4 : (column + 1) * cell - 4
        ]
        value |= int(block.mean() > 127) << bit
    return value


def write_video(path: Path, codec: str, indices: range | list[int], fps: int = 30, faststart=False):
    """Write frames showing ``indices`` (in order) as one MP4 stream."""
    encoder, options = CODECS[codec]
    path.parent.mkdir(parents=True, exist_ok=True)
    container = av.open(str(path), "w", options={"movflags": "+faststart"} if faststart else {})
    stream = container.add_stream(encoder, rate=fps)
    stream.width = stream.height = SIZE
    stream.pix_fmt = "yuv420p"
    stream.options = options
    for index in indices:
        frame = av.VideoFrame.from_ndarray(frame_image(index), format="rgb24")
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return path
