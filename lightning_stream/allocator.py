"""glibc's allocator told to keep large read buffers for the next read.

lance allocates every read's buffers afresh, megabytes at a time. glibc serves a block
above its mmap threshold (128 KiB, raised as blocks are freed) with a fresh mapping and
hands memory at the top of a heap above its trim threshold back to the kernel, so each
read faults its pages in again and the kernel zeroes them: for rows of tens of KB, most of
a read's CPU. The thresholds below keep those blocks in the heap for the next read.

glibc also gives threads arenas of their own, up to 8 per core, and lance's threads
allocate in many of them: what one arena frees another cannot reuse, so a reading process
grows epoch after epoch. At most ``ARENA_MAX`` arenas keep it flat; the limit grows with
the cores (``max(4, cores)``), as lance's threads do. ``benchmarks/memory_over_epochs.py``
measures a reading process's memory over epochs with these settings, with the thresholds
alone and with glibc's defaults (figures: ``docs/benchmarks.md``).

Each process sets them once, as early as the package can: when a ``LanceDataModule`` is
made (before Lightning's ``prepare_data`` and ``setup``) and as each reading worker starts.
A thread keeps the arena it first allocated from, and glibc fixes its arena limit once a
process has more than 8 arenas: in a process that used lancedb before, lance's threads
keep the arenas they have (the thresholds still apply). The settings are process-wide:
they also apply to the rest of the training process. A process whose environment already
tunes glibc's malloc (``MALLOC_*_`` variables or ``GLIBC_TUNABLES``) is left as it is, as
is any process when ``LIGHTNING_STREAM_MALLOC=0``; elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# mallopt's parameter numbers (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
M_ARENA_MAX = -8
# Blocks up to 32 MiB (glibc's ceiling for this setting) come from the heap, and up to
# 64 MiB free at a heap's top stay there for the next reads.
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 64 * 2**20
ARENA_MAX = max(4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 4)

_tuned: bool | None = None


def keep_read_buffers() -> bool:
    """Set glibc's thresholds and arena limit in this process (once); whether glibc
    accepted them all (an arena limit set after the process had more than 8 arenas is
    accepted and has no effect)."""
    global _tuned
    if _tuned is None:
        _tuned = _tune()
    return _tuned


def _user_tunes_malloc() -> bool:
    return os.environ.get("LIGHTNING_STREAM_MALLOC") == "0" or any(
        name.startswith("MALLOC_") or name == "GLIBC_TUNABLES" for name in os.environ
    )


def _tune() -> bool:
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    if _user_tunes_malloc():
        return False
    mallopt = ctypes.CDLL(None).mallopt
    settings = (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
        (M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
        (M_ARENA_MAX, ARENA_MAX),
    )
    # a list, not a generator: each setting is applied even if one before it is refused
    return all([bool(mallopt(parameter, value)) for parameter, value in settings])
