"""The ``lightning-stream`` command."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from lightning_stream import ledger

DEMO_ROWS = 960
DEMO_SPLITS = 24  # divides 1, 2, 3 and 4 processes
DEMO_BATCH = 8
DEMO_SAVE_AT = 37  # mid-epoch: an epoch is 60 steps on 2 processes
DEMO_KILL_AFTER = 45


def _train_command(workdir: Path, run: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "lightning_stream.demo",
        "--uri",
        str(workdir / "db"),
        "--ledger-dir",
        str(workdir / run / "ledger"),
        "--ckpt-dir",
        str(workdir / run / "ckpt"),
        "--num-splits",
        str(DEMO_SPLITS),
        "--batch-size",
        str(DEMO_BATCH),
        *args,
    ]


def _last_step(ledger_dir: Path) -> int:
    try:
        return max(entry["step"] for entry in ledger.read(ledger_dir))
    except (ValueError, FileNotFoundError):
        return -1


def _train_and_kill(workdir: Path, log) -> Path:
    """Train on 2 DDP processes and SIGKILL the whole job once it is past the checkpoint."""
    command = _train_command(workdir, "first", "--devices", "2", "--save-at", str(DEMO_SAVE_AT))
    job = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    ckpt = workdir / "first" / "ckpt" / f"step={DEMO_SAVE_AT}.ckpt"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and job.poll() is None:
        if ckpt.exists() and _last_step(workdir / "first" / "ledger") >= DEMO_KILL_AFTER:
            os.killpg(job.pid, signal.SIGKILL)
            break
        time.sleep(0.05)
    job.wait()
    if not ckpt.exists():
        raise SystemExit(f"the first run ended before its checkpoint; see {workdir / 'demo.log'}")
    return ckpt


def demo(workdir: Path) -> int:
    """Train, kill, resume on 1 and on 3 processes, and print the samples ledger."""
    from lightning_stream.demo import make_table

    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    make_table(str(workdir / "db"), DEMO_ROWS)
    print(
        f"table: {DEMO_ROWS} rows in {DEMO_SPLITS} splits, batch {DEMO_BATCH} per process,"
        f" 2 epochs; work directory {workdir}"
    )
    with (workdir / "demo.log").open("w") as log:
        print("run 1: 2 processes (ddp, gloo) ...", flush=True)
        ckpt = _train_and_kill(workdir, log)
        killed_at = _last_step(workdir / "first" / "ledger")
        print(f"  killed with SIGKILL at step {killed_at}; last checkpoint {ckpt.name}")
        before = ledger.read(workdir / "first" / "ledger")
        rows = []
        exact = True
        for devices in (1, 3):
            run = f"resume-{devices}"
            print(f"resume from {ckpt.name} on {devices} process(es) ...", flush=True)
            command = _train_command(
                workdir, run, "--devices", str(devices), "--ckpt-path", str(ckpt)
            )
            subprocess.run(command, stdout=log, stderr=log, check=True)
            entries = ledger.kept(before, DEMO_SAVE_AT, ledger.read(workdir / run / "ledger"))
            for epoch in ledger.coverage(entries, DEMO_ROWS):
                rows.append((f"2 -> {devices}", epoch))
                exact &= epoch.exact()
    print("\nsamples ledger (every id that reached training_step, per epoch)")
    print(
        f"{'processes':<10} {'epoch':>5} {'samples':>8} {'distinct':>8} {'lost':>5} {'repeated':>8}"
    )
    for name, e in rows:
        print(f"{name:<10} {e.epoch:>5} {e.samples:>8} {e.distinct:>8} {e.lost:>5} {e.repeated:>8}")
    print("\nexact: every sample of every epoch trained once" if exact else "\nNOT EXACT")
    return 0 if exact else 1


def build_sidecars(
    root: str,
    cache_dir: Path | None,
    lock_timeout: float,
    storage_options: dict[str, str] | None = None,
) -> int:
    """Index every MP4 of a LeRobot v3 dataset into the sidecar cache."""
    from lightning_stream.storage import pyarrow_filesystem
    from lightning_stream.video.datamodule import default_sidecar_dir
    from lightning_stream.video.lerobot import open_dataset
    from lightning_stream.video.sidecar import VideoFile, load_or_build, sidecar_path

    dataset = open_dataset(root, fs=pyarrow_filesystem(root, storage_options)[0])
    cache = cache_dir or default_sidecar_dir()
    files = sorted({path for paths in dataset.episodes.video_files.values() for path in paths})
    key = root if "://" in root else os.path.abspath(root)
    for relative in files:
        video = VideoFile(dataset.fs, dataset.path(relative))
        track, built = load_or_build(video, cache, key, lock_timeout)
        state = "built" if built else "up to date"
        print(f"{relative}: {len(track.pts)} frames, {track.codec}, {state}")
        print(f"  -> {sidecar_path(cache, key, video)}")
    return 0


def _key_values(pairs: list[str]) -> dict[str, str] | None:
    options = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise SystemExit("--storage-option: write each as KEY=VALUE (one has no '=')")
        options[key] = value
    return options or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lightning-stream", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_demo = commands.add_parser("demo", help=demo.__doc__)
    run_demo.add_argument("--workdir", type=Path, default=Path("lightning-stream-demo"))
    run_inspect = commands.add_parser(
        "inspect", help="print a checkpoint's data provenance (tensors are not read)"
    )
    run_inspect.add_argument("checkpoint", help="a local path or an fsspec URL (s3://...)")
    run_inspect.add_argument("--json", action="store_true", help="machine-readable output")

    run_sidecars = commands.add_parser("build-sidecar", help=build_sidecars.__doc__)
    run_sidecars.add_argument("root", help="LeRobot v3 dataset root (directory or URI)")
    run_sidecars.add_argument("--cache-dir", type=Path, help="default ~/.cache/lightning-stream")
    run_sidecars.add_argument("--lock-timeout", type=float, default=600.0)
    for command in (run_inspect, run_sidecars):
        command.add_argument(
            "--storage-option",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="object-store option, with lancedb's names (e.g."
            " aws_endpoint=http://127.0.0.1:9000); default: the AWS_* environment variables",
        )
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args.workdir.resolve())
    if args.command == "build-sidecar":
        options = _key_values(args.storage_option)
        return build_sidecars(args.root, args.cache_dir, args.lock_timeout, options)
    from lightning_stream.inspect import render

    try:
        print(render(args.checkpoint, args.json, _key_values(args.storage_option)))
    except (FileNotFoundError, ValueError, OSError) as exc:
        print(f"lightning-stream inspect: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
