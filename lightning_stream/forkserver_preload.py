"""What the forkserver that starts the data modules' workers runs first.

The server imports the reading side of a data module, and the modules the training
script imports, once (:func:`lightning_stream.workers.worker_context`); every worker is
forked from it with those already imported. The server only imports lancedb, it never
opens a table, so no lancedb thread or runtime is in use when it forks; lancedb's own
fork hook restarts its event loop in each worker, with a warning meant for forking a
process that uses lancedb, which is silenced here.
"""

import warnings

warnings.filterwarnings(
    "ignore", message="lancedb fork support is experimental", category=RuntimeWarning
)
