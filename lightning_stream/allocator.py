"""glibc's allocator told to keep large read buffers for the next read.

lance allocates every read's buffers afresh, megabytes at a time. glibc serves a block
above its mmap threshold (128 KiB, raised as blocks are freed) with a fresh mapping and
hands memory at the top of a heap above its trim threshold back to the kernel, so each
read faults its pages in again and the kernel zeroes them. On rows of 22 KB that was most
of a read's CPU: 25,000 clumped rows taken in reads of 760 cost 1.1-1.4 s of CPU with
glibc's defaults and 0.54-0.61 s with the thresholds below (one thread, the same rows;
a whole epoch of ``LanceDataModule`` at 0 workers ran 35k -> 42-48k rows/s).

The settings are process-wide; each reading process (the main process when it reads,
each reading worker) sets them once, before its first read. A process whose environment
already tunes glibc's malloc (``MALLOC_*_`` variables or ``GLIBC_TUNABLES``) is left as
it is, as is any process when ``LIGHTNING_STREAM_MALLOC=0``; elsewhere than glibc this
does nothing.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys

# mallopt's parameter numbers (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# Blocks up to 32 MiB (glibc's ceiling for this setting; a read is at most 32 MiB) come
# from the heap, and up to 64 MiB free at a heap's top stay there: two reads' worth. The
# memory held stays bounded by the reads in flight (a 22 KB-row epoch held 0.06 GB more).
MMAP_THRESHOLD_BYTES = 32 * 2**20
TRIM_THRESHOLD_BYTES = 64 * 2**20

_tuned: bool | None = None


def keep_read_buffers() -> bool:
    """Set glibc's thresholds in this process (once); whether they are set."""
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
    )
