"""Measurement helpers shared by the benchmarks."""

from __future__ import annotations

import os
import threading


def tree_rss_mb() -> float:
    """Resident memory of this process and all its descendants, from /proc."""
    total, pending = 0, [os.getpid()]
    while pending:
        pid = pending.pop()
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as children:
                    pending.extend(int(child) for child in children.read().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total / 1024


class PeakRss:
    def __enter__(self) -> PeakRss:
        self.peak = tree_rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, tree_rss_mb())

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
