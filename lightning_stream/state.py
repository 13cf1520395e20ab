"""The stream-state record kept in checkpoints: build, validate, merge (pure, no I/O).

A record says, for one stream, which run it belongs to (``identity``: data source and
every setting that decides which sample lands where) and how far the current epoch got:
``consumed[s]`` rows of split ``s`` reached a finished ``training_step``. Each rank knows
the exact count only for its own splits, so the records of all ranks are merged by an
element-wise maximum before they are saved.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# 2: the epoch order of lightning_stream.placement (1: lancedb's permutation of rows,
# lightning-stream 0.1)
FORMAT = 2
# Where a checkpoint holds the record: StreamStateCallback's state key, under "callbacks"
STATE_KEY = "StreamStateCallback"
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
        written = record.get("format")
        if written != FORMAT:
            raise ValueError(_format_message(written, record.get("provenance") or {}))
        fields = {k: v for k, v in record.items() if k != "format"}
        return cls(**fields)


def _format_message(written: Any, provenance: Mapping[str, Any]) -> str:
    """Why a record of another format cannot resume here, and what to do instead."""
    release = (provenance.get("versions") or {}).get("lightning-stream")
    release = release or ("0.1.0" if written == 1 else None)
    wrote = f"lightning-stream {release}" if release else "another lightning-stream release"
    this = f"this release reads stream-state format {FORMAT}"
    if isinstance(written, int) and written > FORMAT:
        return (
            f"this checkpoint's data stream was written by {wrote} (stream-state format"
            f" {written}), newer than this release; {this}. Upgrade lightning-stream to"
            " resume it"
        )
    install = f"pip install 'lightning-stream=={release}'" if release else "that release"
    return (
        f"this checkpoint's data stream was written by {wrote} (stream-state format"
        f" {written}); {this}, whose order of an epoch's rows differs, so the run cannot"
        f" continue exactly here. Finish that run with the release that wrote it"
        f" ({install}), or start a new run without ckpt_path"
    )


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
) -> None:
    """Raise ``ValueError`` naming the first setting whose saved value differs (the data
    version aside)."""
    for key, value in current.items():
        if key == "version":
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
