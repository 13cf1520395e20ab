"""A table shaped like real training data, for tests and benchmarks."""

from __future__ import annotations

import lancedb
import numpy as np
import pyarrow as pa

EMBEDDING_DIM = 512
# columns that never hold a null are declared so: their batches carry no validity mask
HEAVY_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("caption", pa.string(), nullable=False),
        pa.field("jpeg", pa.binary(), nullable=False),
        pa.field("label", pa.int64()),
        pa.field("rare", pa.int64()),
        pa.field("tokens", pa.list_(pa.float32())),
        pa.field("embedding", pa.list_(pa.float32(), EMBEDDING_DIM), nullable=False),
    ]
)
LIGHT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("vec", pa.list_(pa.float32(), 16), nullable=False),
        pa.field("label", pa.float32(), nullable=False),
    ]
)


def heavy_rows(start: int, count: int, blob_bytes: int, seed: int = 0) -> pa.Table:
    """Rows ``start .. start + count`` of the heavy table (deterministic per row range).

    Columns: ``id``; ``caption`` (string); ``jpeg`` (binary, ``blob_bytes`` per row);
    ``label`` (int64, every 10th row null); ``rare`` (int64, null in rows 3 and 7 only);
    ``tokens`` (variable-length list of float32, 0 to 15 values; every 50th row null);
    ``embedding`` (fixed-size list of 512 float32).
    """
    rng = np.random.default_rng(seed + start)
    ids = np.arange(start, start + count, dtype=np.int64)
    lengths = ids % 16
    tokens = pa.ListArray.from_arrays(
        pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)),
        pa.array(rng.random(int(lengths.sum()), dtype=np.float32)),
        mask=pa.array(ids % 50 == 1),
    )
    blobs = rng.integers(0, 256, size=(count, blob_bytes), dtype=np.uint8)
    embedding = pa.FixedSizeListArray.from_arrays(
        pa.array(rng.random(count * EMBEDDING_DIM, dtype=np.float32)), EMBEDDING_DIM
    )
    return pa.table(
        {
            "id": ids,
            "caption": pa.array([f"row {i}" for i in ids]),
            "jpeg": pa.array([row.tobytes() for row in blobs], type=pa.binary()),
            "label": pa.array(ids % 7, mask=ids % 10 == 0),
            "rare": pa.array(ids % 5, mask=np.isin(ids, [3, 7])),
            "tokens": tokens,
            "embedding": embedding,
        },
        schema=HEAVY_SCHEMA,
    )


def make_heavy_table(
    uri: str, rows: int, *, blob_bytes: int = 20_000, name: str = "heavy", chunk: int = 2_000
) -> int:
    """Write ``rows`` heavy rows to table ``name`` at ``uri``; returns the bytes written."""
    db = lancedb.connect(uri)
    table = None
    written = 0
    for start in range(0, rows, chunk):
        part = heavy_rows(start, min(chunk, rows - start), blob_bytes)
        written += part.nbytes
        if table is None:
            table = db.create_table(name, part, mode="overwrite")
        else:
            table.add(part)
    return written


def light_rows(start: int, count: int, seed: int = 0) -> pa.Table:
    """Rows ``start .. start + count`` of the light table (deterministic per row range):
    ``id`` (int64), ``vec`` (16 float32) and ``label`` (float32, the sum of ``vec``);
    76 bytes a row."""
    vec = np.random.default_rng([seed, start]).standard_normal((count, 16), dtype=np.float32)
    return pa.table(
        {
            "id": np.arange(start, start + count, dtype=np.int64),
            "vec": pa.FixedSizeListArray.from_arrays(pa.array(vec.reshape(-1)), 16),
            "label": vec.sum(axis=1),
        },
        schema=LIGHT_SCHEMA,
    )


def make_light_table(
    uri: str,
    rows: int,
    *,
    name: str = "light",
    chunk: int = 2**20,
    storage_options: dict[str, str] | None = None,
) -> None:
    """Write ``rows`` light rows to table ``name`` at ``uri``, ``chunk`` rows per write."""
    db = lancedb.connect(uri, storage_options=storage_options)
    table = None
    for start in range(0, rows, chunk):
        part = light_rows(start, min(chunk, rows - start))
        if table is None:
            table = db.create_table(name, part, mode="overwrite")
        else:
            table.add(part)


# A document's tokens say where they come from: token = document * MAX_DOCUMENT + position
MAX_DOCUMENT = 20_000


def document_lengths(documents: int, seed: int = 0) -> np.ndarray:
    """Heavy-tailed document lengths from 1 to ``MAX_DOCUMENT`` tokens (a Pareto tail:
    most documents short, a few very long), the first two exactly 1 and ``MAX_DOCUMENT``."""
    rng = np.random.default_rng(seed)
    lengths = np.floor(24 * (1 + rng.pareto(1.2, documents))).astype(np.int64) - 23
    lengths = np.clip(lengths, 1, MAX_DOCUMENT)
    lengths[: min(2, documents)] = [1, MAX_DOCUMENT][: min(2, documents)]
    return lengths


def make_token_table(
    uri: str,
    documents: int,
    name: str = "documents",
    seed: int = 0,
    chunk: int = 10_000,
    storage_options: dict[str, str] | None = None,
) -> np.ndarray:
    """A table of ``documents`` tokenised documents (``id`` and ``tokens``, a
    ``list<int32>``) of :func:`document_lengths`; returns the lengths. Token ``p`` of
    document ``d`` is ``d * MAX_DOCUMENT + p``, so a block's tokens name their source."""
    lengths = document_lengths(documents, seed)
    schema = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("tokens", pa.list_(pa.int32()), nullable=False),
        ]
    )
    db = lancedb.connect(uri, storage_options=storage_options)
    table = None
    for start in range(0, documents, chunk):
        part = lengths[start : start + chunk]
        ids = np.arange(start, start + len(part), dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(part)]).astype(np.int32)
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], part)
        values = (np.repeat(ids, part) * MAX_DOCUMENT + within).astype(np.int32)
        tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        rows = pa.table([pa.array(ids), tokens], schema=schema)
        if table is None:
            table = db.create_table(name, rows, mode="overwrite")
        else:
            table.add(rows)
    return lengths
