"""LoaderMonitor: how long training waits for data, logged to the trainer's logger."""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_stream.batching import batch_len
from lightning_stream.callback import StreamBatchCallback
from lightning_stream.stream import ResumableStream


class LoaderMonitor(StreamBatchCallback):
    """Logs the data wait of every training step through ``LightningModule.log``.

    Hooks: ``on_train_batch_start`` notes when the step began (right after the loader
    returned its batch); ``on_train_batch_end`` logs, per rank (``rank_zero_only`` is not
    used, so a logger sees rank 0's values unless the user syncs them):

    - ``loader/wait_s``: seconds ``training_step``'s loop spent waiting in the loader;
    - ``loader/wait_share``: that wait over wait plus step time;
    - ``loader/samples_per_s``: samples of the batch over wait plus step time;
    - the stream's own counters as ``loader/<name>``, summed over the rank's reading
      processes: bytes loaded and bytes held (``resident_bytes``); for a table also rows
      read; for video also frames decoded, the compressed bytes behind the resident frames
      (``reserved_bytes``) and ``skipped_windows``, the windows a damaged video made it
      skip.

    ``on_train_epoch_end`` warns when the epoch's total wait exceeded ``warn_share`` of
    its total time: the model is starved and more workers may help.

    Values are logged as the trainer's ``log_every_n_steps`` decides.

    Args:
        warn_share: wait share of an epoch above which a warning is given; default 0.5.
    """

    def __init__(self, warn_share: float = 0.5) -> None:
        self.warn_share = warn_share
        self._step_start = 0.0
        self._epoch_wait = 0.0
        self._epoch_time = 0.0

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_wait = self._epoch_time = 0.0

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._step_start = time.perf_counter()

    def _batch_done(self, trainer: pl.Trainer, stream: ResumableStream, batch: Any) -> None:
        wait = stream.last_wait
        total = wait + time.perf_counter() - self._step_start
        self._epoch_wait += wait
        self._epoch_time += total
        samples = batch_len(batch) if isinstance(batch, dict) else 0
        metrics = {
            "loader/wait_s": wait,
            "loader/wait_share": wait / total if total else 0.0,
            "loader/samples_per_s": samples / total if total else 0.0,
        }
        metrics.update({f"loader/{k}": float(v) for k, v in stream.counters().items()})
        trainer.lightning_module.log_dict(
            metrics, on_step=True, on_epoch=False, batch_size=samples or 1
        )

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._epoch_time and self._epoch_wait / self._epoch_time > self.warn_share:
            rank_zero_warn(
                f"training waited for data {self._epoch_wait / self._epoch_time:.0%} of epoch"
                f" {trainer.current_epoch}: the loader is the bottleneck; more num_workers"
                " may help"
            )
