"""TokenPacking: what a user asks for when a table's documents are packed into blocks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa

IGNORE_INDEX = -100


@dataclass(frozen=True)
class TokenPacking:
    """Pack the documents of a token column into blocks of ``block_size`` tokens.

    Pass it as ``LanceDataModule(..., pack=TokenPacking(...))`` (under LightningCLI:
    ``pack: {column: tokens, block_size: 2048, eos_id: 2}``). A sample is then a block:
    ``batch_size`` counts blocks, and a batch is a dict of

    - ``input_ids`` ``[B, block_size]`` int64: documents one after another, each followed
      by ``eos_id`` when given, the epoch's last block ending in ``pad_id``;
    - ``labels`` ``[B, block_size]`` int64, already shifted: the token that follows each
      position in its document, or ``-100`` (PyTorch's ``cross_entropy`` ignore index)
      where the next token belongs to another document or the position is padding. The
      last position of a block whose document goes on in the next block is labelled with
      that next token. Compute ``cross_entropy(logits.flatten(0, 1), labels.flatten())``
      without shifting again;
    - ``position_ids`` ``[B, block_size]`` int64: 0, 1, 2, ... restarting at every
      document and at the start of every block (a document continued from the previous
      block starts at 0 again, so every position is below ``block_size``); padding
      counts as one more segment;
    - ``document_ids`` ``[B, block_size]`` int32: which segment of the block each
      position belongs to (0, 1, ...), ``-1`` for padding;
    - ``cu_seqlens`` ``[B, block_size + 1]`` int32: each block's segment boundaries
      (``0``, the end of each segment, padding the last one), then ``block_size``
      repeated, the form flash-attention's varlen kernels take (per block: add
      ``i * block_size`` to flatten a batch);
    - ``max_seqlen`` ``[B]`` int32: each block's longest segment.

    A long document is split across blocks, never truncated. Every token of an epoch
    reaches ``training_step`` once; padding only fills the end of the epoch's last
    blocks (fewer than ``num_splits * block_size`` tokens an epoch).

    Args:
        column: a ``list<int>`` (or ``large_list``) column of token ids, one document a row.
        block_size: tokens per block, at least 1.
        eos_id: a token appended after every document (so the model learns where one
            ends); default ``None``: documents are packed back to back.
        pad_id: the token that fills the epoch's last blocks; default 0. It must not be a
            token of any document (a block that holds it raises an error naming
            ``pad_id``); ``eos_id`` may equal it.
        cache_dir: where the token count of every row is kept, counted once per table
            version by a scan of ``column`` (one process per machine scans, the others
            wait); default ``None``: ``$XDG_CACHE_HOME/lightning-stream/token-lengths``.
        local_copy: where the readers take the documents from. ``True``: from a copy of
            the token column on local disk in ``cache_dir``, written by that same scan
            (the token ids at their stored width, each document followed by ``eos_id``,
            and 8 bytes a row; one copy per table version and ``eos_id``, per machine),
            each block cut from it by a positional read per run of consecutive rows.
            ``False``: through lance, from the table, which may be larger than this
            machine's disk; lance's reads cost CPU per row, so with short documents that,
            not the bytes, bounds the tokens a second. Default ``None``: the copy where it
            takes at most half of the free space of ``cache_dir`` (decided per machine,
            once per table version, and logged as a warning where it does not fit), the
            table elsewhere. The blocks, and so the resume, are the same either way (a run
            may resume with the other, and machines of one job may differ).
    """

    column: str
    block_size: int
    eos_id: int | None = None
    pad_id: int = 0
    cache_dir: str | None = None
    local_copy: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(
                f"TokenPacking(block_size={self.block_size!r}): pass a positive number of"
                " tokens per block, e.g. 2048"
            )
        for name in ("eos_id", "pad_id"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"TokenPacking({name}={value!r}): pass a token id, 0 or more")
        if self.local_copy not in (True, False, None):
            raise ValueError(
                f"TokenPacking(local_copy={self.local_copy!r}): pass True (always copy), False"
                " (read the table) or None (copy where it fits)"
            )
        if not isinstance(self.column, str) or not self.column:
            raise ValueError(f"TokenPacking(column={self.column!r}): pass the token column's name")

    @property
    def eos_tokens(self) -> int:
        """Tokens added to every document."""
        return 0 if self.eos_id is None else 1

    @property
    def identity(self) -> dict[str, Any]:
        """What a checkpoint records: a resume must pack the same way."""
        return {k: v for k, v in asdict(self).items() if k not in ("cache_dir", "local_copy")}

    def pad_error(self, table: str) -> ValueError:
        """The error when ``pad_id`` is a token of a document of ``table``."""
        return ValueError(
            f"TokenPacking(pad_id={self.pad_id}) is a token of a document of table {table!r}:"
            " padding would be indistinguishable from data; pass a pad_id that no"
            " document uses (eos_id may equal it)"
        )

    def check_column(self, schema: pa.Schema, table: str) -> None:
        """Raise ``ValueError`` naming ``column`` unless it is a list of integers."""
        if self.column not in schema.names:
            raise ValueError(
                f"TokenPacking(column={self.column!r}) is not a column of table {table!r}"
                f" (its columns: {schema.names})"
            )
        kind = schema.field(self.column).type
        listed = pa.types.is_list(kind) or pa.types.is_large_list(kind)
        if not listed or not pa.types.is_integer(kind.value_type):
            raise ValueError(
                f"TokenPacking(column={self.column!r}) has type {kind} in table {table!r};"
                " packing needs a list<int32> (or another list of integers) of token ids per"
                " row"
            )
