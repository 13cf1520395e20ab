"""Workarounds for measured lancedb 0.40 costs, applied on import of the lance source.

``Permutation.with_transform``, ``select_columns`` and ``with_skip`` return
``copy.copy(self)``. ``Permutation`` defines ``__getstate__`` for pickling, so
``copy.copy`` goes through it: every call serialises the whole permutation table to Arrow
and rebuilds it in a new in-memory database. ``StreamingDataset`` makes two or three such
calls per split when an iterator starts, which is most of the time to the first batch
(1.6 s of 2.4 s for 32 splits of 200k rows, measured here) and of a resume. All the
``with_*`` methods assign new attributes to the copy and never mutate shared state, so a
shallow copy of the instance dictionary, which is what ``copy.copy`` does for a class
without ``__getstate__``, is the same object at none of the cost. Nothing is changed if a
lancedb release defines ``__copy__`` itself.
"""

from __future__ import annotations

from lancedb.permutation import Permutation


def _shallow_copy(self: Permutation) -> Permutation:
    clone = object.__new__(type(self))
    clone.__dict__.update(self.__dict__)
    return clone


def apply() -> None:
    if "__copy__" not in vars(Permutation):
        Permutation.__copy__ = _shallow_copy
