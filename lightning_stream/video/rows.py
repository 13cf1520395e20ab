"""Per-frame Parquet rows of an episode, read when a chunk of it becomes resident.

A LeRobot v3 data file holds the rows of several episodes (one per frame). A reading
process reads the row groups that hold the frames a chunk needs, found by the row groups'
``episode_index`` statistics (a file without them is read whole), keeps that chunk's rows
and drops the rest. So a rank reads rows only of the episodes it serves, when it serves
them, and holds them only while their chunk is resident or about to be; what one read
costs is set by the file's row groups (LeRobot's writer and
:mod:`lightning_stream.video.synthetic` put one episode in each).

Opening a data file (its footer) costs far more than reading one episode's rows, and the
chunks a reader serves next lie in files all over the dataset. So :class:`RowsAhead`
reads the rows of many upcoming chunks at once, each file opened once for all of them: a
chunk a split at first (the first batch waits for no more), eight times as many each
time after, up to :data:`AHEAD_CHUNKS` chunks or a 64th of the byte budget of rows.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from lightning_stream.video.lerobot import ID_COLUMNS, LeRobotDataset
from lightning_stream.video.plan import Piece, Pieces

OPEN_FILES = 16  # data files whose footer a reader keeps open
READ_THREADS = 8  # data files read at once on an object store
AHEAD_CHUNKS = 4096  # the most chunks whose rows are read at once

Rows = tuple[int, dict[str, np.ndarray]]  # the episode frame of the first row, the columns


class FrameRows:
    """Reads the per-frame rows of ``dataset``'s episodes, chunks at a time.

    Args:
        dataset: the dataset's metadata.
        columns: the per-frame features served (besides the ids, which are always read).
        offsets: the frame offsets of each key's windows (those of ``columns`` set the
            rows read around a chunk's anchors).
    """

    def __init__(
        self, dataset: LeRobotDataset, columns: list[str], offsets: dict[str, np.ndarray]
    ) -> None:
        self.dataset = dataset
        self.columns = list(dict.fromkeys([*ID_COLUMNS, *columns]))
        spans = [offsets[c] for c in columns if c in offsets]
        self.margins = (
            min([0, *(int(o.min()) for o in spans)]),
            max([0, *(int(o.max()) for o in spans)]),
        )
        self._open: OrderedDict[str, pq.ParquetFile] = OrderedDict()
        # per data file, the episode_index range of each row group: a few bytes a group
        self._ranges: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self.bytes_per_frame = 0.0  # of the rows read so far
        self.frames_per_chunk = 0.0  # rows a chunk took, in the last read
        self._lock = threading.Lock()  # a read ahead runs beside the reader's own
        self._files_lock = threading.Lock()  # the files of one read, read at once
        self.remote = not isinstance(dataset.fs, pafs.LocalFileSystem)
        self._readers: ThreadPoolExecutor | None = None

    def read(self, pieces: list[Piece]) -> list[Rows]:
        """The rows the windows of each chunk of ``pieces`` take (frames of its episode
        around its anchors), in frame order; a list column as ``[rows, size]`` float32.
        Each data file is opened once for all the pieces it holds."""
        with self._lock:
            return self._read(pieces)

    def _read(self, pieces: list[Piece]) -> list[Rows]:
        episodes = self.dataset.episodes
        spans = []
        for piece in pieces:
            first = max(0, piece.start + self.margins[0])
            stop = min(int(episodes.length[piece.episode]), piece.stop + self.margins[1])
            spans.append((first, stop))
        found: list[Rows | None] = [None] * len(pieces)
        by_file: dict[int, list[int]] = {}
        for at, piece in enumerate(pieces):
            by_file.setdefault(int(episodes.data_file[piece.episode]), []).append(at)
        relatives = [episodes.data_files[file] for file in by_file]
        wanted = [{int(episodes.index[pieces[at].episode]) for at in m} for m in by_file.values()]
        if self.remote and len(by_file) > 1:  # a round trip or more a file: all at once
            if self._readers is None:
                self._readers = ThreadPoolExecutor(READ_THREADS, "video-rows-read")
            tables = self._readers.map(self._read_episodes, relatives, wanted)
        else:
            tables = map(self._read_episodes, relatives, wanted)
        frames = read_bytes = 0
        for relative, members, table in zip(relatives, by_file.values(), tables, strict=True):
            read_bytes += table.nbytes
            frames += len(table)
            columns = {name: _numpy(table[name]) for name in table.column_names}
            # rows by (episode, frame): a chunk's rows are one run of this order
            key = columns["episode_index"].astype(np.int64) << 32 | columns["frame_index"]
            order = np.argsort(key, kind="stable")
            for at in members:
                first, stop = spans[at]
                rows = self._select(relative, columns, (order, key[order]), pieces[at], first, stop)
                found[at] = (first, rows)
        if frames:
            self.bytes_per_frame = read_bytes / frames
            self.frames_per_chunk = sum(b - a for a, b in spans) / len(spans)
        return found  # type: ignore[return-value]

    def _read_episodes(self, relative: str, episodes: set[int]) -> pa.Table:
        """The row groups of ``relative`` that may hold rows of ``episodes`` (one file per
        thread at a time: the kept files are shared)."""
        with self._files_lock:
            file = self._open.pop(relative, None)
            ranges = self._ranges.get(relative)
        if file is None:
            handle = self.dataset.fs.open_input_file(self.dataset.path(relative))
            file = pq.ParquetFile(handle)
        if ranges is None:
            ranges = _episode_ranges(file)
        with self._files_lock:
            self._open[relative] = file  # the most recently used, last
            self._ranges[relative] = ranges
            if len(self._open) > OPEN_FILES:
                self._open.popitem(last=False)
        low, high = ranges
        wanted = np.asarray(sorted(episodes))
        # a group holds a wanted episode if one lies within its range
        above = np.searchsorted(wanted, low, side="left")  # the first wanted at or above low
        holds = wanted[np.minimum(above, len(wanted) - 1)] <= high
        groups = np.flatnonzero((above < len(wanted)) & holds)
        return file.read_row_groups(groups.tolist(), columns=self.columns)

    def _select(
        self,
        relative: str,
        columns: dict[str, np.ndarray],
        ordered: tuple[np.ndarray, np.ndarray],
        piece: Piece,
        first: int,
        stop: int,
    ) -> dict[str, np.ndarray]:
        """The rows of frames ``[first, stop)`` of ``piece``'s episode, in frame order
        (``ordered``: the rows' order by episode and frame, and their keys in that order)."""
        order, keys = ordered
        episode = int(self.dataset.episodes.index[piece.episode])
        wanted = episode << 32 | np.arange(first, stop, dtype=np.int64)
        begin = int(np.searchsorted(keys, wanted[0]))
        if not np.array_equal(keys[begin : begin + len(wanted)], wanted):
            raise ValueError(
                f"{self.dataset.path(relative)} lacks rows of episode {episode}: frames"
                f" {first}..{stop - 1} of its {self.dataset.episodes.length[piece.episode]}"
                " (meta/episodes) are not all there once each; the dataset is incomplete"
                " (re-export it, or leave the episode out with episodes=[...])"
            )
        at = order[begin : begin + len(wanted)]
        return {name: values[at] for name, values in columns.items()}


class RowsAhead:
    """The rows of the chunks a reader makes resident, read many at a time ahead of them.

    :meth:`begin` is given, per split of a pass, its chunks still to serve in the order
    they become resident. :meth:`take` hands a chunk its rows; the rows of the next chunks
    of every split are read together, on a thread of their own, once half of those read
    before have been taken, so a reader seldom waits for them (it does at a pass's first
    chunk, whose read takes one chunk a split). A chunk taken out of that order (or
    without :meth:`begin`) is read alone.

    Args:
        rows: the reader of the data files.
        limit: the most bytes of rows read ahead of their chunks (the data module gives a
            64th of ``byte_budget_gb``: 16 MiB at its default).
        after_read: called with the chunks whose rows were just read ahead, on the thread
            that read them (the reader indexes their MP4s ahead on an object store).
    """

    def __init__(
        self,
        rows: FrameRows,
        limit: int,
        after_read: Callable[[list[Piece]], None] | None = None,
    ) -> None:
        self.rows = rows
        self.limit = limit
        self.after_read = after_read
        self._queues: dict[int, list] = {}  # split -> [chunks in order, next to read]
        self._ready: dict[tuple[int, Piece], Rows] = {}
        self._reading: Future[None] | None = None  # the next chunks' rows, being read
        self._reader: ThreadPoolExecutor | None = None
        self._per_split = 1
        self._last_read = 0  # chunks the last read took

    def begin(self, queues: dict[int, Pieces]) -> None:
        self.clear()
        self._queues = {split: [chunks, 0] for split, chunks in queues.items()}

    def clear(self) -> None:
        if self._reading is not None:
            self._reading.result()  # it fills what is cleared next
            self._reading = None
        self._queues.clear()
        self._ready.clear()
        self._per_split = 1

    def take(self, split: int, piece: Piece) -> Rows:
        """The rows of ``piece``, the next chunk of ``split`` to become resident."""
        key = (split, piece)
        if key not in self._ready and self._reading is not None:
            reading, self._reading = self._reading, None
            reading.result()
        if key not in self._ready:
            queue = self._queues.get(split)
            if queue is None or queue[1] >= len(queue[0]) or queue[0][queue[1]] != piece:
                return self.rows.read([piece])[0]
            self._read(self._next_chunks())
        rows = self._ready.pop(key)
        if self._reading is None and len(self._ready) <= self._last_read // 2:
            chunks = self._next_chunks()
            if chunks:
                if self._reader is None:
                    self._reader = ThreadPoolExecutor(1, "video-rows")
                self._reading = self._reader.submit(self._read, chunks)
        return rows

    def _next_chunks(self) -> list[tuple[int, Piece]]:
        """The next chunks of every split (:attr:`_per_split` a split), marked as read."""
        chunks = []
        for split, (queued, at) in self._queues.items():
            stop = min(len(queued), at + self._per_split)
            chunks += [(split, queued[i]) for i in range(at, stop)]
            self._queues[split][1] = stop
        self._last_read = len(chunks)
        per_chunk = self.rows.bytes_per_frame * max(1, self.rows.frames_per_chunk)
        most = min(AHEAD_CHUNKS, self.limit / max(per_chunk, 1.0)) / max(1, len(self._queues))
        self._per_split = int(max(1, min(8 * self._per_split, most)))
        return chunks

    def _read(self, chunks: list[tuple[int, Piece]]) -> None:
        pieces = [piece for _, piece in chunks]
        found = self.rows.read(pieces)
        self._ready.update(zip(chunks, found, strict=True))
        if self.after_read is not None:
            self.after_read(pieces)


def _episode_ranges(file: pq.ParquetFile) -> tuple[np.ndarray, np.ndarray]:
    """The smallest and largest ``episode_index`` of each row group (the whole range of
    values for a group without statistics, which is then always read)."""
    metadata = file.metadata
    column = file.schema_arrow.get_field_index("episode_index")
    low = np.full(metadata.num_row_groups, np.iinfo(np.int64).min)
    high = np.full(metadata.num_row_groups, np.iinfo(np.int64).max)
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(column).statistics
        if statistics is not None and statistics.has_min_max:
            low[group], high[group] = statistics.min, statistics.max
    return low, high


def _numpy(column: pa.ChunkedArray) -> np.ndarray:
    """A column as numpy: a list column (a vector per frame) as ``[rows, size]`` float32."""
    values = column.to_numpy(zero_copy_only=False)
    return np.stack(values).astype(np.float32) if values.dtype == object else values
