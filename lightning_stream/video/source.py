"""A LeRobot v3 dataset as a stream source: windows of episodes decoded from byte ranges."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import hashlib
import itertools
import math
import threading
import time
import warnings
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from lightning_stream.batching import SKIP_REASON, Batch
from lightning_stream.plan import RankEpochPlan
from lightning_stream.video.decode import (
    DamagedVideoError,
    DamagedVideoWarning,
    decode,
    decode_range,
    frames_at,
)
from lightning_stream.video.lerobot import ID_COLUMNS, check_video_files, open_dataset
from lightning_stream.video.mp4 import VideoTrack
from lightning_stream.video.plan import (
    anchor_order,
    chunk_frames,
    cut_chunks,
    cut_splits,
    frame_offsets,
    window,
)
from lightning_stream.video.sidecar import VideoFile, fingerprint, load_or_build
from lightning_stream.workers import worker_context

# what the video workers import (the forkserver imports it once for all of them)
WORKER_MODULE = __name__
# a worker's batch carries its reader's counters under this key, taken off in the main
# process, so the counters cover the workers
WORKER_COUNTERS = "_worker_counters"
# the longest the main process serves the workers' batches after starting them; then it
# waits for them (and the DataLoader reports a worker that failed or died)
TAKEOVER_LIMIT_S = 60.0
# in a worker process: its reader, kept for every epoch; its batches carry its counters
_worker_reader: EpisodeReader | None = None


@dataclass(frozen=True)
class VideoSpec:
    """Everything a reader process needs to build samples; picklable."""

    root: str
    episodes: tuple[int, ...] | None
    delta_timestamps: dict[str, tuple[float, ...]]
    num_splits: int
    shuffle_seed: int
    pool_size: int
    byte_budget_gb: float
    sidecar_dir: str
    lock_timeout: float
    image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None
    tolerance_s: float = 1e-4
    image_dtype: str = "uint8"
    drop_n_last_frames: int = 0
    on_decode_error: str = "raise"
    # anchors per chunk, from the byte budget (VideoSource sets it at setup)
    chunk_frames: int = 0
    # holds credentials: out of repr (logs, errors); pickled only to DataLoader workers
    filesystem: pafs.FileSystem | None = field(default=None, repr=False, compare=False)


@dataclass
class _Resident:
    frames: dict[tuple[str, int], torch.Tensor] = field(default_factory=dict)
    last: int = 0
    payload: int = 0
    damaged: set[str] = field(default_factory=set)  # cameras decoded per window instead


class EpisodeReader:
    """Builds the samples of one reading process (the main process or a worker).

    A split's resident chunks are decoded whole, once, when their first anchor is served
    (one byte-range read per camera), and dropped after their last anchor. With
    ``on_decode_error="skip"``, a camera whose chunk does not decode is decoded per window
    instead, and a window that still fails is returned as a placeholder sample whose
    ``SKIP_REASON`` says why (the stream drops it before ``training_step``).
    """

    def __init__(self, spec: VideoSpec) -> None:
        self.spec = spec
        episodes = list(spec.episodes) if spec.episodes else None
        self.dataset = open_dataset(spec.root, episodes, spec.filesystem)
        self.fps = self.dataset.fps
        columns = [k for k, v in self.dataset.features.items() if v.get("dtype") != "video"]
        self.columns = [c for c in columns if c not in ID_COLUMNS]
        table = self.dataset.frames(self.columns).sort_by("index")
        self.table = {
            name: table.column(name).to_numpy(zero_copy_only=False) for name in table.column_names
        }
        for name in self.columns:
            values = self.table[name]
            if values.dtype == object:
                self.table[name] = np.stack(values).astype(np.float32)
        self.lengths = [e.length for e in self.dataset.episodes]
        # frames that may be anchors: LeRobot's EpisodeAwareSampler(drop_n_last_frames)
        self.anchor_lengths = [max(0, n - spec.drop_n_last_frames) for n in self.lengths]
        self.row_start = np.concatenate([[0], np.cumsum(self.lengths)[:-1]]).astype(np.int64)
        self.offsets = {
            key: frame_offsets(key, deltas, self.fps, spec.tolerance_s)
            for key, deltas in spec.delta_timestamps.items()
        }
        self.tracks: dict[str, VideoTrack] = {}
        self.files: dict[str, Any] = {}
        self.epoch_plans: dict[int, tuple] = {}
        self.resident: dict[tuple[int, int], _Resident] = {}
        self.bytes_loaded = 0
        self.frames_decoded = 0
        # FFmpeg's own threads; a decoding worker uses one (it is one of several processes
        # sharing the cores: 2 workers delivered about 1.2x the windows/s with one thread
        # each than with FFmpeg's choice, and the main process alone 0.8x with one)
        self.decode_threads = 0

    # -- planning ------------------------------------------------------------------
    def split_orders(
        self, epoch: int, split: int
    ) -> tuple[list, np.ndarray, np.ndarray, np.ndarray]:
        """The chunks of ``split`` in ``epoch``, the chunk and frame of each position, and
        each chunk's last position."""
        spec = self.spec
        if epoch not in self.epoch_plans:
            pieces = cut_splits(self.anchor_lengths, spec.num_splits, spec.shuffle_seed, epoch)
            self.epoch_plans = {epoch: (pieces[0], {})}
        pieces, orders = self.epoch_plans[epoch]
        if split not in orders:
            chunks = cut_chunks(pieces[split], spec.chunk_frames)
            chunk, frame = anchor_order(chunks, spec.pool_size, spec.shuffle_seed, epoch, split)
            last = np.zeros(len(chunks), dtype=np.int64)
            last[chunk] = np.arange(len(chunk))  # later positions overwrite: the last one
            orders[split] = (chunks, chunk, frame, last)
        return orders[split]

    def chunk_frames(self) -> int:
        """Anchors per chunk such that ``num_splits * pool_size`` resident chunks (all a
        rank can hold, at any world size) keep their decoded frames within the budget."""
        cameras = []
        for camera in self.dataset.cameras:
            files = {e.videos[camera][0] for e in self.dataset.episodes}
            tracks = [self._track(relative)[0] for relative in sorted(files)]
            offsets = self.offsets.get(camera, np.zeros(1, dtype=np.int64))
            frame = max(3 * t.height * t.width for t in tracks)  # uint8 RGB, as resident
            cameras.append((frame, int(offsets.max() - offsets.min())))
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

    # -- decoding ------------------------------------------------------------------
    def _track(self, relative: str) -> tuple[VideoTrack, Any]:
        if relative not in self.tracks:
            video = VideoFile(self.dataset.fs, self.dataset.path(relative))
            track, _ = load_or_build(
                video, Path(self.spec.sidecar_dir), self.spec.root, self.spec.lock_timeout
            )
            self.tracks[relative] = track
            self.files[relative] = self.dataset.fs.open_input_file(video.path)
        return self.tracks[relative], self.files[relative]

    def _decode_chunk(self, episode_slot: int, start: int, stop: int) -> _Resident:
        """The decoded frames of a chunk (plus its windows' margins), from byte ranges."""
        episode = self.dataset.episodes[episode_slot]
        resident = _Resident()
        for camera in self.dataset.cameras:
            offsets = self.offsets.get(camera, np.zeros(1, dtype=np.int64))
            first = max(0, start + int(offsets.min()))
            last = min(episode.length - 1, stop - 1 + int(offsets.max()))
            try:
                decoded = self._decode_frames(
                    episode_slot, camera, np.arange(first, last + 1), resident
                )
            except DamagedVideoError:
                if self.spec.on_decode_error == "raise":
                    raise
                resident.damaged.add(camera)
                continue
            resident.frames.update(((camera, f), image) for f, image in decoded.items())
        return resident

    def _decode_frames(
        self, episode_slot: int, camera: str, needed: np.ndarray, resident: _Resident | None
    ) -> dict[int, torch.Tensor]:
        """Frames ``needed`` of one episode's camera as ``[C, H, W]`` uint8 tensors.

        Raises :class:`DamagedVideoError` naming the file, the episode and the time of the
        first frame the damage costs."""
        episode = self.dataset.episodes[episode_slot]
        relative, from_timestamp = episode.videos[camera]
        track, handle = self._track(relative)
        name = self.dataset.path(relative)
        wanted = frames_at(track, from_timestamp + needed / self.fps, name, 0.5 / self.fps)

        def read_at(offset: int, size: int) -> bytes:
            self.bytes_loaded += size
            if resident is not None:
                resident.payload += size
            return handle.read_at(size, offset)

        try:
            images = decode(read_at, track, wanted, name, self.decode_threads)
        except DamagedVideoError as exc:
            damaged, at = self._episode_at(relative, camera, exc.seconds)
            raise DamagedVideoError(
                f"damaged video: episode {damaged}, camera {camera!r}, frame"
                f" {round(at * self.fps)} at {at:.3f} s of the episode ({exc.seconds:.3f} s"
                f" in the file): {exc}. Re-encode the file, leave the episode out"
                " (episodes=[...]), or pass on_decode_error='skip'"
            ) from exc
        first_packet, last_packet = decode_range(track, wanted)
        self.frames_decoded += last_packet - first_packet + 1
        return {
            f: torch.from_numpy(image).permute(2, 0, 1).contiguous()
            for f, image in zip(needed.tolist(), images, strict=True)
        }

    def _episode_at(self, relative: str, camera: str, seconds: float) -> tuple[int, float]:
        """The episode of ``relative`` shown at ``seconds`` in the file, and its own time."""
        stored = [e for e in self.dataset.episodes if e.videos[camera][0] == relative]
        starts = [e.videos[camera][1] for e in stored]
        owner = stored[max(0, int(np.searchsorted(starts, seconds, side="right")) - 1)]
        return owner.index, seconds - owner.videos[camera][1]

    # -- samples -------------------------------------------------------------------
    def sample(self, epoch: int, split: int, position: int) -> dict[str, Any]:
        chunks, chunk_of, frame_of, last = self.split_orders(epoch, split)
        slot = int(chunk_of[position])
        key = (split, slot)
        chunk = chunks[slot]
        if key not in self.resident:
            self.resident[key] = self._decode_chunk(chunk.episode, chunk.start, chunk.stop)
            self.resident[key].last = int(last[slot])
        resident = self.resident[key]
        frame = int(frame_of[position])
        sample = self._assemble(chunk.episode, frame, resident)
        if position >= resident.last:
            del self.resident[key]
        return sample

    def _camera_window(
        self, episode_slot: int, camera: str, frames: np.ndarray, resident: _Resident
    ) -> torch.Tensor:
        """``[T, C, H, W]`` uint8 frames of one camera's window."""
        if camera in resident.damaged:
            decoded = self._decode_frames(episode_slot, camera, np.unique(frames), None)
            return torch.stack([decoded[int(f)] for f in frames])
        return torch.stack([resident.frames[camera, int(f)] for f in frames])

    def _assemble(self, episode_slot: int, frame: int, resident: _Resident) -> dict[str, Any]:
        episode = self.dataset.episodes[episode_slot]
        row = int(self.row_start[episode_slot]) + frame
        sample: dict[str, Any] = {}
        skip_reason = ""
        for camera in self.dataset.cameras:
            if camera in self.offsets:
                frames, pad = window(frame, episode.length, self.offsets[camera])
                sample[f"{camera}_is_pad"] = torch.from_numpy(pad)
            else:
                frames = np.asarray([frame])
            try:
                images = self._camera_window(episode_slot, camera, frames, resident)
            except DamagedVideoError as exc:
                skip_reason = (
                    f"on_decode_error='skip': skipped the window of episode {episode.index} at"
                    f" frame {frame} ({frame / self.fps:.3f} s): {exc}"
                )
                track, _ = self._track(episode.videos[camera][0])
                images = torch.zeros(len(frames), 3, track.height, track.width, dtype=torch.uint8)
            if len(frames) == 1:
                images = images[0]  # one frame: [C, H, W], as LeRobot squeezes it
            if self.spec.image_dtype == "float32":
                images = images.float().div_(255)
            if self.spec.image_transforms is not None:
                images = self.spec.image_transforms(images)
            sample[camera] = images
        if self.spec.on_decode_error == "skip":
            sample[SKIP_REASON] = skip_reason
        for column in self.columns:
            values = self.table[column]
            if column in self.offsets:
                clamped, pad = window(frame, episode.length, self.offsets[column])
                sample[column] = torch.from_numpy(
                    values[int(self.row_start[episode_slot]) + clamped]
                )
                sample[f"{column}_is_pad"] = torch.from_numpy(pad)
            else:
                sample[column] = torch.from_numpy(np.asarray(values[row]))
        sample["episode_index"] = torch.tensor(episode.index)
        sample["frame_index"] = torch.tensor(frame)
        sample["index"] = torch.tensor(int(self.table["index"][row]))
        sample["timestamp"] = torch.tensor(float(self.table["timestamp"][row]))
        task_index = int(self.table["task_index"][row])
        sample["task_index"] = torch.tensor(task_index)
        sample["task"] = self.dataset.tasks.get(task_index, "")
        return sample

    def counters(self) -> dict[str, float]:
        """Payload read, frames decoded, and what the resident chunks hold now: decoded
        frames (``resident_bytes``, what the byte budget bounds) and the compressed
        payload they were decoded from (``reserved_bytes``, read and dropped)."""
        chunks = self.resident.values()
        return {
            "bytes_loaded": self.bytes_loaded,
            "frames_decoded": self.frames_decoded,
            "resident_bytes": sum(t.numel() for r in chunks for t in r.frames.values()),
            "reserved_bytes": sum(r.payload for r in chunks),
        }


