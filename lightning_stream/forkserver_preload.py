"""What the forkserver that starts the data modules' DataLoader workers imports once.

Every worker is forked from that server with the reading side of the package, lancedb
and PyAV already imported: importing lancedb costs 1.5 s of CPU per process here (most
of it building its REST client's validators), and on 2 cores two workers importing it
at once took 5 to 10 s to start. The server only imports lancedb, it never opens a
table, so no lancedb thread or runtime is in use when it forks; lancedb's own fork hook
restarts its event loop in each worker, with a warning meant for forking a process that
uses lancedb, which is silenced here.
"""

import warnings

warnings.filterwarnings(
    "ignore", message="lancedb fork support is experimental", category=RuntimeWarning
)

import lightning_stream.lance.source  # noqa: E402
import lightning_stream.video.source  # noqa: E402, F401
