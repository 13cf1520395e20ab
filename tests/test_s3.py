"""Tables, videos and checkpoints on a real S3-protocol server (moto) on 127.0.0.1.

The server answers every request after ``LATENCY_MS`` (20 ms), as a real object store
does after 10-100 ms, so reads that wait on one another show up here as slow tests and
a reader that mishandles slow answers as a failing one."""

import collections
import io
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from lightning_stream import LanceDataModule, cli, ledger
from lightning_stream.demo import make_table
from lightning_stream.inspect import render
from lightning_stream.lance.order import clump_rows
from lightning_stream.storage import StorageError, fsspec_options, pyarrow_filesystem
from lightning_stream.video.datamodule import VideoEpisodeDataModule
from lightning_stream.video.synthetic import write_dataset

from .conftest import ENV, ROOT, ROWS, assert_exact, train_command
from .s3_server import LATENCY_MS, S3Server, free_port, requests_served
from .test_video_datamodule import LENGTHS

BUCKET = "lightning-stream"
TABLE = f"s3://{BUCKET}/db"
SECRET = "sEcReT-9f3a1c-never-in-a-file"  # the secret key the training runs are given
FRONT = "observation.images.front"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server(log=tmp_path_factory.mktemp("s3") / "moto.log", latency_ms=LATENCY_MS)
    with server:
        server.create_bucket(BUCKET)
        make_table(TABLE, ROWS, storage_options=server.storage_options())
        yield server


