"""A real S3-protocol server on 127.0.0.1 (moto's server mode) for tests and benchmarks.

``python tests/s3_server.py PORT [--latency-ms MS] [--bandwidth-mb-s MB] [--cpus N,...]``
serves moto's S3 with these additions:

- Latency: every S3 request waits ``--latency-ms`` before its first byte (a real object
  store answers a range GET after 10-100 ms; ``LATENCY_MS``, 20, is the figure tests and
  benchmarks use; 0: none). ``--bandwidth-mb-s`` caps each response body's rate (one
  connection serves one request at a time, so it is a per-connection cap).
- Counting: the response body bytes of every GET (object reads, range reads and listings
  alike) are totalled at ``GET /_bytes_served`` (``DELETE`` resets it and the request
  log), so a benchmark measures what a reader fetched on the server side;
  ``GET /_whole_gets`` lists the objects read by a GET without a ``Range`` header;
  ``GET /_requests`` gives, as JSON, ``[start_s, duration_s, body_bytes]`` of every
  object GET since the last reset (times from the server's monotonic clock), from which
  the reads in flight and their sizes follow; ``GET /_cpu`` gives the CPU seconds (user
  and system) the server process has used, for a benchmark on the same host.
- Waits a test can see: ``GET /_waiting`` gives the number of requests waiting now (for
  their latency or under the bandwidth cap), ``PUT /_waiting`` holds every request's
  latency wait from then on until ``DELETE /_waiting``, which also ends every wait in
  progress at once. So a test checks that requests wait, and wait together, by counting
  them while they wait, not by timing them.
- Cores: ``--cpus`` keeps the server on those cores (all its threads), so that a
  benchmark can leave the others to the reader, as a real store's CPU is not on the
  reader's host.

The front is a plain asyncio server (``asyncio.start_server``: one event loop, so every
wait is an ``asyncio.sleep`` that holds up no other request); moto's own server runs on a
thread of the same process (``moto.server.ThreadedMotoServer``) on a port of its own. A
range GET of one byte range is answered at the front from moto's stored object, reading
only that range (``_range_reply``): moto itself copies the whole object twice for every
range read, under the object's lock. Where moto keeps the object in a file (above its
in-memory size), the range goes out with ``sendfile``. Every other request (listings,
HEAD, PUT, whole-object GETs, and every request when ``check_credentials``) is passed to
moto as it came, Host header included, so its signature checks hold, on a connection of
its own.

Why so lean: the store shares this host's 2 cores with the reader it serves, and a real
store's CPU is not on the reader's host, so every microsecond it spends per GET is taken
from the reader being measured. werkzeug (moto's server) spent 0.8 ms of CPU per range
GET; an aiohttp front 0.24 ms (its request, router and response objects: 0.2-0.4 s per
epoch of a 0.55 GB table, 1,350-1,580 GETs at 2 workers, most of the host CPU an S3
epoch took above a local one); this front 0.14 ms, 0.10 of it in Python (4 x 500 GETs of
100 bytes over keep-alive connections, ``/proc`` of the server, scratch script).

:class:`S3Server` starts it as a subprocess in its own process group and kills the group
on :meth:`S3Server.stop`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import weakref
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import unquote

# dummy credentials: moto accepts any
ACCESS_KEY = "lightning-stream-test"
SECRET_KEY = "lightning-stream-test-secret"
REGION = "us-east-1"
BYTES_PATH = "/_bytes_served"
WHOLE_GETS_PATH = "/_whole_gets"
REQUESTS_PATH = "/_requests"
CPU_PATH = "/_cpu"
WAITING_PATH = "/_waiting"
LATENCY_MS = 20.0  # the per-request latency tests and benchmarks ask for
PACE_BYTES = 64 * 2**10  # a capped body is sent in pieces of this size


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def storage_options(endpoint: str, secret: str = SECRET_KEY) -> dict[str, str]:
    """lancedb-style options for the server at ``endpoint`` (``secret`` as the secret key)."""
    return {
        "aws_access_key_id": ACCESS_KEY,
        "aws_secret_access_key": secret,
        "aws_region": REGION,
        "aws_endpoint": endpoint,
        "allow_http": "true",
    }


def bytes_served(endpoint: str, reset: bool = False) -> int:
    """Response body bytes of every GET the server at ``endpoint`` sent; ``reset``: then
    start the count (and the request log) again from zero."""
    request = urllib.request.Request(endpoint + BYTES_PATH, method="DELETE" if reset else "GET")
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.read())


def requests_served(endpoint: str) -> list[tuple[float, float, int]]:
    """``(start_s, duration_s, body_bytes)`` of every object GET since the last reset."""
    with urllib.request.urlopen(endpoint + REQUESTS_PATH, timeout=30) as response:
        return [tuple(r) for r in json.loads(response.read())]


def waiting(endpoint: str, method: str = "GET") -> int:
    """Requests waiting now at the server at ``endpoint`` (``PUT``: hold every latency wait
    from now on; ``DELETE``: end every wait now and hold none)."""
    request = urllib.request.Request(endpoint + WAITING_PATH, method=method)
    with urllib.request.urlopen(request, timeout=30) as response:
        return int(response.read())


def cpu_seconds(endpoint: str) -> float:
    """CPU seconds the server at ``endpoint`` has used so far."""
    with urllib.request.urlopen(endpoint + CPU_PATH, timeout=5) as response:
        return float(response.read())


class S3Server:
    """A moto S3 server subprocess; ``with S3Server() as s3:`` starts and kills it.

    Args:
        log: file the server's output is appended to (default: discarded).
        startup_timeout: seconds to wait for it to answer.
        check_credentials: moto then refuses every request whose access key its IAM does
            not hold (``INITIAL_NO_AUTH_ACTION_COUNT=0``), i.e. all of them here.
        latency_ms: wait of every S3 request before its first byte (0: none).
        bandwidth_mb_s: cap on each response body's rate, in 10^6 bytes/s (None: none).
        cpus: the cores the server runs on (None: any).
        moto_ranges: moto's own server answers range GETs too (the front passes them on)
            instead of the front reading the range from moto's stored object.
    """

    def __init__(
        self,
        log: Path | None = None,
        startup_timeout: float = 60.0,
        check_credentials: bool = False,
        latency_ms: float = 0.0,
        bandwidth_mb_s: float | None = None,
        cpus: set[int] | None = None,
        moto_ranges: bool = False,
    ) -> None:
        self.cpus = cpus
        self.moto_ranges = moto_ranges
        self.check_credentials = check_credentials
        self.latency_ms = latency_ms
        self.bandwidth_mb_s = bandwidth_mb_s
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None

    def storage_options(self, secret: str = SECRET_KEY) -> dict[str, str]:
        """lancedb-style options for this server (``secret`` as the secret key)."""
        return storage_options(self.endpoint, secret)

    def environment(self) -> dict[str, str]:
        """``AWS_*`` variables that point boto/s3fs/pyarrow/lance at this server."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": REGION,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
        }

    def start(self) -> S3Server:
        out = self.log.open("ab") if self.log else subprocess.DEVNULL
        env = dict(os.environ)
        if self.check_credentials:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        command = [sys.executable, __file__, str(self.port), "--latency-ms", str(self.latency_ms)]
        if self.bandwidth_mb_s is not None:
            command += ["--bandwidth-mb-s", str(self.bandwidth_mb_s)]
        if self.cpus is not None:
            command += ["--cpus", ",".join(map(str, sorted(self.cpus)))]
        if self.moto_ranges:
            command.append("--moto-ranges")
        self.process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the S3 server exited with {self.process.returncode}")
            try:
                self.bytes_served()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"the S3 server did not answer on {self.endpoint}")

    def stop(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        self.process = None

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def bytes_served(self, reset: bool = False) -> int:
        return bytes_served(self.endpoint, reset)

    def requests(self) -> list[tuple[float, float, int]]:
        return requests_served(self.endpoint)

    def waiting(self) -> int:
        """Requests waiting now (for their latency or under the bandwidth cap)."""
        return waiting(self.endpoint)

    def hold(self) -> None:
        """Hold every request's latency wait from now on, until :meth:`release`."""
        waiting(self.endpoint, "PUT")

    def release(self) -> None:
        """End every wait now, and hold no more."""
        waiting(self.endpoint, "DELETE")

    def whole_object_gets(self) -> list[str]:
        """Paths of the objects read whole (a GET without ``Range``) since the start."""
        with urllib.request.urlopen(self.endpoint + WHOLE_GETS_PATH, timeout=5) as response:
            return response.read().decode().split()

    def create_bucket(self, name: str) -> None:
        import boto3

        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
        ).create_bucket(Bucket=name)

    def upload(self, local: Path, url: str) -> None:
        """Copy the directory tree ``local`` to ``s3://bucket/prefix``."""
        import pyarrow.fs as pafs

        s3 = pafs.S3FileSystem(
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region=REGION,
            endpoint_override=f"127.0.0.1:{self.port}",
            scheme="http",
        )
        pafs.copy_files(str(local), url.removeprefix("s3://"), destination_filesystem=s3)


