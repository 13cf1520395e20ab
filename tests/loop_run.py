"""``lightning_stream.demo`` with an ``OnExceptionCheckpoint`` and slowed-down steps.

A preemption test sends SIGTERM to the whole job while it trains, then runs this same
command again: with ``OnExceptionCheckpoint`` Lightning resumes from the newest
checkpoint by itself (``fit(ckpt_path=None)`` becomes ``"last"``).
"""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint

from lightning_stream.demo import arguments, run


class SlowSteps(Callback):
    """Sleep after every training batch, so a signal lands in the middle of an epoch."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = arguments()
    parser.add_argument("--step-delay", type=float, default=0.0)
    args = parser.parse_args()
    callbacks = (OnExceptionCheckpoint(args.ckpt_dir), SlowSteps(args.step_delay))
    run(args, callbacks)


if __name__ == "__main__":
    main()
