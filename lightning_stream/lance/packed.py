"""A table's documents packed into blocks: token counts, the rows a reader reads, its job.

The arithmetic of which tokens each block holds is :mod:`lightning_stream.packing`; this
module adds the table: the tokens of every row (counted once per table version by a scan
of the token column's list lengths, and cached on local disk, :func:`token_lengths_file`),
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
from lightning_stream.lance.reader import BudgetedReader, TableOpener, Window
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


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache"))
    return Path(base) / "lightning-stream" / "token-lengths"


def token_lengths_file(table: Any, opener: TableOpener, column: str, cache_dir: Path) -> str:
    """The path of a ``.npy`` file of the token count of every row of ``column`` at the
    pinned version (a null row counts 0): read from the cache, or counted by one scan of
    the column under a file lock (one process of a machine scans, the others wait)."""
    key = f"{opener.uri}\0{opener.name}\0{opener.version}\0{column}".encode()
    path = cache_dir / f"{hashlib.sha256(key).hexdigest()[:32]}.npy"
    if path.exists():
        return str(path)
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        if not path.exists():
            log.info(
                "counting the tokens of column %r of table %r (version %d), once per version,"
                " into %s",
                column,
                opener.name,
                opener.version,
                path,
            )
            lengths = _scan_lengths(table, column)
            partial = path.with_suffix(f".{os.getpid()}.partial")
            with partial.open("wb") as out:
                np.save(out, lengths)
            os.replace(partial, path)
    return str(path)


def _scan_lengths(table: Any, column: str) -> np.ndarray:
    rows = table.count_rows()
    lengths = np.empty(rows, dtype=np.int32)
    done = 0
    for batch in table.search().select([column]).to_batches(SCAN_ROWS):
        counts = pc.fill_null(pc.list_value_length(batch.column(0)), 0).to_numpy()
        lengths[done : done + len(counts)] = counts
        done += len(counts)
    if done != rows:
        raise RuntimeError(f"the scan of column {column!r} gave {done} rows of {rows}")
    return lengths


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
    turns a batch's arrays into its payload in the reader (``None``: the arrays)."""

    rows: PackRows
    sizes: Sequence[int]
    opener: TableOpener
    packing: TokenPacking
    make: Callable[[dict[str, np.ndarray]], Any] | None

    def payloads(self, reader: BudgetedReader) -> Iterator[Any]:
        if len(self.sizes):  # the first window brings the first batch's rows in
            first = self.rows.blocks.needs(0, self.sizes[0]).rows.sum()
            reader.window_rows = max(reader.window_rows, int(first))
        builder = BlockBuilder(self.packing, self.rows.blocks.layout.total)
        documents = _Documents(reader.windows(), self.packing, self.opener.name)
        block_size, total = self.packing.block_size, self.rows.blocks.layout.total
        for size in self.sizes:
            blocks = self.rows.next_blocks(size)
            tokens, ends = documents.take(int(blocks[:, 2].sum()))
            batch = builder.batch(blocks, tokens, ends)
            real = int(np.clip(total - blocks[:, 1], 0, block_size).sum())
            reader.counters.add("tokens", real)
            reader.counters.add("padding_tokens", size * block_size - real)
            yield batch if self.make is None else self.make(batch)


class _Documents:
    """The rows a reader read, in serving order, as documents: their tokens end to end
    (each followed by the end-of-document token, if any), taken a batch's rows at a time
    from the windows as read (rows in consecutive storage order as one slice), so nothing
    beyond a batch's rows is copied out of the reader's windows."""

    def __init__(self, windows: Iterator[Window], packing: TokenPacking, table: str) -> None:
        self.windows = windows
        self.packing = packing
        self.table = table
        self._values = _NO_TOKENS
        self._offsets = np.zeros(1, dtype=np.int64)  # of each row in _values, and the end
        self._where = np.zeros(0, dtype=np.int64)  # the row served at each position
        self._row = 0  # the next serving position of the window

    def _window(self) -> None:
        window = next(self.windows)
        rows = window.rows.column(0).combine_chunks()
        if rows.null_count:
            rows = pc.if_else(pc.is_null(rows), pa.scalar([], rows.type), rows)
        self._offsets = rows.offsets.to_numpy().astype(np.int64)
        self._values = rows.values.to_numpy(zero_copy_only=False)
        self._where, self._row = window.where, 0

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The next ``count`` rows' tokens, and the position after each row's last."""
        tokens, lengths = [], []
        while count:
            if self._row == len(self._where):
                self._window()
                continue
            taken = min(count, len(self._where) - self._row)
            rows = self._where[self._row : self._row + taken]
            starts, stops = self._offsets[rows], self._offsets[rows + 1]
            cuts = np.flatnonzero(rows[1:] != rows[:-1] + 1) + 1
            firsts, lasts = np.append(0, cuts), np.append(cuts, taken) - 1
            for low, high in zip(starts[firsts].tolist(), stops[lasts].tolist(), strict=True):
                tokens.append(self._values[low:high])
            lengths.append(stops - starts)
            self._row += taken
            count -= taken
        values = tokens[0] if len(tokens) == 1 else np.concatenate([_NO_TOKENS, *tokens])
        lengths = lengths[0] if len(lengths) == 1 else np.concatenate([_NO_TOKENS, *lengths])
        pad = self.packing.pad_id
        if bool((values == pad).any()):
            raise ValueError(
                f"TokenPacking(pad_id={pad}) is a token of a document of table"
                f" {self.table!r}: padding would be indistinguishable from data; pass a"
                " pad_id that no document uses (eos_id may equal it)"
            )
        ends = np.cumsum(lengths)
        eos = self.packing.eos_id
        if eos is None:
            return values, ends
        if values.dtype != np.int64 and eos > np.iinfo(values.dtype).max:
            values = values.astype(np.int64)
        return np.insert(values, ends, eos), ends + np.arange(1, len(ends) + 1)


_NO_TOKENS = np.zeros(0, dtype=np.int64)
