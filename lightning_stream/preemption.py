"""Preemption under DDP: every rank stops at the same step, and the ranks' progress
reaches the checkpoint written after the exception.

**Stopping together.** Lightning 2.6 runs a ``broadcast`` inside its SIGTERM handler. A
scheduler signals every rank, and rank 0's launcher forwards the signal to the ranks it
started, so those run the handler twice: the ranks' collectives no longer pair up and
the job hangs (here: 3 of 3 tries with 2 processes on gloo; 1 of 2 with the signal sent
to rank 0 alone, as a ``broadcast`` run inside a handler can pair with another rank's
training collective). :class:`SigtermSync` replaces that handler, for the length of
``fit``, by one that only records the signal (and forwards it as Lightning does); at the
end of every training batch the ranks agree with one ``all_reduce`` of one integer
whether any was signalled, and all of them then raise Lightning's ``SIGTERMException``
at the end of the same batch.

**One collective a step.** Lightning also broadcasts rank 0's received-SIGTERM flag
before every training batch, a collective and a host sync of its own. It cannot stand in
for the agreement, since it carries rank 0's signal only (a preempted node of a
multi-node job signals the ranks of that node alone); and while :class:`SigtermSync`
handles the signal, that flag is set only by the agreement, on every rank at once, so the
broadcast carries nothing. :class:`SigtermSync` turns it off for the length of ``fit``:
the agreement is the step's one collective.

**Gathering without a collective.** After the exception each rank runs
``on_exception``. A rank that failed alone does so while the others wait in a training
collective, where another collective would hang; so the ranks meet in the process
group's key-value store, with a timeout: each writes its progress under a key and waits
for the others' keys.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl
import torch
import torch.distributed as dist

from lightning_stream import loop_state

log = logging.getLogger(__name__)


def gather_through_store(
    progress: list[int], rank: int, world_size: int, key: str, timeout_s: float
) -> list[list[int]] | None:
    """Every rank's ``progress`` through the default process group's store.

    Returns ``None`` when the store is not there or some rank did not write within
    ``timeout_s`` seconds (it failed alone, or is stuck elsewhere).
    """
    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"{key}/{rank}", json.dumps(progress))
        keys = [f"{key}/{other}" for other in range(world_size)]
        store.wait(keys, timedelta(seconds=timeout_s))
        return [json.loads(store.get(name)) for name in keys]
    except Exception as exc:  # a timeout, or a store whose server already exited
        log.warning("rank %d: the other ranks' stream progress did not arrive (%s)", rank, exc)
        return None


class SigtermSync:
    """Make every rank of a DDP run stop at the same step on SIGTERM (see the module)."""

    def __init__(self) -> None:
        self.signalled = False
        self._installed = False

    def install(self, trainer: pl.Trainer) -> None:
        """Replace Lightning's SIGTERM handler (which ``fit`` installed) by ours."""
        self.signalled = False
        self._installed = False
        if trainer.world_size == 1 or threading.current_thread() is not threading.main_thread():
            return
        lightning_handler = loop_state.sigterm_notifier(trainer)
        previous = signal.getsignal(signal.SIGTERM)
        others = [
            handler
            for handler in getattr(previous, "signal_handlers", [previous])
            if callable(handler) and handler != lightning_handler
        ]

        def record(signum: int, frame: Any) -> None:
            if not self.signalled:
                self.signalled = True
                launcher = trainer.strategy.launcher
                if launcher is not None:
                    launcher.kill(signum)  # the ranks it started, as Lightning does
            for handler in others:
                handler(signum, frame)

        signal.signal(signal.SIGTERM, record)
        loop_state.skip_sigterm_broadcast(trainer, True)
        self._installed = True

    def uninstall(self, trainer: pl.Trainer) -> None:
        """When ``fit``'s training ends: Lightning's per-batch broadcast runs again in a
        later ``fit`` of the trainer (which restores the SIGTERM handler itself)."""
        if self._installed:
            loop_state.skip_sigterm_broadcast(trainer, False)
            self._installed = False

    def agree(self, trainer: pl.Trainer) -> None:
        """After a training batch: if any rank was signalled, every rank stops now.

        One ``all_reduce`` of one integer and one host sync per batch, in place of the
        per-batch ``broadcast`` Lightning runs for the same purpose (see the module).
        """
        if not self._installed:
            return
        flag = torch.tensor([int(self.signalled)], device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag.item():
            loop_state.mark_sigterm(trainer)
