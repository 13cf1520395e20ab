"""Object-store access: one vocabulary of storage options, redaction, clear errors.

Users pass lancedb's object-store option names (``aws_access_key_id``,
``aws_secret_access_key``, ``aws_session_token``, ``aws_region``, ``aws_endpoint``,
``allow_http``, and lance's short aliases) to every data module and command. They go to
``lancedb.connect`` as they are, and are mapped here onto ``pyarrow.fs.S3FileSystem``
(video) and fsspec/s3fs (remote checkpoints in ``inspect``). Without options each library
reads the ``AWS_*`` environment variables.

Secrets travel only in memory (and pickled to DataLoader workers): every message built
here passes through :func:`redact`, and nothing here is stored in a checkpoint.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import pyarrow.fs as pafs

# lance's names (and its aliases) of each S3 setting
ACCESS_KEY = ("aws_access_key_id", "access_key_id")
SECRET_KEY = ("aws_secret_access_key", "secret_access_key")
SESSION_TOKEN = ("aws_session_token", "session_token", "token")
REGION = ("aws_region", "region")
ENDPOINT = ("aws_endpoint", "endpoint", "aws_endpoint_url", "endpoint_url")
ALLOW_HTTP = ("allow_http",)
KNOWN = (*ACCESS_KEY, *SECRET_KEY, *SESSION_TOKEN, *REGION, *ENDPOINT, *ALLOW_HTTP)
SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
_SECRET_NAME = re.compile(r"secret|token|password|account_key|sas", re.IGNORECASE)
MASK = "***"


class StorageError(OSError):
    """An object store could not be read: the message names the URI and what to set."""


def is_remote(uri: str) -> bool:
    """Whether ``uri`` names an object store rather than a local path."""
    return "://" in uri and not uri.startswith("file://")


def _renamed(options: Mapping[str, str], names: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """The options present under any of their lance names, keyed by the other library's
    name for them."""
    found = {name: _pick(options, lance_names) for name, lance_names in names.items()}
    return {name: value for name, value in found.items() if value is not None}


def _allows_http(options: Mapping[str, str]) -> bool:
    return (_pick(options, ALLOW_HTTP) or "false").lower() in ("1", "true", "yes")


def _pick(options: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        if name in options:
            return str(options[name])
    return None


def secrets(options: Mapping[str, str] | None) -> list[str]:
    """Values to hide: secret-looking options, and the secret ``AWS_*`` variables."""
    values = [str(v) for k, v in (options or {}).items() if _SECRET_NAME.search(k)]
    values += [os.environ[name] for name in SECRET_ENV if os.environ.get(name)]
    return [v for v in values if v]


def redact(text: str, options: Mapping[str, str] | None) -> str:
    """``text`` with every secret value of ``options`` (and the environment) masked."""
    for value in sorted(secrets(options), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def check_options(options: Mapping[str, str] | None, argument: str = "storage_options") -> None:
    """Refuse options that are not a mapping of strings (the object stores' own format)."""
    if options is None:
        return
    if not isinstance(options, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in options.items()
    ):
        keys = list(options) if isinstance(options, Mapping) else type(options).__name__
        raise TypeError(
            f"{argument} must map option names to strings, e.g."
            f' {{"aws_region": "us-east-1"}}; got keys {keys}'
        )


def _hint(message: str) -> str:
    """What to set, from the words of the object store's error."""
    lower = message.lower()
    if "nosuchbucket" in lower or "bucket does not exist" in lower:
        return "the bucket does not exist: create it, or fix the bucket name in the URI"
    refused = (
        "credential",
        "invalidaccesskeyid",
        "signaturedoesnotmatch",
        "accessdenied",
        "access_denied",
        "forbidden",
    )
    if any(word in lower for word in refused) or re.search(r"\b403\b", lower):
        return (
            "the credentials were missing or refused: set storage_options"
            " 'aws_access_key_id' and 'aws_secret_access_key' (plus 'aws_session_token' for"
            " temporary ones), or the AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY variables"
        )
    if "region" in lower:
        return "set storage_options 'aws_region' (or the AWS_REGION variable)"
    if any(
        word in lower
        for word in ("connect", "dns", "resolve", "timed out", "timeout", "network", "curl")
    ):
        return (
            "no object store answered: set storage_options 'aws_endpoint' to the service's"
            " URL (with 'allow_http': 'true' for http://), or AWS_ENDPOINT_URL"
        )
    return (
        "check the URI and storage_options ('aws_endpoint', 'aws_region',"
        " 'aws_access_key_id', 'aws_secret_access_key') or the AWS_* variables"
    )


def storage_error(uri: str, exc: BaseException, options: Mapping[str, str] | None) -> StorageError:
    """One error naming ``uri`` and the option to set, with secrets masked."""
    detail = redact(str(exc), options)
    if len(detail) > 600:
        detail = detail[:600] + " ..."
    message = f"cannot read {uri}: {_hint(detail)}. The object store said: {detail}"
    return StorageError(redact(message, options))


def pyarrow_filesystem(
    uri: str,
    options: Mapping[str, str] | None = None,
    filesystem: pafs.FileSystem | None = None,
) -> tuple[pafs.FileSystem, str]:
    """The ``pyarrow.fs`` file system and path of ``uri``.

    ``filesystem``, when given, is used as it is and ``uri``'s scheme is dropped. An
    ``s3://`` URI with ``options`` gets an ``S3FileSystem`` built from them (lance's option
    names); without options, ``pyarrow.fs.FileSystem.from_uri`` (credentials from the
    environment). A local path gets the local file system.
    """
    if filesystem is not None:
        return filesystem, uri.split("://", 1)[-1].rstrip("/")
    if not is_remote(uri):
        return pafs.LocalFileSystem(), os.path.abspath(uri.removeprefix("file://"))
    if not options:
        return pafs.FileSystem.from_uri(uri)
    scheme, path = uri.split("://", 1)
    if scheme not in ("s3", "s3a"):
        raise ValueError(
            f"storage_options are mapped onto S3 only; for {uri!r} pass a ready"
            " pyarrow.fs.FileSystem as filesystem= instead"
        )
    unknown = sorted(set(options) - set(KNOWN))
    if unknown:
        raise ValueError(
            f"storage_options {unknown} are not S3 options this package maps"
            f" onto pyarrow; known: {list(KNOWN)}"
        )
    credentials = {"access_key": ACCESS_KEY, "secret_key": SECRET_KEY}
    arguments = _renamed(options, {**credentials, "session_token": SESSION_TOKEN, "region": REGION})
    endpoint = _pick(options, ENDPOINT)
    http = _allows_http(options)
    if endpoint is not None:
        if endpoint.startswith("http://"):
            http = True
        arguments["endpoint_override"] = endpoint.split("://", 1)[-1]
    if http:
        arguments["scheme"] = "http"
    return pafs.S3FileSystem(**arguments), path.rstrip("/")


def fsspec_options(options: Mapping[str, str] | None) -> dict[str, Any]:
    """Lance-named S3 options as s3fs arguments; other keys are passed on unchanged."""
    options = dict(options or {})
    mapped: dict[str, Any] = _renamed(
        options,
        {"key": ACCESS_KEY, "secret": SECRET_KEY, "token": SESSION_TOKEN, "endpoint_url": ENDPOINT},
    )
    region = _pick(options, REGION)
    if region is not None:
        mapped["client_kwargs"] = {"region_name": region}
    if "endpoint_url" in mapped and "://" not in mapped["endpoint_url"]:
        scheme = "http://" if _allows_http(options) else "https://"
        mapped["endpoint_url"] = scheme + mapped["endpoint_url"]
    rest = {k: v for k, v in options.items() if k not in KNOWN}
    return {**rest, **mapped}
