"""Arrow tables of a read: binary values as views, reordering, and the bytes they hold.

A read's rows come from lance in storage order; a window hands them out in the plan's
order. Reordering moves 16-byte views of binary and string values instead of the values,
so a read's bytes are copied once, into the batch.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

# Binary and string values are reordered by their views (16 bytes a value) over lance's
# buffers instead of copied: a read's bytes are then copied once, into the batch's
# ``bytes``, which matters for rows of large blobs.
# Views stay in the reading process: a worker's batch crosses as plain arrays
# (:func:`lightning_stream.workers.slots.plain`).
_VIEW_TYPES = {
    pa.binary(): pa.binary_view(),
    pa.large_binary(): pa.binary_view(),
    pa.string(): pa.string_view(),
    pa.large_string(): pa.string_view(),
}


def _with_view_type(field: pa.Field) -> pa.Field:
    return field.with_type(_VIEW_TYPES.get(field.type, field.type))


def with_views(rows: pa.Table) -> pa.Table:
    """``rows`` with binary and string columns as views over the same buffers."""
    return rows.cast(pa.schema([_with_view_type(f) for f in rows.schema]))


def held_bytes(table: pa.Table) -> int:
    """Bytes ``table`` holds: ``nbytes``, except that a view column's data buffers count
    once each, at their largest extent.

    lance hands a read's binary data to all its chunks as one buffer, from the same start,
    and :func:`_reordered` keeps it: ``nbytes`` counts it once a chunk (too much),
    ``get_total_buffer_size`` only at its first chunk's extent (too little).
    """
    held = 0
    for column in table.columns:
        if column.type not in _VIEW_TYPES.values():
            held += column.nbytes
            continue
        extents: dict[int, int] = {}
        for chunk in column.chunks:
            for buffer in chunk.buffers():
                if buffer is not None:
                    extents[buffer.address] = max(extents.get(buffer.address, 0), buffer.size)
        held += sum(extents.values())
    return held


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """``column`` as one array, joined (a copy) only when it has several chunks: a batch
    within one read is one chunk already (a read's columns are joined by
    :func:`_reordered`)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def reordered(rows: pa.Table, where: np.ndarray) -> pa.Table:
    """``rows.take(where)`` as one chunk a column, binary and string values as views over
    ``rows``' buffers (not copied)."""
    columns = [_reordered(column, where) for column in rows.columns]
    return pa.Table.from_arrays(columns, names=rows.column_names)


def _reordered(column: pa.ChunkedArray, where: np.ndarray) -> pa.Array:
    """``column.take(where)``, with binary and string values not copied."""
    view_type = _VIEW_TYPES.get(column.type, column.type)
    if view_type not in _VIEW_TYPES.values():
        return column.take(where)
    # cast first: joining views appends each chunk's data buffers instead of copying them
    # (a read of more than 1,024 rows, lance's batch, comes as several chunks)
    views = column.cast(view_type).combine_chunks()
    buffers = views.buffers()
    slots = np.frombuffer(buffers[1], dtype="V16")[views.offset : views.offset + len(views)]
    validity = views.is_valid().take(where).buffers()[1] if views.null_count else None
    return pa.Array.from_buffers(
        view_type, len(where), [validity, pa.py_buffer(slots[where]), *buffers[2:]]
    )
