"""A block's arrays from the documents it holds: pure numpy, no I/O.

:class:`BlockBuilder` fills one reader's blocks in serving order. Blocks of several
splits interleave in a reader, so it keeps, per split, the document that crossed the end
of that split's last block (the rest of one document, never more), and opens the
split's next block with it.
"""

from __future__ import annotations

import numpy as np

from lightning_stream.packing.option import IGNORE_INDEX, TokenPacking

Block = dict[str, np.ndarray]


class BlockBuilder:
    """Makes blocks of ``packing.block_size`` tokens from a stream of ``total`` tokens.

    Attributes:
        tokens: document tokens placed in blocks so far (end-of-document tokens included).
        padding: padding tokens placed so far.
    """

    def __init__(self, packing: TokenPacking, total: int) -> None:
        self.packing = packing
        self.total = total
        self.tokens = 0
        self.padding = 0
        self._carried: dict[int, tuple[np.ndarray, int]] = {}

    def document(self, values: np.ndarray, table: str) -> np.ndarray:
        """A row's token ids as a document: int64, with its end-of-document token."""
        pad = self.packing.pad_id
        if len(values) and bool((values == pad).any()):
            raise ValueError(
                f"TokenPacking(pad_id={pad}) is a token of a document of table {table!r}:"
                " padding would be indistinguishable from data; pass a pad_id that no"
                " document uses (eos_id may equal it)"
            )
        if self.packing.eos_id is None:
            return values.astype(np.int64)
        return np.append(values.astype(np.int64), self.packing.eos_id)

    def block(self, split: int, start: int, documents: list[np.ndarray], offset: int) -> Block:
        """The block of ``split`` at stream offset ``start``: the document carried from
        the split's previous block, then ``documents`` (the first one from ``offset``)."""
        size = self.packing.block_size
        real = min(size, max(0, self.total - start))
        input_ids = np.full(size, self.packing.pad_id, dtype=np.int64)
        labels = np.full(size, IGNORE_INDEX, dtype=np.int64)
        positions = np.zeros(size, dtype=np.int64)
        document_ids = np.full(size, -1, dtype=np.int32)
        pieces = [(doc, offset if i == 0 else 0) for i, doc in enumerate(documents)]
        carried = self._carried.pop(split, None)
        if carried is not None:
            pieces.insert(0, carried)
        ends: list[int] = []
        filled = 0
        for doc, begin in pieces:
            if begin >= len(doc):
                continue  # an empty document
            take = min(len(doc) - begin, real - filled)
            if take <= 0:
                raise self._mismatch(split, start)
            stop = begin + take
            span = slice(filled, filled + take)
            input_ids[span] = doc[begin:stop]
            labels[filled : filled + take - 1] = doc[begin + 1 : stop]
            positions[span] = np.arange(take)
            document_ids[span] = len(ends)
            filled += take
            ends.append(filled)
            if stop < len(doc):  # the document goes on in the split's next block
                if split in self._carried:
                    raise self._mismatch(split, start)
                self._carried[split] = (doc, stop)
                labels[filled - 1] = doc[stop]
        if filled != real:
            raise self._mismatch(split, start)
        if filled < size:  # padding: a segment of its own
            positions[filled:] = np.arange(size - filled)
            ends.append(size)
        cu_seqlens = np.full(size + 1, size, dtype=np.int32)
        cu_seqlens[0] = 0
        cu_seqlens[1 : len(ends) + 1] = ends
        self.tokens += filled
        self.padding += size - filled
        return {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": positions,
            "document_ids": document_ids,
            "cu_seqlens": cu_seqlens,
            "max_seqlen": np.asarray(np.diff(cu_seqlens).max(), dtype=np.int32),
        }

    def _mismatch(self, split: int, start: int) -> RuntimeError:
        return RuntimeError(
            f"the documents read for split {split} do not fill its block at token {start}:"
            " the table's rows changed while the stream was read (or since its token"
            " counts were cached); start a new run on the current table version"
        )


def stack(blocks: list[Block]) -> Block:
    """Blocks as one batch: every array gains a leading block dimension."""
    return {name: np.stack([block[name] for block in blocks]) for name in blocks[0]}
