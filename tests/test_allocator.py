"""glibc's thresholds and arena limit are set in a reading process unless its environment
tunes malloc; with them, its allocations stay in at most ``ARENA_MAX`` arenas."""

import os
import subprocess
import sys

import pytest

ASK = "from lightning_stream.allocator import keep_read_buffers; print(keep_read_buffers())"

# two epochs at 0 workers, then glibc's own report of the arenas it made
ARENAS = """
import ctypes, sys
from lightning_stream import LanceDataModule
dm = LanceDataModule(sys.argv[1], "t", num_splits=8, batch_size=64, num_workers=0)
dm.setup("fit")
for _ in range(2):
    for batch in dm.train_dataloader():
        pass
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
libc.fclose.argtypes = [ctypes.c_void_p]
out = libc.fopen(sys.argv[2].encode(), b"w")
libc.malloc_info(0, out)
libc.fclose(out)
"""

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")


def run(arguments: list[str], **env: str) -> subprocess.CompletedProcess:
    """``python arguments`` in an environment without malloc tuning, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    clean.pop("LIGHTNING_STREAM_MALLOC", None)
    return subprocess.run(
        [sys.executable, *arguments], env={**clean, **env}, capture_output=True, text=True
    )


@glibc_only
def test_read_buffers_are_kept_unless_the_environment_says_otherwise():
    assert run(["-c", ASK]).stdout.strip() == "True"
    assert run(["-c", ASK], LIGHTNING_STREAM_MALLOC="0").stdout.strip() == "False"
    assert run(["-c", ASK], MALLOC_ARENA_MAX="2").stdout.strip() == "False"  # the user's own
    tunables = "glibc.malloc.trim_threshold=0"
    assert run(["-c", ASK], GLIBC_TUNABLES=tunables).stdout.strip() == "False"


@glibc_only
def test_a_reading_process_allocates_in_at_most_arena_max_arenas(tmp_path):
    import lancedb
    import numpy as np
    import pyarrow as pa

    from lightning_stream.allocator import ARENA_MAX

    rows = 8_000
    blobs = pa.array([bytes([i % 256]) * 2_000 for i in range(rows)], pa.binary())
    db = tmp_path / "db"
    lancedb.connect(str(db)).create_table("t", pa.table({"id": np.arange(rows), "b": blobs}))

    def arenas(**env: str) -> int:
        report = tmp_path / "malloc_info.xml"
        result = run(["-c", ARENAS, str(db), str(report)], **env)
        assert result.returncode == 0, result.stderr[-3000:]
        return report.read_text().count("<heap nr=")

    # set before lancedb starts its threads, the limit holds for all of them
    assert arenas() <= ARENA_MAX
    assert arenas(LIGHTNING_STREAM_MALLOC="0") > ARENA_MAX  # glibc's own: about one a thread