class _Waits:
    """The server's waits (a request's latency, a capped body's pauses): counted while they
    last, held on request, ended early on request."""

    def __init__(self) -> None:
        self.held = False
        self.pending: set[asyncio.Future] = set()

    async def wait(self, seconds: float, holdable: bool = False) -> None:
        """``seconds``, or, ``holdable`` while held, until :meth:`release`."""
        held = holdable and self.held
        if seconds <= 0 and not held:
            return
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        timer = None if held else loop.call_later(seconds, _finish, done)
        self.pending.add(done)
        try:
            await done
        finally:
            self.pending.discard(done)
            if timer is not None:
                timer.cancel()

    def count(self) -> int:
        return sum(not done.done() for done in self.pending)

    def release(self) -> None:
        self.held = False
        for done in self.pending:
            _finish(done)


def _finish(done: asyncio.Future) -> None:
    if not done.done():
        done.set_result(None)


async def _send_paced(
    writer: asyncio.StreamWriter, body: bytes, bytes_per_s: float, waits: _Waits
) -> None:
    """Write ``body`` in pieces, no faster than ``bytes_per_s``."""
    start, sent = time.monotonic(), 0
    for offset in range(0, len(body), PACE_BYTES):
        piece = body[offset : offset + PACE_BYTES]
        sent += len(piece)
        ahead = start + sent / bytes_per_s - time.monotonic()
        if ahead > 0:
            await waits.wait(ahead)
        writer.write(piece)
        await writer.drain()


