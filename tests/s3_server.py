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
- Cores: ``--cpus`` keeps the server on those cores (all its threads), so that a
  benchmark can leave the others to the reader, as a real store's CPU is not on the
  reader's host.

The front is an aiohttp server (its HTTP parser is C; one event loop, so every wait is an
``asyncio.sleep`` that holds up no other request); moto's own server runs on a thread of
the same process (``moto.server.ThreadedMotoServer``) on a port of its own. A range GET
of one byte range is answered at the front from moto's stored object, reading only that
range (``_range_reply``): moto itself copies the whole object twice for every range read,
under the object's lock. Where moto keeps the object in a file (above its in-memory size),
the range goes out with ``sendfile``, which cut the server's CPU on an epoch of 22 KB rows
at 0 workers from 0.24 to 0.16 s (medians of 4 rounds, the same reads). Every other
request (listings, HEAD, PUT, whole-object GETs, and every request when
``check_credentials``) is passed to moto as it came, Host header included, so its
signature checks hold. Why not werkzeug, moto's server, for the range
reads too: the store shares this host's 2 cores with the reader it serves, and a real
store's CPU is not on the reader's host. werkzeug spent 0.8 ms of CPU per range GET
(Python's header parsing, a thread per connection): 1.5 s per epoch of a 0.55 GB table
read in 1,864 GETs, as much as the reader; the front spends 0.45-0.7 s on the same epoch.

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
from pathlib import Path
from typing import Any

# dummy credentials: moto accepts any
ACCESS_KEY = "lightning-stream-test"
SECRET_KEY = "lightning-stream-test-secret"
REGION = "us-east-1"
BYTES_PATH = "/_bytes_served"
WHOLE_GETS_PATH = "/_whole_gets"
REQUESTS_PATH = "/_requests"
CPU_PATH = "/_cpu"
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
    """

    def __init__(
        self,
        log: Path | None = None,
        startup_timeout: float = 60.0,
        check_credentials: bool = False,
        latency_ms: float = 0.0,
        bandwidth_mb_s: float | None = None,
        cpus: set[int] | None = None,
    ) -> None:
        self.cpus = cpus
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
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=REGION,
            endpoint_override=f"127.0.0.1:{self.port}", scheme="http",
        )  # fmt: skip
        pafs.copy_files(str(local), url.removeprefix("s3://"), destination_filesystem=s3)


async def _send_paced(response, body: bytes, bytes_per_s: float) -> None:
    """Write ``body`` in pieces, no faster than ``bytes_per_s``."""
    start, sent = time.monotonic(), 0
    for offset in range(0, len(body), PACE_BYTES):
        piece = body[offset : offset + PACE_BYTES]
        sent += len(piece)
        ahead = start + sent / bytes_per_s - time.monotonic()
        if ahead > 0:
            await asyncio.sleep(ahead)
        await response.write(piece)


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


def _range_reply(path: str, header: str) -> tuple[dict[str, str], bytes | _FileRange] | None:
    """Headers and body of a range GET of ``path`` (``/bucket/key``), read from moto's
    stored object (a :class:`_FileRange` where moto keeps it in a file); ``None`` for
    anything but one satisfiable range of an existing object (moto then answers it, errors
    included)."""
    from urllib.parse import unquote

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    unit, _, spec = header.partition("=")
    first, _, last = spec.partition("-")
    if unit.strip() != "bytes" or "," in spec or not first.isdigit():
        return None
    bucket, _, name = unquote(path).lstrip("/").partition("/")
    try:
        key = s3_backends[DEFAULT_ACCOUNT_ID]["aws"].get_object(bucket, name)
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


# headers of one hop, not forwarded (aiohttp sets its own framing)
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


def _serve(port: int, latency_ms: float, bandwidth_mb_s: float | None, fast_ranges: bool) -> None:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web
    from moto.server import ThreadedMotoServer
    from yarl import URL

    moto = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    moto.start()
    moto_url = "http://{}:{}".format(*moto.get_host_and_port())
    served = [0]
    whole: list[str] = []
    log: list[tuple[float, float, int]] = []
    sending = [0]  # object GETs whose body is still being written, so not yet logged
    state: dict[str, ClientSession] = {}

    def text(body: str) -> web.Response:
        return web.Response(text=body)

    async def to_moto(request: web.Request) -> tuple[int, dict[str, str], bytes]:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
        # moto checks a signature over the Host the client signed
        headers["Host"] = request.host
        async with state["moto"].request(
            request.method, URL(moto_url + request.raw_path, encoded=True), headers=headers,
            data=await request.read(), allow_redirects=False,
        ) as reply:  # fmt: skip
            body = await reply.read()
            kept = {k: v for k, v in reply.headers.items() if k.lower() not in _HOP_HEADERS}
            if request.method == "HEAD" and "Content-Length" in reply.headers:
                kept["Content-Length"] = reply.headers["Content-Length"]
            return reply.status, kept, body

    async def handle(request: web.Request) -> web.StreamResponse:
        path = request.path
        if path == WHOLE_GETS_PATH:
            return text("\n".join(whole))
        if path == REQUESTS_PATH:
            # a reader that has its bytes finds them logged: wait for bodies being written
            deadline = time.monotonic() + 10
            while sending[0] and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            return text(json.dumps(log))
        if path == CPU_PATH:
            used = os.times()
            return text(str(used.user + used.system))
        if path == BYTES_PATH:
            if request.method == "DELETE":
                served[0] = 0
                log.clear()
            return text(str(served[0]))
        start = time.monotonic()
        if latency_ms > 0:
            await asyncio.sleep(latency_ms / 1000)
        ranged = "Range" in request.headers
        reply = None
        if fast_ranges and request.method == "GET" and ranged:
            reply = _range_reply(request.rel_url.raw_path, request.headers["Range"])
        if reply is not None:
            status, headers, body = 206, *reply
        else:
            status, headers, body = await to_moto(request)
        if request.method == "HEAD":  # moto's Content-Length is the object's size
            return web.Response(status=status, headers=headers)
        if request.method != "GET":
            return web.Response(status=status, headers=headers, body=body)
        served[0] += len(body)
        if not ranged and not request.query_string:
            whole.append(path)
        obj = "/" in path.strip("/")  # /bucket/key: an object, not a listing
        sending[0] += obj
        try:
            response = web.StreamResponse(status=status, headers=headers)
            response.content_length = len(body)
            await response.prepare(request)
            if bandwidth_mb_s is not None:
                body = body.read() if isinstance(body, _FileRange) else body
                await _send_paced(response, body, bandwidth_mb_s * 1e6)
            elif isinstance(body, _FileRange):
                await _send_file_range(request.transport, body)
            else:
                await response.write(body)
            await response.write_eof()
        finally:
            sending[0] -= obj
        if obj:
            log.append((start, time.monotonic() - start, len(body)))
        return response

    async def open_session(app: web.Application):
        state["moto"] = ClientSession(
            connector=TCPConnector(limit=64), timeout=ClientTimeout(total=300),
            auto_decompress=False, skip_auto_headers=("Content-Type",),
        )  # fmt: skip
        yield
        await state["moto"].close()

    # werkzeug (moto's server) logs a line per request: CPU on the host's cores, for nothing
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    app = web.Application(client_max_size=2**40)
    app.cleanup_ctx.append(open_session)
    app.router.add_route("*", "/{tail:.*}", handle)
    # A store accepts every connection: with a backlog of 128, two readers' bursts of new
    # connections overflowed it (TcpExtListenOverflows), and each dropped SYN cost its GET
    # a second's retransmit: an epoch of 2 workers stalled in half-second gaps.
    web.run_app(app, host="127.0.0.1", port=port, backlog=4096, print=None, access_log=None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("port", type=int)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--bandwidth-mb-s", type=float)
    parser.add_argument("--cpus", help="comma-separated cores to run on (default: any)")
    args = parser.parse_args()
    if args.cpus:
        # before moto's and aiohttp's threads start: they inherit it
        os.sched_setaffinity(0, {int(cpu) for cpu in args.cpus.split(",")})
    # moto checks credentials when this is set: it then answers every request itself
    checking = "INITIAL_NO_AUTH_ACTION_COUNT" in os.environ
    _serve(args.port, args.latency_ms, args.bandwidth_mb_s, fast_ranges=not checking)
