"""The settings of a video data module that every reading process of a rank needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs


@dataclass(frozen=True)
class VideoSpec:
    """Everything a reading process needs to build samples; picklable."""

    root: str
    episodes: tuple[int, ...] | None
    delta_timestamps: dict[str, tuple[float, ...]]
    num_splits: int
    shuffle_seed: int
    pool_size: int
    byte_budget_gb: float
    sidecar_dir: str
    lock_timeout: float
    image_transforms: Callable[[Any], Any] | None = None
    tolerance_s: float = 1e-4
    image_dtype: str = "uint8"
    drop_n_last_frames: int = 0
    on_decode_error: str = "raise"
    # anchors per chunk, from the byte budget (VideoSource sets it at setup)
    chunk_frames: int = 0
    # holds credentials: out of repr (logs, errors); pickled only to the workers
    filesystem: pafs.FileSystem | None = field(default=None, repr=False, compare=False)
