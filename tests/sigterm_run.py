"""A DDP training run that records the collectives of every step, for
``tests/test_sigterm_collectives.py``.

``python -m tests.sigterm_run <demo arguments> --record-dir DIR [--sigterm-rank R
--sigterm-at-step S]`` is ``lightning_stream.demo`` with an ``OnExceptionCheckpoint``.
In every process it wraps ``torch.distributed``'s collectives and writes
``DIR/rank<r>.json``: per global step, the collectives called from the start of that
training batch to the start of the next (module, function and collective of each
caller), and the strategy's checkpoint IO. With ``--sigterm-rank R`` process ``R``
alone sends itself SIGTERM once the global step reaches ``S``: a signal only one rank
received (a preempted node of a multi-node job).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist
from lightning.pytorch.callbacks import Callback, OnExceptionCheckpoint

from lightning_stream.demo import arguments, run

COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "gather",
    "scatter",
    "barrier",
)


class CollectiveRecorder(Callback):
    """Wraps ``torch.distributed``'s collectives and records their callers per step."""

    def __init__(self, record_dir: str, sigterm_rank: int | None, sigterm_at_step: int) -> None:
        self.record_dir = Path(record_dir)
        self.sigterm_rank = sigterm_rank
        self.sigterm_at_step = sigterm_at_step
        self.step: int | None = None
        self.calls: dict[int, list[str]] = {}
        self.checkpoint_io: list[str] = []
        for name in COLLECTIVES:
            setattr(dist, name, self._recorded(name, getattr(dist, name)))

    def _recorded(self, name: str, collective: Any) -> Any:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self.step is not None:
                caller = sys._getframe(1).f_code
                where = f"{Path(caller.co_filename).name}:{caller.co_name}:{name}"
                self.calls[self.step].append(where)
            return collective(*args, **kwargs)

        return recorded

    def on_train_start(self, trainer, pl_module) -> None:
        io = trainer.strategy.checkpoint_io
        self.checkpoint_io = [type(io).__name__, type(getattr(io, "inner", None)).__name__]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.step = trainer.global_step
        self.calls[self.step] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_rank == self.sigterm_rank and trainer.global_step == self.sigterm_at_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_train_end(self, trainer, pl_module) -> None:
        self._write(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._write(trainer)  # before OnExceptionCheckpoint saves (a barrier of its own)

    def _write(self, trainer) -> None:
        self.step = None
        self.record_dir.mkdir(parents=True, exist_ok=True)
        record = {"calls": self.calls, "checkpoint_io": self.checkpoint_io}
        (self.record_dir / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = arguments()
    parser.add_argument("--record-dir", required=True)
    parser.add_argument("--sigterm-rank", type=int)
    parser.add_argument("--sigterm-at-step", type=int, default=-1)
    args = parser.parse_args()
    recorder = CollectiveRecorder(args.record_dir, args.sigterm_rank, args.sigterm_at_step)
    run(args, (recorder, OnExceptionCheckpoint(args.ckpt_dir)))


if __name__ == "__main__":
    main()
