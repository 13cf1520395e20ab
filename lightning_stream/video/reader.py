"""EpisodeReader: what a reading process (the main process or a worker) knows of a LeRobot
dataset, and the chunks of it that are resident.

It holds the episodes' metadata (arrays), the indexes (sidecars) and open handles of
the MP4 files it has read lately, each split's anchor order for the epoch
(:mod:`lightning_stream.video.plan`), and the split's resident chunks
(:mod:`lightning_stream.video.frames`): a chunk becomes resident at its first anchor, with
its per-frame Parquet rows (:mod:`lightning_stream.video.rows`), and is dropped after its
last. A file's sidecar is loaded, and its rows read, when a chunk in it is first served:
a reader reads the per-frame rows of the episodes it serves only, and holds the indexes of
the files it read lately only. It imports neither torch nor Lightning, so a worker that
runs it starts in a fraction of a second.
"""

from __future__ import annotations

import math
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow.fs as pafs

from lightning_stream.video.decode import DamagedVideoError, decode_range, frames_at, packet_range
from lightning_stream.video.frames import CameraFrames, ResidentChunk
from lightning_stream.video.lerobot import ID_COLUMNS, open_dataset
from lightning_stream.video.plan import (
    Piece,
    Pieces,
    anchor_order,
    chunk_frames,
    cut_chunks,
    cut_splits,
    frame_offsets,
)
from lightning_stream.video.rows import FrameRows, RowsAhead
from lightning_stream.video.shared import Fetch, SharedRanges, read_now
from lightning_stream.video.spec import VideoSpec
from lightning_stream.video.tracks import Tracks

# reads in flight ahead of the chunks being decoded, on an object store (each waits a
# round trip: one per camera of each split's next chunk)
FETCH_THREADS = 8
# MP4s whose sidecars are loaded ahead at once, on an object store (each 2 round trips)
INDEX_AHEAD = 256


@dataclass(frozen=True)
class SplitOrder:
    """A split's chunks in one epoch, the chunk and frame of each position, and the
    position of each chunk's last anchor."""

    chunks: Pieces
    chunk_of: np.ndarray
    frame_of: np.ndarray
    last: np.ndarray
    following: np.ndarray  # the chunk made resident after each one (-1: none)
    arrival: np.ndarray  # the chunks in the order they become resident