def reader_positions(plan: RankEpochPlan, splits: range, head: bool) -> Iterator[tuple[int, int]]:
    """(split, position) of every row one reader serves, in the plan's order."""
    counts = dict(zip(plan.splits, plan.start, strict=True))
    if head:
        for local in plan.head:
            split = plan.splits[local]
            yield split, counts[split]
            counts[split] += 1
        level = plan.level
    else:
        level = plan.level
    for position in range(level, plan.split_len):
        for split in splits:
            yield split, position


def reader_samples(
    reader: EpisodeReader,
    epoch: int,
    plan: RankEpochPlan,
    worker: int,
    workers: int,
    head: bool,
    skip: int = 0,
) -> Iterator[dict[str, Any]]:
    """The samples reader ``worker`` of ``workers`` serves (its contiguous block of the
    rank's splits), with the plan's head first if ``head``, but for the first ``skip``
    (served by another process; they are not decoded)."""
    splits = plan.splits
    if workers > 1:
        per_worker = len(splits) // workers
        splits = splits[worker * per_worker : (worker + 1) * per_worker]
    for split, position in itertools.islice(reader_positions(plan, splits, head), skip, None):
        yield reader.sample(epoch, split, position)


class _WorkerStream(IterableDataset):
    """What a persistent DataLoader worker serves: each epoch's job (epoch, plan, whether
    the main process served the head, how many of the worker's samples the main process
    served while the workers started) arrives through the worker's queue, and the
    worker's :class:`EpisodeReader` (its Parquet columns, open files and indexes) serves
    every epoch."""

    def __init__(self, spec: VideoSpec, jobs: list[Any], ready: Any) -> None:
        super().__init__()
        self.spec, self.jobs, self.ready = spec, jobs, ready

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        global _worker_reader
        if _worker_reader is None:  # before the first job: setup's time, not the epoch's
            _worker_reader = EpisodeReader(self.spec)
            _worker_reader.decode_threads = 1
            self.ready.release()
        # one job per iteration: each iter(loader) of the main process starts one here
        job = self.jobs[info.id].get()
        if job is None:
            return  # the workers are being stopped
        epoch, plan, head_done, skip = job
        _worker_reader.resident.clear()  # an epoch stopped early leaves its chunks
        yield from reader_samples(
            _worker_reader, epoch, plan, info.id, info.num_workers, not head_done, skip
        )