def test_the_server_waits_before_each_answer_without_holding_up_the_others(s3):
    """8 range reads at once take about one latency, not eight; each is logged."""
    fs, path = pyarrow_filesystem(f"s3://{BUCKET}/latency-probe", s3.storage_options())
    with fs.open_output_stream(path) as out:
        out.write(b"x" * 4096)
    probe = fs.open_input_file(path)
    s3.bytes_served(reset=True)
    start = time.monotonic()
    threads = [threading.Thread(target=probe.read_at, args=(512, 512 * i)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    assert LATENCY_MS / 1000 <= elapsed < 6 * LATENCY_MS / 1000, elapsed  # 8 in turn: 8x
    logged = requests_served(s3.endpoint)
    assert [size for _, _, size in logged] == [512] * 8
    assert all(duration >= LATENCY_MS / 1000 for _, duration, _ in logged)
    assert s3.bytes_served() == 8 * 512


def write_object(server, name: str, size: int) -> tuple[object, bytes]:
    """An object of ``size`` random bytes (above moto's in-memory size: kept in a file)."""
    fs, path = pyarrow_filesystem(f"s3://{BUCKET}/{name}", server.storage_options())
    data = os.urandom(size)
    with fs.open_output_stream(path) as out:
        out.write(data)
    return fs.open_input_file(path), data


RANGES = [(0, 1), (4096, 2**20), (6 * 2**20 - 100, 100), (123_457, 3 * 2**20)]


def test_ranges_of_an_object_kept_in_a_file_are_its_bytes(s3):
    """Ranges the server sends with ``sendfile``, at once, are the object's bytes."""
    probe, data = write_object(s3, "big-probe", 6 * 2**20)
    s3.bytes_served(reset=True)
    with ThreadPoolExecutor(len(RANGES)) as pool:
        got = list(pool.map(lambda r: probe.read_at(r[1], r[0]), RANGES))
    assert got == [data[o : o + n] for o, n in RANGES]
    assert s3.bytes_served() == sum(n for _, n in RANGES)


def test_a_capped_server_sends_an_object_kept_in_a_file_no_faster_than_its_cap(tmp_path):
    with S3Server(log=tmp_path / "moto.log", bandwidth_mb_s=40) as capped:
        capped.create_bucket(BUCKET)
        probe, data = write_object(capped, "big-probe", 6 * 2**20)
        start = time.monotonic()
        assert probe.read_at(2 * 10**6, 4096) == data[4096 : 4096 + 2 * 10**6]
        assert time.monotonic() - start >= 2 / 40


def epoch_ids(dm):
    dm.setup("fit")
    return collections.Counter(int(i) for b in dm.train_dataloader() for i in b["id"])


@pytest.mark.parametrize("workers", [0, 2])
def test_one_epoch_of_a_table_on_s3_is_exact(s3, workers):
    dm = LanceDataModule(
        TABLE, "samples", num_splits=12, batch_size=5, num_workers=workers,
        storage_options=s3.storage_options(SECRET),
    )  # fmt: skip
    counts = epoch_ids(dm)
    assert sorted(counts) == list(range(ROWS)) and set(counts.values()) == {1}
    assert dm.stream.source.shuffle_clump_size == clump_rows(None, ROWS, 12) > 1  # the default


def last_step(ledger_dir):
    try:
        return max(entry["step"] for entry in ledger.read(ledger_dir))
    except (ValueError, FileNotFoundError):
        return -1


def test_killed_run_resumes_exactly_from_an_s3_checkpoint_and_leaks_no_secret(s3, tmp_path):
    """2 workers, SIGKILLed mid-epoch; resumed on 0 workers from ``last.ckpt`` on S3.

    The data module gets the secret key in ``storage_options`` (checkpoints go through
    s3fs with the environment's other key): the secret must appear in no file, no line
    of output, no checkpoint and no ``inspect`` output.
    """
    env = {**ENV, **s3.environment()}
    ckpt_dir = f"s3://{BUCKET}/run/ckpt"
    options = [f"--storage-option={k}={v}" for k, v in s3.storage_options(SECRET).items()]
    common = ["--uri", TABLE, "--ckpt-dir", ckpt_dir, "--max-epochs", "1", "--batch-size", "6"]
    common += options  # an epoch is 40 steps
    out, command = train_command(tmp_path, "first", *common, "--workers", "2", "--save-every", "4")
    with open(tmp_path / "first.log", "wb") as log:
        job = subprocess.Popen(
            command, env=env, cwd=ROOT, start_new_session=True, stdout=log, stderr=log
        )
        try:
            deadline = time.monotonic() + 150
            while (
                job.poll() is None
                and time.monotonic() < deadline
                and last_step(out / "ledger") < 16
            ):
                time.sleep(0.05)
        finally:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(timeout=30)
    assert last_step(out / "ledger") >= 16, (tmp_path / "first.log").read_text()[-3000:]
    last = f"{ckpt_dir}/last.ckpt"
    resumed, command = train_command(tmp_path, "resumed", *common, "--ckpt-path", last)
    result = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, timeout=180)
    assert result.returncode == 0, result.stderr[-4000:]
    inspected = subprocess.run(
        [sys.executable, "-m", "lightning_stream.cli", "inspect", last, "--json"],
        env=env, cwd=ROOT, capture_output=True, timeout=60,
    )  # fmt: skip
    assert inspected.returncode == 0, inspected.stderr[-2000:]
    assert TABLE.encode() in inspected.stdout
    shown = render(last, False, s3.storage_options(SECRET))  # options, not the environment
    assert TABLE in shown and SECRET not in shown

    import fsspec

    fs = fsspec.filesystem("s3", **fsspec_options(s3.storage_options()))
    checkpoints = {path: fs.cat(path) for path in fs.find(ckpt_dir)}
    step = torch.load(io.BytesIO(checkpoints[last.removeprefix("s3://")]), weights_only=False)[
        "global_step"
    ]
    assert 0 < step < 40
    entries = ledger.kept(ledger.read(out / "ledger"), step, ledger.read(resumed / "ledger"))
    assert_exact(entries, epochs=1)

    secret = SECRET.encode()
    assert len(checkpoints) >= 2
    for path, data in checkpoints.items():
        assert secret not in data, path
        loaded = torch.load(io.BytesIO(data), weights_only=False)
        assert SECRET not in repr(loaded), path
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert secret not in path.read_bytes(), path
    for stream in (result.stdout, result.stderr, inspected.stdout, inspected.stderr):
        assert secret not in stream


def test_unreachable_stores_fail_at_setup_naming_the_uri_and_the_option(s3, tmp_path):
    options = s3.storage_options(SECRET)
    wrong_endpoint = {**options, "aws_endpoint": f"http://127.0.0.1:{free_port()}"}
    cases = [
        ("s3://no-such-bucket/db", options, "bucket does not exist"),
        (TABLE, wrong_endpoint, "'aws_endpoint'"),
    ]
    for uri, storage_options, hint in cases:
        dm = LanceDataModule(
            uri, "samples", num_splits=12, batch_size=5, storage_options=storage_options
        )
        with pytest.raises(StorageError) as error:
            dm.setup("fit")
        message = str(error.value)
        assert uri in message and hint in message and SECRET not in message, message
        video = VideoEpisodeDataModule(
            uri, delta_timestamps={FRONT: [0.0]}, num_splits=12, batch_size=5,
            storage_options=storage_options, sidecar_dir=str(tmp_path),
        )  # fmt: skip
        with pytest.raises(StorageError) as error:
            video.setup("fit")
        message = str(error.value)
        assert uri in message and hint in message and SECRET not in message, message


def test_refused_credentials_fail_at_setup_naming_the_uri_and_the_option(tmp_path):
    with S3Server(check_credentials=True) as refusing:
        options = refusing.storage_options(SECRET)
        for uri, make in (
            (TABLE, lambda uri: LanceDataModule(
                uri, "samples", num_splits=12, batch_size=5, storage_options=options)),
            (f"s3://{BUCKET}/lerobot", lambda uri: VideoEpisodeDataModule(
                uri, delta_timestamps={FRONT: [0.0]}, num_splits=12, batch_size=5,
                storage_options=options, sidecar_dir=str(tmp_path))),
        ):  # fmt: skip
            with pytest.raises(StorageError) as error:
                make(uri).setup("fit")
            message = str(error.value)
            assert uri in message and "credentials were missing or refused" in message
            assert "'aws_secret_access_key'" in message and SECRET not in message, message


@pytest.mark.parametrize("workers", [0, 2])
def test_lerobot_dataset_on_s3_gives_every_anchor_once(s3, tmp_path_factory, workers):
    root = f"s3://{BUCKET}/lerobot"
    local = tmp_path_factory.getbasetemp() / "lerobot-s3"
    if not local.exists():
        write_dataset(local, LENGTHS)
        s3.upload(local, root)
    sidecars = local.parent / f"lerobot-s3-sidecars-{workers}"
    if workers == 0:  # ahead of time, from the command line
        options = [f"--storage-option={k}={v}" for k, v in s3.storage_options().items()]
        assert cli.main(["build-sidecar", root, "--cache-dir", str(sidecars), *options]) == 0
    dm = VideoEpisodeDataModule(
        root, delta_timestamps={FRONT: [-2 / 30, 0.0]}, num_splits=12, batch_size=5,
        num_workers=workers, sidecar_dir=str(sidecars),
        storage_options=s3.storage_options(SECRET),
    )  # fmt: skip
    dm.setup("fit")
    assert len(list(sidecars.rglob("*.arrow"))) == len(list(local.rglob("*.mp4")))
    assert not [p for p in s3.whole_object_gets() if p.endswith(".mp4")], "range reads only"
    counts = collections.Counter(int(i) for batch in dm.train_dataloader() for i in batch["index"])
    assert sorted(counts) == list(range(sum(LENGTHS))) and set(counts.values()) == {1}
