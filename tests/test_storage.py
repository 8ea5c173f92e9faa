"""Object store behaviour, the same suite over both backends.

The local backend runs in tmp_path; the S3 backend against moto's threaded
server over real HTTP. No PostgreSQL needed.
"""
from __future__ import annotations

import base64
import hashlib
import os
import socket
import threading
import time
import tracemalloc
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import Callable

import boto3
import pytest
import requests

from app.storage import (IntegrityError, LocalObjectStore, ObjectNotFound, ObjectStore,
                         StorageUnavailable, content_key, from_config)
from app.storage.base import hash_stream

PREFIX = "archive"


def s3_client(endpoint: str):
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="test", aws_secret_access_key="test")


def s3_config(endpoint: str, bucket: str, **extra) -> dict:
    return {"S3_BUCKET": bucket, "S3_ENDPOINT_URL": endpoint, "S3_REGION": "us-east-1",
            "S3_ACCESS_KEY_ID": "test", "S3_SECRET_ACCESS_KEY": "test", **extra}


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@dataclass
class Backend:
    store: ObjectStore
    corrupt: Callable[[str, bytes], None]  # overwrite an object behind the store's back
    listing: Callable[[], list[str]]  # every stored name, temp files included


@pytest.fixture(params=["local", "s3"])
def backend(request, tmp_path):
    if request.param == "local":
        store = LocalObjectStore(str(tmp_path / "objects"))

        def corrupt(key, data):
            with open(store.path_of(key), "wb") as f:
                f.write(data)

        def listing():
            return sorted(os.path.relpath(os.path.join(d, n), store.root)
                          for d, _, names in os.walk(store.root) for n in names)
        return Backend(store, corrupt, listing)
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    raw = s3_client(endpoint)
    raw.create_bucket(Bucket=bucket)
    store = from_config(s3_config(endpoint, bucket, S3_PREFIX=PREFIX))
    return Backend(
        store,
        lambda key, data: raw.put_object(Bucket=bucket, Key=f"{PREFIX}/{key}", Body=data),
        lambda: sorted(o["Key"] for o in raw.list_objects_v2(Bucket=bucket).get("Contents", [])))


def make_file(tmp_path, data: bytes) -> tuple[str, str, int]:
    path = tmp_path / f"src-{uuid.uuid4().hex}"
    path.write_bytes(data)
    return str(path), hashlib.sha256(data).hexdigest(), len(data)


def pdf_bytes(n: int = 20_000) -> bytes:
    return b"%PDF-1.7\n" + os.urandom(n) + b"\n%%EOF\n"


def test_put_then_read(backend, tmp_path):
    data = pdf_bytes()
    path, sha, size = make_file(tmp_path, data)
    key = content_key(sha)
    result = backend.store.put_file(key, path, sha256_hex=sha, size=size)
    assert (result.key, result.existed, result.matches) == (key, False, True)
    assert backend.store.exists(key)
    assert not backend.store.exists(content_key("0" * 64))
    with backend.store.open(key) as stream:
        assert stream.read() == data
    assert backend.store.sha256_of(key) == (sha, size)


def test_second_put_reports_existing_and_keeps_object(backend, tmp_path):
    data = pdf_bytes()
    path, sha, size = make_file(tmp_path, data)
    key = content_key(sha)
    backend.store.put_file(key, path, sha256_hex=sha, size=size)
    again = backend.store.put_file(key, make_file(tmp_path, data)[0], sha256_hex=sha, size=size)
    assert (again.existed, again.matches) == (True, True)
    assert backend.store.sha256_of(key) == (sha, size)


def test_corrupted_existing_object_raises_and_is_not_overwritten(backend, tmp_path):
    data = pdf_bytes()
    path, sha, size = make_file(tmp_path, data)
    key = content_key(sha)
    backend.store.put_file(key, path, sha256_hex=sha, size=size)
    backend.corrupt(key, b"not the archived bytes")
    with pytest.raises(IntegrityError) as err:
        backend.store.put_file(key, path, sha256_hex=sha, size=size)
    assert err.value.stored is True
    assert err.value.actual == (hashlib.sha256(b"not the archived bytes").hexdigest(), 22)
    with backend.store.open(key) as stream:
        assert stream.read() == b"not the archived bytes"  # left for an operator


