"""The order a table's rows are shuffled in: how many storage-order rows stay together.

Pure arithmetic over the table's row count and ``num_splits``, so the order of an epoch
is a function of the stream's identity and table version alone (lancedb shuffles the
clumps per (seed, epoch) and cuts them into equal splits).
"""

from __future__ import annotations

# Rows per clump at most. On an object store a clump is read in a few large range reads
# and its narrow columns span several of lance's storage chunks (``bench_lance.py --s3``,
# 20 ms: 2M light rows read 1.14-1.15x the table's bytes per epoch in clumps of 4,096,
# 6.7-9.4x as single rows; 200k rows 1.28-1.45x in clumps of 1,024, 1.23-1.38x in 4,096).
# On local disk lance takes storage runs at about half the CPU of scattered rows (25,000
# rows of 22 KB: 0.8 s against 1.7 s).
CLUMP_ROWS = 4096
# Clumps per split at least, so that a smaller table is still shuffled (a clump as large
# as a split would leave each split one storage run, in the same order every epoch).
CLUMPS_PER_SPLIT = 8


def clump_rows(requested: int | None, rows: int, num_splits: int) -> int | None:
    """Rows per shuffled clump (``None``: single rows).

    ``requested`` is ``shuffle_clump_size``: ``None`` picks ``CLUMP_ROWS``, or fewer so
    that every split holds at least ``CLUMPS_PER_SPLIT`` clumps; ``1`` is single rows.
    """
    if requested is None:
        requested = min(CLUMP_ROWS, rows // (num_splits * CLUMPS_PER_SPLIT))
    return requested if requested > 1 else None
