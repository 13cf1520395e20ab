"""The stream-state record kept in checkpoints: build, validate, merge (pure, no I/O).

A record says, for one stream, which run it belongs to (``identity``: data source and
every setting that decides which sample lands where) and how far the current epoch got:
``consumed[s]`` rows of split ``s`` reached a finished ``training_step``. Each rank knows
the exact count only for its own splits, so the records of all ranks are merged by an
element-wise maximum before they are saved.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

FORMAT = 1
# A setting recorded as left at its default (``None``), whose value follows from the data
# (e.g. the clump size from the table's rows): the same data gives the same value.
DEFAULT = "default"


@dataclass
class StreamState:
    """Progress of one stream.

    Attributes:
        identity: data source and sampling settings; a resume must match them.
        epoch: the epoch in progress.
        consumed: per split, rows consumed by ``training_step`` in ``epoch``.
        epoch_done: the epoch ended (all rows consumed, or Lightning ended it early, e.g.
            ``limit_train_batches``); the next iterator starts ``epoch + 1``.
        steps: batches each rank has taken in ``epoch``.
        complete: every rank's progress is in the record. ``False`` for a checkpoint
            that one rank wrote alone (after an exception), which cannot resume exactly.
        topology: world size, workers and batch size of the run that saved it.
        provenance: library versions, code revision and time of the save.
    """

    identity: dict[str, Any]
    epoch: int = 0
    consumed: list[int] = field(default_factory=list)
    epoch_done: bool = False
    steps: int = 0
    complete: bool = True
    topology: dict[str, int] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> StreamState:
        if record.get("format") != FORMAT:
            raise ValueError(
                f"unsupported stream-state format {record.get('format')!r} (this version reads"
                f" format {FORMAT}); resume with the lightning-stream version that wrote it"
            )
        fields = {k: v for k, v in record.items() if k != "format"}
        return cls(**fields)


def merge(progress: Sequence[Sequence[int]]) -> list[int]:
    """Merge per-rank rows ``[epoch, epoch_done, steps, *consumed]`` into one row.

    Every rank must be in the same epoch; consumed counts merge by maximum, since each
    rank holds the exact count of its own splits and a lower bound of the others.
    """
    epochs = {row[0] for row in progress}
    if len(epochs) != 1:
        raise RuntimeError(
            f"ranks are in different epochs {sorted(epochs)} at checkpoint time; the"
            " stream state cannot be merged"
        )
    return [max(column) for column in zip(*progress, strict=True)]


def check_identity(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    owner: str,
    leave_out: Collection[str] = (),
) -> None:
    """Raise ``ValueError`` naming the first setting whose saved value differs (the data
    version and ``leave_out`` aside)."""
    for key, value in current.items():
        if key == "version" or key in leave_out:
            continue
        if saved.get(key) != value:
            was, now = _argument(saved.get(key)), _argument(value)
            raise ValueError(
                f"the checkpoint's data stream was saved with {key}={was!r}, but this"
                f" {owner} has {key}={now!r}. Pass {key}={was!r} to resume this run exactly,"
                " or start a new run without ckpt_path."
            )


def _argument(recorded: Any) -> Any:
    """The argument that gives a recorded setting."""
    return None if recorded == DEFAULT else recorded
