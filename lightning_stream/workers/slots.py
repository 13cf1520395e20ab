"""Where a worker's batches cross to the main process: slots of one shared memory arena.

The arena is an anonymous memory file (``memfd_create``): it has no name under
``/dev/shm``, so nothing of it is left behind when the processes that map it end, however
they end, and a container's small ``/dev/shm`` does not limit it. Each worker owns
``SLOTS`` slots of ``slot_bytes``. A batch is written into a slot as Arrow IPC (an Arrow
table, which IPC truncates to its own rows where pickling a slice would carry its parent's
whole buffers) or as a protocol-5 pickle whose large buffers (numpy arrays) are copied in
beside it; only a few bytes then cross the pipe. A batch larger than its slot crosses the
pipe instead (:func:`to_pipe`).
"""

from __future__ import annotations

import mmap
import os
import pickle
import struct
from typing import Any

import pyarrow as pa

# A worker may hold this many batches the main process has not taken back.
SLOTS = 4
ALIGN = 64  # Arrow reads a buffer in place when it starts 64-byte aligned
_ARROW, _PICKLE = 1, 2
_COUNT = struct.Struct("<BxxxI")  # kind, number of out-of-band buffers
_SIZE = struct.Struct("<Q")


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN


class Arena:
    """``workers x SLOTS`` slots of ``slot_bytes`` in one anonymous shared memory file.

    Created in the main process (``fd=None``); a worker maps the same file from ``fd``.
    """

    def __init__(self, workers: int, slot_bytes: int, fd: int | None = None) -> None:
        self.slot_bytes = max(ALIGN, slot_bytes // ALIGN * ALIGN)
        size = workers * SLOTS * self.slot_bytes
        if fd is None:
            fd = os.memfd_create("lightning-stream-slots", os.MFD_CLOEXEC)
            os.ftruncate(fd, size)
        self.fd = fd
        self._map = mmap.mmap(fd, size)
        self._view = memoryview(self._map)

    def slot(self, worker: int, slot: int) -> memoryview:
        start = (worker * SLOTS + slot) * self.slot_bytes
        return self._view[start : start + self.slot_bytes]

    def close(self) -> None:
        self._view.release()
        self._map.close()
        os.close(self.fd)


_PLAIN_TYPES = {pa.binary_view(): pa.binary(), pa.string_view(): pa.string()}


def plain(payload: Any) -> Any:
    """``payload`` as it crosses to another process: an Arrow table's view columns as
    plain arrays (the IPC stream of a view array carries every buffer its values sit in,
    a reader's whole read; a plain array only its own rows' values); else as it is."""
    if not isinstance(payload, pa.Table):
        return payload
    schema = payload.schema
    if not any(field.type in _PLAIN_TYPES for field in schema):
        return payload
    fields = [field.with_type(_PLAIN_TYPES.get(field.type, field.type)) for field in schema]
    return payload.cast(pa.schema(fields))


def pack(payload: Any, into: memoryview) -> int | None:
    """Write ``payload`` into the slot ``into``; the bytes used, ``None`` if it does not fit."""
    if isinstance(payload, pa.Table):
        sizing = pa.MockOutputStream()
        with pa.ipc.new_stream(sizing, payload.schema) as writer:
            writer.write_table(payload)
        if ALIGN + sizing.size() > len(into):
            return None
        _COUNT.pack_into(into, 0, _ARROW, 0)
        sink = pa.FixedSizeBufferWriter(pa.py_buffer(into[ALIGN:]))
        with pa.ipc.new_stream(sink, payload.schema) as writer:
            writer.write_table(payload)
        return ALIGN + sizing.size()
    buffers: list[pickle.PickleBuffer] = []
    head = pickle.dumps(payload, protocol=5, buffer_callback=buffers.append)
    raws = [buffer.raw() for buffer in buffers]
    offset = _aligned(_COUNT.size + _SIZE.size * (1 + len(raws)))
    layout = []
    for part in (head, *raws):
        layout.append((offset, part))
        offset = _aligned(offset + len(part))
    if offset > len(into):
        return None
    _COUNT.pack_into(into, 0, _PICKLE, len(raws))
    for number, (start, part) in enumerate(layout):
        _SIZE.pack_into(into, _COUNT.size + _SIZE.size * number, len(part))
        into[start : start + len(part)] = part
    return offset


def unpack(view: memoryview) -> Any:
    """The payload in slot ``view``. An Arrow table reads the slot in place (valid while the
    slot is held); a pickled payload's buffers are copied out (it owns its memory)."""
    kind, count = _COUNT.unpack_from(view, 0)
    if kind == _ARROW:
        return pa.ipc.open_stream(pa.py_buffer(view[ALIGN:])).read_all()
    offset = _aligned(_COUNT.size + _SIZE.size * (1 + count))
    parts = []
    for number in range(1 + count):
        (size,) = _SIZE.unpack_from(view, _COUNT.size + _SIZE.size * number)
        parts.append(view[offset : offset + size])
        offset = _aligned(offset + size)
    head, *buffers = parts
    return pickle.loads(head, buffers=[bytearray(buffer) for buffer in buffers])


class _Piped:
    """A payload too large for its slot, as bytes for the pipe: Arrow IPC for a table
    (truncated to its rows, as in a slot), else a plain pickle (a tensor travels by
    value, never as a handle to another process's memory)."""

    def __init__(self, payload: Any) -> None:
        self.arrow = isinstance(payload, pa.Table)
        if self.arrow:
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, payload.schema) as writer:
                writer.write_table(payload)
            self.data = sink.getvalue().to_pybytes()
        else:
            self.data = pickle.dumps(payload, protocol=5)

    def payload(self) -> Any:
        if self.arrow:
            return pa.ipc.open_stream(self.data).read_all()
        return pickle.loads(self.data)


def post(connection: Any, message: Any) -> None:
    """Send ``message`` with the standard pickler: a ``Connection``'s own sends a tensor
    as a handle to shared memory that only multiprocessing's own children can open."""
    connection.send_bytes(pickle.dumps(message, protocol=5))


def fetch(connection: Any) -> Any:
    """Receive a message :func:`post` sent."""
    return pickle.loads(connection.recv_bytes())


def to_pipe(payload: Any) -> _Piped:
    """What crosses the pipe for a payload too large for its slot."""
    return _Piped(payload)


def from_pipe(sent: _Piped) -> Any:
    return sent.payload()
