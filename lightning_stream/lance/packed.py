"""A table's documents packed into blocks: token counts, the rows a reader reads, its job.

The arithmetic of which tokens each block holds is :mod:`lightning_stream.packing`; this
module adds the table: the tokens of every row (counted once per table version and cached
on local disk, :mod:`lightning_stream.lance.token_cache`), the storage rows a reader reads
in order (:class:`PackRows`, a :class:`~lightning_stream.lance.reader.RowOrder` for the
byte-bounded reader), and a reader's job (:class:`PackJob`), whose blocks are made in the
reader from the documents it read (:mod:`lightning_stream.lance.documents`), or cut from
the column's local copy (:mod:`lightning_stream.lance.copied`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from lightning_stream.lance.copied import copied_groups
from lightning_stream.lance.documents import Documents, token_window, with_ends
from lightning_stream.lance.order import storage_offsets
from lightning_stream.lance.reader import BudgetedReader, TableOpener
from lightning_stream.lance.selection import Selection
from lightning_stream.lance.token_cache import LocalTokens
from lightning_stream.packing.blocks import BlockBuilder
from lightning_stream.packing.layout import ReaderBlocks, TokenLayout, runs_of
from lightning_stream.packing.option import TokenPacking
from lightning_stream.placement import ClumpLayout, epoch_permutation

# Blocks whose rows a reader computes at once.
NEEDS_BLOCKS = 256
# Rows whose token counts are read at once (a part of the counts file: 4 MiB).
COUNT_ROWS = 2**20
# Tokens of blocks a reader builds at once (at least one batch; the batches are then
# served one by one): numpy's cost per call, not per token, bounds a batch of short
# documents built alone.
BUILT_TOKENS = 2**17


@dataclass(frozen=True)
class TokenCounts:
    """The tokens of the selected rows, by clump of ``clump`` rows.

    ``path``: the per-row lengths file (``.npy``), read a part at a time by positional
    reads: no page of it stays mapped, so nothing per row of the table is held;
    ``extra``: tokens added to every document (its end-of-document).
    """

    path: str
    rows: int
    clump: int
    extra: int
    selection: Selection | None

    @cached_property
    def _stored(self) -> tuple[int, np.dtype, int]:
        """Where the file's values start, their type and how many there are."""
        mapped = np.load(self.path, mmap_mode="r")
        return mapped.offset, mapped.dtype, len(mapped)

    def _read(self, offsets: np.ndarray) -> np.ndarray:
        """The lengths of storage rows ``offsets`` (ascending), read in spans of at most
        ``COUNT_ROWS`` rows."""
        start, dtype, stored = self._stored
        lengths = np.empty(len(offsets), dtype=np.int64)
        if not len(offsets):
            return lengths
        if offsets[-1] >= stored:
            raise RuntimeError(
                f"the token counts file {self.path} holds {stored} rows, fewer than its"
                " table version: it was cut short or changed; delete it (it is written anew)"
            )
        cuts = np.flatnonzero(np.diff(offsets // COUNT_ROWS)) + 1
        item = dtype.itemsize
        file = os.open(self.path, os.O_RDONLY)  # a read per span: a file object costs more
        try:
            for low, high in zip([0, *cuts.tolist()], [*cuts.tolist(), len(offsets)], strict=True):
                first, last = int(offsets[low]), int(offsets[high - 1])
                span = os.pread(file, (last - first + 1) * item, start + first * item)
                lengths[low:high] = np.frombuffer(span, dtype)[offsets[low:high] - first]
        finally:
            os.close(file)
        return lengths

    def row_tokens(self, clump: int) -> np.ndarray:
        """Tokens of each row of ``clump``."""
        selected = np.arange(clump * self.clump, min(self.rows, (clump + 1) * self.clump))
        return self._read(storage_offsets(self.selection, selected)) + self.extra

    @cached_property
    def clump_tokens(self) -> np.ndarray:
        """Tokens of each clump."""
        sums = [np.zeros(0, dtype=np.int64)]
        step = self.clump * max(1, COUNT_ROWS // self.clump)
        for first in range(0, self.rows, step):
            selected = np.arange(first, min(self.rows, first + step))
            lengths = self._read(storage_offsets(self.selection, selected))
            sums.append(np.add.reduceat(lengths, np.arange(0, len(lengths), self.clump)))
        starts = np.arange(0, self.rows, self.clump)
        return np.concatenate(sums) + self.extra * np.diff(np.append(starts, self.rows))

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
        self._held = [np.zeros(0, dtype=np.int64)]  # rows computed, not yet asked for
        self._held_count = 0
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
        self._held.append(rows)
        self._held_count += len(rows)
        per_block = np.stack([needs.splits, needs.starts, needs.rows, needs.offsets], axis=1)
        self._pending = np.concatenate([self._pending, per_block])
        return True

    def __call__(self, start: int, stop: int) -> np.ndarray:
        """The storage offsets of rows ``[start, stop)``; asked in order."""
        while self._first + self._held_count < stop and self._more():
            pass
        held = np.concatenate(self._held) if len(self._held) != 1 else self._held[0]
        asked = held[start - self._first : stop - self._first]
        self._held = [held[stop - self._first :]]
        self._held_count = len(self._held[0])
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
    documents are read from the table, each once, or the blocks are cut from ``local``
    (a local copy of the column, :mod:`lightning_stream.lance.copied`); either way a
    group of batches at a time (``BUILT_TOKENS``), then handed over batch by batch."""

    rows: PackRows
    sizes: Sequence[int]
    opener: TableOpener
    packing: TokenPacking
    make: Callable[[dict[str, np.ndarray]], Any] | None
    local: LocalTokens | None = None

    @property
    def reads_table(self) -> bool:
        return self.local is None

    @property
    def runs_on_caller(self) -> bool:
        """Cut from the local copy, blocks only compute (positional reads of a local file,
        numpy under the GIL): at ``num_workers=0`` a reading thread would not overlap that
        with training, only contend with the training loop for the GIL."""
        return self.local is not None

    def payloads(self, reader: BudgetedReader) -> Iterator[Any]:
        at_once = max(1, BUILT_TOKENS // self.packing.block_size)
        groups = [[self.sizes[i] for i in run] for run in runs_of(self.sizes, at_once)]
        if self.local is not None:
            made = copied_groups(
                self.rows.blocks,
                self.rows.selection,
                self.local,
                groups,
                self.packing,
                self.opener.name,
                reader.counters,
                reader.budget,
            )
        else:
            made = self._read_groups(reader, groups)
        size = self.packing.block_size
        try:
            for sizes, (arrays, real) in zip(groups, made, strict=True):
                at = 0
                for blocks in sizes:
                    served = int(real[at : at + blocks].sum())
                    reader.counters.add("tokens", served)
                    reader.counters.add("padding_tokens", blocks * size - served)
                    batch = {name: array[at : at + blocks] for name, array in arrays.items()}
                    yield batch if self.make is None else self.make(batch)
                    at += blocks
        finally:
            made.close()

    def _read_groups(
        self, reader: BudgetedReader, groups: list[list[int]]
    ) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        """The arrays of each of ``groups`` (of batches), in order, and each block's
        tokens that are not padding, from the documents read from the table, each once."""
        if len(self.sizes):  # the first window brings the first batch's rows in
            first = self.rows.blocks.needs(0, self.sizes[0]).rows.sum()
            reader.window_rows = max(reader.window_rows, int(first))
        documents = Documents(reader.windows(token_window))
        builder = BlockBuilder(self.packing, self.rows.blocks.layout.total)
        try:
            for sizes in groups:
                blocks = self.rows.next_blocks(sum(sizes))
                values, lengths = documents.take(int(blocks[:, 2].sum()))
                tokens, ends = with_ends(values, lengths, self.packing, self.opener.name)
                yield builder.batch(blocks, tokens, ends), builder.lengths(blocks)
        finally:
            documents.close()
