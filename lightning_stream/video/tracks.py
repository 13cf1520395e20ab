"""The sample tables (sidecar indexes) and open handles of the MP4 files a reader used
lately.

A file's sidecar is loaded (built if missing, :mod:`lightning_stream.video.sidecar`) at
its first use by the reader and checked against the frame size ``meta/info.json``
declares, which the byte budget is sized from. The tables of the files used lately are
kept up to a byte limit, so a reader of a dataset of any number of files holds a bounded
share of their indexes; a chunk still decoding from an evicted file keeps its own
references to its table and handle. An evicted file's sidecar is read again without
checking it against its MP4 a second time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

from lightning_stream.video.lerobot import LeRobotDataset
from lightning_stream.video.mp4 import VideoTrack
from lightning_stream.video.sidecar import (
    COLUMNS,
    VideoFile,
    load_or_build,
    read_sidecar,
    sidecar_path,
)

# about 41 bytes a frame: the files read again within this many bytes of tables are not
# loaded again
CACHE_BYTES = 128 * 2**20


class Tracks:
    """The video files of ``dataset`` a reader used lately: the sample tables of files not
    in use are kept up to ``limit`` bytes (``CACHE_BYTES``).

    Args:
        dataset: the dataset's metadata.
        sidecar_dir: the sidecar cache.
        lock_timeout: seconds to wait for another process building a sidecar.
    """

    def __init__(self, dataset: LeRobotDataset, sidecar_dir: str, lock_timeout: float) -> None:
        self.dataset, self.sidecar_dir = dataset, Path(sidecar_dir)
        self.lock_timeout = lock_timeout
        self.limit = CACHE_BYTES
        self._kept: OrderedDict[str, tuple[VideoTrack, Any]] = OrderedDict()
        self._checked: dict[str, Path] = {}  # file -> its sidecar, checked in this process
        self._lock = threading.Lock()
        self._bytes = 0

    def __call__(self, relative: str, camera: str) -> tuple[VideoTrack, Any]:
        """The sample table of ``camera``'s file ``relative`` and an open handle (several
        threads may ask at once: on an object store a pass's first files load together)."""
        with self._lock:
            if relative in self._kept:
                self._kept.move_to_end(relative)
                return self._kept[relative]
            checked = self._checked.get(relative)
        video = VideoFile(self.dataset.fs, self.dataset.path(relative))
        handle, _ = video.reader()
        # a sidecar checked against its MP4 once is read again as it is, once evicted
        again = checked is not None and read_sidecar(checked)
        if again:
            track = again[0]
        else:
            root, timeout = self.dataset.root, self.lock_timeout
            track, _ = load_or_build(video, self.sidecar_dir, root, timeout, handle)
            checked = sidecar_path(self.sidecar_dir, root, video)
        declared = self.dataset.frame_shape(camera)
        if (track.height, track.width) != declared:
            raise ValueError(
                f"{video.path} holds {track.height}x{track.width} frames but meta/info.json"
                f" declares {declared[0]}x{declared[1]} for camera {camera!r}: the byte budget"
                " is sized from info.json, so correct it there"
            )
        with self._lock:
            self._checked[relative] = checked
            if relative not in self._kept:  # else another thread loaded it meanwhile
                self._kept[relative] = track, handle
                self._bytes += _table_bytes(track)
            found = self._kept[relative]
            while self._bytes > self.limit and len(self._kept) > 1:
                evicted, _ = self._kept.popitem(last=False)[1]
                self._bytes -= _table_bytes(evicted)
        return found


def _table_bytes(track: VideoTrack) -> int:
    return sum(getattr(track, name).nbytes for name in COLUMNS)