class VideoSource:
    """Episodes of a LeRobot v3 dataset, as ``num_splits`` equal splits of anchors."""

    def __init__(self, spec: VideoSpec, multiprocessing_context: str) -> None:
        self.multiprocessing_context = multiprocessing_context
        self.reader = EpisodeReader(spec)
        check_video_files(self.reader.dataset)
        # the chunk length depends on the frames' sizes, read from the MP4s' indexes here
        self.spec = spec = dataclasses.replace(spec, chunk_frames=self.reader.chunk_frames())
        self.reader.spec = spec
        self.num_splits = spec.num_splits
        self.skipped_windows = 0
        total = sum(self.reader.anchor_lengths)
        self.split_len = total // spec.num_splits
        self.dropped = total % spec.num_splits
        self.manifest = self._manifest()
        self.loader: DataLoader | None = None
        self.jobs: list[Any] = []
        self.ready: Any = None  # released by each worker once its reader is built
        self.starting = 0  # workers not yet seen ready
        self.started: Iterator[Batch] | None = None  # the workers' first iterator
        self.starter: threading.Thread | None = None  # makes it
        self.launched_at = 0.0
        self.start_error: BaseException | None = None
        self.worker_counters: dict[int, dict[str, float]] = {}  # the latest of each
        self.stopped_counts = {"bytes_loaded": 0.0, "frames_decoded": 0.0}  # of past workers

    def start_workers(self, workers: int, batch_size: int) -> None:
        """Prepare the rank's ``workers`` decoding processes; they serve every epoch.

        A persistent DataLoader whose processes start once the first epoch's first batch
        is out (or at :meth:`wait_for_workers`): starting them takes seconds of CPU (the
        forkserver imports torch and the decoders, each worker reads the Parquet), which
        on a 2-core host made the first batch 1.6x slower when they started at ``setup``.
        Until they are ready the main process serves their batches. They keep their
        readers for every epoch after.
        """
        if self.loader is not None and (self.loader.num_workers, self.loader.batch_size) == (
            workers,
            batch_size,
        ):
            return
        self.stop_workers()
        context = worker_context(self.multiprocessing_context, [WORKER_MODULE])
        self.jobs = [context.SimpleQueue() for _ in range(workers)]
        self.ready, self.starting = context.Semaphore(0), workers
        self.loader = DataLoader(
            _WorkerStream(self.spec, self.jobs, self.ready),
            batch_size=batch_size,
            num_workers=workers,
            collate_fn=_numpy_collate,
            multiprocessing_context=context,
            persistent_workers=True,
            # the workers' seeds, drawn from this, not from torch's global generator at
            # whatever moment the starter thread runs
            generator=torch.Generator().manual_seed(self.spec.shuffle_seed),
        )

    def _launch(self) -> None:
        """Start the workers, on a thread: making the DataLoader's first iterator waits
        for each process to start."""
        if self.starter is None and self.loader is not None:
            self.start_error = None
            self.launched_at = time.monotonic()
            self.starter = threading.Thread(target=self._start, name="video-workers", daemon=True)
            self.starter.start()

    def _start(self) -> None:
        try:
            self.started = iter(self.loader)
        except BaseException as exc:  # re-raised in the main thread by _started()
            self.start_error = exc

    def _started(self) -> Iterator[Batch] | None:
        """The workers' first iterator (``None`` once an epoch took it), after the thread
        that makes it ends; its error, if it failed."""
        self._launch()
        self.starter.join()
        if self.start_error is not None:
            raise self.start_error
        return self.started

    def wait_for_workers(self, timeout: float) -> bool:
        """Start the workers if they are not yet, and wait until every one has built its
        reader (it then waits for its first epoch); ``False`` if ``timeout`` seconds pass
        first."""
        self._launch()
        return self._ready(timeout)

    def _ready(self, timeout: float) -> bool:
        """Whether every started worker is ready, waiting up to ``timeout`` seconds."""
        if not self.starting:
            return True
        if self.starter is None:
            return False
        deadline = time.monotonic() + timeout
        self.starter.join(timeout)
        if self.starter.is_alive():
            return False
        if self.start_error is not None:
            raise self.start_error
        while self.starting:
            if not self.ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
            self.starting -= 1
        return True

    def stop_workers(self) -> None:
        """Stop the decoding processes (dropping the last reference to the DataLoader's
        iterator shuts its workers down)."""
        if self.starter is not None:
            self.starter.join()
        for jobs in self.jobs:
            jobs.put(None)  # a worker waiting for a job (none ran yet) then exits at once
        for counters in self.worker_counters.values():
            for name in self.stopped_counts:
                self.stopped_counts[name] += counters[name]
        self.worker_counters = {}
        self.loader = self.started = self.ready = self.starter = None
        self.jobs, self.starting = [], 0

    def _manifest(self) -> str:
        dataset = self.reader.dataset
        digest = hashlib.blake2b(dataset.read_bytes("meta/info.json"), digest_size=16)
        files = sorted(
            {f for e in dataset.episodes for f, _ in e.videos.values()}
            | {e.data_file for e in dataset.episodes}
        )
        for relative in files:
            with dataset.fs.open_input_file(dataset.path(relative)) as handle:
                digest.update(relative.encode() + fingerprint(handle, handle.size()).encode())
        return digest.hexdigest()

    @property
    def identity(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "source": "lerobot",
            "root": spec.root,
            "version": self.manifest,
            "episodes": list(spec.episodes) if spec.episodes else None,
            "num_splits": spec.num_splits,
            "shuffle_seed": spec.shuffle_seed,
            "delta_timestamps": {k: list(v) for k, v in spec.delta_timestamps.items()},
            "episode_pool_size": spec.pool_size,
            "byte_budget_gb": spec.byte_budget_gb,
            "drop_n_last_frames": spec.drop_n_last_frames,
        }

    def pin(self, identity: dict[str, Any]) -> None:
        if identity["version"] != self.manifest:
            raise ValueError(
                f"the files of {self.spec.root!r} changed since the checkpoint was saved (its"
                f" manifest {identity['version']}, now {self.manifest}): a video or Parquet"
                " file was replaced, added or removed. Restore them, or start a new run."
            )

    def chunks(self, epoch: int, consumed: list[int], plan: RankEpochPlan) -> Iterator[Batch]:
        self.reader.resident.clear()  # a pass stopped early leaves its chunks
        if plan.num_workers == 0:
            samples = reader_samples(self.reader, epoch, plan, 0, 1, head=True)
            yield from self._note_skips(_batched(samples, plan.batch_size))
            return
        head_here = plan.num_workers > 1
        if head_here:
            yield from self._note_skips(self._head_batches(epoch, plan))
        self.start_workers(plan.num_workers, plan.batch_size)
        rounds = yield from self._rounds_while_starting(epoch, plan, not head_here)
        if rounds is None:
            return  # the workers were not ready before the epoch ended
        for jobs in self.jobs:
            jobs.put((epoch, plan, head_here, rounds * plan.batch_size))
        # the first epoch takes the iterator the workers started with; a later one
        # resumes them (a persistent DataLoader's iter)
        started = self._started()
        batches = iter(self.loader) if started is None else started
        self.started = None
        yield from self._note_skips(map(self._from_worker, batches))

    def _rounds_while_starting(
        self, epoch: int, plan: RankEpochPlan, head: bool
    ) -> Generator[Batch, None, int | None]:
        """While the workers start, the main process serves their batches itself, a round
        (the next batch of each worker, in the DataLoader's order) at a time, so the first
        batch does not wait for them. Returns the rounds served, ``None`` if they were the
        whole epoch. Its chunks are dropped before the workers take over (they decode
        again what they still need of them), so the budget holds."""
        workers = plan.num_workers
        streams = [
            _batched(reader_samples(self.reader, epoch, plan, w, workers, head), plan.batch_size)
            for w in range(workers)
        ]
        rounds = 0
        try:
            while not self._ready(0) and not self._waited_too_long():
                for stream in streams:  # the workers' counts are equal: all end together
                    batch = next(stream, None)
                    if batch is None:
                        return None
                    yield from self._note_skips([batch])
                    self._launch()  # once the first batch is out
                    # one FFmpeg thread leaves a core to the starting workers: with FFmpeg's
                    # choice (2 threads on 2 cores) this epoch took about twice as long
                    self.reader.decode_threads = 1
                rounds += 1
        finally:
            self.reader.resident.clear()
            self.reader.decode_threads = 0
            if rounds:
                with contextlib.suppress(OSError, AttributeError):
                    ctypes.CDLL(None).malloc_trim(0)
        return rounds

    def _waited_too_long(self) -> bool:
        """Whether the workers, started over ``TAKEOVER_LIMIT_S`` ago (in this epoch or an
        earlier one), are still not ready: a worker that failed is then reported."""
        started = self.starter is not None
        return started and time.monotonic() > self.launched_at + TAKEOVER_LIMIT_S

    def _head_batches(self, epoch: int, plan: RankEpochPlan) -> Iterator[Batch]:
        """The head's batches, each decoded when it is asked for: the first batch waits
        only for its own windows."""
        positions = reader_positions(plan, range(0), True)
        samples = (self.reader.sample(epoch, split, p) for split, p in positions)
        try:
            for batch in _batched(samples, plan.batch_size):
                yield batch
                self._launch()  # once the first batch is out
        finally:
            # the head's chunks are finished by the workers: do not keep them here
            self.reader.resident.clear()

    def _note_skips(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """Warn about, and count, the skipped windows of each batch (in the main process,
        whichever process decoded them, so the logger sees the count)."""
        for batch in batches:
            for reason in batch.get(SKIP_REASON, ()):
                if reason:
                    self.skipped_windows += 1
                    warnings.warn(reason, DamagedVideoWarning, stacklevel=2)
            yield batch

    def _from_worker(self, batch: dict[str, Any]) -> Batch:
        worker, counters = batch.pop(WORKER_COUNTERS)
        self.worker_counters[worker] = counters
        return {
            name: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
            for name, v in batch.items()
        }

    def counters(self) -> dict[str, float]:
        """The main process's reader's counters plus each worker's, as of its last batch."""
        totals = self.reader.counters()
        for name, value in self.stopped_counts.items():
            totals[name] += value
        for counters in self.worker_counters.values():
            for name, value in counters.items():
                totals[name] += value
        return {**totals, "skipped_windows": self.skipped_windows}


def _batched(samples: Iterator[dict[str, Any]], size: int) -> Iterator[Batch]:
    """``samples`` collated ``size`` at a time, each batch as soon as its samples are."""
    while chunk := list(itertools.islice(samples, size)):
        yield default_collate(chunk)


def _numpy_collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """A worker's batch with numpy arrays for tensors, and its reader's counters.

    Numpy arrays cross the pipe pickled, in one copy, where torch would hand over each
    tensor's shared memory as a file descriptor, a socket connection per tensor (with 2
    workers that made the main process the bottleneck, at half the windows/s of none).
    """
    batch = {name: _as_numpy(value) for name, value in default_collate(samples).items()}
    batch[WORKER_COUNTERS] = (get_worker_info().id, _worker_reader.counters())
    return batch


def _as_numpy(value: Any) -> Any:
    """``value`` as a numpy array if it is a tensor numpy can hold (not bfloat16, say)."""
    if isinstance(value, torch.Tensor):
        with contextlib.suppress(TypeError, RuntimeError):
            return value.numpy()
    return value
