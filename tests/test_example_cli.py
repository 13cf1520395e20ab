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


def train_on_two_and_resume_on_one(tmp_path, config, flags, resume_step) -> list[dict]:
    """``configs/<config>.yaml`` (with ``examples/train_<config>.py``) for an epoch on 2
    DDP processes, then resumed on 1 from its checkpoint at ``resume_step`` for a second
    epoch; the resumed run's logged metrics."""
    named = {"example": f"train_{config}", "config": config}
    ddp = ["--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=1"]
    cli(tmp_path, *flags, *ddp, **named)
    checkpoints = tmp_path / "runs" / config / "checkpoints"
    mid_epoch = checkpoints / f"epoch=0-step={resume_step}.ckpt"
    assert mid_epoch.exists(), sorted(p.name for p in checkpoints.iterdir())
    cli(tmp_path, *flags, "--trainer.max_epochs=2", f"--ckpt_path={mid_epoch}", **named)
    metrics = sorted((tmp_path / "runs" / config).glob("lightning_logs/*/metrics.csv"))
    with metrics[-1].open() as rows:
        return list(csv.DictReader(rows))


def test_video_policy_config_trains_on_two_processes_and_resumes_on_one(tmp_path):
    flags = ["--data.episodes_to_write=12", f"--data.sidecar_dir={tmp_path / 'sidecars'}"]
    logged = train_on_two_and_resume_on_one(tmp_path, "video_policy", flags, 10)
    assert any(row.get("train/mae") for row in logged)
    assert any(row.get("loader/wait_share") for row in logged)


def test_language_model_config_packs_on_two_processes_and_resumes_on_one(tmp_path):
    flags = ["--data.documents=2000", f"--data.pack.cache_dir={tmp_path / 'token-counts'}"]
    logged = train_on_two_and_resume_on_one(tmp_path, "language_model", flags, 20)
    losses = [float(row["train/loss"]) for row in logged if row["train/loss"]]
    assert losses and losses[-1] < losses[0], "the resumed run learns"
