"""VideoEpisodeDataModule: temporal windows of LeRobot v3 episodes, exactly resumable."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs
import torch
from typing_extensions import override

from lightning_stream.datamodule import StreamingDataModule, check_positive
from lightning_stream.plan import check_topology
from lightning_stream.storage import (
    StorageError,
    check_options,
    is_remote,
    pyarrow_filesystem,
    storage_error,
)
from lightning_stream.video.source import VideoSource
from lightning_stream.video.spec import VideoSpec
from lightning_stream.workers.checks import check_sendable

log = logging.getLogger(__name__)


def default_sidecar_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "lightning-stream" / "sidecars"


class VideoEpisodeDataModule(StreamingDataModule):
    """Windows of robot episodes (LeRobot dataset v3) with exact elastic resume.

    A sample follows ``LeRobotDataset``'s (documentation, "LeRobot parity"): every camera
    key gives ``[T, C, H, W]`` images (``T = len(delta_timestamps[key])``; ``[C, H, W]``
    with one delta or none), every per-frame Parquet feature its window (``[T, ...]``,
    also for one delta) or its value at the anchor, ``<key>_is_pad`` bool masks for keys with deltas
    (frames outside the episode are clamped to its edge and flagged), and
    ``episode_index``, ``frame_index``, ``index``, ``timestamp``, ``task_index`` and
    ``task`` (the task string). Frames are decoded from byte ranges of the MP4s, located
    through a sidecar index of each file, and checked against their presentation time.
    :attr:`stats` holds ``meta/stats.json`` for policy normalisers.

    Each epoch every selected frame is an anchor exactly once (up to ``num_splits - 1``
    frames are left out so the splits are equal); resume follows the same contract as
    :class:`~lightning_stream.LanceDataModule` through
    :class:`~lightning_stream.StreamStateCallback`.

    Args:
        root: dataset root: a directory or any URI ``pyarrow.fs`` opens.
        delta_timestamps: per key (camera or Parquet feature), offsets in seconds of the
            window's frames around the anchor, e.g. ``{"observation.images.front":
            [-0.1, 0.0]}``. Each must be a multiple of ``1 / fps`` within ``tolerance_s``,
            else ``ValueError`` (as LeRobot).
        num_splits: fixed splits of each epoch, balanced by frame count; keep it for the
            run. Must be divisible by ``world_size * max(1, num_workers)``.
        batch_size: samples per batch per process.
        num_workers: decoding worker processes per rank; default 0 (the main process
            decodes, on a thread of its own, up to 4 batches ahead of ``training_step``:
            :mod:`lightning_stream.workers.inline`). Started at ``setup`` without waiting
            for them, kept for every epoch (each begins the next epoch as soon as it
            finishes one), stopped at ``teardown``, and gone within moments of the training
            process if it dies, even by ``SIGKILL``. The batches do not depend on who decodes them
            (:mod:`lightning_stream.workers.pool`).
        shuffle_seed: seed of the episode order and each split's anchor order; default 0.
        episodes: episode indices to train on; default ``None`` (all). An empty list raises
            ``ValueError``.
        episode_pool_size: chunks of episodes resident per split (each decoded once, reused
            by all its windows; each round serves one window of each, in a seeded order);
            default 2. Part of the run's identity.
        byte_budget_gb: the most decoded frames (GiB) a rank holds, over all its reading
            processes, whatever ``num_splits``, ``episode_pool_size`` or the topology: it
            sets the chunk length (``budget / (num_splits x episode_pool_size)`` bytes per
            chunk, windows' margins included), so at world size 1 the rank may fill it and
            at world size N about ``1 / N`` of it. Larger chunks mix each batch less
            locally in time and cost fewer keyframe restarts. On an object store each
            reading process also keeps up to a sixteenth of it in compressed packets that
            both sides of a cut inside an episode need, so they are fetched once. Default
            1.0. Part of the run's identity (it changes the anchor order); too small to
            hold one window's frames per chunk raises ``ValueError`` at setup.
        image_transforms: callable on each camera's window of images (a tensor of
            ``image_dtype``), run in the worker; must be picklable when ``num_workers >
            0``. Define it in a module rather than in the training script: workers import
            the script only to find it there (slower to start; the script then needs an
            ``if __name__ == "__main__":`` guard). Default ``None``.
        sidecar_dir: cache of the MP4 sidecar indexes; default
            ``~/.cache/lightning-stream/sidecars``.
        sidecar_lock_timeout: seconds to wait for another process building a sidecar;
            default 600.
        tolerance_s: how far (seconds) a delta may be off the fps grid; default ``1e-4``,
            LeRobot's.
        image_dtype: ``"uint8"`` (default: 0-255, a quarter of float32's memory and of the
            bytes moved from workers and to the device; normalise there, e.g.
            ``images.float() / 255``) or ``"float32"`` (in ``[0, 1]``, as LeRobot gives).
        drop_n_last_frames: the last frames of each episode that are never anchors (still
            in other anchors' windows), like LeRobot's ``EpisodeAwareSampler``; default 0.
            Part of the run's identity: it changes the epoch's anchors.
        on_decode_error: ``"raise"`` (default): a damaged packet raises
            :class:`~lightning_stream.video.decode.DamagedVideoError` naming the MP4 file,
            the episode and the frame's time. ``"skip"``: its windows are left out of
            training with a ``DamagedVideoWarning`` naming them, counted in
            ``loader/skipped_windows``; a skipped window counts as consumed, so a resume
            does not serve it again and the rest of the epoch stays exactly once.
        storage_options: object-store options for an ``s3://`` root, with lancedb's names
            (``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``,
            ``aws_region``, ``aws_endpoint``, ``allow_http``), mapped onto
            ``pyarrow.fs.S3FileSystem``; default ``None`` (pyarrow reads the ``AWS_*``
            environment variables). Never written to checkpoints, logs or errors.
        filesystem: a ready ``pyarrow.fs.FileSystem`` holding ``root`` (then ``root`` is a
            path on it; a ``scheme://`` prefix is dropped), for stores or settings that
            ``storage_options`` does not cover; default ``None``.
        pin_memory: as ``DataLoader``'s: with an accelerator, every training batch is
            copied into page-locked memory in the training process, for Lightning's
            ``non_blocking`` copy to the device (the decoded frames are most of a batch's
            bytes); without one, a warning once and no effect. Default ``False``; which
            windows form a batch does not change.
    """

    def __init__(
        self,
        root: str,
        *,
        delta_timestamps: dict[str, list[float]],
        num_splits: int,
        batch_size: int,
        num_workers: int = 0,
        shuffle_seed: int = 0,
        episodes: list[int] | None = None,
        episode_pool_size: int = 2,
        byte_budget_gb: float = 1.0,
        image_transforms: Callable[[torch.Tensor], torch.Tensor] | None = None,
        sidecar_dir: str | None = None,
        sidecar_lock_timeout: float = 600.0,
        tolerance_s: float = 1e-4,
        image_dtype: str = "uint8",
        drop_n_last_frames: int = 0,
        on_decode_error: str = "raise",
        storage_options: dict[str, str] | None = None,
        filesystem: pafs.FileSystem | None = None,
        pin_memory: bool = False,
    ) -> None:
        super().__init__(pin_memory)
        check_options(storage_options)
        if storage_options and filesystem is not None:
            raise ValueError("pass storage_options or filesystem, not both")
        check_positive(num_splits=num_splits, batch_size=batch_size)
        check_positive(episode_pool_size=episode_pool_size)
        if episodes is not None and not len(episodes):
            raise ValueError(
                "episodes=[] selects no episode: pass the episode indices to train on, or"
                " episodes=None for all"
            )
        for name, value, allowed in (
            ("image_dtype", image_dtype, ("uint8", "float32")),
            ("on_decode_error", on_decode_error, ("raise", "skip")),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r}: use one of {allowed}")
        if not isinstance(drop_n_last_frames, int) or drop_n_last_frames < 0:
            raise ValueError(
                f"drop_n_last_frames must be a non-negative integer, got {drop_n_last_frames!r}"
            )
        remote = "://" in root or filesystem is not None
        self.root = root if remote else os.path.abspath(root)
        self.storage_options = storage_options
        self.spec = VideoSpec(
            root=self.root,
            episodes=tuple(episodes) if episodes is not None else None,
            delta_timestamps={k: tuple(float(d) for d in v) for k, v in delta_timestamps.items()},
            num_splits=num_splits,
            shuffle_seed=shuffle_seed,
            pool_size=episode_pool_size,
            byte_budget_gb=byte_budget_gb,
            sidecar_dir=str(sidecar_dir or default_sidecar_dir()),
            lock_timeout=sidecar_lock_timeout,
            image_transforms=image_transforms,
            tolerance_s=tolerance_s,
            image_dtype=image_dtype,
            drop_n_last_frames=drop_n_last_frames,
            on_decode_error=on_decode_error,
            filesystem=_filesystem(self.root, storage_options, filesystem),
        )
        self.stats: dict[str, dict[str, torch.Tensor]] | None = None
        self.batch_size = batch_size
        self.num_workers = num_workers

    @override
    def setup(self, stage: str) -> None:
        if stage != "fit":
            return
        rank, world_size = self._rank_and_world()
        check_topology(self.spec.num_splits, world_size, self.num_workers)
        if self.num_workers:
            check_sendable(self.spec.image_transforms, "image_transforms")
        try:
            source = VideoSource(self.spec, rank)
        except OSError as exc:
            if not is_remote(self.root) or isinstance(exc, StorageError):
                raise
            raise storage_error(self.root, exc, self.storage_options) from None
        self.stats = stats_tensors(source.reader.dataset.stats)
        self._check_keys(source)
        frames = source.split_len * self.spec.num_splits + source.dropped
        log.info(
            "%s: %d frames in %d splits of %d; %d frames per epoch left out",
            self.root,
            frames,
            self.spec.num_splits,
            source.split_len,
            source.dropped,
        )
        self._start_stream(source, self.num_workers)
        if self.num_workers:
            source.start_workers(self.num_workers, self._served_batch_size())

    @override
    def teardown(self, stage: str) -> None:
        """Stops the decoding workers that ``setup("fit")`` started."""
        if stage == "fit" and self.stream is not None:
            self.stream.source.stop_workers()

    def _check_keys(self, source: VideoSource) -> None:
        known = set(source.reader.dataset.features)
        unknown = sorted(set(self.spec.delta_timestamps) - known)
        if unknown:
            raise ValueError(
                f"delta_timestamps has keys {unknown} that are not features of {self.root!r}"
                f" (its features: {sorted(known)})"
            )


def stats_tensors(stats: dict | None) -> dict[str, dict[str, torch.Tensor]] | None:
    """``meta/stats.json`` as float32 tensors, ``{feature: {"mean": ..., "std": ...}}``: the
    nested mapping LeRobot policies' normalisers take (``dataset.meta.stats``, there numpy)."""
    if stats is None:
        return None
    return {
        feature: {name: torch.tensor(value, dtype=torch.float32) for name, value in s.items()}
        for feature, s in stats.items()
    }


def _filesystem(
    root: str, storage_options: dict[str, str] | None, filesystem: pafs.FileSystem | None
) -> pafs.FileSystem | None:
    """The file system given, or built from the options; ``None``: resolved from ``root``
    in each reading process at setup (no network access at construction)."""
    if filesystem is None and storage_options:
        return pyarrow_filesystem(root, storage_options)[0]
    return filesystem
