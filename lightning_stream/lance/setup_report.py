"""What ``LanceDataModule.setup`` checks and logs about a source's rows and layout."""

from __future__ import annotations

import logging

from lightning_stream.lance.order import CLUMP_ROWS
from lightning_stream.lance.source import LanceSource
from lightning_stream.storage import is_remote

# the data module's logger: these lines are its setup's, where users filter for them
log = logging.getLogger("lightning_stream.lance.datamodule")


def check_rows(
    source: LanceSource,
    argument: str,
    filter: str | None,
    needed: int,
    what: str = "num_splits",
) -> None:
    """Raise ``ValueError`` naming ``argument`` when ``source`` has no rows, or fewer
    than ``needed`` (``what``: the setting that needs them)."""
    if source.rows == 0:
        total = source.table.count_rows()
        if total == 0:
            raise ValueError(
                f"table {source.name!r} in {source.uri!r} is empty: add rows to it, or pass"
                " the name of a table that has some"
            )
        raise ValueError(
            f"{argument}={filter!r} selects no rows of table {source.name!r} (it has"
            f" {total} rows); loosen it"
        )
    if source.rows < needed:
        raise ValueError(
            f"table {source.name!r} has {source.rows} rows ({argument}={filter!r}), fewer"
            f" than {what}={needed}; every split needs at least one row, so lower"
            f" {what} or add rows"
        )


def report_layout(source: LanceSource, shuffle: bool, batch_size: int, world_size: int) -> None:
    """Log how the epoch is cut; warn where reads or global batches suffer."""
    if is_remote(source.uri) and shuffle and source.requested_clump_size == 1:
        log.warning(
            "%s is on an object store and rows are shuffled one by one"
            " (shuffle_clump_size=1): each read of scattered rows fetches whole pages,"
            " several times the table's bytes per epoch (docs/object-stores.md); leave"
            " shuffle_clump_size=None to read clumps of up to %d rows",
            source.uri,
            CLUMP_ROWS,
        )
    num_splits = source.num_splits
    if source.tokens is not None:
        layout = source.token_layout(0)
        log.info(
            "%s: %d documents, %d tokens packed into %d splits of %d blocks of %d; %d"
            " padding tokens per epoch",
            source.name,
            source.rows,
            layout.total,
            num_splits,
            layout.blocks,
            layout.block_size,
            num_splits * layout.split_tokens - layout.total,
        )
    else:
        log.info(
            "%s: %d rows in %d splits of %d, shuffled in clumps of %d rows; %d surplus"
            " rows per epoch are left out",
            source.name,
            source.rows,
            num_splits,
            source.split_len,
            source.shuffle_clump_size or 1,
            source.rows % num_splits,
        )
    global_batch = batch_size * world_size
    if global_batch % num_splits:
        log.warning(
            "global batch %d (batch_size %d x world_size %d) is not a multiple of"
            " num_splits=%d: the epoch's samples are the same on every topology, but"
            " which samples share a global step differs between topologies",
            global_batch,
            batch_size,
            world_size,
            num_splits,
        )
