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
