"""Two nodes of one process each (two launches, ``NODE_RANK`` 0 and 1), killed, resumed on one."""

import os
import signal
import subprocess
import time

from lightning_stream import ledger
from lightning_stream.inspect import read_stream_record

from .conftest import ENV, ROOT, assert_exact, last_step, train, train_command
from .s3_server import free_port

KILL_AFTER = 16  # an epoch is 40 steps: 240 rows, 2 processes, batch 3


def test_two_nodes_killed_mid_epoch_resume_exactly_on_one_node_of_two_devices(table_dir):
    args = ["--num-nodes", "2", "--devices", "1", "--save-every", "4", "--max-epochs", "1"]
    out, command = train_command(table_dir, "nodes", *args)
    cluster = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "WORLD_SIZE": "2"}
    nodes = []
    try:
        for node_rank in (0, 1):
            env = {**ENV, **cluster, "NODE_RANK": str(node_rank)}
            node = subprocess.Popen(
                command,
                env=env,
                cwd=ROOT,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            nodes.append(node)
        deadline = time.monotonic() + 150
        while time.monotonic() < deadline and all(n.poll() is None for n in nodes):
            if last_step(out / "ledger") >= KILL_AFTER:
                break
            time.sleep(0.02)
    finally:
        for node in nodes:
            os.killpg(node.pid, signal.SIGKILL)
            node.wait(timeout=30)
    assert all(n.returncode == -signal.SIGKILL for n in nodes), "killed, not finished"
    first = ledger.read(out / "ledger")
    assert {e["step"] for e in first} >= set(range(KILL_AFTER)), "both nodes trained"
    assert (out / "ledger" / "rank1.jsonl").exists()

    last = out / "ckpt" / "last.ckpt"
    record = read_stream_record(last)
    step = record["global_step"]
    assert 0 < step < 40 and record["topology"]["world_size"] == 2 and record["complete"]
    resumed, _ = train(
        table_dir, "nodes-resumed", "--devices", "2", "--max-epochs", "1", "--ckpt-path", str(last)
    )
    assert_exact(ledger.kept(first, step, ledger.read(resumed / "ledger")), epochs=1)
