"""Tasks for :class:`~lightning_stream.workers.pool.WorkerPool` tests (importable by the
workers, which do not run the test modules)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np


class Numbers:
    """Worker ``k``'s job ``(start, count)``: ``count`` payloads numbered from ``start``,
    each with an array of ``size`` copies of its number."""

    def __init__(self, size: int = 1_000) -> None:
        self.size = size

    def open(self, worker: int) -> dict:
        return {"worker": worker, "served": 0}

    def run(self, state: dict, job: tuple[int, int]) -> Iterator[dict]:
        start, count = job
        for number in range(start, start + count):
            state["served"] += 1
            yield {"worker": state["worker"], "number": number, "data": np.full(self.size, number)}

    def counters(self, state: dict) -> int:
        return state["served"]


class FailsToOpen(Numbers):
    def open(self, worker: int) -> dict:
        raise FileNotFoundError(f"worker {worker}: no table at 's3://bucket/missing'")


class FailsToLoad(Numbers):
    """Raises while a worker unpickles it (a transform whose module state is wrong)."""

    def __setstate__(self, state: dict) -> None:
        raise ImportError("the transform's weights file 'norm.pt' is missing")


class FailsAtTwo(Numbers):
    def run(self, state: dict, job: tuple[int, int]) -> Iterator[dict]:
        for payload in super().run(state, job):
            if payload["number"] == 2:
                raise ValueError("row 2 is corrupt")
            yield payload