@pytest.mark.parametrize("wrong", ["sha", "size"])
def test_source_not_matching_its_digest_is_refused(backend, tmp_path, wrong):
    path, sha, size = make_file(tmp_path, pdf_bytes())
    claimed_sha = hashlib.sha256(b"something else").hexdigest() if wrong == "sha" else sha
    claimed_size = size + 1 if wrong == "size" else size
    key = content_key(claimed_sha)
    with pytest.raises(IntegrityError) as err:
        backend.store.put_file(key, path, sha256_hex=claimed_sha, size=claimed_size)
    assert err.value.stored is False
    assert not backend.store.exists(key)
    assert backend.listing() == []  # no object, no temp file


def test_caller_hashed_source_is_stored_and_still_measured(backend, tmp_path):
    data = pdf_bytes()
    path, sha, size = make_file(tmp_path, data)
    key = content_key(sha)
    with pytest.raises(IntegrityError) as err:
        backend.store.put_file(key, path, sha256_hex=sha, size=size - 1, source_hashed=True)
    assert err.value.stored is False
    assert backend.listing() == []
    result = backend.store.put_file(key, path, sha256_hex=sha, size=size, source_hashed=True)
    assert result.existed is False
    with backend.store.open(key) as stream:
        assert stream.read() == data
    # An existing object is re-hashed whatever the caller says about its source.
    backend.corrupt(key, b"rotted")
    with pytest.raises(IntegrityError) as err:
        backend.store.put_file(key, path, sha256_hex=sha, size=size, source_hashed=True)
    assert err.value.stored is True


def test_20_mib_round_trip(backend, tmp_path):
    path = tmp_path / "big.pdf"
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for _ in range(20):
            chunk = os.urandom(1024 * 1024)
            digest.update(chunk)
            f.write(chunk)
    sha, size = digest.hexdigest(), 20 * 1024 * 1024
    key = content_key(sha)
    local = isinstance(backend.store, LocalObjectStore)
    if local:  # moto runs in-process and buffers bodies: measure local only
        tracemalloc.start()
    try:
        assert not backend.store.put_file(key, str(path), sha256_hex=sha, size=size).existed
        assert backend.store.sha256_of(key) == (sha, size)
        with backend.store.open(key) as stream:
            assert hash_stream(stream) == (sha, size)
        if local:
            assert tracemalloc.get_traced_memory()[1] < 8 * 1024 * 1024
    finally:
        if local:
            tracemalloc.stop()


def test_concurrent_puts_of_one_key_write_once(backend, tmp_path):
    data = pdf_bytes(200_000)
    paths = [make_file(tmp_path, data)[0] for _ in range(6)]
    sha, size = hashlib.sha256(data).hexdigest(), len(data)
    key = content_key(sha)
    results, errors = [], []
    barrier = threading.Barrier(len(paths))

    def put(path):
        barrier.wait()
        try:
            results.append(backend.store.put_file(key, path, sha256_hex=sha, size=size))
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=put, args=(p,)) for p in paths]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(r.existed for r in results) == [False] + [True] * (len(paths) - 1)
    assert backend.store.sha256_of(key) == (sha, size)


def test_missing_object_and_delete(backend, tmp_path):
    key = content_key("ab" * 32)
    with pytest.raises(ObjectNotFound):
        backend.store.open(key)
    with pytest.raises(ObjectNotFound):
        backend.store.sha256_of(key)
    backend.store.delete(key)  # absent: no error
    path, sha, size = make_file(tmp_path, pdf_bytes())
    key = content_key(sha)
    backend.store.put_file(key, path, sha256_hex=sha, size=size)
    backend.store.delete(key)
    assert not backend.store.exists(key)
    assert not backend.store.put_file(key, path, sha256_hex=sha, size=size).existed


@pytest.mark.parametrize("key", ["../escape.pdf", "/abs.pdf", "a//b.pdf", ".tmp-x", "a/../b", ""])
def test_unsafe_keys_are_rejected(backend, tmp_path, key):
    path, sha, size = make_file(tmp_path, b"x")
    with pytest.raises(ValueError):
        backend.store.put_file(key, path, sha256_hex=sha, size=size)
    with pytest.raises(ValueError):
        backend.store.exists(key)


