"""Packets that two chunks of an episode both need, fetched once from an object store.

Where an episode is cut (between two chunks of a split, or between two splits), the later
piece's frames decode from the keyframe before its first frame, so its packet range starts
inside the earlier piece's, and both would fetch the bytes from that keyframe to the
earlier piece's last frame: a group of pictures per camera per cut, more of the video's
bytes the smaller the byte budget (the more cuts). A reading process that serves both pieces keeps
those bytes from its first read of them until its second, within a byte limit; past the
limit a range is fetched again, as without sharing. Pure bookkeeping over byte ranges and
futures: which pieces share what is the reader's to say (:meth:`SharedRanges.read`'s
``sharers``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

Fetch = Callable[[int, int], "Future[bytes]"]  # (offset, size) -> the bytes, when read


@dataclass
class _Held:
    start: int
    stop: int
    data: Future[bytes]
    waiting: set[Hashable]  # the reads that will take these bytes


def read_now(handle: Any, offset: int, size: int) -> Future[bytes]:
    """Bytes ``[offset, offset + size)`` of an open file, read in this thread."""
    read: Future[bytes] = Future()
    read.set_result(handle.read_at(size, offset))
    return read


def _slice(source: Future[bytes], lo: int, hi: int) -> Future[bytes]:
    """A copy of ``source``'s bytes ``[lo, hi)`` once they are in (its error, if it fails)."""
    part: Future[bytes] = Future()

    def done(finished: Future[bytes]) -> None:
        if finished.cancelled():
            part.cancel()
        elif finished.exception() is not None:
            part.set_exception(finished.exception())
        else:
            part.set_result(bytes(memoryview(finished.result())[lo:hi]))

    source.add_done_callback(done)
    return part


def _join(parts: Sequence[Future[bytes]]) -> Future[bytes]:
    """The bytes of ``parts`` end to end, once all are in."""
    if len(parts) == 1:
        return parts[0]
    joined: Future[bytes] = Future()
    left = [len(parts)]
    lock = threading.Lock()  # the parts complete on the fetching threads

    def done(_: Future[bytes]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        if any(p.cancelled() for p in parts):
            joined.cancel()
            return
        errors = [e for e in (p.exception() for p in parts) if e is not None]
        if errors:
            joined.set_exception(errors[0])
        else:
            joined.set_result(b"".join(p.result() for p in parts))

    for part in parts:
        part.add_done_callback(done)
    return joined


class SharedRanges:
    """Bytes of one reading process's files kept for a later read that needs them.

    Args:
        limit: the most bytes held at once; a range past it is not kept (its later reader
            fetches it).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held: dict[str, list[_Held]] = {}
        self.held_bytes = 0

    @classmethod
    def within(cls, byte_budget_gb: float) -> SharedRanges:
        """Limited to a sixteenth of the data module's byte budget: what is kept is
        compressed packets, a group of pictures per camera per cut, far smaller than the
        decoded frames the budget bounds; past the limit the later side of a cut fetches
        its bytes."""
        return cls(int(byte_budget_gb * 2**30) // 16)

    def read(
        self,
        file: str,
        start: int,
        stop: int,
        key: Hashable,
        sharers: Sequence[tuple[Hashable, int, int]],
        fetch: Fetch,
    ) -> tuple[Future[bytes], int]:
        """Bytes ``[start, stop)`` of ``file`` for the read ``key``, and how many of them
        were fetched: the held ones are taken, the rest fetched. Bytes that the later reads
        ``sharers`` (``(key, start, stop)`` in the same file) need are then held for them."""
        parts, fetched, at = [], 0, start
        kept = self.held.get(file, [])
        for held in sorted(kept, key=lambda h: h.start):
            if held.stop <= at or held.start >= stop:
                continue
            if held.start > at:
                parts.append(fetch(at, held.start - at))
                fetched += held.start - at
                at = held.start
            hi = min(held.stop, stop)
            parts.append(_slice(held.data, at - held.start, hi - held.start))
            at = hi
        if at < stop:
            parts.append(fetch(at, stop - at))
            fetched += stop - at
        data = _join(parts)
        for held in kept:
            held.waiting.discard(key)
        self._drop(file, [h for h in kept if not h.waiting])
        for sharer, lo, hi in sharers:
            self._hold(file, data, start, max(lo, start), min(hi, stop), sharer)
        return data, fetched

    def _hold(self, file: str, data: Future[bytes], base: int, lo: int, hi: int, sharer) -> None:
        """Hold ``[lo, hi)`` (of ``data``, which starts at ``base``) for ``sharer``, except
        what is held already (``sharer`` waits on that too)."""
        kept = self.held.setdefault(file, [])
        gaps = []
        for held in sorted(kept, key=lambda h: h.start):
            if held.stop <= lo or held.start >= hi:
                continue
            held.waiting.add(sharer)
            if held.start > lo:
                gaps.append((lo, held.start))
            lo = max(lo, held.stop)
        if lo < hi:
            gaps.append((lo, hi))
        for a, b in gaps:
            if self.held_bytes + b - a <= self.limit:
                kept.append(_Held(a, b, _slice(data, a - base, b - base), {sharer}))
                self.held_bytes += b - a

    def _drop(self, file: str, done: list[_Held]) -> None:
        for held in done:
            self.held[file].remove(held)
            self.held_bytes -= held.stop - held.start

    def clear(self) -> None:
        self.held.clear()
        self.held_bytes = 0