@dataclass(frozen=True)
class _FileRange:
    """A range of a file, sent with ``sendfile``: the kernel copies the bytes from the page
    cache to the socket, with no copy in the server's memory."""

    file: Any
    start: int
    size: int

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        return os.pread(self.file.fileno(), self.size, self.start)


def _range_reply(
    backend: Any, path: str, header: str
) -> tuple[dict[str, str], bytes | _FileRange] | None:
    """Headers and body of a range GET of ``path`` (``/bucket/key``, quoted), read from
    moto's stored object in ``backend`` (a :class:`_FileRange` where moto keeps it in a
    file); ``None`` for anything but one satisfiable range of an existing object (moto
    then answers it, errors included)."""
    unit, _, spec = header.partition("=")
    first, _, last = spec.partition("-")
    if unit.strip() != "bytes" or "," in spec or not first.isdigit():
        return None
    bucket, _, name = unquote(path).lstrip("/").partition("/")
    try:
        key = backend.get_object(bucket, name)
    except Exception:
        return None
    if key is None or int(first) >= key.size:
        return None
    start = int(first)
    end = min(int(last), key.size - 1) if last.isdigit() else key.size - 1
    buffer = key._value_buffer  # a SpooledTemporaryFile
    if getattr(buffer, "_rolled", False):
        body = _FileRange(_own_file(buffer), start, end - start + 1)
    else:
        with key.lock:
            buffer.seek(start)
            body = buffer.read(end - start + 1)
    return {**_object_headers(key), "Content-Range": f"bytes {start}-{end}/{key.size}"}, body


# moto's stored objects -> their reply headers (an object written again is a new key)
_HEADERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _object_headers(key: Any) -> dict[str, str]:
    """A stored object's own reply headers, made once: moto formats its date anew on every
    call, 5% of the server's CPU on an epoch of range reads."""
    if key not in _HEADERS:
        _HEADERS[key] = {
            "Content-Type": "binary/octet-stream",
            "Accept-Ranges": "bytes",
            "ETag": key.etag,
            "Last-Modified": key.last_modified_RFC1123,
        }
    return _HEADERS[key]


