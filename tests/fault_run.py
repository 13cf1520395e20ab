"""``lightning_stream.demo`` with faults injected from inside the training process."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

from lightning_stream.atomic import PARTIAL_SUFFIX
from lightning_stream.demo import arguments, run


class KillDuringSave(Callback):
    """At the n-th save, SIGKILL this process while the checkpoint file is being written."""

    def __init__(self, ckpt_dir: str, save_number: int) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.save_number = save_number
        self.saves = 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self.saves += 1
        if self.saves == self.save_number:
            # 64 MB of ballast, so that writing the file takes long enough to be caught.
            checkpoint["ballast"] = torch.ones(16 * 2**20)
            threading.Thread(target=self._kill_once_writing, daemon=True).start()

    def _kill_once_writing(self) -> None:
        while True:
            for partial in self.ckpt_dir.glob(f".*{PARTIAL_SUFFIX}"):
                if partial.stat().st_size > 0:
                    os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(0.0002)


class KillWorker(Callback):
    """SIGKILL one reading worker after the given global step (waiting for the workers,
    which start in the background, to be up)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step != self.step:
            return
        pool = trainer.datamodule.stream.source.engine.pool
        deadline = time.monotonic() + 120
        while not pool.ready():
            if time.monotonic() > deadline:
                raise RuntimeError("the reading workers did not start within 120 s")
            time.sleep(0.05)
        os.kill(pool.pids[0], signal.SIGKILL)


class SlowStep(Callback):
    """A training step of ``ms`` milliseconds, slower than the reads, as real ones are."""

    def __init__(self, ms: float) -> None:
        self.seconds = ms / 1000

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = arguments()
    parser.add_argument("--kill-during-save", type=int)
    parser.add_argument("--kill-worker-after", type=int)
    parser.add_argument("--step-ms", type=float)
    args = parser.parse_args()
    faults = []
    if args.kill_during_save:
        faults.append(KillDuringSave(args.ckpt_dir, args.kill_during_save))
    if args.kill_worker_after:
        faults.append(KillWorker(args.kill_worker_after))
    if args.step_ms:
        faults.append(SlowStep(args.step_ms))
    run(args, tuple(faults))


if __name__ == "__main__":
    main()
