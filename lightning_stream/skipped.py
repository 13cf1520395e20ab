"""The column in which a source marks rows it could not produce.

A source may mark rows it could not produce (e.g. windows of a damaged video) with a
non-empty reason in this column: they travel as placeholders, so batches are still cut at
the plan's row boundaries, and are dropped just before the batch is handed out
(:func:`lightning_stream.batching.drop_skipped`). Its own module, without torch, because
the worker processes that mark them import no torch.
"""

SKIP_REASON = "_skip_reason"
