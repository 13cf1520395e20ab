"""Atomic, durable publication of a file on a local file system."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

PARTIAL_SUFFIX = ".partial"


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@contextmanager
def atomic_write(final: Path) -> Iterator[BinaryIO]:
    """A file to write ``final``'s new content into; published only if the block succeeds.

    The content goes to ``.<name>.<pid>.<random>.partial`` in the same directory, is
    flushed and fsync-ed, renamed over ``final`` (atomic on POSIX file systems), and the
    directory is fsync-ed so the rename survives a power loss. Leftover partial files of
    the same name (from a killed writer) are removed first.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    for stale in final.parent.glob(f".{final.name}.*{PARTIAL_SUFFIX}"):
        stale.unlink(missing_ok=True)
    descriptor, partial = tempfile.mkstemp(
        dir=final.parent, prefix=f".{final.name}.{os.getpid()}.", suffix=PARTIAL_SUFFIX
    )
    try:
        with os.fdopen(descriptor, "wb") as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(partial, final)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    _fsync_directory(final.parent)