def test_presigned_url(backend, tmp_path):
    data = pdf_bytes()
    path, sha, size = make_file(tmp_path, data)
    key = content_key(sha)
    backend.store.put_file(key, path, sha256_hex=sha, size=size)
    url = backend.store.presigned_url(key, 60)
    if isinstance(backend.store, LocalObjectStore):
        assert url is None  # the master serves local objects itself
        return
    response = requests.get(url, timeout=10)
    assert response.status_code == 200
    assert response.content == data
    assert response.headers["Content-Type"] == "application/pdf"


def test_check_passes_when_reachable(backend):
    backend.store.check()


def test_content_key():
    sha = hashlib.sha256(b"x").hexdigest()
    assert content_key(sha) == f"sha256/{sha[:2]}/{sha[2:4]}/{sha}.pdf"
    assert content_key(sha.upper()) == content_key(sha)
    for bad in ("", "ab", "g" * 64, sha + "0"):
        with pytest.raises(ValueError):
            content_key(bad)


def test_s3_object_carries_sha256_checksum_under_prefix(s3_endpoint, tmp_path):
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    raw = s3_client(s3_endpoint)
    raw.create_bucket(Bucket=bucket)
    store = from_config(s3_config(s3_endpoint, bucket, S3_PREFIX="/deep/prefix/"))
    path, sha, size = make_file(tmp_path, pdf_bytes())
    store.put_file(content_key(sha), path, sha256_hex=sha, size=size)
    head = raw.head_object(Bucket=bucket, Key=f"deep/prefix/{content_key(sha)}",
                           ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(sha)).decode()
    assert head["ContentLength"] == size


def test_s3_put_signs_its_checksum_not_a_second_hash_of_the_body(s3_endpoint, tmp_path):
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    s3_client(s3_endpoint).create_bucket(Bucket=bucket)
    store = from_config(s3_config(s3_endpoint, bucket))
    sent = []
    store._client.meta.events.register(
        "before-send.s3.PutObject", lambda request, **_: sent.append(dict(request.headers)))
    path, sha, size = make_file(tmp_path, pdf_bytes())
    store.put_file(content_key(sha), path, sha256_hex=sha, size=size)
    [headers] = sent
    def value(name):
        return headers[name].decode() if isinstance(headers[name], bytes) else headers[name]
    # The body is not hashed again for the signature (UNSIGNED-PAYLOAD, even
    # over plain HTTP); its SHA-256 travels in a header the signature covers.
    assert value("X-Amz-Content-SHA256") == "UNSIGNED-PAYLOAD"
    assert value("x-amz-checksum-sha256") == base64.b64encode(bytes.fromhex(sha)).decode()
    signed = value("Authorization").split("SignedHeaders=")[1].split(",")[0].split(";")
    assert "x-amz-checksum-sha256" in signed


def _staged_store(s3_endpoint, tmp_path):
    bucket = f"test-{uuid.uuid4().hex[:12]}"
    raw = s3_client(s3_endpoint)
    raw.create_bucket(Bucket=bucket)
    store = from_config(s3_config(s3_endpoint, bucket))
    data = pdf_bytes()
    path, sha, size = make_file(tmp_path, data)
    store.put_file("staging/1.1.pdf", path, sha256_hex=sha, size=size)
    copies = []
    store._client.meta.events.register(
        "provide-client-params.s3.CopyObject", lambda params, **_: copies.append(dict(params)))
    return store, raw, bucket, data, sha, size, copies