class EpisodeReader:
    """The dataset as one reading process sees it (see the module's docstring).

    Args:
        spec: the data module's settings.
        decode_threads: FFmpeg threads per decode; default 1 (the frames of robot cameras
            are small: threads cost more than they save, and several processes share the
            cores).
    """

    def __init__(self, spec: VideoSpec, decode_threads: int = 1) -> None:
        self.spec = spec
        self.decode_threads = decode_threads
        # False: the consumer applies image_transforms (the main process's reading thread
        # leaves them to the main thread, whose random draws they share)
        self.applies_transforms = True
        episodes = list(spec.episodes) if spec.episodes else None
        self.dataset = open_dataset(spec.root, episodes, spec.filesystem)
        self.fps = self.dataset.fps
        columns = [k for k, v in self.dataset.features.items() if v.get("dtype") != "video"]
        self.columns = [c for c in columns if c not in ID_COLUMNS]
        self.episodes = self.dataset.episodes
        self.lengths = self.episodes.length
        # frames that may be anchors: LeRobot's EpisodeAwareSampler(drop_n_last_frames)
        self.anchor_lengths = np.maximum(0, self.lengths - spec.drop_n_last_frames)
        self.offsets = {
            key: frame_offsets(key, deltas, self.fps, spec.tolerance_s)
            for key, deltas in spec.delta_timestamps.items()
        }
        rows = FrameRows(self.dataset, self.columns, self.offsets)
        self.remote = not isinstance(self.dataset.fs, pafs.LocalFileSystem)
        warm = self._index_files if self.remote else None
        self.ahead = RowsAhead(rows, int(spec.byte_budget_gb * 2**30) // 64, warm)
        self.track = Tracks(self.dataset, spec.sidecar_dir, spec.lock_timeout)
        self._epoch_plans: dict[int, tuple[list[Pieces], dict[int, SplitOrder]]] = {}
        self.resident: dict[tuple[int, int], ResidentChunk] = {}
        # on an object store, the packets of each split's next chunk are read while the
        # current ones decode: (file, offset, size) -> the read in flight
        self._fetches: dict[tuple[str, int, int], Future] = {}
        # the camera ranges of chunks not resident yet (read ahead, or sharing packets)
        self._ranges: dict[tuple[Piece, str], tuple] = {}
        self._fetcher: ThreadPoolExecutor | None = None
        self._indexer: ThreadPoolExecutor | None = None
        # on an object store the packets both sides of a cut need are read once (see
        # video/shared.py); the pass's chunks not read yet, by episode
        self._shared = SharedRanges.within(spec.byte_budget_gb)
        self._unread: defaultdict[int, set[Piece]] = defaultdict(set)
        self.bytes_loaded = 0
        self.frames_decoded = 0  # packets decoded by chunks already dropped

    # -- planning ------------------------------------------------------------------
    def split_order(self, epoch: int, split: int) -> SplitOrder:
        spec = self.spec
        if epoch not in self._epoch_plans:
            pieces = cut_splits(self.anchor_lengths, spec.num_splits, spec.shuffle_seed, epoch)
            self._epoch_plans = {epoch: (pieces[0], {})}
        pieces, orders = self._epoch_plans[epoch]
        if split not in orders:
            chunks = cut_chunks(pieces[split], spec.chunk_frames)
            chunk, frame = anchor_order(chunks, spec.pool_size, spec.shuffle_seed, epoch, split)
            last = np.zeros(len(chunks), dtype=np.int64)
            last[chunk] = np.arange(len(chunk))  # later positions overwrite: the last one
            slots, firsts = np.unique(chunk, return_index=True)
            arrival = slots[np.argsort(firsts)]
            following = np.full(len(chunks), -1, dtype=np.int64)
            following[arrival[:-1]] = arrival[1:]
            # int32: 8 bytes an anchor of the reader's splits
            orders[split] = SplitOrder(
                chunks, chunk.astype(np.int32), frame.astype(np.int32), last, following, arrival
            )
        return orders[split]

    def chunk_frames(self) -> int:
        """Anchors per chunk such that ``num_splits * pool_size`` resident chunks (all a
        rank can hold, at any world size) keep their decoded frames within the budget."""
        cameras = []
        for camera in self.dataset.cameras:
            height, width = self.dataset.frame_shape(camera)
            offsets = self.offsets.get(camera, np.zeros(1, dtype=np.int64))
            # uint8 RGB, as resident
            cameras.append((3 * height * width, int(offsets.max() - offsets.min())))
        spec = self.spec
        budget = int(spec.byte_budget_gb * 2**30)
        anchors = chunk_frames(budget, spec.num_splits * spec.pool_size, cameras)
        if anchors < 1:
            least = spec.num_splits * spec.pool_size * sum(f * (1 + s) for f, s in cameras)
            least_gb = math.ceil(least / 2**30 * 1000) / 1000
            raise ValueError(
                f"byte_budget_gb={spec.byte_budget_gb:g} cannot hold one window's"
                f" decoded frames per resident chunk: num_splits={spec.num_splits} x"
                f" episode_pool_size={spec.pool_size} chunks, each at least"
                f" {least // (spec.num_splits * spec.pool_size)} bytes. Raise"
                f" byte_budget_gb to at least {least_gb:g}, or lower num_splits or"
                " episode_pool_size"
            )
        return anchors

    # -- residency -----------------------------------------------------------------
    def chunk(self, epoch: int, split: int, position: int) -> tuple[int, int, ResidentChunk]:
        """Episode slot and frame of the anchor at ``position``, and its resident chunk
        (made resident here at its first anchor)."""
        order = self.split_order(epoch, split)
        slot = int(order.chunk_of[position])
        piece = order.chunks[slot]
        key = (split, slot)
        if key not in self.resident:
            self.resident[key] = self._make_resident(split, piece, int(order.last[slot]))
            following = int(order.following[slot])
            if following >= 0:
                self._fetch_chunk(order.chunks[following])
        return piece.episode, int(order.frame_of[position]), self.resident[key]

    def release(self, split: int, position: int, epoch: int) -> None:
        """Drop the chunk of ``position`` if that was its last anchor."""
        order = self.split_order(epoch, split)
        key = (split, int(order.chunk_of[position]))
        chunk = self.resident.get(key)
        if chunk is not None and position >= chunk.last:
            del self.resident[key]
            self.frames_decoded += sum(c.packets_decoded for c in chunk.cameras.values())

    def clear(self) -> None:
        """Drop every resident chunk (a pass stopped early leaves some)."""
        for chunk in self.resident.values():
            self.frames_decoded += sum(c.packets_decoded for c in chunk.cameras.values())
        self.resident.clear()
        self._fetches.clear()
        self._ranges.clear()
        self._shared.clear()
        self._unread.clear()
        self.ahead.clear()

    def _make_resident(self, split: int, piece: Piece, last: int) -> ResidentChunk:
        """A chunk's packets, read (one range per camera, or the read ahead of it), none
        decoded yet."""
        chunk = ResidentChunk(last, *self.ahead.take(split, piece))
        for camera in self.dataset.cameras:
            relative, track, handle, first, wanted, _, _ = self._camera_range(piece, camera)
            del self._ranges[piece, camera]

            def read_at(offset: int, size: int, handle=handle, relative=relative, camera=camera):
                fetched = self._fetches.pop((relative, offset, size), None) or self._read(
                    piece, camera, relative, offset, size, partial(read_now, handle)
                )
                return fetched.result()

            name = self.dataset.path(relative)
            chunk.cameras[camera] = CameraFrames(read_at, track, wanted, name, self.decode_threads)
            chunk.first[camera] = first
        return chunk

    def _camera_range(self, piece: Piece, camera: str) -> tuple:
        """A chunk's file of ``camera``, its index and handle, the chunk's first episode
        frame there, the decode indices of its frames, and its packets' byte range
        (offset, size); kept until the chunk is made resident."""
        if (piece, camera) in self._ranges:
            return self._ranges[piece, camera]
        offsets = self.offsets.get(camera, np.zeros(1, dtype=np.int64))
        first = max(0, piece.start + int(offsets.min()))
        stop = min(int(self.lengths[piece.episode]), piece.stop + int(offsets.max()))
        relative, from_timestamp = self.episodes.video(piece.episode, camera)
        track, handle = self.track(relative, camera)
        seconds = from_timestamp + np.arange(first, stop) / self.fps
        wanted = frames_at(track, seconds, self.dataset.path(relative), 0.5 / self.fps)
        offset, size = packet_range(track, *decode_range(track, wanted))
        found = self._ranges[piece, camera] = (relative, track, handle, first, wanted, offset, size)
        return found

    def begin_pass(self, epoch: int, first_round: list[tuple[int, int]]) -> None:
        """A pass over the ``(split, position)`` anchors starting with ``first_round``: its
        splits' chunks from each one's first position there on, in the order they become
        resident, have their per-frame rows read ahead (:class:`RowsAhead`). On an object
        store they are also noted as to be read, so that they share packets (a split not in
        it shares none), and the first round's chunks are read at once."""
        starts: dict[int, int] = {}
        for split, position in first_round:
            starts.setdefault(split, position)  # a split's positions rise
        queues = {}
        for split, start in starts.items():
            order = self.split_order(epoch, split)
            upcoming = order.arrival[order.last[order.arrival] >= start]
            queues[split] = order.chunks.subset(upcoming)
            for piece in queues[split] if self.remote else ():
                self._unread[piece.episode].add(piece)
        self.ahead.begin(queues)
        if not self.remote:
            return
        # the first round's files, indexed at once rather than one round trip after another
        self._index_files([chunks[0] for chunks in queues.values() if len(chunks)])
        for split, position in first_round:
            order = self.split_order(epoch, split)
            if (split, int(order.chunk_of[position])) not in self.resident:
                self._fetch_chunk(order.chunks[int(order.chunk_of[position])])

    def _fetch_chunk(self, piece: Piece) -> None:
        """Start reading the packets of a chunk that becomes resident later."""
        if not self.remote:
            return  # a local read costs no round trip
        fetcher = self._fetch_pool()
        for camera in self.dataset.cameras:
            relative, _, handle, _, _, offset, size = self._camera_range(piece, camera)
            key = (relative, offset, size)
            if key not in self._fetches:
                fetch = partial(_submitted_read, fetcher, handle)
                self._fetches[key] = self._read(piece, camera, *key, fetch)

    def _index_files(self, pieces: list[Piece]) -> None:
        """Load the sidecars of the MP4s of ``pieces`` at once (up to ``INDEX_AHEAD``), on
        threads of their own: on an object store each costs round trips."""
        cameras = self.dataset.cameras
        files = {(self.episodes.video(p.episode, c)[0], c) for p in pieces for c in cameras}
        if self._indexer is None:
            self._indexer = ThreadPoolExecutor(FETCH_THREADS, "video-index")
        list(self._indexer.map(lambda file: self.track(*file), list(files)[:INDEX_AHEAD]))

    def _fetch_pool(self) -> ThreadPoolExecutor:
        if self._fetcher is None:
            self._fetcher = ThreadPoolExecutor(FETCH_THREADS, "video-fetch")
        return self._fetcher

    def _read(
        self, piece: Piece, camera: str, relative: str, offset: int, size: int, fetch: Fetch
    ) -> Future[bytes]:
        """A chunk's packets of ``camera``: what the pass's unread chunks of its episode
        need of them is kept for those."""
        unread = self._unread[piece.episode]
        unread.discard(piece)
        sharers = []
        for other in unread:  # of the same episode, so in the same file
            start, length = self._camera_range(other, camera)[5:]
            if start < offset + size and start + length > offset:
                sharers.append(((other, camera), start, start + length))
        data, fetched = self._shared.read(
            relative, offset, offset + size, (piece, camera), sharers, fetch
        )
        self.bytes_loaded += fetched
        return data

    def window(self, episode_slot: int, camera: str, frames: np.ndarray, chunk: ResidentChunk):
        """``[T, H, W, 3]`` frames of one camera's window; damage raises
        :class:`DamagedVideoError` naming the episode, the camera and the frame's time."""
        try:
            return chunk.window(camera, frames)
        except DamagedVideoError as exc:
            file = self.episodes.video_file[camera][episode_slot]
            damaged, at = self.episodes.shown_at(camera, file, exc.seconds)
            raise DamagedVideoError(
                f"damaged video: episode {damaged}, camera {camera!r}, frame"
                f" {round(at * self.fps)} at {at:.3f} s of the episode ({exc.seconds:.3f} s"
                f" in the file): {exc}. Re-encode the file, leave the episode out"
                " (episodes=[...]), or pass on_decode_error='skip'"
            ) from exc

    def counters(self) -> dict[str, float]:
        """Payload read, packets decoded, and what the resident chunks hold now: decoded
        frames (``resident_bytes``, what the byte budget bounds) and the compressed
        payload they are decoded from (``reserved_bytes``)."""
        chunks = self.resident.values()
        live = sum(c.packets_decoded for chunk in chunks for c in chunk.cameras.values())
        return {
            "bytes_loaded": self.bytes_loaded,
            "frames_decoded": self.frames_decoded + live,
            "resident_bytes": sum(chunk.decoded_bytes for chunk in chunks),
            "reserved_bytes": sum(chunk.payload_bytes for chunk in chunks),
        }


def _submitted_read(fetcher: ThreadPoolExecutor, handle: Any, at: int, length: int) -> Future:
    """A read of ``length`` bytes at ``at`` of ``handle``, started on ``fetcher``."""
    return fetcher.submit(handle.read_at, length, at)
