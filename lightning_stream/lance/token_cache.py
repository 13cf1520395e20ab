"""A token column's per-row counts, and its local copy, written once per table version.

Packing needs the token count of every row (:class:`~lightning_stream.lance.packed.TokenCounts`);
with ``TokenPacking(local_copy=True)`` its readers also read the documents from a copy of
the column on local disk (:mod:`lightning_stream.lance.documents`). Both are written by
one scan of the column under a file lock (one process of a machine scans, the others
wait), each file moved in place once whole, keyed by the table's uri, name and version
and the column.
"""

from __future__ import annotations

import hashlib
import logging
import os
from contextlib import nullcontext
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
    at the pinned version (a null row counts 0), and with ``packing.local_copy`` the
    column's :class:`LocalTokens`: read from the cache, or written by one scan of the
    column under a file lock (one process of a machine scans, the others wait)."""
    column = packing.column
    key = f"{opener.uri}\0{opener.name}\0{opener.version}\0{column}".encode()
    base = cache_dir / hashlib.sha256(key).hexdigest()[:32]
    lengths = Path(f"{base}.npy")
    local = None
    if packing.local_copy:
        dtype = np.dtype(table.schema.field(column).type.value_type.to_pandas_dtype())
        eos = packing.eos_id
        if eos is not None and eos > np.iinfo(dtype).max:
            dtype = np.dtype(np.int64)
        named = f"{base}.eos{eos}" if eos is not None else str(base)
        files = (f"{named}.tokens", f"{named}.starts")
        local = LocalTokens(*files, dtype.str, eos, table.count_rows())
    wanted = [lengths] + ([Path(local.tokens), Path(local.starts)] if local else [])
    if all(path.exists() for path in wanted):
        return str(lengths), local
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{lengths}.lock"):
        if not all(path.exists() for path in wanted):
            log.info(
                "counting the tokens of column %r of table %r (version %d)%s, once per"
                " version, into %s",
                column,
                opener.name,
                opener.version,
                " and copying them" if local else "",
                cache_dir,
            )
            _scan_tokens(table, column, lengths, local)
    return str(lengths), local


def _scan_tokens(table: Any, column: str, path: Path, local: LocalTokens | None) -> None:
    """Write the row lengths to ``path`` and, with ``local``, the tokens and row starts:
    each file written aside and moved in place once whole."""
    rows = local.rows if local is not None else table.count_rows()
    lengths = np.empty(rows, dtype=np.int32)
    done = 0
    partial = f".{os.getpid()}.partial"
    with open(local.tokens + partial, "wb") if local else nullcontext() as copy:
        for batch in table.search().select([column]).to_batches(SCAN_ROWS):
            documents = batch.column(0)
            counts = pc.fill_null(pc.list_value_length(documents), 0).to_numpy()
            lengths[done : done + len(counts)] = counts
            done += len(counts)
            if local is not None:
                tokens = pc.list_flatten(documents).to_numpy(zero_copy_only=False)
                tokens = tokens.astype(local.dtype, copy=False)
                if local.eos_id is not None:
                    tokens = np.insert(tokens, np.cumsum(counts), local.eos_id)
                tokens.tofile(copy)
    if done != rows:
        raise RuntimeError(f"the scan of column {column!r} gave {done} rows of {rows}")
    if local is not None:
        extra = int(local.eos_id is not None)
        starts = np.concatenate([[0], np.cumsum(lengths + extra, dtype=np.int64)])
        starts.tofile(local.starts + partial)
        os.replace(local.tokens + partial, local.tokens)
        os.replace(local.starts + partial, local.starts)
    with open(f"{path}{partial}", "wb") as out:
        np.save(out, lengths)
    os.replace(f"{path}{partial}", path)
