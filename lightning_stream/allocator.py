"""glibc's allocator told to keep large read buffers for the next read.

lance allocates every read's buffers afresh, megabytes at a time. glibc serves a block
above its mmap threshold (128 KiB, raised as blocks are freed) with a fresh mapping and
hands memory at the top of a heap above its trim threshold back to the kernel, so each
read faults its pages in again and the kernel zeroes them. On rows of 22 KB that was most
of a read's CPU: 25,000 clumped rows taken in reads of 760 cost 1.1-1.4 s of CPU with
glibc's defaults and 0.54-0.61 s with the thresholds below (one thread, the same rows;
a whole epoch of ``LanceDataModule`` at 0 workers ran 35k -> 42-48k rows/s).

glibc also gives threads arenas of their own, up to 8 per core, and lance's threads
allocate in many of them: what one arena frees another cannot reuse, so a reading process
grew epoch after epoch. 2M light rows, 8 epochs at 0 workers on 2 cores
(``benchmarks/memory_over_epochs.py``): with glibc's defaults, resident memory at each
epoch's end went 1.13 -> 1.50 GB and 0.90 -> 1.31 GB (peak 1.57-1.63 GB; the thresholds
above alone did not stop it); with at most ``ARENA_MAX`` arenas it stayed at 0.87-0.92
and 0.97-1.01 GB (peak 1.24-1.27 GB), at the same speed (0.75-0.89M rows/s either way).
Rows of 22 KB read at 0.95-1.0 of the speed of glibc's arenas (within this host's noise).

The settings are process-wide; each process sets them once, before it opens a table
(``LanceDataModule.setup`` in the main process, each reading worker as it starts): a
thread keeps the arena it first allocated from, so the limit holds for lance's threads
only if it is set before lancedb starts them (on its first ``connect`` in the process).
A process whose environment already tunes glibc's malloc (``MALLOC_*_`` variables or
``GLIBC_TUNABLES``) is left as it is, as is any process when
``LIGHTNING_STREAM_MALLOC=0``; elsewhere than glibc this does nothing.
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
# Blocks up to 32 MiB (glibc's ceiling for this setting; a read is at most 32 MiB) come
# from the heap, and up to 64 MiB free at a heap's top stay there: two reads' worth. The
# memory held stays bounded by the reads in flight (a 22 KB-row epoch held 0.06 GB more).
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 64 * 2**20
ARENA_MAX = 4

_tuned: bool | None = None


def keep_read_buffers() -> bool:
    """Set glibc's thresholds and arena limit in this process (once); whether they are set."""
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
    return bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
        and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
        and mallopt(M_ARENA_MAX, ARENA_MAX)
    )
