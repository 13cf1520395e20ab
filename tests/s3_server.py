"""A real S3-protocol server on 127.0.0.1 (moto's server mode) for tests and benchmarks.

``python tests/s3_server.py PORT`` serves moto's S3 with one addition: it counts the
response body bytes of every GET (object reads, range reads and listings alike) and
reports the total at ``GET /_bytes_served`` (``DELETE`` resets it), so a benchmark can
measure what a reader fetched on the server side; ``GET /_whole_gets`` lists the objects
read by a GET without a ``Range`` header (whole objects, not range reads).
:class:`S3Server` starts it as a subprocess in its own process group and kills the group
on :meth:`S3Server.stop`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

# dummy credentials: moto accepts any
ACCESS_KEY = "lightning-stream-test"
SECRET_KEY = "lightning-stream-test-secret"
REGION = "us-east-1"
BYTES_PATH = "/_bytes_served"
WHOLE_GETS_PATH = "/_whole_gets"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class S3Server:
    """A moto S3 server subprocess; ``with S3Server() as s3:`` starts and kills it."""

    def __init__(
        self,
        log: Path | None = None,
        startup_timeout: float = 60.0,
        check_credentials: bool = False,
    ) -> None:
        """``check_credentials``: moto then refuses every request whose access key its
        IAM does not hold (``INITIAL_NO_AUTH_ACTION_COUNT=0``), i.e. all of them here."""
        self.check_credentials = check_credentials
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None

    def storage_options(self, secret: str = SECRET_KEY) -> dict[str, str]:
        """lancedb-style options for this server (``secret`` as the secret key)."""
        return {
            "aws_access_key_id": ACCESS_KEY,
            "aws_secret_access_key": secret,
            "aws_region": REGION,
            "aws_endpoint": self.endpoint,
            "allow_http": "true",
        }

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
        self.process = subprocess.Popen(
            [sys.executable, __file__, str(self.port)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
        )  # fmt: skip
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
        request = urllib.request.Request(
            self.endpoint + BYTES_PATH, method="DELETE" if reset else "GET"
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.read())

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


def _serve(port: int) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    app = DomainDispatcherApplication(create_backend_app)
    served = [0]
    whole: list[str] = []
    lock = threading.Lock()

    def counting(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == WHOLE_GETS_PATH:
            start_response("200 OK", [("Content-Type", "text/plain")])
            return ["\n".join(whole).encode()]
        if path == BYTES_PATH:
            if environ["REQUEST_METHOD"] == "DELETE":
                with lock:
                    served[0] = 0
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [str(served[0]).encode()]
        body = app(environ, start_response)
        if environ["REQUEST_METHOD"] != "GET":
            return body
        chunks = list(body)
        with lock:
            served[0] += sum(len(chunk) for chunk in chunks)
            if "HTTP_RANGE" not in environ and not environ.get("QUERY_STRING"):
                whole.append(path)
        return chunks

    run_simple("127.0.0.1", port, counting, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
