"""``pin_memory`` on an accelerator: do pinned batches arrive, and what do they change in
the copy to the device?

    python benchmarks/pin_memory.py [--batch-mb 32] [--steps 40] [--step-ms 20]
        [--host-ms 5] [--sync-every 1] [--json benchmarks/results/pin_memory.json]

Needs an accelerator that takes pinned memory (CUDA). Without one it says so, says what
it would measure, writes nothing and exits 0.

1. **Arrival.** A ``LanceDataModule`` over a 4,096-row table (written to a temporary
   directory), read for one epoch outside a ``Trainer`` with ``pin_memory=True`` and
   with ``False``: the share of the batches' tensors that are in page-locked memory, for
   the training and the validation loader (1.0 and 0.0 expected).
2. **Copy to the device, as Lightning makes it.** Lightning moves a batch with
   ``.to(device, non_blocking=True)`` on the step's stream. Each step here: ``--host-ms``
   of host work (the loader cutting the next batch), a fresh ``--batch-mb`` MB uint8
   batch (pageable, as the stream makes it), for ``pinned`` copied into page-locked
   memory with the stream's own routine (that copy is timed as ``pin_ms``), moved with
   ``non_blocking=True`` (the host's time in that call is ``to_ms``), then a simulated
   step of about ``--step-ms`` of matrix products that reads the batch, and ``.item()``
   of its result every ``--sync-every`` steps (Lightning's progress bar and a SIGTERM
   agreement sync every step: ``--sync-every 1``). Reported per mode: ms per step, ms in
   ``.to()``, ms pinning. A pageable ``non_blocking`` copy holds the host for the whole
   copy; a pinned one returns at once, and the host goes on to the next batch while the
   device copies and computes.

The figures, with the device's name, go to ``--json`` (default
``benchmarks/results/pin_memory.json``) only when an accelerator ran them.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from lightning_stream.pinning import pin_batch, pinning_device

RESULT = Path(__file__).resolve().parent / "results" / "pin_memory.json"


def _synchronize() -> None:
    getattr(torch, "accelerator", torch.cuda).synchronize()  # torch.accelerator: 2.6+


def _busy(ms: float) -> None:
    """Host work of ``ms`` milliseconds (a loop, not a sleep: the host is occupied)."""
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def arrival(rows: int = 4096) -> dict[str, float]:
    """Share of the tensors of an epoch's batches that arrive pinned, per loader."""
    from lightning_stream import LanceDataModule
    from lightning_stream.lance.synthetic import make_light_table

    shares = {}
    with tempfile.TemporaryDirectory() as workdir:
        make_light_table(f"{workdir}/db", rows, name="samples")
        for pin in (True, False):
            settings = {"num_splits": 16, "batch_size": 64, "val_filter": "id < 1024"}
            dm = LanceDataModule(f"{workdir}/db", "samples", pin_memory=pin, **settings)
            dm.setup("fit")
            for name, loader in (("train", dm.train_dataloader()), ("val", dm.val_dataloader())):
                tensors = [
                    v for batch in loader for v in batch.values() if isinstance(v, torch.Tensor)
                ]
                shares[f"{name}_pinned_share_pin_memory_{pin}"] = sum(
                    t.is_pinned() for t in tensors
                ) / max(1, len(tensors))
            dm.teardown("fit")
    return shares


def _step_kernel(device: torch.device, step_ms: float) -> tuple[torch.Tensor, int]:
    """A square matrix and the number of products of it that take about ``step_ms``."""
    matrix = torch.randn(2048, 2048, device=device)
    _synchronize()
    started = time.perf_counter()
    for _ in range(10):
        matrix = torch.tanh(matrix @ matrix)
    _synchronize()
    per_product = (time.perf_counter() - started) / 10
    return matrix, max(1, round(step_ms / 1000 / per_product))


def copy_overlap(args: argparse.Namespace, device: torch.device) -> dict[str, dict]:
    """Per mode (``pageable``, ``pinned``): ms per step, in ``.to()`` and pinning."""
    matrix, products = _step_kernel(device, args.step_ms)
    numel = int(args.batch_mb * 2**20)
    results = {}
    for mode in ("pageable", "pinned", "pageable", "pinned"):  # second round is measured
        to_ms, pin_ms = [], []
        _synchronize()
        started = time.perf_counter()
        for step in range(args.steps):
            _busy(args.host_ms)
            batch = {"images": torch.randint(0, 255, (numel,), dtype=torch.uint8)}
            if mode == "pinned":
                began = time.perf_counter()
                batch = pin_batch(batch)
                pin_ms.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            moved = batch["images"].to(device, non_blocking=True)
            to_ms.append((time.perf_counter() - began) * 1000)
            out = matrix
            for _ in range(products):
                out = torch.tanh(out @ matrix)
            out = out + moved[:1].float()  # the step reads its batch
            if (step + 1) % args.sync_every == 0:
                out.sum().item()
        _synchronize()
        elapsed = time.perf_counter() - started
        results[mode] = {
            "ms_per_step": elapsed * 1000 / args.steps,
            "to_ms_median": statistics.median(to_ms),
            "pin_ms_median": statistics.median(pin_ms) if pin_ms else 0.0,
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-mb", type=float, default=32.0)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--host-ms", type=float, default=5.0)
    parser.add_argument("--sync-every", type=int, default=1)
    parser.add_argument("--json", type=Path, default=RESULT, help=f"default: {RESULT}")
    args = parser.parse_args()
    kind = pinning_device()
    if kind is None or kind == "mps":
        print(
            f"no accelerator that takes pinned memory here (found: {kind or 'none'}):"
            " skipped, nothing written. On a CUDA GPU this measures (1) whether the batches"
            " of LanceDataModule(pin_memory=True) arrive pinned (train and validation) and"
            " (2) per step, the host's time in a non_blocking .to(device) of a"
            f" {args.batch_mb:g} MB batch, the time pinning it takes, and ms per step of"
            f" {args.host_ms:g} ms host work + a {args.step_ms:g} ms device step, pageable"
            " against pinned."
        )
        return 0
    device = torch.device(kind, 0)
    name = torch.cuda.get_device_name(device) if kind == "cuda" else kind
    print(f"device: {name}; torch {torch.__version__}")
    shares = arrival()
    for key, share in shares.items():
        print(f"  {key}: {share:.2f}")
    results = copy_overlap(args, device)
    for mode, figures in results.items():
        step, to, pin = (figures[k] for k in ("ms_per_step", "to_ms_median", "pin_ms_median"))
        print(f"  {mode:>8}: {step:.2f} ms/step, .to() {to:.3f} ms, pinning {pin:.3f} ms (medians)")
    record = {
        "device": name,
        "torch": torch.__version__,
        "host": platform.node(),
        "settings": vars(args) | {"json": str(args.json)},
        "arrival": shares,
        "copy": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(record, indent=2) + "\n")
    print(f"written: {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
