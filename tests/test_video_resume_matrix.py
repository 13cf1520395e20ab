"""The core resume matrix on the video stream: save at W=2/K=2, resume at W=1/K=0, W=3/K=2."""

import pytest

from lightning_stream import ledger
from lightning_stream.video.synthetic import write_dataset

from .conftest import assert_exact, train
from .test_video_datamodule import LENGTHS


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("video-matrix")
    write_dataset(workdir / "db", LENGTHS)  # 240 frames: 12 splits of 20, batch 3
    return workdir


def video_train(video_dir, name, *args):
    sidecars = ["--video", "--sidecar-dir", str(video_dir / "sidecars")]
    return train(video_dir, name, *sidecars, *args)


@pytest.fixture(scope="module")
def saved(video_dir):
    out, _ = video_train(
        video_dir, "save", "--devices", "2", "--workers", "2", "--save-at", "7", "40"
    )
    assert_exact(ledger.read(out / "ledger"), epochs=2)
    return out


@pytest.mark.parametrize("step", [7, 40])
@pytest.mark.parametrize(("devices", "workers"), [(1, 0), (3, 2)])
def test_video_resume_is_exact(video_dir, saved, step, devices, workers):
    ckpt = saved / "ckpt" / f"step={step}.ckpt"
    args = ["--devices", str(devices), "--workers", str(workers), "--ckpt-path", str(ckpt)]
    resumed, _ = video_train(video_dir, f"resume-{step}-{devices}-{workers}", *args)
    entries = ledger.kept(ledger.read(saved / "ledger"), step, ledger.read(resumed / "ledger"))
    assert_exact(entries, epochs=2)
