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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightning_stream.storage import is_remote, pyarrow_filesystem

ID_COLUMNS = ("index", "episode_index", "frame_index", "timestamp", "task_index")
VIDEO_COLUMNS = ("chunk_index", "file_index", "from_timestamp")


def filesystem(root: str, fs: pafs.FileSystem | None = None) -> tuple[pafs.FileSystem, str]:
    """The file system and base path of ``root`` (on ``fs`` when given)."""
    return pyarrow_filesystem(root, None, fs)


@dataclass(frozen=True)
class Episode:
    index: int
    length: int
    data_file: str
    videos: dict[str, tuple[str, float]]  # camera -> (video file, from_timestamp)


@dataclass
class LeRobotDataset:
    root: str
    fs: pafs.FileSystem
    base: str
    fps: float
    cameras: list[str]
    features: dict[str, Any]
    episodes: list[Episode]
    tasks: dict[int, str]
    stats: dict[str, dict[str, Any]] | None

    def path(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def read_bytes(self, relative: str) -> bytes:
        with self.fs.open_input_file(self.path(relative)) as handle:
            return handle.read()

    def frames(self, columns: list[str]) -> pa.Table:
        """Per-frame Parquet rows of the selected episodes (``columns`` plus ids)."""
        wanted = list(dict.fromkeys([*ID_COLUMNS, *columns]))
        files = sorted({e.data_file for e in self.episodes})
        tables = [pq.read_table(self.path(f), columns=wanted, filesystem=self.fs) for f in files]
        table = pa.concat_tables(tables)
        keep = pc.is_in(table["episode_index"], pa.array([e.index for e in self.episodes]))
        return table.filter(keep)


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
    table = pa.concat_tables(pq.read_table(f, filesystem=fs) for f in episode_files)
    _check_camera_columns(cameras, table.column_names, f"{base}/meta/episodes")
    data_template, video_template = info["data_path"], info["video_path"]
    rows = table.to_pylist()
    known = {row["episode_index"] for row in rows}
    if episodes is not None:
        unknown = sorted(set(episodes) - known)
        if unknown:
            raise ValueError(
                f"episodes={unknown} are not in {root!r} (it has {len(known)} episodes)"
            )
        rows = [row for row in rows if row["episode_index"] in set(episodes)]
    selected = []
    for row in sorted(rows, key=lambda r: r["episode_index"]):
        data_file = data_template.format(
            chunk_index=row["data/chunk_index"], file_index=row["data/file_index"]
        )
        videos = {
            camera: (
                video_template.format(
                    video_key=camera,
                    chunk_index=row[f"videos/{camera}/chunk_index"],
                    file_index=row[f"videos/{camera}/file_index"],
                ),
                float(row[f"videos/{camera}/from_timestamp"]),
            )
            for camera in cameras
        }
        selected.append(Episode(row["episode_index"], row["length"], data_file, videos))
    return LeRobotDataset(
        root=root, fs=fs, base=base, fps=float(info["fps"]), cameras=cameras,
        features=features, episodes=selected, tasks=read_tasks(fs, base),
        stats=read_stats(fs, base),
    )  # fmt: skip


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


def check_video_files(dataset: LeRobotDataset) -> None:
    """Fail, naming camera and file, when a selected episode's MP4 does not exist."""
    files: dict[str, tuple[str, int]] = {}
    for episode in dataset.episodes:
        for camera, (relative, _) in episode.videos.items():
            files.setdefault(relative, (camera, episode.index))
    infos = dataset.fs.get_file_info([dataset.path(relative) for relative in files])
    for (relative, (camera, episode)), info in zip(files.items(), infos, strict=True):
        if info.type != pafs.FileType.File:
            raise FileNotFoundError(
                f"video file {dataset.path(relative)} of camera {camera!r} (episode {episode}"
                " and the others stored in it) does not exist: download or restore it, or"
                " leave its episodes out with episodes=[...]"
            )
