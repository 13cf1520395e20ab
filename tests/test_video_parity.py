"""VideoEpisodeDataModule against LeRobotDataset (lerobot 0.6.1), point by point.

Each test asserts the value LeRobotDataset gives, or the message of the error it raises;
the README's "LeRobot parity" table lists them.
"""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lightning_stream.video.datamodule import VideoEpisodeDataModule
from lightning_stream.video.synthetic import frame_index, write_dataset

LENGTHS = [12, 9, 15, 10]
STARTS = np.concatenate([[0], np.cumsum(LENGTHS)[:-1]])
FRONT, WRIST = "observation.images.front", "observation.images.wrist"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("parity")
    write_dataset(workdir / "db", LENGTHS)
    return workdir


def make(workdir, root=None, **options):
    settings = {"delta_timestamps": {FRONT: [0.0]}, "num_splits": 2, "batch_size": 4, **options}
    return VideoEpisodeDataModule(
        str(root or workdir / "db"), sidecar_dir=str(workdir / "sidecars"), **settings
    )


def epoch(dm) -> list[dict]:
    dm.setup("fit")
    return list(dm.train_dataloader())


def test_off_grid_delta_timestamps_raise_with_lerobots_tolerance(dataset):
    # LeRobot's check_delta_timestamps: |d * fps - round(d * fps)| / fps <= tolerance_s (1e-4)
    with pytest.raises(
        ValueError,
        match=r"delta_timestamps\['observation.images.front'\] has \[-0\.05\], not multiples"
        r" of 1/30 s \(the dataset's fps grid\) within tolerance_s=0\.0001: -0\.05 s lies"
        r" between frames at -0\.0667 and -0\.0333 s",
    ):
        make(dataset, delta_timestamps={FRONT: [-0.05, 0.0]}).setup("fit")
    with pytest.raises(ValueError, match=r"delta_timestamps\['action'\] has \[0\.0335"):
        make(dataset, delta_timestamps={"action": [0.0, 1 / 30 + 2e-4]}).setup("fit")
    make(dataset, delta_timestamps={"action": [0.0, 1 / 30 + 5e-5]}).setup("fit")
    make(dataset, delta_timestamps={"action": [1 / 30 + 2e-4]}, tolerance_s=1e-3).setup("fit")


def test_window_shapes_follow_lerobot(dataset):
    one = epoch(make(dataset, delta_timestamps={FRONT: [0.0], "action": [0.0]}))[0]
    rows = len(one["index"])
    assert one[FRONT].shape == (rows, 3, 96, 96), "one delta: [C, H, W], LeRobot squeezes it"
    assert one[WRIST].shape == (rows, 3, 96, 96), "no delta: [C, H, W]"
    assert one["action"].shape == (rows, 1, 2), "Parquet features keep T, also for one delta"
    assert one[f"{FRONT}_is_pad"].shape == (rows, 1)
    several = epoch(make(dataset, delta_timestamps={FRONT: [-1 / 30, 0.0]}))[0]
    assert several[FRONT].shape == (len(several["index"]), 2, 3, 96, 96), "[T, C, H, W]"


def test_float32_images_are_in_0_1_and_reach_the_transforms_as_float(dataset):
    seen = []

    def transform(images: torch.Tensor) -> torch.Tensor:
        seen.append(images.dtype)
        return images

    raw = epoch(make(dataset, shuffle_seed=3))[0]
    scaled = epoch(make(dataset, shuffle_seed=3, image_dtype="float32", image_transforms=transform))
    first = scaled[0]
    assert raw[FRONT].dtype == torch.uint8 and first[FRONT].dtype == torch.float32
    assert torch.equal(first[FRONT], raw[FRONT].float() / 255)
    assert float(first[FRONT].min()) >= 0.0 and float(first[FRONT].max()) <= 1.0
    assert set(seen) == {torch.float32}
    index = int(first["index"][0])
    assert frame_index((first[FRONT][0] * 255).round().byte().permute(1, 2, 0).numpy()) == index
    with pytest.raises(
        ValueError, match=r"image_dtype='float16': use one of \('uint8', 'float32'\)"
    ):
        make(dataset, image_dtype="float16")


def test_stats_json_is_exposed_as_tensors_for_normalisers(dataset):
    dm = make(dataset)
    dm.setup("fit")
    frames = pq.read_table(dataset / "db" / "data" / "chunk-000" / "file-000.parquet")
    actions = np.stack(frames["action"].to_numpy(zero_copy_only=False))
    stats = dm.stats["action"]
    assert set(stats) >= {"mean", "std", "min", "max"}
    assert stats["mean"].dtype == torch.float32 and stats["mean"].shape == (2,)
    assert torch.allclose(stats["mean"], torch.tensor(actions.mean(0), dtype=torch.float32))
    assert torch.allclose(stats["max"], torch.tensor(actions.max(0), dtype=torch.float32))
    assert dm.stats["observation.state"]["std"].shape == (3,)


def test_drop_n_last_frames_leaves_the_episode_tails_out_of_the_anchors(dataset):
    dm = make(dataset, drop_n_last_frames=3, delta_timestamps={"action": [0.0, 3 / 30]})
    batches = epoch(dm)
    anchors = [int(i) for b in batches for i in b["index"]]
    expected = [int(STARTS[e]) + f for e, n in enumerate(LENGTHS) for f in range(n - 3)]
    assert sorted(anchors) == expected  # 34 anchors: 2 splits of 17, none left out
    assert not any(bool(pad.any()) for b in batches for pad in b["action_is_pad"])
    assert dm.stream.source.identity["drop_n_last_frames"] == 3


def test_an_empty_episode_list_raises(dataset):
    with pytest.raises(ValueError, match=r"episodes=\[\] selects no episode"):
        make(dataset, episodes=[])
    anchors = {int(i) for b in epoch(make(dataset, episodes=[1])) for i in b["index"]}
    assert anchors == set(range(STARTS[1], STARTS[1] + LENGTHS[1] - 1))  # 9 frames, 2 splits


def task_strings(workdir, root) -> dict[int, str]:
    tasks = {}
    for batch in epoch(make(workdir, root=root)):
        tasks.update(zip(batch["episode_index"].tolist(), batch["task"], strict=True))
    return tasks


def test_task_strings_come_from_tasks_parquet_as_lerobot_writes_it(dataset, tmp_path):
    assert task_strings(dataset, None) == {e: f"task {e % 2}" for e in range(len(LENGTHS))}
    # LeRobot v3 writes tasks.parquet from pandas: the strings are the frame's index
    root = write_dataset(tmp_path / "db", [6, 5])
    index = pa.table({"task_index": [0, 1], "__index_level_0__": ["pick", "place"]})
    pandas = {"index_columns": ["__index_level_0__"], "columns": []}
    pq.write_table(
        index.replace_schema_metadata({"pandas": json.dumps(pandas)}), root / "meta/tasks.parquet"
    )
    assert task_strings(dataset, root) == {0: "pick", 1: "place"}
    # older layouts: meta/tasks.jsonl
    (root / "meta/tasks.parquet").unlink()
    lines = [{"task_index": 0, "task": "open"}, {"task_index": 1, "task": "close"}]
    (root / "meta/tasks.jsonl").write_text("\n".join(json.dumps(line) for line in lines))
    assert task_strings(dataset, root) == {0: "open", 1: "close"}
