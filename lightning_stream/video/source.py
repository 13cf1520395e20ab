"""VideoSource: a LeRobot v3 dataset as a rank's stream source, windows of its episodes.

The main process plans and checks the data's identity; the windows are made by an
:class:`~lightning_stream.video.reader.EpisodeReader` per reader, run by the rank's
:class:`~lightning_stream.serving.ServingEngine`: this process's, on a thread of its own,
or each worker's (:class:`~lightning_stream.video.task.DecodeTask`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_stream.batching import Batch
from lightning_stream.plan import ReaderOrder
from lightning_stream.serving import PoolSpec, ServingEngine
from lightning_stream.skipped import SKIP_REASON
from lightning_stream.video.decode import DamagedVideoWarning
from lightning_stream.video.lerobot import file_sizes
from lightning_stream.video.reader import EpisodeReader
from lightning_stream.video.sidecar import VideoFile, build_missing
from lightning_stream.video.spec import VideoSpec
from lightning_stream.video.task import DecodeJob, DecodeTask
from lightning_stream.video.windows import transformed

log = logging.getLogger(__name__)


def to_tensors(batch: dict[str, Any]) -> Batch:
    """A numpy batch's arrays as tensors (sharing their memory); lists stay lists."""
    return {
        name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for name, value in batch.items()
    }


class VideoSource:
    """Episodes of a LeRobot v3 dataset, as ``num_splits`` equal splits of anchors; the
    format of its :class:`~lightning_stream.serving.ServingEngine`."""

    cumulative = ("bytes_loaded", "frames_decoded")

    def __init__(self, spec: VideoSpec, rank: int = 0) -> None:
        self.reader = EpisodeReader(spec)
        dataset = self.reader.dataset
        self.manifest = self._manifest(file_sizes(dataset))
        videos = [
            VideoFile(dataset.fs, dataset.path(relative))
            for files in dataset.episodes.video_files.values()
            for relative in files
        ]
        # every rank reads nearly every file within an epoch (the episodes are shuffled
        # over the splits each epoch), so each node builds the sidecars of all of them
        built, seconds = build_missing(
            videos, Path(spec.sidecar_dir), spec.root, spec.lock_timeout, rank
        )
        if built:
            log.info(
                "built %d MP4 sidecars of %s in %.1f s (%.3f s a file)",
                built,
                spec.root,
                seconds,
                seconds / built,
            )
        # the chunk length depends on the frames' sizes, read from the MP4s' indexes here
        self.spec = spec = dataclasses.replace(spec, chunk_frames=self.reader.chunk_frames())
        self.reader.spec = spec
        self.num_splits = spec.num_splits
        self.skipped_windows = 0
        total = int(self.reader.anchor_lengths.sum())
        self.split_len = total // spec.num_splits
        self.dropped = total % spec.num_splits
        # the reading thread leaves image_transforms to the main thread: their random
        # draws and training_step's come from the same global generators, in batch order
        self.reader.applies_transforms = False
        self.engine = ServingEngine(self)

    def start_workers(self, workers: int, batch_size: int) -> None:
        """Start the rank's ``workers`` decoding processes now (``setup`` does not wait for
        them); they are kept for every epoch, and replaced if the batch size changes (a
        batch-size finder), since their shared-memory slots are sized for one batch."""
        self.engine.start_pool(workers, batch_size)

    def _sample_bytes(self) -> int:
        """Bytes of one sample's arrays (frames of the spec's dtype, Parquet features), from
        the sizes ``meta/info.json`` declares."""
        reader = self.reader
        dataset = reader.dataset
        itemsize = 4 if self.spec.image_dtype == "float32" else 1
        total = 64 * (len(reader.columns) + 8)
        for camera in dataset.cameras:
            height, width = dataset.frame_shape(camera)
            frames = len(reader.offsets.get(camera, [0]))
            total += frames * 3 * height * width * itemsize
        for column in reader.columns:
            feature = dataset.features[column]
            values = int(np.prod(feature.get("shape") or [1]))
            frames = len(reader.offsets.get(column, [0]))
            total += frames * values * 8  # at most 8 bytes a value
        return total

    def stop_workers(self) -> None:
        self.engine.close()

    def _manifest(self, sizes: dict[str, int]) -> str:
        """A digest of ``meta/info.json``, of the selected episodes' metadata (what the
        epoch's plan is made of) and of the name and size of every data and video file they
        use: no file's content is read at setup. A file replaced by one of the same size is
        not seen here; its sidecar's content fingerprint catches an MP4 at its first read
        (and indexes it again)."""
        dataset = self.reader.dataset
        episodes = dataset.episodes
        digest = hashlib.blake2b(dataset.read_bytes("meta/info.json"), digest_size=16)
        for array in (episodes.index, episodes.length, episodes.data_file):
            digest.update(np.ascontiguousarray(array).tobytes())
        for camera in dataset.cameras:
            digest.update(np.ascontiguousarray(episodes.video_file[camera]).tobytes())
            digest.update(np.ascontiguousarray(episodes.from_timestamp[camera]).tobytes())
        for relative, size in sorted(sizes.items()):
            digest.update(f"{relative}\0{size}\0".encode())
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

    def counters(self) -> dict[str, float]:
        return {**self.engine.counters(), "skipped_windows": self.skipped_windows}

    # -- the serving engine's format (lightning_stream.serving.SourceFormat) ----------
    @property
    def activity(self) -> str:
        return f"decoding {self.spec.root!r}"

    def reader_here(self) -> tuple[DecodeTask, EpisodeReader]:
        return DecodeTask(self.spec), self.reader

    def pool(self, workers: int, batch_size: int) -> PoolSpec:
        slot_bytes = int(1.1 * batch_size * self._sample_bytes()) + 2**16
        return PoolSpec(DecodeTask(self.spec), slot_bytes, "video-decoder", self.spec.shuffle_seed)

    def job(self, epoch: int, order: ReaderOrder, pooled: bool) -> DecodeJob:
        return DecodeJob(epoch, order)

    def finish(self, payload: dict[str, Any], pooled: bool) -> Batch:
        """A reader's numpy batch as tensors; the reading thread's cameras through
        ``image_transforms`` here. Its skipped windows are warned about and counted here,
        whichever process decoded them, so the logger sees the count."""
        transform = self.spec.image_transforms
        if not pooled and transform is not None:
            for camera in self.reader.dataset.cameras:
                payload[camera] = transformed(payload[camera], transform)
        for reason in payload.get(SKIP_REASON, ()):
            if reason:
                self.skipped_windows += 1
                warnings.warn(reason, DamagedVideoWarning, stacklevel=2)
        return to_tensors(payload)