def test_s3_copy_keeps_the_staged_checksum_without_rehashing(s3_endpoint, tmp_path):
    store, raw, bucket, data, sha, size, copies = _staged_store(s3_endpoint, tmp_path)
    heads = []
    store._client.meta.events.register(
        "provide-client-params.s3.HeadObject", lambda params, **_: heads.append(params["Key"]))
    result = store.copy("staging/1.1.pdf", content_key(sha), sha256_hex=sha, size=size)
    assert (result.key, result.existed) == (content_key(sha), False)
    # One server-side copy that asks for no new checksum: the store carries
    # the staged object's SHA-256 over and names it in its answer, which is
    # what was verified (no HEAD of the copy).
    assert [c.get("ChecksumAlgorithm") for c in copies] == [None]
    assert heads == ["staging/1.1.pdf", content_key(sha)]  # its checksum; is the key taken
    assert store.sha256_of(content_key(sha)) == (sha, size)
    assert raw.get_object(Bucket=bucket, Key=content_key(sha))["Body"].read() == data


def test_s3_copy_on_a_store_that_drops_checksums_asks_it_to_hash(s3_endpoint, tmp_path):
    store, raw, bucket, data, sha, size, copies = _staged_store(s3_endpoint, tmp_path)

    def drop_checksum(parsed, **_):
        # As a store that does not carry checksums over: the first copy
        # lands, and is answered, without one.
        if len(copies) == 1:
            parsed.get("CopyObjectResult", {}).pop("ChecksumSHA256", None)
            raw.put_object(Bucket=bucket, Key=content_key(sha), Body=data)
    store._client.meta.events.register("after-call.s3.CopyObject", drop_checksum)
    store.copy("staging/1.1.pdf", content_key(sha), sha256_hex=sha, size=size)
    assert [c.get("ChecksumAlgorithm") for c in copies] == [None, "SHA256"]
    head = raw.head_object(Bucket=bucket, Key=content_key(sha), ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == base64.b64encode(bytes.fromhex(sha)).decode()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_unavailable_quickly(store, tmp_path, limit_s=10.0):
    path, sha, size = make_file(tmp_path, pdf_bytes())
    calls = [store.check, lambda: store.exists(content_key(sha)),
             lambda: store.put_file(content_key(sha), path, sha256_hex=sha, size=size)]
    for call in calls:
        started = time.monotonic()
        with pytest.raises(StorageUnavailable):
            call()
        assert time.monotonic() - started < limit_s


def test_s3_unreachable_is_storage_unavailable(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    assert_unavailable_quickly(from_config(s3_config(endpoint, "bucket")), tmp_path)


def test_s3_silent_server_times_out(tmp_path):
    with socket.socket() as sock:  # accepts connections (backlog), never answers
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
        store = from_config(s3_config(endpoint, "bucket", S3_READ_TIMEOUT=1,
                                      S3_MAX_ATTEMPTS=1))
        assert_unavailable_quickly(store, tmp_path)


def test_s3_server_errors_are_storage_unavailable(tmp_path):
    class Failing(BaseHTTPRequestHandler):
        def _fail(self):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
        do_GET = do_HEAD = do_PUT = _fail

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        assert_unavailable_quickly(from_config(s3_config(endpoint, "bucket")), tmp_path)
    finally:
        server.shutdown()
        server.server_close()


def test_local_unusable_directory_is_storage_unavailable(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    assert_unavailable_quickly(LocalObjectStore(str(blocker / "objects")), tmp_path)


def test_local_objects_are_private_and_complete(tmp_path):
    store = LocalObjectStore(str(tmp_path / "objects"))
    path, sha, size = make_file(tmp_path, pdf_bytes())
    key = content_key(sha)
    store.put_file(key, path, sha256_hex=sha, size=size)
    assert os.stat(store.path_of(key)).st_mode & 0o777 == 0o640
    files = [n for _, _, names in os.walk(store.root) for n in names]
    assert files == [f"{sha}.pdf"]


def test_from_config_picks_backend(tmp_path, s3_endpoint):
    assert from_config({}).root == os.path.abspath("var/objects")
    assert from_config({"DATA_DIR": str(tmp_path)}).root == str(tmp_path / "objects")
    store = from_config({"DATA_DIR": "x", "OBJECT_STORE_DIR": str(tmp_path / "o")})
    assert store.root == str(tmp_path / "o")
    from app.storage.s3 import S3ObjectStore
    s3 = from_config(s3_config(s3_endpoint, "bkt", S3_PREFIX=""))
    assert isinstance(s3, S3ObjectStore) and s3.prefix == ""
