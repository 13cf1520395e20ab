"""Storage options: mapping onto pyarrow and s3fs, redaction, errors (no server needed)."""

import pyarrow.fs as pafs
import pytest

from lightning_stream.storage import (
    StorageError,
    check_options,
    fsspec_options,
    pyarrow_filesystem,
    storage_error,
)

SECRET = "wJalrXUtnFEMI-secret"
OPTIONS = {
    "aws_access_key_id": "AKID",
    "aws_secret_access_key": SECRET,
    "aws_session_token": "token-" + SECRET,
    "region": "eu-west-1",
    "aws_endpoint": "http://127.0.0.1:9000",
}


def test_lance_option_names_map_onto_pyarrow_and_s3fs():
    fs, path = pyarrow_filesystem("s3://bucket/data/", OPTIONS)
    assert isinstance(fs, pafs.S3FileSystem) and path == "bucket/data"
    assert fs.region == "eu-west-1"
    assert fsspec_options(OPTIONS) == {
        "key": "AKID",
        "secret": SECRET,
        "token": "token-" + SECRET,
        "endpoint_url": "http://127.0.0.1:9000",
        "client_kwargs": {"region_name": "eu-west-1"},
    }
    ready = pafs.LocalFileSystem()
    assert pyarrow_filesystem("s3://bucket/data", None, ready) == (ready, "bucket/data")
    with pytest.raises(ValueError, match="aws_profile"):
        pyarrow_filesystem("s3://bucket/data", {"aws_profile": "x"})
    with pytest.raises(TypeError, match="storage_options"):
        check_options({"allow_http": True})


@pytest.mark.parametrize(
    ("store_said", "hint"),
    [
        ("Failed to get AWS credentials: ProviderError", "'aws_secret_access_key'"),
        ("Status { status: 403, body: InvalidAccessKeyId }", "AWS_ACCESS_KEY_ID"),
        ("Generic S3 error: Failed to resolve region for bucket", "'aws_region'"),
        ("tcp connect error 127.0.0.1:40312 ConnectionRefused", "'aws_endpoint'"),
        ("<Code>NoSuchBucket</Code>", "bucket does not exist"),
    ],
)
def test_errors_name_the_uri_and_the_option_and_mask_secrets(store_said, hint):
    error = storage_error("s3://bucket/db", OSError(f"{store_said} (key {SECRET})"), OPTIONS)
    message = str(error)
    assert isinstance(error, StorageError)
    assert message.startswith("cannot read s3://bucket/db:") and hint in message
    assert SECRET not in message and "***" in message
