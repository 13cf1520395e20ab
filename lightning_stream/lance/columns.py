"""Arrow record batches to training batches, column by column.

lancedb hands rows to the DataLoader one at a time. A row here is only a reference,
``(columns, index)``, into the columns of the record batch it came from, converted to
numpy once per record batch; the collate function gathers a batch's rows from their
record batches with one ``numpy.take`` per column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lightning_stream.batching import Batch, check_columnar

Columns = dict[str, Any]
Row = tuple[Columns, int]


def _is_tensor_type(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    )


def tensor_column(arrow_type: pa.DataType) -> bool:
    """Whether a column of this type becomes a tensor (else a list of Python values)."""
    if pa.types.is_fixed_size_list(arrow_type):
        return tensor_column(arrow_type.value_type)
    return _is_tensor_type(arrow_type)


def _to_numpy(column: pa.Array) -> np.ndarray | list:
    if column.null_count == 0:
        if pa.types.is_fixed_size_list(column.type) and tensor_column(column.type):
            values = _to_numpy(column.flatten())
            if isinstance(values, np.ndarray):
                return values.reshape(len(column), -1, *values.shape[1:])
        elif _is_tensor_type(column.type):
            return column.to_numpy(zero_copy_only=False)
    return column.to_pylist()


def record_batch_rows(batch: pa.RecordBatch) -> list[Row]:
    """lancedb transform: one cheap row reference per row of ``batch``."""
    columns = {name: _to_numpy(batch.column(name)) for name in batch.schema.names}
    return list(zip(repeat(columns, batch.num_rows), range(batch.num_rows), strict=True))


class ColumnarCollate:
    """Collate row references into a dict batch, then apply the user's ``transform``.

    Numeric and fixed-size-list columns without nulls become tensors stacked along dim
    0; any other column a list. Picklable, so it runs in DataLoader workers.
    """

    def __init__(self, transform: Callable[[Batch], Batch] | None = None) -> None:
        self.transform = transform

    def __call__(self, rows: Sequence[Row]) -> Batch:
        sources, indices = zip(*rows, strict=True)
        offsets: dict[int, int] = {}
        parts: list[Columns] = []
        total = 0
        for columns in sources:
            if id(columns) not in offsets:
                offsets[id(columns)] = total
                total += _rows_in(columns)
                parts.append(columns)
        base = [offsets[id(columns)] for columns in sources]
        take = np.asarray(indices, dtype=np.int64) + np.asarray(base, dtype=np.int64)
        batch: Batch = {}
        for name in parts[0]:
            values = [part[name] for part in parts]
            if all(isinstance(v, np.ndarray) for v in values):
                joined = values[0] if len(values) == 1 else np.concatenate(values)
                batch[name] = torch.from_numpy(np.take(joined, take, axis=0))
            else:
                joined = [item for value in values for item in value]
                batch[name] = [joined[i] for i in take.tolist()]
        if self.transform is not None:
            batch = self.transform(batch)
            check_columnar(batch, len(rows), "transform")
        return batch


def _rows_in(columns: Columns) -> int:
    for values in columns.values():
        return len(values)
    return 0
