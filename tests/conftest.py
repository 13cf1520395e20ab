import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from lightning_stream import ledger
from lightning_stream.demo import make_table

ROWS = 240  # 12 splits of 20 rows, no surplus


@dataclass(frozen=True)
class Rows:
    """A reader's rows held as one array of storage offsets, served from ``width`` clumps
    of ``run_rows`` rows at once (a ``RowOrder`` of ``lightning_stream.lance.reader``)."""

    offsets: np.ndarray
    width: int = 1
    run_rows: int = 1

    def __len__(self) -> int:
        return len(self.offsets)

    def __call__(self, start: int, stop: int) -> np.ndarray:
        return self.offsets[start:stop]


ROOT = Path(__file__).resolve().parents[1]
DEMO = "lightning_stream.demo"


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, dead and waiting to be reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def gone(pids: list[int], within: float = 60.0) -> bool:
    """Whether every process of ``pids`` ends (an exiting one closes its pipes a moment
    before it is gone); ``within`` seconds is a hang guard, not a bound the test asserts."""
    deadline = time.monotonic() + within
    while any(map(alive, pids)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def last_step(ledger_dir: Path) -> int:
    """The highest step in a run's ledger so far; -1 before its first entry."""
    try:
        return max(entry["step"] for entry in ledger.read(ledger_dir))
    except (ValueError, FileNotFoundError):
        return -1


def train_command(workdir: Path, name: str, *args: str, module=DEMO):
    out = workdir / name
    return out, [
        sys.executable,
        "-m",
        module,
        "--uri",
        str(workdir / "db"),
        "--ledger-dir",
        str(out / "ledger"),
        "--ckpt-dir",
        str(out / "ckpt"),
        *args,
    ]


ENV = {**os.environ, "PYTHONWARNINGS": "ignore"}


def train(
    workdir: Path, name: str, *args: str, expect_failure=False, module="lightning_stream.demo"
):
    """Run a training script as its own process (DDP ranks are real processes too)."""
    out, command = train_command(workdir, name, *args, module=module)
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, env=ENV, cwd=ROOT)
    if expect_failure:
        assert result.returncode != 0, result.stdout + result.stderr
    else:
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return out, result


def assert_exact(entries, epochs):
    report = ledger.coverage(entries, ROWS)
    assert [c.epoch for c in report] == list(range(epochs)), report
    for epoch in report:
        assert epoch.exact(), epoch


@pytest.fixture(scope="session")
def table_dir(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("lance")
    make_table(str(workdir / "db"), ROWS)
    return workdir


HEAVY_ROWS = 1_200


@pytest.fixture(scope="session")
def heavy_uri(tmp_path_factory) -> str:
    """A table shaped like real training data: strings, 2 KB blobs, nulls, lists."""
    from lightning_stream.lance.synthetic import make_heavy_table

    uri = str(tmp_path_factory.mktemp("heavy") / "db")
    make_heavy_table(uri, HEAVY_ROWS, blob_bytes=2_000, chunk=300)
    return uri


def worker_pids(dm) -> list[int]:
    """The pids of a data module's workers, once they all started."""
    pool = dm.stream.source.engine.pool
    deadline = time.monotonic() + 120
    while not pool.ready():
        assert time.monotonic() < deadline, "the workers did not start in 120 s"
        time.sleep(0.05)
    return list(pool.pids)