async def _send_file_range(transport: asyncio.Transport, body: _FileRange) -> None:
    """``body`` sent with ``os.sendfile`` straight to the socket while it takes the bytes,
    the rest (a full socket buffer) with asyncio's ``loop.sendfile``: asyncio's wrapper
    pauses reading, registers the socket for writing and waits once per call, which
    was a third of the server's CPU on an epoch of range reads of 0.1-2 MB."""
    offset, left = body.start, body.size
    if transport.get_write_buffer_size() == 0:  # the headers are out: nothing goes before
        socket_fd = transport.get_extra_info("socket").fileno()
        with contextlib.suppress(BlockingIOError):
            while left:
                sent = os.sendfile(socket_fd, body.file.fileno(), offset, left)
                if not sent:  # the file ended: the rest is asyncio's to report
                    break
                offset, left = offset + sent, left - sent
    if left:
        await asyncio.get_running_loop().sendfile(transport, body.file, offset, left)


# moto's object buffers -> the server's own file objects on them (gone with the buffer)
_OWN_FILES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _own_file(buffer: Any) -> Any:
    """A file object of the server's own on ``buffer``'s file: ``sendfile`` leaves a file's
    position after the bytes it sent, and moto seeks and reads its own."""
    if buffer not in _OWN_FILES:
        _OWN_FILES[buffer] = open(f"/proc/self/fd/{buffer.fileno()}", "rb")  # noqa: SIM115
    return _OWN_FILES[buffer]


# headers of one hop, not forwarded: each side frames its own messages (the front has
# answered ``Expect: 100-continue`` itself; werkzeug would answer it again, even to HTTP/1.0)
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "expect"}


@dataclass(frozen=True)
class _Request:
    method: str
    target: str  # path and query, as sent (quoted)
    headers: list[tuple[str, str]]
    body: bytes

    @property
    def path(self) -> str:
        return self.target.partition("?")[0]

    def header(self, name: str) -> str | None:
        return _header(self.headers, name)


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    """The value of header ``name`` (lower case) in ``headers``; ``None`` if absent."""
    return next((v for k, v in headers if k.lower() == name), None)


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    """The first line and the headers of an HTTP message's head."""
    first, *lines = head.decode("latin-1").rstrip("\r\n").split("\r\n")
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return first, headers


