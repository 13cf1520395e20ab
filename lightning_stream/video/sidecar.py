"""The MP4 sidecar index: the sample table of a video file, cached in Arrow IPC.

One sidecar per video file, in a cache directory keyed by dataset and file identity. It
is built under a file lock by one process while the others wait (bounded by a timeout),
written to a temporary file and installed with an atomic rename, so an interrupted or
failed build leaves the previous valid sidecar in place. Each sidecar records a
fingerprint of its MP4's content (size, first and last 64 KiB, 16 blocks spread over the
file); a sidecar whose fingerprint no longer matches (the file was replaced, even by one
of the same size) is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc
from filelock import FileLock, Timeout

from lightning_stream.atomic import atomic_write
from lightning_stream.video.mp4 import VideoTrack, read_video_track

FORMAT = "1"
EDGE = 64 * 1024
BLOCK = 4 * 1024
BLOCKS = 16
COLUMNS = ("dts", "pts", "duration", "offset", "size", "keyframe")


@dataclass(frozen=True)
class VideoFile:
    """One MP4 file on any file system ``pyarrow.fs`` opens."""

    filesystem: pafs.FileSystem
    path: str

    @classmethod
    def open(cls, uri: str) -> VideoFile:
        filesystem, path = (
            pafs.FileSystem.from_uri(uri)
            if "://" in uri
            else (pafs.LocalFileSystem(), os.path.abspath(uri))
        )
        return cls(filesystem, path)

    def reader(self) -> tuple[pafs.NativeFile, int]:
        try:
            handle = self.filesystem.open_input_file(self.path)
        except (FileNotFoundError, OSError) as exc:
            raise FileNotFoundError(f"video file {self.path} cannot be opened: {exc}") from exc
        return handle, handle.size()


def fingerprint(handle: pafs.NativeFile, size: int, concurrent: bool = False) -> str:
    """A digest of the file's size and sampled content: cheap, and changes on replacement.
    ``concurrent``: the sampled blocks are read at once (on an object store: one round trip
    rather than one a block)."""
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    spans = [(0, min(EDGE, size)), (max(0, size - EDGE), min(EDGE, size))]
    spans += [(size * i // (BLOCKS + 1), min(BLOCK, size)) for i in range(1, BLOCKS + 1)]
    if concurrent:
        with ThreadPoolExecutor(len(spans), "fingerprint") as pool:
            blocks = list(pool.map(lambda span: handle.read_at(span[1], span[0]), spans))
    else:
        blocks = [handle.read_at(length, offset) for offset, length in spans]
    for block in blocks:
        digest.update(block)
    return digest.hexdigest()


def sidecar_path(cache_dir: Path, dataset: str, video: VideoFile) -> Path:
    """Where the sidecar of ``video`` in ``dataset`` lives."""
    dataset_key = hashlib.blake2b(dataset.encode(), digest_size=8).hexdigest()
    file_key = hashlib.blake2b(video.path.encode(), digest_size=8).hexdigest()
    return cache_dir / dataset_key / f"{Path(video.path).stem}-{file_key}.arrow"


def _to_table(track: VideoTrack, digest: str, source: str) -> pa.Table:
    metadata = {
        "format": FORMAT,
        "source": source,
        "fingerprint": digest,
        "codec": track.codec,
        "extradata": track.extradata.hex(),
        "timescale": str(track.timescale),
        "width": str(track.width),
        "height": str(track.height),
    }
    columns = {name: getattr(track, name) for name in COLUMNS}
    return pa.table(columns).replace_schema_metadata(metadata)


def _from_table(table: pa.Table) -> tuple[VideoTrack, str]:
    meta = {k.decode(): v.decode() for k, v in table.schema.metadata.items()}
    columns = {name: table.column(name).to_numpy() for name in COLUMNS}
    track = VideoTrack(
        codec=meta["codec"],
        extradata=bytes.fromhex(meta["extradata"]),
        timescale=int(meta["timescale"]),
        width=int(meta["width"]),
        height=int(meta["height"]),
        **{name: np.asarray(values) for name, values in columns.items()},
    )
    return track, meta["fingerprint"]


def read_sidecar(path: Path) -> tuple[VideoTrack, str] | None:
    """The sidecar at ``path`` and the fingerprint of the MP4 it indexes, if it is
    readable and of this format."""
    try:
        with pa.memory_map(str(path)) as source:
            table = ipc.open_file(source).read_all()
        if (table.schema.metadata or {}).get(b"format") != FORMAT.encode():
            return None
        return _from_table(table)
    except (OSError, pa.ArrowInvalid, KeyError, ValueError):
        return None


def _load(path: Path, digest: str) -> VideoTrack | None:
    """The sidecar at ``path`` if it is readable, current and matches ``digest``."""
    found = read_sidecar(path)
    return found[0] if found is not None and found[1] == digest else None


def _install(table: pa.Table, path: Path) -> None:
    with atomic_write(path) as file, ipc.new_file(file, table.schema) as writer:
        writer.write_table(table)


def load_or_build(
    video: VideoFile,
    cache_dir: Path,
    dataset: str,
    lock_timeout: float = 600.0,
    handle: pafs.NativeFile | None = None,
) -> tuple[VideoTrack, bool]:
    """The sample table of ``video`` and whether this call built its sidecar; ``handle``:
    the MP4 already open (left open), else it is opened and closed here.

    Raises:
        Mp4Error: the file is truncated, corrupt or not an indexable MP4 (names the file).
        TimeoutError: another process held the build lock longer than ``lock_timeout``.
    """
    if handle is None:
        opened, _ = video.reader()
        with opened:
            return load_or_build(video, cache_dir, dataset, lock_timeout, opened)
    path = sidecar_path(cache_dir, dataset, video)
    size = handle.size()
    digest = fingerprint(handle, size, not isinstance(video.filesystem, pafs.LocalFileSystem))
    track = _load(path, digest)
    if track is not None:
        return track, False
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(path) + ".lock", timeout=lock_timeout):
            track = _load(path, digest)  # built by another process while we waited
            if track is not None:
                return track, False
            track = read_video_track(
                lambda offset, length: handle.read_at(length, offset), size, video.path
            )
            _install(_to_table(track, digest, video.path), path)
            return track, True
    except Timeout as exc:
        raise TimeoutError(
            f"waited {lock_timeout:.0f} s for another process building the sidecar of"
            f" {video.path} (lock {path}.lock); raise the lock timeout if building it takes"
            " longer"
        ) from exc


def build_missing(
    videos: list[VideoFile], cache_dir: Path, dataset: str, lock_timeout: float, start: int = 0
) -> tuple[int, float]:
    """Build the sidecars of ``videos`` that have none yet (an existing one is checked
    against its MP4 when it is loaded, not here): how many were built, in how many
    seconds. Processes sharing ``cache_dir`` (the ranks of a node) each build what the
    others have not; a ``start`` per process (its rank) spreads them over the files
    rather than queueing all of them on the first file's lock."""
    started = time.perf_counter()
    built = 0
    for video in videos[start % max(1, len(videos)) :] + videos[: start % max(1, len(videos))]:
        if not sidecar_path(cache_dir, dataset, video).exists():
            built += load_or_build(video, cache_dir, dataset, lock_timeout)[1]
    return built, time.perf_counter() - started
