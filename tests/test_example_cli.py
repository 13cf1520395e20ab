"""The configs under configs/ run as they are under LightningCLI, with DDP, and resume."""

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cli(workdir: Path, *flags: str, example="train_world_model", config="world_model") -> None:
    command = [
        sys.executable,
        str(ROOT / "examples" / f"{example}.py"),
        "fit",
        "--config",
        str(ROOT / "configs" / f"{config}.yaml"),
        "--trainer.enable_progress_bar=false",
        *flags,
    ]
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    result = subprocess.run(
        command, cwd=workdir, capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr[-5000:]


def test_world_model_config_trains_on_two_processes_and_resumes_on_one(tmp_path):
    # 96 episodes: 2400 windows, 25 steps per epoch on 2 processes
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--data.episodes=96"]
    cli(tmp_path, *ddp, "--trainer.max_epochs=1")
    checkpoints = tmp_path / "runs" / "world_model" / "checkpoints"
    mid_epoch = checkpoints / "epoch=0-step=20.ckpt"
    assert mid_epoch.exists(), sorted(p.name for p in checkpoints.iterdir())
    cli(tmp_path, "--data.episodes=96", "--trainer.max_epochs=2", f"--ckpt_path={mid_epoch}")
    metrics = sorted((tmp_path / "runs" / "world_model").glob("lightning_logs/*/metrics.csv"))
    with metrics[-1].open() as rows:
        logged = [row for row in csv.DictReader(rows) if row.get("train/mse")]
    assert logged, "the torchmetrics MSE is logged each epoch"


def test_video_policy_config_trains_on_two_processes_and_resumes_on_one(tmp_path):
    video = {"example": "train_video_policy", "config": "video_policy"}
    flags = ["--data.episodes_to_write=12", f"--data.sidecar_dir={tmp_path / 'sidecars'}"]
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=1"]
    cli(tmp_path, *flags, *ddp, **video)
    checkpoints = tmp_path / "runs" / "video_policy" / "checkpoints"
    mid_epoch = checkpoints / "epoch=0-step=10.ckpt"
    assert mid_epoch.exists(), sorted(p.name for p in checkpoints.iterdir())
    cli(tmp_path, *flags, "--trainer.max_epochs=2", f"--ckpt_path={mid_epoch}", **video)
    metrics = sorted((tmp_path / "runs" / "video_policy").glob("lightning_logs/*/metrics.csv"))
    with metrics[-1].open() as rows:
        logged = list(csv.DictReader(rows))
    assert any(row.get("train/mae") for row in logged)
    assert any(row.get("loader/wait_share") for row in logged)


def test_language_model_config_packs_on_two_processes_and_resumes_on_one(tmp_path):
    lm = {"example": "train_language_model", "config": "language_model"}
    flags = ["--data.documents=2000", f"--data.pack.cache_dir={tmp_path / 'token-counts'}"]
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=1"]
    cli(tmp_path, *flags, *ddp, **lm)
    checkpoints = tmp_path / "runs" / "language_model" / "checkpoints"
    mid_epoch = checkpoints / "epoch=0-step=20.ckpt"
    assert mid_epoch.exists(), sorted(p.name for p in checkpoints.iterdir())
    cli(tmp_path, *flags, "--trainer.max_epochs=2", f"--ckpt_path={mid_epoch}", **lm)
    metrics = sorted((tmp_path / "runs" / "language_model").glob("lightning_logs/*/metrics.csv"))
    with metrics[-1].open() as rows:
        losses = [float(row["train/loss"]) for row in csv.DictReader(rows) if row["train/loss"]]
    assert losses and losses[-1] < losses[0], "the resumed run learns"