async def _read_request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> _Request | None:
    """The next request on a connection (``None``: the client closed it)."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    first, headers = _parse_head(head)
    method, target, _ = first.split(" ", 2)
    if (_header(headers, "expect") or "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    if "chunked" in (_header(headers, "transfer-encoding") or "").lower():
        chunks = []
        while size := int((await reader.readuntil(b"\r\n")).split(b";")[0], 16):
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        body = b"".join(chunks)
    else:
        body = await reader.readexactly(int(_header(headers, "content-length") or 0))
    return _Request(method, target, headers, body)


def _reply_head(status: int, headers: dict[str, str], length: int | str) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _to_moto(address: tuple[str, int], request: _Request) -> tuple[int, dict, bytes]:
    """``request`` answered by moto's own server at ``address``: status, headers, body.

    Sent as HTTP/1.0 on a connection of its own, its end sent with the request (werkzeug
    waits 10 ms for more input before it closes otherwise), so the reply is framed by the
    connection's end (moto gives every reply a Content-Length, so werkzeug sends no
    chunks); the headers as they came, Host included, so moto's signature checks hold.
    """
    reader, writer = await asyncio.open_connection(*address)
    try:
        headers = [(k, v) for k, v in request.headers if k.lower() not in _HOP_HEADERS]
        headers.append(("Content-Length", str(len(request.body))))
        lines = [f"{request.method} {request.target} HTTP/1.0"]
        lines += [f"{name}: {value}" for name, value in headers]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + request.body)
        writer.write_eof()
        reply = await reader.read()
    finally:
        writer.close()
    if not reply:
        raise ConnectionError(f"moto closed the connection without answering {request.target}")
    head, _, body = reply.partition(b"\r\n\r\n")
    first, headers = _parse_head(head)
    kept = {k: v for k, v in headers if k.lower() not in _HOP_HEADERS}
    if request.method == "HEAD":  # moto's Content-Length is the object's size
        kept["Content-Length"] = _header(headers, "content-length") or "0"
    return int(first.split(" ", 2)[1]), kept, body


def _serve(port: int, latency_ms: float, bandwidth_mb_s: float | None, fast_ranges: bool) -> None:
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends
    from moto.server import ThreadedMotoServer

    moto = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    moto.start()
    moto_address = moto.get_host_and_port()
    backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
    served = [0]
    whole: list[str] = []
    log: list[tuple[float, float, int]] = []
    sending = [0]  # object GETs whose body is still being written, so not yet logged
    waits = _Waits()

    def text(writer: asyncio.StreamWriter, body: str) -> None:
        data = body.encode()
        writer.write(_reply_head(200, {"Content-Type": "text/plain"}, len(data)) + data)

    async def respond(request: _Request, writer: asyncio.StreamWriter) -> None:
        path = unquote(request.path)
        if path == WHOLE_GETS_PATH:
            return text(writer, "\n".join(whole))
        if path == REQUESTS_PATH:
            # a reader that has its bytes finds them logged: wait for bodies being written
            deadline = time.monotonic() + 10
            while sending[0] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return text(writer, json.dumps(log))
        if path == WAITING_PATH:
            if request.method == "PUT":
                waits.held = True
            elif request.method == "DELETE":
                waits.release()
            return text(writer, str(waits.count()))
        if path == CPU_PATH:
            used = os.times()
            return text(writer, str(used.user + used.system))
        if path == BYTES_PATH:
            if request.method == "DELETE":
                served[0] = 0
                log.clear()
            return text(writer, str(served[0]))
        start = time.monotonic()
        await waits.wait(latency_ms / 1000, holdable=True)
        ranged = request.header("range")
        reply = None
        if fast_ranges and request.method == "GET" and ranged:
            reply = _range_reply(backend, request.path, ranged)
        if reply is not None:
            status, headers, body = 206, *reply
        else:
            status, headers, body = await _to_moto(moto_address, request)
        if request.method == "HEAD":
            length = headers.pop("Content-Length")
            return writer.write(_reply_head(status, headers, length))
        if request.method != "GET":
            return writer.write(_reply_head(status, headers, len(body)) + body)
        served[0] += len(body)
        if not ranged and "?" not in request.target:
            whole.append(path)
        obj = "/" in path.strip("/")  # /bucket/key: an object, not a listing
        sending[0] += obj
        try:
            writer.write(_reply_head(status, headers, len(body)))
            if bandwidth_mb_s is not None:
                body = body.read() if isinstance(body, _FileRange) else body
                await _send_paced(writer, body, bandwidth_mb_s * 1e6, waits)
            elif isinstance(body, _FileRange):
                await _send_file_range(writer.transport, body)
            else:
                writer.write(body)
            await writer.drain()
        finally:
            sending[0] -= obj
        if obj:
            log.append((start, time.monotonic() - start, len(body)))

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while (request := await _read_request(reader, writer)) is not None:
                await respond(request, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a client gone or a request the front cannot read: the connection closes
        finally:
            writer.close()

    async def main() -> None:
        # A store accepts every connection: with a backlog of 128, two readers' bursts of
        # new connections overflowed it (TcpExtListenOverflows), and each dropped SYN cost
        # its GET a second's retransmit: an epoch of 2 workers stalled in half-second gaps.
        server = await asyncio.start_server(connection, "127.0.0.1", port, backlog=4096)
        async with server:
            await server.serve_forever()

    # werkzeug (moto's server) logs a line per request: CPU on the host's cores, for nothing
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    asyncio.run(main())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--bandwidth-mb-s", type=float)
    parser.add_argument("--cpus", help="comma-separated cores to run on (default: any)")
    parser.add_argument("--moto-ranges", action="store_true", help="moto answers range GETs")
    args = parser.parse_args()
    if args.cpus:
        # before moto's threads start: they inherit it
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    # moto checks credentials when this is set: it then answers every request itself
    checking = "INITIAL_NO_AUTH_ACTION_COUNT" in os.environ
    fast_ranges = not (checking or args.moto_ranges)
    _serve(args.port, args.latency_ms, args.bandwidth_mb_s, fast_ranges=fast_ranges)
