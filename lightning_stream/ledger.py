"""The samples ledger: which sample ids reached ``training_step``, per epoch.

:mod:`lightning_stream.demo` writes one JSON line per training batch and rank
(``{"epoch", "stream_epoch", "step", "ids"}``). A run that was killed and resumed is
judged on the batches the model kept: those of the first run before the checkpoint's
global step, then everything the resumed run trained.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path


def read(ledger_dir: str | Path) -> list[dict]:
    """All entries of all ranks in a ledger directory."""
    entries = []
    for path in sorted(Path(ledger_dir).glob("rank*.jsonl")):
        with path.open() as lines:
            entries.extend(json.loads(line) for line in lines if line.strip())
    return entries


def kept(before: list[dict], resume_step: int, after: list[dict]) -> list[dict]:
    """The entries the model trained on: ``before`` up to the checkpoint, then ``after``."""
    return [e for e in before if e["step"] < resume_step] + after


@dataclass(frozen=True)
class EpochCoverage:
    epoch: int
    samples: int
    distinct: int
    repeated: int
    lost: int

    def exact(self) -> bool:
        return self.repeated == 0 and self.lost == 0


def coverage(entries: list[dict], epoch_size: int) -> list[EpochCoverage]:
    """Per epoch: samples trained, repeats, and samples of the epoch never trained.

    Raises ``AssertionError`` if an entry's Lightning epoch and stream epoch disagree.
    """
    per_epoch: dict[int, Counter] = {}
    for entry in entries:
        if entry["epoch"] != entry["stream_epoch"]:
            raise AssertionError(f"Lightning epoch and stream epoch differ: {entry}")
        per_epoch.setdefault(entry["epoch"], Counter()).update(entry["ids"])
    report = []
    for epoch in sorted(per_epoch):
        counts = per_epoch[epoch]
        samples = sum(counts.values())
        report.append(
            EpochCoverage(
                epoch=epoch,
                samples=samples,
                distinct=len(counts),
                repeated=samples - len(counts),
                lost=epoch_size - len(counts),
            )
        )
    return report
