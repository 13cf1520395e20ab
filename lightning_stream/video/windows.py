"""Window assembly: a batch of samples, as ``LeRobotDataset`` gives them, in numpy.

A batch is built column by column from the anchors of its positions: every camera with
deltas gives ``[B, T, C, H, W]`` frames (``[B, C, H, W]`` with one frame) and a
``<camera>_is_pad`` mask, every per-frame Parquet feature its window or its value at the
anchor, then the ids (``episode_index``, ``frame_index``, ``index``, ``timestamp``,
``task_index``) and ``task`` (the task strings). The main process turns the arrays into
tensors (:func:`lightning_stream.video.source.to_tensors`). A window whose frames were
lost to damage (``on_decode_error="skip"``) is a zero placeholder whose
``SKIP_REASON`` says why; the stream drops it before ``training_step``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from lightning_stream.skipped import SKIP_REASON
from lightning_stream.video.decode import DamagedVideoError
from lightning_stream.video.plan import window
from lightning_stream.video.reader import EpisodeReader

Batch = dict[str, Any]


def assemble(reader: EpisodeReader, epoch: int, positions: Iterable[tuple[int, int]]) -> Batch:
    """The batch of the anchors at ``positions`` (``(split, position)`` pairs) of ``epoch``;
    each chunk is dropped after its last anchor."""
    anchors = []  # (episode slot, frame)
    chunks = []  # each anchor's chunk, kept for its rows after the chunk is released
    images: dict[str, list[np.ndarray]] = {camera: [] for camera in reader.dataset.cameras}
    reasons: list[str] = []
    for split, position in positions:
        slot, frame, chunk = reader.chunk(epoch, split, position)
        anchors.append((slot, frame))
        chunks.append(chunk)
        reasons.append("")
        for camera, gathered in images.items():
            frames = _frames(reader, camera, slot, frame)
            try:
                gathered.append(reader.window(slot, camera, frames, chunk))
            except DamagedVideoError as exc:
                if reader.spec.on_decode_error == "raise":
                    raise
                episode = int(reader.episodes.index[slot])
                reasons[-1] = (
                    f"on_decode_error='skip': skipped the window of episode {episode} at"
                    f" frame {frame} ({frame / reader.fps:.3f} s): {exc}"
                )
                track, _ = reader.track(reader.episodes.video(slot, camera)[0], camera)
                gathered.append(np.zeros((len(frames), track.height, track.width, 3), np.uint8))
        reader.release(split, position, epoch)
    batch: Batch = {}
    for camera, gathered in images.items():
        if camera in reader.offsets:
            batch[f"{camera}_is_pad"] = np.stack([_pad(reader, camera, *a) for a in anchors])
        batch[camera] = _camera_batch(reader, gathered)
    if reader.spec.on_decode_error == "skip":
        batch[SKIP_REASON] = reasons
    slots = np.asarray([slot for slot, _ in anchors], dtype=np.int64)
    frames = np.asarray([frame for _, frame in anchors], dtype=np.int64)

    def at_anchors(column: str) -> np.ndarray:
        return np.stack([c.row(column, f) for c, f in zip(chunks, frames.tolist(), strict=True)])

    for column in reader.columns:
        if column in reader.offsets:
            windows = [window(f, reader.lengths[s], reader.offsets[column]) for s, f in anchors]
            batch[column] = np.stack(
                [c.row(column, w[0]) for c, w in zip(chunks, windows, strict=True)]
            )
            batch[f"{column}_is_pad"] = np.stack([w[1] for w in windows])
        else:
            batch[column] = at_anchors(column)
    batch["episode_index"] = reader.episodes.index[slots]
    batch["frame_index"] = frames
    batch["index"] = at_anchors("index").astype(np.int64)
    batch["timestamp"] = at_anchors("timestamp").astype(np.float32)
    task_index = at_anchors("task_index").astype(np.int64)
    batch["task_index"] = task_index
    batch["task"] = [reader.dataset.tasks.get(int(t), "") for t in task_index]
    return batch


def _frames(reader: EpisodeReader, camera: str, slot: int, frame: int) -> np.ndarray:
    """The episode frames of a camera's window (the anchor alone without deltas)."""
    if camera not in reader.offsets:
        return np.asarray([frame])
    return window(frame, reader.lengths[slot], reader.offsets[camera])[0]


def _pad(reader: EpisodeReader, key: str, slot: int, frame: int) -> np.ndarray:
    return window(frame, reader.lengths[slot], reader.offsets[key])[1]


def _camera_batch(reader: EpisodeReader, windows: list[np.ndarray]) -> Any:
    """``[B, T, C, H, W]`` (``[B, C, H, W]`` for one frame) images of one camera, of the
    spec's dtype, each window through ``image_transforms`` when given and the reader
    applies them."""
    images = np.moveaxis(np.stack(windows), -1, -3)  # [B, T, H, W, 3] -> [B, T, 3, H, W]
    if images.shape[1] == 1:
        images = images[:, 0]  # one frame: [C, H, W], as LeRobot squeezes it
    images = np.ascontiguousarray(images)
    if reader.spec.image_dtype == "float32":
        images = images.astype(np.float32)
        images /= 255
    transform = reader.spec.image_transforms
    if transform is None or not reader.applies_transforms:
        return images
    return transformed(images, transform)


def transformed(images: np.ndarray, transform: Callable[[Any], Any]) -> Any:
    """Each window of ``images`` through ``transform`` (it takes and gives tensors)."""
    import torch  # only a transform needs it

    return as_numpy(torch.stack([transform(torch.from_numpy(image)) for image in images]))


def as_numpy(value: Any) -> Any:
    """``value`` as a numpy array if it is a tensor numpy can hold (not bfloat16, say):
    an array crosses from a worker in shared memory, a tensor pickled."""
    if type(value).__module__.startswith("torch"):
        with contextlib.suppress(TypeError, RuntimeError):
            return value.numpy()
    return value
