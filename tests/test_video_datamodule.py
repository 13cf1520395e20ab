"""VideoEpisodeDataModule on LeRobot v3 datasets written here with PyAV."""

import collections

import numpy as np
import pytest
import torch

from lightning_stream.video.datamodule import VideoEpisodeDataModule
from lightning_stream.video.synthetic import frame_index, write_dataset

from .conftest import gone, worker_pids

LENGTHS = [25, 14, 31, 18, 22, 9, 27, 16, 20, 19, 24, 15]  # 240 frames
STARTS = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])
FRONT, WRIST = "observation.images.front", "observation.images.wrist"
DELTAS = {FRONT: [-3 / 30, 0.0, 2 / 30], "action": [0.0, 1 / 30]}


@pytest.fixture(scope="module", params=["h264", "av1"])
def dataset(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"lerobot-{request.param}")
    write_dataset(root / "data", LENGTHS, codec=request.param)
    return root


def make(dataset, **options):
    settings = {"delta_timestamps": DELTAS, "num_splits": 12, "batch_size": 5, **options}
    return VideoEpisodeDataModule(
        str(dataset / "data"), sidecar_dir=str(dataset / "sidecars"), **settings
    )


def set_up(dm, workers):
    dm.setup("fit")
    return dm


def expected_window(episode, frame, offsets):
    clamped = np.clip(frame + np.asarray(offsets), 0, LENGTHS[episode] - 1)
    return (STARTS[episode] + clamped).tolist(), (clamped != frame + np.asarray(offsets)).tolist()


def check_windows(batch):
    """Every window of ``batch`` shows the frames it claims; its dataset indices."""
    indices = []
    for i in range(len(batch["index"])):
        episode, frame = int(batch["episode_index"][i]), int(batch["frame_index"][i])
        index = int(batch["index"][i])
        assert index == STARTS[episode] + frame
        indices.append(index)
        front, pads = expected_window(episode, frame, [-3, 0, 2])
        images = batch[FRONT][i]
        assert images.shape == (3, 3, 96, 96) and images.dtype.is_floating_point is False
        assert [frame_index(im.permute(1, 2, 0).numpy()) for im in images] == front
        assert batch[f"{FRONT}_is_pad"][i].tolist() == pads
        assert frame_index(batch[WRIST][i].permute(1, 2, 0).numpy()) == index
        actions, action_pads = expected_window(episode, frame, [0, 1])
        assert batch["action"][i][:, 0].tolist() == actions
        assert batch["action_is_pad"][i].tolist() == action_pads
        assert batch["task"][i] == f"task {episode % 2}"
    return indices


@pytest.mark.parametrize("workers", [0, 2])
def test_every_frame_is_the_one_it_claims_and_every_anchor_comes_once(dataset, workers):
    dm = set_up(make(dataset, num_workers=workers), workers)
    anchors = collections.Counter()
    for batch in dm.train_dataloader():
        anchors.update(check_windows(batch))
    assert len(anchors) == sum(LENGTHS) and set(anchors.values()) == {1}


@pytest.mark.parametrize("workers", [0, 2])
def test_the_byte_budget_bounds_the_decoded_frames_held(dataset, workers):
    # 12 resident chunks (12 splits, pool 1) of 5 anchors: at most 5.4 MB of the 13.3 MB
    # the epoch decodes, where whole pieces held about all of it; frames still exact
    budget_gb = 0.005
    dm = make(dataset, num_workers=workers, byte_budget_gb=budget_gb, episode_pool_size=1)
    set_up(dm, workers)
    held, anchors = [], collections.Counter()
    for batch in dm.train_dataloader():
        held.append(dm.stream.counters()["resident_bytes"])
        anchors.update(check_windows(batch))
    dm.teardown("fit")
    assert 0 < max(held) <= budget_gb * 2**30
    assert len(anchors) == sum(LENGTHS) and set(anchors.values()) == {1}


@pytest.mark.parametrize("workers", [0, 2])
def test_decoded_frames_per_delivered_frame_stay_low(dataset, workers):
    # the counters sum the workers' (each batch carries its worker's)
    dm = set_up(make(dataset, num_workers=workers), workers)
    delivered = sum(3 * len(b["index"]) + len(b["index"]) for b in dm.train_dataloader())
    counters = dm.stream.counters()
    dm.teardown("fit")
    assert counters["frames_decoded"] / delivered <= 1.3
    assert counters["frames_decoded"] > 0 and counters["bytes_loaded"] > 0
    assert counters["resident_bytes"] == 0, "every piece is dropped after its last window"


def test_bad_keys_and_budgets_are_named(dataset):
    with pytest.raises(
        ValueError, match=r"delta_timestamps has keys \['observation.images.side'\]"
    ):
        make(dataset, delta_timestamps={"observation.images.side": [0.0]}).setup("fit")
    with pytest.raises(
        ValueError, match=r"byte_budget_gb=1e-06 cannot hold one window's decoded frames per"
    ):
        make(dataset, byte_budget_gb=1e-6).setup("fit")
    with pytest.raises(ValueError, match="not divisible"):
        make(dataset, num_workers=5).setup("fit")


def test_workers_stopped_before_their_first_epoch_exit(dataset):
    # started at setup, they wait for a job; teardown (a fit that never trained) ends them
    dm = set_up(make(dataset, num_workers=2), 2)
    pids = worker_pids(dm)
    dm.teardown("fit")
    assert len(pids) == 2 and gone(pids)


def to_bfloat16(images):
    return images.to(torch.bfloat16)


def test_a_bfloat16_image_transform_crosses_from_the_workers(dataset):
    # numpy has no bfloat16: such a tensor crosses the pipe as a tensor
    dm = set_up(make(dataset, num_workers=2, image_transforms=to_bfloat16), 2)
    batch = next(iter(dm.train_dataloader()))
    dm.teardown("fit")
    assert batch[FRONT].dtype == torch.bfloat16 and batch["action"].dtype == torch.float32


def test_a_pass_stopped_early_leaves_no_stale_frames_in_the_next(dataset):
    # the main process's chunks of a stopped pass must not serve the next pass's windows
    dm = set_up(make(dataset, byte_budget_gb=0.005, episode_pool_size=1), 0)
    for number, batch in enumerate(dm.train_dataloader()):
        check_windows(batch)
        if number == 3:
            break
    for batch in dm.train_dataloader():
        check_windows(batch)
