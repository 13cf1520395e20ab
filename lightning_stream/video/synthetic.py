"""Synthetic LeRobot v3 datasets whose video frames carry their own index in their pixels.

Used by the tests (every decoded frame can be checked to be the one it claims to be), the
example and the benchmark: no dataset is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import av
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

SIZE = 96
GRID = 4  # 4 x 4 cells, one bit each: frame indices up to 65535

CODECS = {
    "h264": ("libx264", {"bf": "3", "g": "30", "crf": "12", "preset": "veryfast"}),
    "av1": ("libsvtav1", {"g": "30", "preset": "8", "crf": "20"}),  # preset 12 flips bits
    # a camera's stream as robots record it: x264's default quality, B-frames, a GOP of 1 s
    "h264-camera": ("libx264", {"bf": "3", "g": "30", "crf": "23", "preset": "veryfast"}),
}


def frame_image(index: int, texture: bool = False) -> np.ndarray:
    """A frame whose cells spell ``index``; ``texture`` adds a moving pattern of +-40 grey
    levels, so the encoder spends on each frame what a camera's picture costs it."""
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    cell = SIZE // GRID
    for bit in range(GRID * GRID):
        if index >> bit & 1:
            row, column = divmod(bit, GRID)
            image[row * cell : (row + 1) * cell, column * cell : (column + 1) * cell] = 255
    if texture:
        shifted = np.roll(_TEXTURE, (index % SIZE, 2 * index % SIZE), (0, 1))
        image = np.where(image > 127, 215, 40).astype(np.int16) + shifted
        image = np.clip(image, 0, 255).astype(np.uint8)
    return image


_TEXTURE = np.random.default_rng(0).integers(-40, 41, (SIZE, SIZE, 3)).astype(np.int16)


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


def write_video(
    path: Path,
    codec: str,
    indices: range | list[int],
    fps: int = 30,
    faststart: bool = False,
    texture: bool = False,
) -> Path:
    """Write frames showing ``indices`` (in order) as one MP4 stream."""
    encoder, options = CODECS[codec]
    path.parent.mkdir(parents=True, exist_ok=True)
    container = av.open(str(path), "w", options={"movflags": "+faststart"} if faststart else {})
    stream = container.add_stream(encoder, rate=fps)
    stream.width = stream.height = SIZE
    stream.pix_fmt = "yuv420p"
    stream.options = options
    for index in indices:
        frame = av.VideoFrame.from_ndarray(frame_image(index, texture), format="rgb24")
        for packet in stream.encode(frame):
            container.mux(packet)
    for packet in stream.encode():
        container.mux(packet)
    container.close()
    return path


def write_dataset(
    root: Path,
    lengths: list[int],
    cameras: tuple[str, ...] = ("observation.images.front", "observation.images.wrist"),
    codec: str = "h264",
    fps: int = 30,
    episodes_per_file: int = 4,
    texture: bool = False,
) -> Path:
    """A LeRobot v3 dataset: episodes of ``lengths`` frames, ``cameras`` MP4 streams with
    several episodes per file (``texture``: see :func:`frame_image`), and per-frame
    ``action`` (2 floats) and ``observation.state`` (3 floats) whose first value is the
    frame's dataset index."""
    root = Path(root)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
    files = [
        list(range(i, min(i + episodes_per_file, len(lengths))))
        for i in range(0, len(lengths), episodes_per_file)
    ]
    episode_rows = []
    columns: dict[str, list] = {"action": [], "observation.state": []}
    for file_index, members in enumerate(files):
        frames = [int(starts[e]) + f for e in members for f in range(lengths[e])]
        for camera in cameras:
            write_video(
                root / f"videos/{camera}/chunk-000/file-{file_index:03d}.mp4",
                codec,
                frames,
                fps,
                texture=texture,
            )
        rows = {
            "index": [],
            "episode_index": [],
            "frame_index": [],
            "timestamp": [],
            "task_index": [],
            "action": [],
            "observation.state": [],
        }
        for e in members:
            for f in range(lengths[e]):
                index = int(starts[e]) + f
                rows["index"].append(index)
                rows["episode_index"].append(e)
                rows["frame_index"].append(f)
                rows["timestamp"].append(f / fps)
                rows["task_index"].append(e % 2)
                rows["action"].append([float(index), float(e)])
                rows["observation.state"].append([float(index), float(f), 0.5])
        for name, values in columns.items():
            values.extend(rows[name])
        table = pa.table(rows)
        path = root / f"data/chunk-000/file-{file_index:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        # one row group per episode, as LeRobot writes them
        with pq.ParquetWriter(path, table.schema) as writer:
            for e in members:
                writer.write_table(table.filter(pc.equal(table["episode_index"], e)))
        offset = 0.0
        for e in members:
            row = {
                "episode_index": e,
                "length": lengths[e],
                "tasks": [f"task {e % 2}"],
                "dataset_from_index": int(starts[e]),
                "dataset_to_index": int(starts[e] + lengths[e]),
                "data/chunk_index": 0,
                "data/file_index": file_index,
            }
            for camera in cameras:
                row[f"videos/{camera}/chunk_index"] = 0
                row[f"videos/{camera}/file_index"] = file_index
                row[f"videos/{camera}/from_timestamp"] = offset
                row[f"videos/{camera}/to_timestamp"] = offset + lengths[e] / fps
            offset += lengths[e] / fps
            episode_rows.append(row)
    meta = root / "meta"
    (meta / "episodes/chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episode_rows), meta / "episodes/chunk-000/file-000.parquet")
    pq.write_table(
        pa.table({"task_index": [0, 1], "task": ["task 0", "task 1"]}), meta / "tasks.parquet"
    )
    video_feature = {
        "dtype": "video",
        "shape": [SIZE, SIZE, 3],
        "names": ["height", "width", "channels"],
    }
    features = {camera: video_feature for camera in cameras}
    features["action"] = {"dtype": "float32", "shape": [2], "names": None}
    features["observation.state"] = {"dtype": "float32", "shape": [3], "names": None}
    for column in ("index", "episode_index", "frame_index", "task_index"):
        features[column] = {"dtype": "int64", "shape": [1], "names": None}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    info = {
        "codebase_version": "v3.0",
        "fps": fps,
        "features": features,
        "total_episodes": len(lengths),
        "total_frames": int(sum(lengths)),
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
    }
    (meta / "info.json").write_text(json.dumps(info, indent=2))
    (meta / "stats.json").write_text(json.dumps(feature_stats(columns), indent=2))
    return root


def feature_stats(columns: dict[str, list]) -> dict[str, dict[str, list[float]]]:
    """Per-dimension statistics as LeRobot keeps them in ``meta/stats.json``."""
    stats = {}
    for name, values in columns.items():
        array = np.asarray(values, dtype=np.float64)
        stats[name] = {
            "mean": array.mean(0).tolist(),
            "std": array.std(0).tolist(),
            "min": array.min(0).tolist(),
            "max": array.max(0).tolist(),
            "count": [len(array)],
        }
    return stats
