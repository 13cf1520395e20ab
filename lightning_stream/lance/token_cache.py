"""A token column's per-row counts, and its local copy, written once per table version.

Packing needs the token count of every row (:class:`~lightning_stream.lance.packed.TokenCounts`);
its readers cut the blocks from a copy of the column on local disk
(:mod:`lightning_stream.lance.copied`) when ``TokenPacking.local_copy`` is ``True``, or
``None`` (the default) and the copy fits in half the free space of the cache directory
(else a mark says so, and the documents are read from the table). Counts and copy are
written by one scan of the column under a file lock (one process of a machine scans, the
others wait), each file moved in place once whole, keyed by the table's uri, name and
version and the column.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
from filelock import FileLock

from lightning_stream.lance.reader import TableOpener
from lightning_stream.packing.option import TokenPacking

log = logging.getLogger(__name__)

# Rows a scan of the token column reads at once (a batch of documents, not of tokens).
SCAN_ROWS = 8192
# With local_copy=None, the most of its cache directory's free disk the copy may take.
COPY_SHARE_OF_FREE_DISK = 0.5


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "lightning-stream" / "token-lengths"


@dataclass(frozen=True)
class LocalTokens:
    """A local copy of a token column at one table version, for one ``eos_id``: every
    row's tokens end to end, each row followed by ``eos_id`` unless it is ``None``, as
    raw values of ``dtype`` (``tokens``), and where each row starts in them (``starts``:
    raw int64, one more than the ``rows`` of the table version)."""

    tokens: str
    starts: str
    dtype: str
    eos_id: int | None
    rows: int


def token_files(
    table: Any, opener: TableOpener, packing: TokenPacking, cache_dir: Path
) -> tuple[str, LocalTokens | None]:
    """The path of a ``.npy`` file of the token count of every row of ``packing.column``
    at the pinned version (a null row counts 0), and the column's :class:`LocalTokens`
    when there is to be a copy (``packing.local_copy``: ``True``, or ``None`` and the copy
    fits in ``COPY_SHARE_OF_FREE_DISK`` of the free space of ``cache_dir``): read from
    the cache, or written by one scan of the column under a file lock (one process of a
    machine scans, the others wait)."""
    column = packing.column
    key = f"{opener.uri}\0{opener.name}\0{opener.version}\0{column}".encode()
    base = cache_dir / hashlib.sha256(key).hexdigest()[:32]
    lengths = Path(f"{base}.npy")
    local = None if packing.local_copy is False else _local_tokens(table, packing, base)
    if _cached(lengths, local, packing):
        return str(lengths), _kept(local)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{lengths}.lock"):
        if not _cached(lengths, local, packing):
            room = None
            if packing.local_copy is None:
                room = int(shutil.disk_usage(cache_dir).free * COPY_SHARE_OF_FREE_DISK)
                needed = (
                    _copy_bytes(np.load(lengths, mmap_mode="r"), local) if lengths.exists() else 0
                )
                if needed > room:  # known from the counts: no scan to find it out
                    _decline(local, needed, room, cache_dir)
            if _cached(lengths, local, packing):
                return str(lengths), _kept(local)
            log.info(
                "counting the tokens of column %r of table %r (version %d)%s, once per"
                " version, into %s",
                column,
                opener.name,
                opener.version,
                " and copying them" if local else "",
                cache_dir,
            )
            _scan_tokens(table, column, lengths, local, room, cache_dir)
    return str(lengths), _kept(local)


def _local_tokens(table: Any, packing: TokenPacking, base: Path) -> LocalTokens:
    """Where the copy of ``packing.column`` is (or goes), and how it is stored."""
    dtype = np.dtype(table.schema.field(packing.column).type.value_type.to_pandas_dtype())
    eos = packing.eos_id
    if eos is not None and eos > np.iinfo(dtype).max:
        dtype = np.dtype(np.int64)
    named = f"{base}.eos{eos}" if eos is not None else str(base)
    return LocalTokens(f"{named}.tokens", f"{named}.starts", dtype.str, eos, table.count_rows())


def _declined_mark(local: LocalTokens) -> Path:
    """A file that says this machine has no room for the copy (``local_copy=None``)."""
    return Path(local.tokens).with_suffix(".declined")


def _cached(lengths: Path, local: LocalTokens | None, packing: TokenPacking) -> bool:
    """Whether the counts, and the copy unless it is declined here, are written."""
    if not lengths.exists() or local is None:
        return lengths.exists()
    if packing.local_copy is None and _declined_mark(local).exists():
        return True
    return Path(local.tokens).exists() and Path(local.starts).exists()


def _kept(local: LocalTokens | None) -> LocalTokens | None:
    """``local`` if its copy is written, ``None`` where it was declined."""
    return local if local is not None and Path(local.tokens).exists() else None


def _copy_bytes(lengths: np.ndarray, local: LocalTokens) -> int:
    """The size of the copy of rows of ``lengths`` tokens: its tokens and row starts."""
    tokens = int(lengths.sum(dtype=np.int64)) + (local.eos_id is not None) * len(lengths)
    return tokens * np.dtype(local.dtype).itemsize + 8 * (len(lengths) + 1)


def _decline(local: LocalTokens, needed: int, room: int, cache_dir: Path) -> None:
    """Record that the copy does not fit here, so that no process of this machine tries
    again at this table version."""
    log.warning(
        "the local copy of the token column would take %.1f GB, more than %d%% of the free"
        " space of %s (%.1f GB): its documents are read from the table instead. Pass a"
        " cache_dir with more room, or TokenPacking(local_copy=True) to copy anyway (once"
        " there is room, delete %s and this machine tries again)",
        needed / 1e9,
        round(COPY_SHARE_OF_FREE_DISK * 100),
        cache_dir,
        room / COPY_SHARE_OF_FREE_DISK / 1e9,
        _declined_mark(local),
    )
    _declined_mark(local).write_text(f"{needed} bytes needed, {room} allowed\n")


def _scan_tokens(
    table: Any,
    column: str,
    path: Path,
    local: LocalTokens | None,
    room: int | None,
    cache_dir: Path,
) -> None:
    """Write the row lengths to ``path`` and, with ``local``, the tokens and row starts:
    each file written aside and moved in place once whole. With a ``room`` in bytes, the
    copy is given up (its part deleted) as soon as it would take more."""
    rows = local.rows if local is not None else table.count_rows()
    lengths = np.empty(rows, dtype=np.int32)
    done = 0
    partial = f".{os.getpid()}.partial"
    copy = open(local.tokens + partial, "wb") if local is not None else None  # noqa: SIM115
    try:
        for batch in table.search().select([column]).to_batches(SCAN_ROWS):
            documents = batch.column(0)
            counts = pc.fill_null(pc.list_value_length(documents), 0).to_numpy()
            lengths[done : done + len(counts)] = counts
            done += len(counts)
            if copy is None:
                continue
            tokens = pc.list_flatten(documents).to_numpy(zero_copy_only=False)
            tokens = tokens.astype(local.dtype, copy=False)
            if local.eos_id is not None:
                tokens = np.insert(tokens, np.cumsum(counts), local.eos_id)
            tokens.tofile(copy)
            if room is not None and copy.tell() + 8 * (rows + 1) > room:
                copy.close()
                os.remove(copy.name)
                copy = None
    finally:
        if copy is not None:
            copy.close()
    if done != rows:
        raise RuntimeError(f"the scan of column {column!r} gave {done} rows of {rows}")
    if local is not None and copy is None:
        _decline(local, _copy_bytes(lengths, local), room, cache_dir)
    elif local is not None:
        extra = int(local.eos_id is not None)
        starts = np.concatenate([[0], np.cumsum(lengths + extra, dtype=np.int64)])
        starts.tofile(local.starts + partial)
        os.replace(local.tokens + partial, local.tokens)
        os.replace(local.starts + partial, local.starts)
    with open(f"{path}{partial}", "wb") as out:
        np.save(out, lengths)
    os.replace(f"{path}{partial}", path)
