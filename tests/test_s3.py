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
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_stream import LanceDataModule, TokenPacking, cli, ledger
from lightning_stream.demo import make_table
from lightning_stream.inspect import render
from lightning_stream.lance.order import clump_rows
from lightning_stream.lance.synthetic import make_token_table
from lightning_stream.storage import StorageError, fsspec_options, pyarrow_filesystem
from lightning_stream.video.datamodule import VideoEpisodeDataModule
from lightning_stream.video.synthetic import write_dataset

from .conftest import ENV, ROOT, ROWS, assert_exact, train_command
from .s3_server import LATENCY_MS, PACE_BYTES, S3Server, free_port, requests_served
from .test_packing import EOS, PAD, assert_every_token_once
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


def wait_for(condition, what: str, within: float = 120.0) -> None:
    """Return once ``condition()`` holds; fail naming ``what`` if it has not in ``within``
    seconds (a guard against a hang: the test asserts the condition, not the time)."""
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not in {within:.0f} s"
        time.sleep(0.01)


def test_the_server_waits_before_each_answer_without_holding_up_the_others(s3):
    """8 range reads sent at once all wait at the server together, none answered while
    they wait (a server that waited for one at a time would never have 8 waiting); once
    their waits end, each gets its own bytes and is logged."""
    fs, path = pyarrow_filesystem(f"s3://{BUCKET}/latency-probe", s3.storage_options())
    data = os.urandom(4096)
    with fs.open_output_stream(path) as out:
        out.write(data)
    probe = fs.open_input_file(path)
    s3.bytes_served(reset=True)
    got: dict[int, bytes] = {}

    def read(i: int) -> None:
        got[i] = probe.read_at(512, 512 * i)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    s3.hold()
    try:
        for thread in threads:
            thread.start()
        wait_for(lambda: s3.waiting() == 8, "8 range reads waiting at the server at once")
        assert s3.bytes_served() == 0 and not got, "nothing is answered before its wait ends"
    finally:
        s3.release()
        for thread in threads:
            thread.join(timeout=120)
    assert got == {i: data[512 * i : 512 * (i + 1)] for i in range(8)}
    assert [size for _, _, size in requests_served(s3.endpoint)] == [512] * 8
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


def test_a_capped_server_holds_back_a_body_its_cap_does_not_allow_yet(tmp_path):
    """At a cap of 1 KB/s a range read's one 64 KiB piece is due in over a minute: the
    request is seen waiting at the server; once its wait is ended it gets the object's
    bytes. Uncapped, the same read would not wait at all (the server has no latency)."""
    with S3Server(log=tmp_path / "moto.log", bandwidth_mb_s=0.001) as capped:
        capped.create_bucket(BUCKET)
        probe, data = write_object(capped, "big-probe", 6 * 2**20)
        got = []
        reader = threading.Thread(target=lambda: got.append(probe.read_at(PACE_BYTES, 4096)))
        reader.start()
        try:
            wait_for(lambda: capped.waiting() == 1 or not reader.is_alive(), "a capped read")
            assert capped.waiting() == 1 and not got, "the body waits for its cap"
        finally:
            capped.release()
            reader.join(timeout=120)
        assert got == [data[4096 : 4096 + PACE_BYTES]]


def epoch_ids(dm):
    dm.setup("fit")
    return collections.Counter(int(i) for b in dm.train_dataloader() for i in b["id"])


@pytest.mark.parametrize("workers", [0, 2])
def test_one_epoch_of_a_table_on_s3_is_exact(s3, workers):
    dm = LanceDataModule(
        TABLE,
        "samples",
        num_splits=12,
        batch_size=5,
        num_workers=workers,
        storage_options=s3.storage_options(SECRET),
    )
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
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=60,
    )
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


def table_module(uri: str, options: dict, sidecars: Path) -> LanceDataModule:
    return LanceDataModule(uri, "samples", num_splits=12, batch_size=5, storage_options=options)


def video_module(uri: str, options: dict, sidecars: Path) -> VideoEpisodeDataModule:
    settings = {"num_splits": 12, "batch_size": 5, "sidecar_dir": str(sidecars)}
    return VideoEpisodeDataModule(
        uri, delta_timestamps={FRONT: [0.0]}, storage_options=options, **settings
    )


@pytest.mark.parametrize(("workers", "local_copy"), [(0, False), (2, False), (2, True)])
def test_packed_documents_on_s3_give_every_token_once(s3, tmp_path, workers, local_copy):
    options = s3.storage_options()
    uri = f"s3://{BUCKET}/tokens-{workers}-{local_copy}"
    lengths = make_token_table(uri, 2_000, storage_options=options)
    cache = str(tmp_path / "token-counts")
    packing = TokenPacking("tokens", 512, EOS, PAD, cache, local_copy)
    dm = LanceDataModule(
        uri,
        "documents",
        num_splits=4,
        batch_size=4,
        num_workers=workers,
        pack=packing,
        storage_options=options,
    )
    dm.setup("fit")
    try:
        tokens = [b["input_ids"][b["document_ids"] >= 0].numpy() for b in dm.train_dataloader()]
    finally:
        dm.teardown("fit")
    assert_every_token_once(np.concatenate(tokens), lengths)


def test_unreachable_stores_fail_at_setup_naming_the_uri_and_the_option(s3, tmp_path):
    options = s3.storage_options(SECRET)
    wrong_endpoint = {**options, "aws_endpoint": f"http://127.0.0.1:{free_port()}"}
    cases = [
        ("s3://no-such-bucket/db", options, "bucket does not exist"),
        (TABLE, wrong_endpoint, "'aws_endpoint'"),
    ]
    for uri, storage_options, hint in cases:
        for make in (table_module, video_module):
            with pytest.raises(StorageError) as error:
                make(uri, storage_options, tmp_path).setup("fit")
            message = str(error.value)
            assert uri in message and hint in message and SECRET not in message, message


def test_refused_credentials_fail_at_setup_naming_the_uri_and_the_option(tmp_path):
    with S3Server(check_credentials=True) as refusing:
        options = refusing.storage_options(SECRET)
        for uri, make in ((TABLE, table_module), (f"s3://{BUCKET}/lerobot", video_module)):
            with pytest.raises(StorageError) as error:
                make(uri, options, tmp_path).setup("fit")
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
        root,
        delta_timestamps={FRONT: [-2 / 30, 0.0]},
        num_splits=12,
        batch_size=5,
        num_workers=workers,
        sidecar_dir=str(sidecars),
        storage_options=s3.storage_options(SECRET),
    )
    dm.setup("fit")
    assert len(list(sidecars.rglob("*.arrow"))) == len(list(local.rglob("*.mp4")))
    assert not [p for p in s3.whole_object_gets() if p.endswith(".mp4")], "range reads only"
    counts = collections.Counter(int(i) for batch in dm.train_dataloader() for i in batch["index"])
    assert sorted(counts) == list(range(sum(LENGTHS))) and set(counts.values()) == {1}
