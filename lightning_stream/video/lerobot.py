"""The LeRobot dataset v3 layout: metadata, per-frame Parquet, episode-concatenated MP4s.

``meta/info.json`` (fps, features, path templates), ``meta/episodes/chunk-*/file-*.parquet``
(one row per episode: length, data and video file of each camera, its from/to timestamps
in that file), ``meta/tasks.parquet``, ``meta/stats.json``, ``data/chunk-*/file-*.parquet``
(one row per frame) and ``videos/<camera>/chunk-*/file-*.mp4`` (several episodes one after
the other; a frame's time in the file is ``from_timestamp + timestamp``). Read through
``pyarrow.fs``, so the root may be a local directory or any URI it opens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightning_stream.storage import is_remote, pyarrow_filesystem

ID_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")
VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp")


def filesystem(root: str, fs: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """The file system and base path of ``root`` (on ``fs`` when given)."""
    return pyarrow_filesystem(root, None, fs)


@dataclass(frozen=True)
class Episodes:
    """The selected episodes, in index order, one array entry each (a *slot*): an array
    per field rather than an object per episode: tens of bytes an episode and camera."""

    index: np.ndarray  # episode_index
    length: np.ndarray  # frames
    data_file: np.ndarray  # position in data_files
    data_files: tuple[str, ...]
    video_file: dict[str, np.ndarray]  # camera -> position in video_files[camera]
    video_files: dict[str, tuple[str, ...]]
    from_timestamp: dict[str, np.ndarray]  # camera -> the episode's start in its file (s)

    def __len__(self) -> int:
        return len(self.index)

    def video(self, slot: int, camera: str) -> tuple[str, float]:
        """The MP4 holding the episode at ``slot`` for ``camera``, and its start there."""
        file = self.video_files[camera][self.video_file[camera][slot]]
        return file, float(self.from_timestamp[camera][slot])

    def shown_at(self, camera: str, file: int, seconds: float) -> tuple[int, float]:
        """The episode that ``camera``'s file ``file`` (a position in ``video_files``)
        shows at ``seconds`` in the file, and the time within that episode."""
        stored = np.flatnonzero(self.video_file[camera] == file)
        starts = self.from_timestamp[camera][stored]
        order = np.argsort(starts, kind="stable")
        at = max(0, int(np.searchsorted(starts[order], seconds, side="right")) - 1)
        slot = int(stored[order][at])
        return int(self.index[slot]), seconds - float(self.from_timestamp[camera][slot])

    def data(self, slot: int) -> str:
        """The Parquet file holding the per-frame rows of the episode at ``slot``."""
        return self.data_files[self.data_file[slot]]

    def files(self) -> list[str]:
        """Every data and video file of the selected episodes."""
        used = [self.data_files[i] for i in np.unique(self.data_file)]
        for camera, files in self.video_files.items():
            used += [files[i] for i in np.unique(self.video_file[camera])]
        return sorted(used)


@dataclass
class LeRobotDataset:
    root: str
    fs: pafs.FileSystem
    base: str
    fps: float
    cameras: list[str]
    features: dict[str, Any]
    episodes: Episodes
    tasks: dict[int, str]
    stats: dict[str, dict[str, Any]] | None

    def path(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def read_bytes(self, relative: str) -> bytes:
        with self.fs.open_input_file(self.path(relative)) as handle:
            return handle.read()

    def frame_shape(self, camera: str) -> tuple[int, int]:
        """``(height, width)`` of ``camera``'s frames, as ``meta/info.json`` declares them
        (``info.video.height``/``width``, else ``shape`` by its ``names``)."""
        feature = self.features[camera]
        info = feature.get("info") or {}
        if "video.height" in info and "video.width" in info:
            return int(info["video.height"]), int(info["video.width"])
        shape = feature.get("shape")
        names = list(feature.get("names") or ["height", "width", "channels"])
        if not shape or "height" not in names or "width" not in names:
            raise ValueError(
                f"meta/info.json of {self.root!r}: camera {camera!r} declares no frame size"
                " (its 'shape' with 'names' height and width, or 'info' video.height and"
                " video.width): add them, as LeRobot writes them"
            )
        return int(shape[names.index("height")]), int(shape[names.index("width")])


def open_dataset(
    root: str, episodes: list[int] | None = None, fs: pafs.FileSystem | None = None
) -> LeRobotDataset:
    """Read the metadata of a LeRobot v3 dataset (on ``fs`` if given); errors name the file."""
    fs, base = filesystem(root, fs)
    info_path = f"{base}/meta/info.json"
    try:
        with fs.open_input_file(info_path) as handle:
            info = json.loads(handle.read())
    except FileNotFoundError as exc:
        bucket = base.split("/", 1)[0]
        if is_remote(root) and fs.get_file_info(bucket).type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"the bucket does not exist ({bucket!r})") from exc
        raise FileNotFoundError(
            f"{info_path} not found: root={root!r} is not a LeRobot v3 dataset"
        ) from exc
    features = info["features"]
    cameras = [k for k, v in features.items() if v.get("dtype") == "video"]
    selector = pafs.FileSelector(f"{base}/meta/episodes", recursive=True)
    episode_files = sorted(
        f.path for f in fs.get_file_info(selector) if f.path.endswith(".parquet")
    )
    if not episode_files:
        raise FileNotFoundError(f"no episode metadata under {base}/meta/episodes")
    where = f"{base}/meta/episodes"
    _check_camera_columns(cameras, pq.read_schema(episode_files[0], filesystem=fs).names, where)
    columns = ["episode_index", "length", "data/chunk_index", "data/file_index"]
    columns += [f"videos/{camera}/{name}" for camera in cameras for name in VIDEO_COLUMNS]
    table = pa.concat_tables(
        pq.read_table(f, columns=columns, filesystem=fs) for f in episode_files
    )
    index = table["episode_index"].to_numpy()
    keep = np.argsort(index, kind="stable")
    if episodes is not None:
        wanted = np.asarray(episodes, dtype=np.int64)
        unknown = np.setdiff1d(wanted, index)
        if len(unknown):
            raise ValueError(
                f"episodes={unknown.tolist()} are not in {root!r} (it has {len(index)} episodes)"
            )
        keep = keep[np.isin(index[keep], wanted)]
    selected = table.take(pa.array(keep))

    def files(prefix: str, template: str, **names: str) -> tuple[np.ndarray, tuple[str, ...]]:
        chunk = selected[f"{prefix}/chunk_index"].to_numpy().astype(np.int64)
        file = selected[f"{prefix}/file_index"].to_numpy().astype(np.int64)
        keys, position = np.unique(chunk << 32 | file, return_inverse=True)
        paths = tuple(
            template.format(chunk_index=key >> 32, file_index=key & 0xFFFFFFFF, **names)
            for key in keys.tolist()
        )
        return position.reshape(-1).astype(np.int32), paths

    data_file, data_files = files("data", info["data_path"])
    video = {
        camera: files(f"videos/{camera}", info["video_path"], video_key=camera)
        for camera in cameras
    }
    return LeRobotDataset(
        root=root,
        fs=fs,
        base=base,
        fps=float(info["fps"]),
        cameras=cameras,
        features=features,
        episodes=Episodes(
            index=selected["episode_index"].to_numpy().astype(np.int64),
            length=selected["length"].to_numpy().astype(np.int64),
            data_file=data_file,
            data_files=data_files,
            video_file={camera: found[0] for camera, found in video.items()},
            video_files={camera: found[1] for camera, found in video.items()},
            from_timestamp={
                camera: selected[f"videos/{camera}/from_timestamp"].to_numpy().astype(np.float64)
                for camera in cameras
            },
        ),
        tasks=read_tasks(fs, base),
        stats=read_stats(fs, base),
    )


def _check_camera_columns(cameras: list[str], columns: list[str], where: str) -> None:
    for camera in cameras:
        wanted = [f"videos/{camera}/{name}" for name in VIDEO_COLUMNS]
        missing = [column for column in wanted if column not in columns]
        if missing:
            raise ValueError(
                f"camera {camera!r} is a video feature of meta/info.json but the episode"
                f" metadata under {where} lacks its columns {missing}: the dataset is"
                " incomplete (re-export it, or remove the camera from info.json)"
            )


def read_tasks(fs: pafs.FileSystem, base: str) -> dict[int, str]:
    """``task_index`` -> task string, from ``meta/tasks.parquet`` (v3) or ``tasks.jsonl``.

    LeRobot v3 writes the task strings as the pandas index of ``tasks.parquet`` (stored as
    a ``task`` column or as the index column pandas names in the file's metadata)."""
    path = f"{base}/meta/tasks.parquet"
    if fs.get_file_info(path).type == pafs.FileType.File:
        table = pq.read_table(path, filesystem=fs)
        column = "task"
        if column not in table.column_names:
            index_columns = (table.schema.pandas_metadata or {}).get("index_columns", [])
            named = [c for c in index_columns if isinstance(c, str)]
            if not named:
                raise ValueError(f"{path} has no 'task' column nor a pandas index of tasks")
            column = named[0]
        return dict(
            zip(table["task_index"].to_pylist(), map(str, table[column].to_pylist()), strict=True)
        )
    path = f"{base}/meta/tasks.jsonl"
    if fs.get_file_info(path).type == pafs.FileType.File:
        with fs.open_input_file(path) as handle:
            lines = handle.read().decode().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        return {int(row["task_index"]): str(row["task"]) for row in rows}
    return {}


def read_stats(fs: pafs.FileSystem, base: str) -> dict[str, dict[str, Any]] | None:
    """``meta/stats.json`` as LeRobot keeps it (feature -> statistic -> list), or ``None``."""
    path = f"{base}/meta/stats.json"
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_file(path) as handle:
        return json.loads(handle.read())


def file_sizes(dataset: LeRobotDataset) -> dict[str, int]:
    """The size of every data and video file of the selected episodes, from listings of
    ``data/`` and ``videos/`` (a few requests on an object store, not one per file); a
    missing MP4 fails naming its camera and an episode stored in it."""
    listed: dict[str, int] = {}
    for folder in ("data", "videos"):
        selector = pafs.FileSelector(dataset.path(folder), recursive=True, allow_not_found=True)
        for info in dataset.fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                listed[info.path] = info.size
    episodes = dataset.episodes
    for camera, files in episodes.video_files.items():
        for position, relative in enumerate(files):
            if dataset.path(relative) not in listed:
                slot = int(np.argmax(episodes.video_file[camera] == position))
                raise FileNotFoundError(
                    f"video file {dataset.path(relative)} of camera {camera!r} (episode"
                    f" {episodes.index[slot]} and the others stored in it) does not exist:"
                    " download or restore it, or leave its episodes out with episodes=[...]"
                )
    for relative in episodes.data_files:
        if dataset.path(relative) not in listed:
            raise FileNotFoundError(
                f"data file {dataset.path(relative)} does not exist: download or restore it,"
                " or leave its episodes out with episodes=[...]"
            )
    return {relative: listed[dataset.path(relative)] for relative in episodes.files()}
