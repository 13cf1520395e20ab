"""A batch's columns as numpy arrays, from Arrow rows: the form a reading worker sends.

How each column is served is decided once, from the table's schema (:class:`ColumnTypes`;
the kinds are listed in :mod:`lightning_stream.lance.columns`). This module needs no
torch, so a worker that makes a batch's arrays does not import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lightning_stream.lance.arrow import one_array

TENSOR, VARLIST, STRING, BINARY, PYTHON = "tensor", "varlist", "string", "binary", "python"
VALID_SUFFIX = "_valid"


def _numeric(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
    )


def column_kind(arrow_type: pa.DataType) -> str:
    """How a column of ``arrow_type`` is served (:mod:`lightning_stream.lance.columns`)."""
    if _numeric(arrow_type):
        return TENSOR
    if pa.types.is_fixed_size_list(arrow_type):
        return TENSOR if column_kind(arrow_type.value_type) == TENSOR else PYTHON
    if (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)) and _numeric(
        arrow_type.value_type
    ):
        return VARLIST
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return STRING
    if pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type):
        return BINARY
    return PYTHON


@dataclass(frozen=True)
class ColumnTypes:
    """The serving kind of each column, and which tensor columns carry a validity mask."""

    kinds: dict[str, str]
    masked: frozenset[str]

    @classmethod
    def of_schema(cls, schema: pa.Schema, columns: list[str] | None) -> ColumnTypes:
        """Decide from the table's ``schema``: a tensor or list column declared nullable
        carries a ``<name>_valid`` mask."""
        names = columns if columns is not None else schema.names
        kinds = {name: column_kind(schema.field(name).type) for name in names}
        masked = frozenset(
            name
            for name, kind in kinds.items()
            if kind in (TENSOR, VARLIST) and schema.field(name).nullable
        )
        clashes = [n + VALID_SUFFIX for n in masked if n + VALID_SUFFIX in schema.names]
        if clashes:
            raise ValueError(
                f"columns {clashes} clash with the validity masks of nullable columns; rename"
                " them, leave them out with columns=[...], or declare the masked columns"
                " nullable=False in the table's schema"
            )
        return cls(kinds, masked)

    def to_wire(self, rows: pa.Table) -> dict[str, Any]:
        """Numpy form of a batch (copies: nothing refers to the rows' Arrow buffers)."""
        wire: dict[str, Any] = {}
        for name, kind in self.kinds.items():
            if kind == BINARY:  # bytes made from each read's buffers, not from a joined copy
                wire[name] = rows.column(name).to_numpy()
                continue
            column = one_array(rows.column(name))
            if name in self.masked:
                wire[name + VALID_SUFFIX] = column.is_valid().to_numpy(zero_copy_only=False)
            if kind == TENSOR:
                wire[name] = _dense(column)
            elif kind == VARLIST:
                # flatten() leaves out null lists' values: they count as empty
                wire[name] = (
                    np.array(column.flatten().to_numpy(zero_copy_only=False)),
                    pc.list_value_length(column).fill_null(0).to_numpy(zero_copy_only=False),
                )
            else:
                wire[name] = column.to_pylist()
        return wire


def _dense(column: pa.Array) -> np.ndarray:
    """A numeric or fixed-size-list column as one numpy array, nulls as zeros."""
    if pa.types.is_fixed_size_list(column.type):
        width = column.type.list_size
        values = column.values.slice(column.offset * width, len(column) * width)
        dense = _dense(values)
        dense = dense.reshape(len(column), width, *dense.shape[1:])
        if column.null_count:
            dense[~column.is_valid().to_numpy(zero_copy_only=False)] = 0
        return dense
    if column.null_count:
        column = column.fill_null(False if pa.types.is_boolean(column.type) else 0)
    # a copy: a view would keep the whole read's buffer alive for as long as the batch
    return np.array(column.to_numpy(zero_copy_only=False))
