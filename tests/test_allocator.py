"""glibc's thresholds are set in a reading process unless its environment tunes malloc."""

import os
import subprocess
import sys

import pytest

ASK = "from lightning_stream.allocator import keep_read_buffers; print(keep_read_buffers())"


def tuned(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    clean.pop("GLIBC_TUNABLES", None)
    clean.pop("LIGHTNING_STREAM_MALLOC", None)
    result = subprocess.run(
        [sys.executable, "-c", ASK], env={**clean, **env}, capture_output=True, text=True
    )
    return result.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_read_buffers_are_kept_unless_the_environment_says_otherwise():
    assert tuned() == "True"
    assert tuned(LIGHTNING_STREAM_MALLOC="0") == "False"
    assert tuned(MALLOC_ARENA_MAX="2") == "False"  # the user's own tuning stands
    assert tuned(GLIBC_TUNABLES="glibc.malloc.trim_threshold=0") == "False"


ARENAS = """
import ctypes, sys, tempfile
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
path = tempfile.mktemp()
out = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, out)
libc.fclose(out)
print(open(path).read().count("<heap nr="))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_a_reading_process_allocates_in_at_most_arena_max_arenas(tmp_path):
    import lancedb
    import numpy as np
    import pyarrow as pa

    from lightning_stream.allocator import ARENA_MAX

    rows = 8_000
    blobs = pa.array([bytes([i % 256]) * 2_000 for i in range(rows)], pa.binary())
    lancedb.connect(str(tmp_path)).create_table("t", pa.table({"id": np.arange(rows), "b": blobs}))

    def arenas(**env: str) -> int:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        clean.pop("GLIBC_TUNABLES", None)
        result = subprocess.run(
            [sys.executable, "-c", ARENAS, str(tmp_path)],
            env={**clean, **env}, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return int(result.stdout.split()[-1])

    # set before lancedb starts its threads, the limit holds for all of them
    assert arenas(LIGHTNING_STREAM_MALLOC="1") <= ARENA_MAX
    assert arenas(LIGHTNING_STREAM_MALLOC="0") > ARENA_MAX  # glibc's own: one per thread
