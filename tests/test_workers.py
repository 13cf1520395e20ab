"""The worker processes of both data modules: the order they serve, how they fail, and
that nothing of theirs outlives a killed training job."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_stream.video.synthetic import write_dataset
from lightning_stream.workers.inline import InlineReader
from lightning_stream.workers.pool import WorkerPool, WorkerStartError

from .conftest import ENV, ROOT, last_step, train_command, worker_pids
from .worker_tasks import FailsAtTwo, FailsToLoad, FailsToOpen, Numbers

LENGTHS = [25, 14, 31, 18, 22, 9, 27, 16, 20, 19, 24, 15]  # 240 frames


def served(pool: WorkerPool, key, jobs, **options) -> list[tuple[int, int]]:
    return [(p["worker"], p["number"]) for p in pool.serve(key, jobs, lambda p: p, **options)]


def test_payloads_come_in_turn_and_an_epoch_stopped_early_leaves_the_next_whole():
    pool = WorkerPool(Numbers(size=100_000), 2, 2**20, "test-pool")  # 800 KB: in the slots
    try:
        in_turn = [(0, 0), (1, 100), (0, 1), (1, 101), (0, 2), (1, 102)]
        assert served(pool, "a", [(0, 3), (100, 3)]) == in_turn
        for number, _ in enumerate(pool.serve("b", [(0, 50), (100, 50)], lambda p: p)):
            if number == 3:
                break  # the workers hold payloads nobody takes
        # the next job is whole; its payloads (8 MB each) cross the pipe
        big = WorkerPool(Numbers(size=10**6), 2, 2**20, "test-pool")
        assert served(big, "c", [(7, 2), (9, 2)]) == [(0, 7), (1, 9), (0, 8), (1, 10)]
        big.close()
        assert served(pool, "d", [(0, 2), (100, 2)]) == [(0, 0), (1, 100), (0, 1), (1, 101)]
    finally:
        pool.close()


def test_a_queued_job_is_served_when_its_key_comes():
    pool = WorkerPool(Numbers(), 2, 2**20, "test-pool")
    try:
        first = served(pool, "epoch0", [(0, 2), (10, 2)], after=("epoch1", [(20, 2), (30, 2)]))
        assert first == [(0, 0), (1, 10), (0, 1), (1, 11)]
        assert served(pool, "epoch1", [(20, 2), (30, 2)]) == [(0, 20), (1, 30), (0, 21), (1, 31)]
        # a guess that did not come true is dropped for the job asked for
        served(pool, "epoch2", [(0, 1), (0, 1)], after=("epoch3", [(50, 9), (60, 9)]))
        assert served(pool, "other", [(5, 1), (6, 1)]) == [(0, 5), (1, 6)]
    finally:
        pool.close()


@pytest.mark.parametrize(
    ("task", "message", "cause"),
    [
        (FailsToOpen(), r"no table at 's3://bucket/missing'", FileNotFoundError),
        (FailsToLoad(), r"the transform's weights file 'norm.pt' is missing", ImportError),
    ],
)
def test_a_worker_that_cannot_start_fails_at_once_with_its_message(task, message, cause):
    """The worker's own error, not a wait for workers that will never be ready: ``ready``
    raises it (never blocking) instead of ever answering that the pool is ready, and
    serving raises it at once instead of waiting for a batch."""
    pool = WorkerPool(task, 2, 2**20, "test-pool")
    deadline = time.monotonic() + 120  # a hang guard, not the assertion
    try:
        with pytest.raises(WorkerStartError, match=message) as raised:
            while not pool.ready():
                assert time.monotonic() < deadline, "no start error from the workers"
                time.sleep(0.01)
        assert isinstance(raised.value.__cause__, cause), raised.value.__cause__
        with pytest.raises(WorkerStartError, match=message):
            served(pool, "a", [(0, 1), (0, 1)])
    finally:
        pool.close()


def test_a_job_that_raises_is_reraised_with_its_type_and_message():
    pool = WorkerPool(FailsAtTwo(), 2, 2**20, "test-pool")
    try:
        with pytest.raises(ValueError, match="row 2 is corrupt"):
            served(pool, "a", [(0, 5), (10, 5)])
    finally:
        pool.close()


def test_the_inline_reader_serves_in_order_queues_the_next_job_and_stops_when_dropped():
    task = Numbers()
    inline = InlineReader(task, task.open(0))

    def numbers(reader, key, job, after=None) -> list[int]:
        queued = after and (after[0], [after[1]])  # one reader: a job list of one
        return [p["number"] for p in reader.serve(key, [job], lambda p: p, queued)]

    assert numbers(inline, "epoch0", (0, 6), after=("epoch1", (10, 3))) == list(range(6))
    assert numbers(inline, "epoch1", (10, 3)) == [10, 11, 12]
    for number, _ in enumerate(inline.serve("epoch2", [(0, 50)], lambda p: p)):
        if number == 3:
            break  # an epoch stopped early: its leftovers are dropped
    assert numbers(inline, "epoch3", (20, 2)) == [20, 21]
    with pytest.raises(ValueError, match="row 2 is corrupt"):
        failing = InlineReader(FailsAtTwo(), task.open(0))
        list(failing.serve("a", [(0, 5)], lambda p: p))
    thread = inline._thread
    del inline, failing  # a data module dropped without teardown
    thread.join(5)
    assert not thread.is_alive()


# -- scripts without a main guard ---------------------------------------------------
UNGUARDED = """
import time
from lightning_stream import VideoEpisodeDataModule

