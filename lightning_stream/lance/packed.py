"""A table's documents packed into blocks: token counts, the rows a reader reads, its job.

The arithmetic of which tokens each block holds is :mod:`lightning_stream.packing`; this
module adds the table: the tokens of every row (counted once per table version by a scan
of the token column's list lengths, and cached on local disk with, if asked for, a copy
of the column: :func:`token_files`),
the storage rows a reader reads in order (:class:`PackRows`, a
:class:`~lightning_stream.lance.reader.RowOrder` for the byte-bounded reader), and a
reader's job (:class:`PackJob`), whose blocks are made in the reader.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from filelock import FileLock

from lightning_stream.lance.order import storage_offsets
from lightning_stream.lance.reader import BudgetedReader, ReadCounters, TableOpener, Window
from lightning_stream.lance.selection import Selection
from lightning_stream.packing.blocks import BlockBuilder
from lightning_stream.packing.layout import ReaderBlocks, TokenLayout
from lightning_stream.packing.option import TokenPacking
from lightning_stream.placement import ClumpLayout, epoch_permutation

log = logging.getLogger(__name__)

# Rows a scan of the token column reads at once (a batch of documents, not of tokens).
SCAN_ROWS = 8192
# Blocks whose rows a reader computes at once.
NEEDS_BLOCKS = 256
# Bytes of tokens a reader of a local copy reads at once (its rows sorted, so that a
# split's rows of several batches are one file read).
COPY_WINDOW_BYTES = 8 * 2**20


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "lightning-stream" / "token-lengths"


@dataclass(frozen=True)
class LocalTokens:
    """A local copy of a token column at one table version, for one ``eos_id``: every
    row's tokens end to end, each row followed by ``eos_id`` unless it is ``None``, as
    raw values of ``dtype`` (``tokens``), and where each row starts in them (``starts``:
    raw int64, one more than the rows)."""

    tokens: str
    starts: str
    dtype: str
    eos_id: int | None


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
        local = LocalTokens(f"{named}.tokens", f"{named}.starts", dtype.str, eos)
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
    rows = table.count_rows()
    lengths = np.empty(rows, dtype=np.int32)
    done = 0
    partial = f".{os.getpid()}.partial"
    with open(local.tokens + partial if local else os.devnull, "wb") as copy:
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


@dataclass(frozen=True)
class TokenCounts:
    """The tokens of the selected rows, by clump of ``clump`` rows.

    ``path``: the per-row lengths file (read through a memory map, so nothing per row is
    held in memory); ``extra``: tokens added to every document (its end-of-document).
    """

    path: str
    rows: int
    clump: int
    extra: int
    selection: Selection | None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_lengths"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @cached_property
    def _lengths(self) -> np.ndarray:
        return np.load(self.path, mmap_mode="r")

    def row_tokens(self, clump: int) -> np.ndarray:
        """Tokens of each row of ``clump``."""
        selected = np.arange(clump * self.clump, min(self.rows, (clump + 1) * self.clump))
        offsets = storage_offsets(self.selection, selected)
        return self._lengths[offsets].astype(np.int64) + self.extra

    @cached_property
    def clump_tokens(self) -> np.ndarray:
        """Tokens of each clump."""
        starts = np.arange(0, self.rows, self.clump)
        if self.selection is None:
            lengths = np.asarray(self._lengths[: self.rows], dtype=np.int64)
        else:
            lengths = self._lengths[self.selection.offsets(np.arange(self.rows))].astype(np.int64)
        sums = np.add.reduceat(lengths, starts) if self.rows else np.zeros(0, np.int64)
        return sums + self.extra * np.diff(np.append(starts, self.rows))

    def layout(
        self, num_splits: int, block_size: int, shuffle: bool, seed: int, epoch: int
    ) -> TokenLayout:
        """The token stream of ``epoch``: clumps in the epoch's order (storage order
        unshuffled), cut into ``num_splits`` splits of blocks of ``block_size``."""
        count = -(-self.rows // self.clump)
        order = epoch_permutation(count, seed, epoch, shuffle)
        clumps = ClumpLayout(self.rows, self.clump, order)
        return TokenLayout(clumps, self.clump_tokens, self.row_tokens, num_splits, block_size)


class PackRows:
    """The storage rows one reader reads for its blocks, in order, each once
    (a :class:`~lightning_stream.lance.reader.RowOrder`: computed as the reader asks,
    ``NEEDS_BLOCKS`` blocks at a time), and what each block needs of them
    (:meth:`next_blocks`, asked in order by the reader's :class:`PackJob`)."""

    def __init__(self, blocks: ReaderBlocks, selection: Selection | None) -> None:
        self.blocks = blocks
        self.selection = selection
        self.width = max(1, len(blocks.order.spans))
        self.run_rows = blocks.layout.clumps.size
        self._computed = 0  # blocks whose rows are computed
        self._first = 0  # the position of the first row held
        self._held = np.zeros(0, dtype=np.int64)
        # per block not yet built: split, stream offset, rows it brings in, offset in the first
        self._pending = np.zeros((0, 4), dtype=np.int64)

    def __len__(self) -> int:
        return self.blocks.row_count

    def _more(self) -> bool:
        if self._computed >= len(self.blocks):
            return False
        needs = self.blocks.needs(self._computed, self._computed + NEEDS_BLOCKS)
        self._computed += NEEDS_BLOCKS
        rows = storage_offsets(self.selection, self.blocks.layout.selected(needs.laid))
        self._held = np.concatenate([self._held, rows])
        per_block = np.stack([needs.splits, needs.starts, needs.rows, needs.offsets], axis=1)
        self._pending = np.concatenate([self._pending, per_block])
        return True

    def __call__(self, start: int, stop: int) -> np.ndarray:
        """The storage offsets of rows ``[start, stop)``; asked in order."""
        while self._first + len(self._held) < stop and self._more():
            pass
        asked = self._held[start - self._first : stop - self._first]
        self._held = self._held[stop - self._first :]
        self._first = stop
        return asked

    def next_blocks(self, count: int) -> np.ndarray:
        """The next ``count`` blocks: per block its split, stream offset, the rows it
        brings in and the offset into the first of them."""
        while len(self._pending) < count and self._more():
            pass
        taken, self._pending = self._pending[:count], self._pending[count:]
        return taken


@dataclass(frozen=True)
class PackJob:
    """One reader's blocks of one epoch, cut into batches of ``sizes`` blocks; ``make``
    turns a batch's arrays into its payload in the reader (``None``: the arrays). The
    documents are read from the table, or from ``local`` (a local copy of the column)."""

    rows: PackRows
    sizes: Sequence[int]
    opener: TableOpener
    packing: TokenPacking
    make: Callable[[dict[str, np.ndarray]], Any] | None
    local: LocalTokens | None = None

    def payloads(self, reader: BudgetedReader) -> Iterator[Any]:
        if self.local is not None:
            window_bytes = min(COPY_WINDOW_BYTES, reader.budget)
            windows = _copy_windows(self.rows, self.local, reader.counters, window_bytes)
        else:
            if len(self.sizes):  # the first window brings the first batch's rows in
                first = self.rows.blocks.needs(0, self.sizes[0]).rows.sum()
                reader.window_rows = max(reader.window_rows, int(first))
            windows = _table_windows(reader.windows())
        documents = _Documents(windows)
        builder = BlockBuilder(self.packing, self.rows.blocks.layout.total)
        block_size, total = self.packing.block_size, self.rows.blocks.layout.total
        try:
            for size in self.sizes:
                blocks = self.rows.next_blocks(size)
                values, lengths = documents.take(int(blocks[:, 2].sum()))
                tokens, ends = _with_ends(
                    values, lengths, self.packing, self.opener.name, self.local is not None
                )
                batch = builder.batch(blocks, tokens, ends)
                real = int(np.clip(total - blocks[:, 1], 0, block_size).sum())
                reader.counters.add("tokens", real)
                reader.counters.add("padding_tokens", size * block_size - real)
                yield batch if self.make is None else self.make(batch)
        finally:
            documents.close()


def _with_ends(
    values: np.ndarray, lengths: np.ndarray, packing: TokenPacking, table: str, ended: bool
) -> tuple[np.ndarray, np.ndarray]:
    """Documents' tokens (``values``, of documents of ``lengths``) each followed by the
    end-of-document token, if any (``ended``: ``values`` hold them already), and the
    position after each one's last token."""
    pad, eos = packing.pad_id, packing.eos_id
    found = int(np.count_nonzero(values == pad))
    if ended and pad == eos:
        found -= len(lengths)
    if found:
        raise ValueError(
            f"TokenPacking(pad_id={pad}) is a token of a document of table {table!r}:"
            " padding would be indistinguishable from data; pass a pad_id that no"
            " document uses (eos_id may equal it)"
        )
    ends = np.cumsum(lengths)
    if ended or eos is None:
        return values, ends
    if values.dtype != np.int64 and eos > np.iinfo(values.dtype).max:
        values = values.astype(np.int64)
    return np.insert(values, ends, eos), ends + np.arange(1, len(ends) + 1)


def _runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each run of consecutive storage offsets starts in ``rows``, and its end."""
    cuts = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1
    return np.append(0, cuts), np.append(cuts, len(rows))


@dataclass(frozen=True)
class _TokenWindow:
    """Rows' tokens end to end in storage order (row ``i``'s are
    ``values[offsets[i]:offsets[i + 1]]``) and the row served at each serving position."""

    values: np.ndarray
    offsets: np.ndarray
    where: np.ndarray


def _table_windows(windows: Iterator[Window]) -> Iterator[_TokenWindow]:
    """The token column of a reader's windows of table rows."""
    try:
        for window in windows:
            rows = window.rows.column(0).combine_chunks()
            if rows.null_count:
                rows = pc.if_else(pc.is_null(rows), pa.scalar([], rows.type), rows)
            offsets = rows.offsets.to_numpy().astype(np.int64)
            values = rows.values.to_numpy(zero_copy_only=False)
            yield _TokenWindow(values, offsets, window.where)
    finally:
        windows.close()


