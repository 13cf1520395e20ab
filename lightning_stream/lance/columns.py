"""Arrow rows to training batches, with one Python type per column decided once.

The type of every column is decided at setup from the table's schema alone (nothing is
scanned, so setup costs the same whatever the table's size): the same on every rank,
worker and epoch, whatever rows a batch happens to hold. A numeric or list column that
the schema declares nullable gets a validity mask; declare a column that never holds
nulls ``nullable=False`` (``pa.field(name, type, nullable=False)`` when the table is
created) and its batches carry no mask.

============================================  ==========================================
Arrow type                                    batch value
============================================  ==========================================
integer, float, bool                          tensor ``[rows]``
fixed-size list of those (nested too)         tensor ``[rows, n, ...]``
either, declared nullable                     tensor (nulls as 0 / ``False``) and a bool
                                              tensor ``<name>_valid`` ``[rows]``
variable-length list of numbers               list of 1-D tensors (views of one buffer);
                                              nulls as empty tensors, plus ``_valid``
                                              when declared nullable
string                                        list of ``str`` (``None`` for null)
binary                                        numpy object array of ``bytes``
anything else (struct, timestamp, ...)        list of Python values
============================================  ==========================================

Binary values become a numpy array because Lightning's device transfer leaves numpy
arrays alone but walks a list of ``bytes`` byte by byte (about 2 s per batch of 64 20 KB
images); a device cannot hold ``bytes`` anyway, so decode them in ``transform``.

Every batch is made by the same code whoever read it: a reading worker without a
``transform`` sends the batch's arrays (:mod:`~lightning_stream.lance.arrays`, in shared
memory), which the main process wraps as tensors without a copy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa
import torch

from lightning_stream.batching import Batch, batch_len, check_columnar
from lightning_stream.lance.arrays import TENSOR, VARLIST, ColumnTypes


def to_batch(types: ColumnTypes, wire: dict[str, Any]) -> Batch:
    """Tensors (and lists) from :meth:`ColumnTypes.to_wire
    <lightning_stream.lance.arrays.ColumnTypes.to_wire>`'s arrays, sharing their memory."""
    batch: Batch = {}
    for name, value in wire.items():
        kind = types.kinds.get(name, TENSOR)
        if kind == TENSOR:
            batch[name] = torch.from_numpy(value)
        elif kind == VARLIST:
            values, lengths = value
            batch[name] = list(torch.from_numpy(values).split(lengths.tolist()))
        else:
            batch[name] = value
    return batch


class BatchMaker:
    """Arrow rows to a training batch: the column types, then the user's ``transform``.

    Picklable, so it runs in the reading workers (with a ``transform``).
    """

    def __init__(self, types: ColumnTypes, transform: Callable[[Batch], Batch] | None) -> None:
        self.types = types
        self.transform = transform

    def __call__(self, rows: pa.Table) -> Batch:
        return self.from_wire(self.types.to_wire(rows))

    def from_wire(self, wire: dict[str, Any]) -> Batch:
        """The batch of arrays made in a reader (:func:`to_batch`), transformed."""
        return self.transformed(to_batch(self.types, wire))

    def transformed(self, batch: Batch) -> Batch:
        """``batch`` after the user's ``transform`` (checked to keep its rows)."""
        if self.transform is None:
            return batch
        rows = batch_len(batch)
        batch = self.transform(batch)
        check_columnar(batch, rows, "transform")
        return batch