class Scale:
    def __call__(self, images):
        return images
{transform}
dm = VideoEpisodeDataModule({root!r}, delta_timestamps={{"observation.images.front": [0.0]}},
    num_splits=12, batch_size=4, num_workers=2, sidecar_dir={sidecars!r}, {options})
stage = "setup"
try:
    dm.setup("fit")
    stage = "serving"
    ids = sorted(i for batch in dm.train_dataloader() for i in batch["index"].tolist())
    print("SERVED", ids == list(range(240)))
finally:
    print("STOPPED IN", stage)
"""


@pytest.fixture(scope="module")
def video_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("workers-video")
    write_dataset(root / "data", LENGTHS)
    return root


def run_script(tmp_path: Path, video_root: Path, options: str) -> subprocess.CompletedProcess:
    script = tmp_path / "train.py"
    script.write_text(
        UNGUARDED.format(
            root=str(video_root / "data"),
            sidecars=str(video_root / "sidecars"),
            transform="",
            options=options,
        )
    )
    command = [sys.executable, str(script)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=ENV)


def test_an_unguarded_script_whose_transform_workers_need_is_refused_at_once(tmp_path, video_root):
    """Refused at ``setup``, before a worker runs the script: it runs once (a worker that
    imported it would run it again and print again), and stops in setup."""
    result = run_script(tmp_path, video_root, "image_transforms=Scale()")
    assert result.returncode != 0
    assert "image_transforms is defined in" in result.stderr and "train.py" in result.stderr
    assert 'under if __name__ == "__main__":' in result.stderr
    assert result.stdout.splitlines() == ["STOPPED IN setup"], result.stdout


def test_an_unguarded_script_trains_when_the_workers_do_not_need_it(tmp_path, video_root):
    # the workers never run the training script unless a callable they need is in it
    result = run_script(tmp_path, video_root, "")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["SERVED True", "STOPPED IN serving"], result.stdout


# -- killed jobs ----------------------------------------------------------------------
def session_processes(session: int) -> list[int]:
    """Running processes (not zombies) of a session."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            found.append(int(entry))
    return found


def kill_and_check(workdir: Path, name: str, *args: str) -> None:
    """Start a training job in a session of its own, SIGKILL its training process (rank 0)
    at step 5, and check that nothing of the session keeps running (each process of it
    watches the trainer and exits when it is gone; waited for up to 60 s, a hang guard)
    and no shared memory segment it made is left."""
    shm_before = set(os.listdir("/dev/shm"))
    out, command = train_command(workdir, name, *args, "--step-ms", "20", module="tests.fault_run")
    job = subprocess.Popen(
        command,
        env=ENV,
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while last_step(out / "ledger") < 5:
            assert job.poll() is None and time.monotonic() < deadline, "no step 5"
            time.sleep(0.02)
        assert len(session_processes(job.pid)) > 2, "the workers run"
        os.kill(job.pid, signal.SIGKILL)
        job.wait()
        deadline = time.monotonic() + 60
        while session_processes(job.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = session_processes(job.pid)
        assert not left, [Path(f"/proc/{pid}/cmdline").read_bytes()[:200] for pid in left]
        assert set(os.listdir("/dev/shm")) <= shm_before
    finally:
        for pid in session_processes(job.pid):
            os.kill(pid, signal.SIGKILL)


def test_nothing_outlives_a_killed_lance_job(table_dir):
    kill_and_check(table_dir, "killed-lance", "--workers", "2")


def test_nothing_outlives_a_killed_video_job(video_root):
    data, sidecars = str(video_root / "data"), str(video_root / "sidecars")
    args = ["--workers", "2", "--video", "--sidecar-dir", sidecars, "--uri", data]
    kill_and_check(video_root, "killed-video", *args)


def test_nothing_outlives_a_ddp_job_whose_rank_0_is_killed(table_dir):
    kill_and_check(table_dir, "killed-ddp", "--devices", "2", "--workers", "2")


def test_a_dead_video_worker_stops_the_epoch_saying_how_to_resume(video_root):
    from lightning_stream import VideoEpisodeDataModule

    dm = VideoEpisodeDataModule(
        str(video_root / "data"),
        delta_timestamps={"observation.images.front": [0.0]},
        num_splits=12,
        batch_size=4,
        num_workers=2,
        sidecar_dir=str(video_root / "sidecars"),
    )
    dm.setup("fit")
    try:
        batches = iter(dm.train_dataloader())
        next(batches)
        os.kill(worker_pids(dm)[1], signal.SIGKILL)
        died = "a reading worker of rank 0 died while decoding"
        with pytest.raises(RuntimeError, match=died) as caught:
            for _ in batches:
                pass
        assert "killed by signal SIGKILL" in str(caught.value)
        assert "ckpt_path=<last checkpoint>" in str(caught.value)
    finally:
        dm.teardown("fit")
