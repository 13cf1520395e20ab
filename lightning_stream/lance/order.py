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
# Clumps per split at least, so that a smaller table is still shuffled: a batch holds
# rows at the same place in each of its splits' clumps, and with one clump per split it
# would hold the same rows every epoch; with k, two such rows meet in about 1 epoch in
# k. Four, not eight as before (CHANGELOG): 25k rows of 22 KB in 32 splits (clumps of
# 195 rows, not 97) from an object store at 20 ms, 8 interleaved rounds: 44.5k against
# 39.5k rows/s at 2 workers (1,269 GETs an epoch, not 1,536), S3/local 0.83 against
# 0.70; from local disk at 0 workers 66k against 62k rows/s (scratch runs of
# ``bench_lance.py --s3 --heavy``). Tables of 1M rows or more in 32 splits get
# CLUMP_ROWS either way.
CLUMPS_PER_SPLIT = 4


def clump_rows(
    requested: int | None, rows: int, num_splits: int, clumps_per_split: int = CLUMPS_PER_SPLIT
) -> int | None:
    """Rows per shuffled clump (``None``: single rows).

    ``requested`` is ``shuffle_clump_size``: ``None`` picks ``CLUMP_ROWS``, or fewer so
    that every split holds at least ``clumps_per_split`` clumps; ``1`` is single rows.
    """
    if requested is None:
        requested = min(CLUMP_ROWS, rows // (num_splits * clumps_per_split))
    return requested if requested > 1 else None