def _copy_windows(
    rows: PackRows, local: LocalTokens, counters: ReadCounters, window_bytes: int
) -> Iterator[_TokenWindow]:
    """The rows a reader serves, in windows of about ``window_bytes`` of tokens read from
    the column's :class:`LocalTokens` (each with its end-of-document token): a window's
    rows in storage order, each run of consecutive rows by one file read."""
    dtype = np.dtype(local.dtype)
    tokens, starts = os.open(local.tokens, os.O_RDONLY), os.open(local.starts, os.O_RDONLY)
    held = 0
    try:
        table_rows = max(1, os.fstat(starts).st_size // 8 - 1)
        row_bytes = max(1.0, os.fstat(tokens).st_size / table_rows)
        window_rows = max(1, int(window_bytes // row_bytes))
        served = 0
        while served < len(rows):
            count = min(window_rows, len(rows) - served)
            wanted = rows(served, served + count)
            served += count
            order = np.argsort(wanted, kind="stable")
            ascending = wanted[order]
            firsts, ends = _runs(ascending)
            # each run's row starts and its end, one run after another in ``bounds``
            sizes = ends - firsts + 1
            last = np.cumsum(sizes)
            bounds = np.empty(int(last[-1]), dtype=np.int64)
            runs = zip(ascending[firsts].tolist(), last.tolist(), sizes.tolist(), strict=True)
            for row, stop, size in runs:
                _read(starts, bounds[stop - size : stop], row, local)
            low, high = bounds[last - sizes], bounds[last - 1]
            values = np.empty(int((high - low).sum()), dtype=dtype)
            at = 0
            for begin, end in zip(low.tolist(), high.tolist(), strict=True):
                _read(tokens, values[at : at + end - begin], begin, local)
                at += end - begin
            lengths = np.delete(np.diff(bounds), last[:-1] - 1)
            where = np.empty(count, dtype=np.int64)
            where[order] = np.arange(count)
            counters.add("resident_bytes", values.nbytes - held)
            held = values.nbytes
            counters.add("rows_read", count)
            counters.add("bytes_loaded", values.nbytes)
            yield _TokenWindow(values, np.append(0, np.cumsum(lengths)), where)
    finally:
        counters.add("resident_bytes", -held)
        os.close(tokens)
        os.close(starts)


def _read(fd: int, into: np.ndarray, first: int, local: LocalTokens) -> None:
    """Fill ``into`` from the file's values at ``first`` on."""
    wanted = into.nbytes
    if wanted and os.preadv(fd, [into], first * into.itemsize) != wanted:
        raise RuntimeError(
            f"the local token copy {local.tokens} (or its .starts) is shorter than its table"
            " version: it was cut short or changed; delete both files and start again"
            " (they are written anew)"
        )


class _Documents:
    """The rows a reader serves, in serving order: their tokens end to end, taken a
    batch's rows at a time from its windows (rows in consecutive storage order as one
    slice), so nothing beyond a batch's rows is copied out of the windows."""

    def __init__(self, windows: Iterator[_TokenWindow]) -> None:
        self.windows = windows
        self._window = _TokenWindow(_NO_TOKENS, np.zeros(1, np.int64), _NO_TOKENS)
        self._row = 0  # the next serving position of the window

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``count`` rows' tokens, one after another, and each row's length."""
        tokens, lengths = [], []
        while count:
            window = self._window
            if self._row == len(window.where):
                self._window, self._row = next(self.windows), 0
                continue
            taken = min(count, len(window.where) - self._row)
            rows = window.where[self._row : self._row + taken]
            starts, stops = window.offsets[rows], window.offsets[rows + 1]
            firsts, ends = _runs(rows)
            for low, high in zip(starts[firsts].tolist(), stops[ends - 1].tolist(), strict=True):
                tokens.append(window.values[low:high])
            lengths.append(stops - starts)
            self._row += taken
            count -= taken
        return _joined_pieces(tokens), _joined_pieces(lengths)

    def close(self) -> None:
        self.windows.close()


def _joined_pieces(pieces: list[np.ndarray]) -> np.ndarray:
    if len(pieces) == 1:
        return pieces[0]
    return np.concatenate(pieces) if pieces else _NO_TOKENS


_NO_TOKENS = np.zeros(0, dtype=np.int64)
