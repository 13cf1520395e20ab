"""``pin_memory``: batches copied into page-locked memory before Lightning moves them.

A tensor in page-locked (pinned) host memory can be copied to an accelerator while the
host goes on: Lightning moves a batch with ``.to(device, non_blocking=True)`` on CUDA,
which from pageable memory waits for the copy. As ``DataLoader(pin_memory=True)`` with
``num_workers=0`` does, a batch is pinned in the training process when it leaves the
loader; with no accelerator (or on MPS, where pinned memory is not supported) there is
nothing to pin for, and ``pin_memory=True`` warns once and changes nothing.

Pinning copies each tensor of the batch once, on the thread that hands the batch to
Lightning (``loader/wait_s`` of :class:`~lightning_stream.LoaderMonitor` includes it).
No thread of its own pins ahead, as DataLoader's workers have: the batches are cut from
the source on that thread, and an iterator Lightning drops mid-epoch must stop there
before the next epoch's begins. ``benchmarks/pin_memory.py`` measures both sides on a
GPU: the pinning, and the copy to the device overlapping a step.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_warn


def pinning_device() -> str | None:
    """The accelerator batches would be pinned for (``"cuda"``, ...), or ``None``."""
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    if accelerator is None:
        return "cuda" if torch.cuda.is_available() else None
    if not accelerator.is_available():
        return None
    current = accelerator.current_accelerator()
    return None if current is None else current.type


def resolve_pin_memory(pin_memory: bool, owner: str) -> bool:
    """Whether ``owner``'s batches are pinned: ``pin_memory`` and an accelerator that
    takes pinned memory. ``pin_memory=True`` without one warns (a ``UserWarning``)."""
    if not pin_memory:
        return False
    device = pinning_device()
    if device is None or device == "mps":
        reason = "no accelerator is found" if device is None else "MPS does not support it"
        rank_zero_warn(
            f"{owner}(pin_memory=True) has no effect: {reason}, so batches stay in pageable"
            " memory (as DataLoader(pin_memory=True) does). Pass pin_memory=False to"
            " silence this warning."
        )
        return False
    return True


def pin_batch(batch: Any) -> Any:
    """``batch`` with every tensor in page-locked memory: in dicts, lists and tuples,
    at any depth. Other values (strings, numpy arrays) are returned as they are."""
    if isinstance(batch, torch.Tensor):
        return batch.pin_memory()
    if isinstance(batch, dict):
        return {key: pin_batch(value) for key, value in batch.items()}
    if isinstance(batch, list):
        return [pin_batch(value) for value in batch]
    if isinstance(batch, tuple):
        values = [pin_batch(value) for value in batch]
        return type(batch)(*values) if hasattr(batch, "_fields") else tuple(values)
    return batch


class PinnedLoader:
    """A re-iterable loader whose batches are pinned (:func:`pin_batch`), with the
    length of the loader it wraps."""

    def __init__(self, loader: Iterable[Any]) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return map(pin_batch, self.loader)

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]
