"""VideoSource: a LeRobot v3 dataset as a rank's stream source, windows of its episodes.

The main process plans, checks the data's identity and turns batches into tensors; the
windows are made by an :class:`~lightning_stream.video.reader.EpisodeReader`: this
process's, on a thread of its own (``num_workers=0``,
:class:`~lightning_stream.workers.inline.InlineReader`; the plan's head after an elastic
resume, when there are several workers, in the main thread), or each worker's, in a
:class:`~lightning_stream.workers.pool.WorkerPool`
(:class:`~lightning_stream.video.task.DecodeTask`). When an epoch starts, the readers are
also given the epoch that probably comes next: they begin it as soon as they finish this
one, so its first batches are ready before it is asked for.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lightning_stream.batching import Batch
from lightning_stream.plan import RankEpochPlan
from lightning_stream.skipped import SKIP_REASON
from lightning_stream.video.decode import DamagedVideoWarning
from lightning_stream.video.lerobot import file_sizes
from lightning_stream.video.reader import EpisodeReader
from lightning_stream.video.sidecar import VideoFile, build_missing
from lightning_stream.video.spec import VideoSpec
from lightning_stream.video.task import DecodeJob, DecodeTask, batches, reader_positions
from lightning_stream.video.windows import transformed
from lightning_stream.workers.inline import InlineReader
from lightning_stream.workers.pool import WorkerDied, WorkerPool

_STOPPED = ("bytes_loaded", "frames_decoded")
log = logging.getLogger(__name__)


def to_tensors(batch: dict[str, Any]) -> Batch:
    """A numpy batch's arrays as tensors (sharing their memory); lists stay lists."""
    return {
        name: torch.from_numpy(value) if isinstance(value, np.ndarray) else value
        for name, value in batch.items()
    }


class VideoSource:
    """Episodes of a LeRobot v3 dataset, as ``num_splits`` equal splits of anchors."""

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
        self.pool: WorkerPool | None = None
        self.inline: InlineReader | None = None  # num_workers=0: the reader's thread
        self._pool_batch_size = 0
        self.stopped_counts = dict.fromkeys(_STOPPED, 0.0)  # of the workers of past pools

    def start_workers(self, workers: int, batch_size: int) -> WorkerPool:
        """The rank's ``workers`` decoding processes, started at once (``setup`` does not
        wait for them) and kept for every epoch; new ones if the batch size changed (a
        batch-size finder), since their shared memory slots are sized for one batch."""
        if self.pool is None or (self.pool.workers, self._pool_batch_size) != (workers, batch_size):
            self.stop_workers()
            slot_bytes = int(1.1 * batch_size * self._sample_bytes()) + 2**16
            self.pool = WorkerPool(
                DecodeTask(self.spec), workers, slot_bytes, "video-decoder", self.spec.shuffle_seed
            )
            self._pool_batch_size = batch_size
        return self.pool

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
        if self.inline is not None:
            inline, self.inline = self.inline, None
            inline.close()
        if self.pool is None:
            return
        for counters in self.pool.counters:
            for name in _STOPPED:
                self.stopped_counts[name] += (counters or {}).get(name, 0.0)
        pool, self.pool = self.pool, None
        pool.close()

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

    def chunks(
        self,
        epoch: int,
        consumed: list[int],
        plan: RankEpochPlan,
        upcoming: tuple[int, RankEpochPlan] | None = None,
    ) -> Iterator[Batch]:
        """This rank's windows of ``epoch`` in plan order; ``upcoming``: the epoch (and
        its plan) that probably follows, which the workers begin when this one ends."""
        workers = plan.num_workers
        after = None
        if upcoming is not None:
            after = (upcoming, self._jobs(*upcoming))
        if workers == 0:
            if self.inline is None:
                # the main thread applies image_transforms, in batch order: their random
                # draws and training_step's come from the same global generators
                self.reader.applies_transforms = False
                self.inline = InlineReader(DecodeTask(self.spec), self.reader)
            job = self._jobs(epoch, plan)[0]
            queued = after and (after[0], after[1][0])
            served = self.inline.serve((epoch, plan), job, self._transformed, queued)
            yield from self._tensors(served, converted=True)
            return
        pool = self.start_workers(workers, plan.batch_size)
        if workers > 1 and plan.head:
            # the lagging splits of an elastic resume, before the workers' level cycles
            positions = reader_positions(plan, range(0), head=True)
            for batch in self._tensors(batches(self.reader, epoch, positions, plan.batch_size)):
                pool.ready()  # a worker that failed to start says so now
                yield batch
            self.reader.clear()  # the workers finish the head's chunks
        served = pool.serve((epoch, plan), self._jobs(epoch, plan), to_tensors, after)
        try:
            yield from self._tensors(served, converted=True)
        except WorkerDied as exc:
            self.stop_workers()
            raise RuntimeError(
                f"a decoding worker of rank {plan.rank} died while decoding {self.spec.root!r}"
                f" ({exc}). Nothing after the last checkpoint is lost: resume with"
                " trainer.fit(..., ckpt_path=<last checkpoint>)"
            ) from exc

    def _transformed(self, batch: dict[str, Any]) -> Batch:
        """A batch of the reading thread, its cameras through ``image_transforms``."""
        transform = self.spec.image_transforms
        if transform is not None:
            for camera in self.reader.dataset.cameras:
                batch[camera] = transformed(batch[camera], transform)
        return to_tensors(batch)

    def _jobs(self, epoch: int, plan: RankEpochPlan) -> list[DecodeJob]:
        """Each reader's job; with several workers the main process serves the head."""
        readers = max(1, plan.num_workers)
        return [DecodeJob(epoch, plan, w, readers, readers == 1) for w in range(readers)]

    def _tensors(self, batches: Iterable[Any], converted: bool = False) -> Iterator[Batch]:
        """Batches as tensors, their skipped windows warned about and counted (here, in
        the main process, whichever process decoded them, so the logger sees the count)."""
        for batch in batches:
            for reason in batch.get(SKIP_REASON, ()):
                if reason:
                    self.skipped_windows += 1
                    warnings.warn(reason, DamagedVideoWarning, stacklevel=2)
            yield batch if converted else to_tensors(batch)

    def counters(self) -> dict[str, float]:
        """The main process's reader's counters plus each worker's, as of its last batch."""
        # never the reader's own while its thread may be changing it
        inline = self.inline
        totals = dict(inline.counters[0]) if inline is not None else self.reader.counters()
        for name, value in self.stopped_counts.items():
            totals[name] += value
        for counters in self.pool.counters if self.pool is not None else ():
            for name, value in (counters or {}).items():
                totals[name] += value
        return {**totals, "skipped_windows": self.skipped_windows}
