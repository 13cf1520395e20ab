"""Save on 2 DDP processes x 2 workers, resume on other topologies: every sample once.

240 rows in 12 splits, batch 3: an epoch is 40 steps per rank on 2 processes. Step 7 is
mid-epoch and not a multiple of the worker count (lancedb's own ``state_dict`` raises
there); step 40 is the last batch of epoch 0, so the resumed run must start epoch 1 in full.
"""

import pytest

from lightning_stream import ledger

from .conftest import assert_exact, train


@pytest.fixture(scope="module")
def saved_run(table_dir):
    out, _ = train(
        table_dir, "save-w2k2", "--devices", "2", "--workers", "2", "--save-at", "7", "40"
    )
    return out


def test_the_saving_run_itself_is_exact(saved_run):
    assert_exact(ledger.read(saved_run / "ledger"), epochs=2)


@pytest.mark.parametrize("step", [7, 40])
@pytest.mark.parametrize(("devices", "workers"), [(1, 0), (3, 2), (2, 0)])
def test_resume_on_another_topology_is_exact(table_dir, saved_run, step, devices, workers):
    ckpt = saved_run / "ckpt" / f"step={step}.ckpt"
    resumed, _ = train(
        table_dir,
        f"resume-{step}-w{devices}k{workers}",
        "--devices",
        str(devices),
        "--workers",
        str(workers),
        "--ckpt-path",
        str(ckpt),
    )
    before = ledger.read(saved_run / "ledger")
    after = ledger.read(resumed / "ledger")
    if step == 40:
        assert {e["epoch"] for e in after} == {1}, "a last-batch checkpoint resumes at epoch 1"
    assert_exact(ledger.kept(before, step, after), epochs=2)
