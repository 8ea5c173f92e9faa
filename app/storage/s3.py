"""Object store on any S3-compatible service (AWS S3, MinIO, ...).

One ``put_object`` per file (bodies are at most 100 MiB, below any
multipart need) with ``ChecksumSHA256`` so that a store that verifies
checksums rejects bytes damaged in transit, and ``IfNoneMatch='*'`` so that
an existing object is never replaced. Before uploading, the source is hashed
locally (not every S3-compatible store verifies the checksum — moto does
not), unless the caller hashed these bytes itself as it wrote them and
vouches that nothing has written them since (``source_hashed``: the archive
commit of a spool file whose seal stamp is unchanged). A HEAD skips the
upload when the object is already there, which is
common with content-addressed keys. Stores that ignore ``IfNoneMatch`` leave
a race between that HEAD and the PUT; the loser then rewrites a
content-addressed key with the same verified bytes.

Errors: connection failures, timeouts, 5xx, throttling and checksum
mismatches (transit damage: the source was verified just before) raise
``StorageUnavailable``; other client errors (credentials, permissions,
missing bucket) raise plain ``StorageError``.
"""
from __future__ import annotations

import base64
import contextlib
import io
import mimetypes
import os
from typing import BinaryIO
from collections.abc import Iterator

import boto3
from botocore.config import Config
from botocore.exceptions import (BotoCoreError, ClientError, HTTPClientError,
                                 IncompleteReadError)
from botocore.exceptions import ConnectionError as BotoConnectionError

from .base import (CHUNK, ObjectNotFound, ObjectStore, PutResult, StorageError,
                   StorageUnavailable, check_digest, check_key, hash_stream,
                   source_mismatch, verify_existing)

_RETRYABLE_CODES = {
    "SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout",
    "ConditionalRequestConflict",  # AWS: a concurrent conditional write; retry
    "BadDigest", "XAmzContentChecksumMismatch", "XAmzContentSHA256Mismatch",
}
_NOT_FOUND_CODES = {"404", "NoSuchKey", "NotFound"}
_PRECONDITION_CODES = {"412", "PreconditionFailed"}


def _code(exc: ClientError) -> tuple[str, int]:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
    return str(exc.response.get("Error", {}).get("Code", status)), status


@contextlib.contextmanager
def _mapped(what: str) -> Iterator[None]:
    """Translate botocore failures into the storage exception tree."""
    try:
        yield
    except ClientError as exc:
        code, status = _code(exc)
        if code in _NOT_FOUND_CODES:
            raise ObjectNotFound(what) from exc
        if status >= 500 or code in _RETRYABLE_CODES:
            raise StorageUnavailable(f"s3 {what}: {code}") from exc
        raise StorageError(f"s3 {what}: {code} (HTTP {status})") from exc
    except (BotoConnectionError, HTTPClientError, IncompleteReadError, OSError) as exc:
        raise StorageUnavailable(f"s3 {what}: {exc}") from exc
    except BotoCoreError as exc:  # e.g. no credentials: configuration, not transient
        raise StorageError(f"s3 {what}: {exc}") from exc


class _Stream(io.RawIOBase):
    """A GET body whose mid-stream failures raise storage errors."""

    def __init__(self, body, what: str):
        self._body = body
        self._what = what

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        with _mapped(self._what):
            data = self._body.read(len(buf))
        buf[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._body.close()
        super().close()


class S3ObjectStore(ObjectStore):
    def __init__(self, *, bucket: str, endpoint_url: str | None = None,
                 region: str | None = None, access_key_id: str | None = None,
                 secret_access_key: str | None = None, prefix: str = "",
                 public_endpoint_url: str | None = None, connect_timeout: float = 3,
                 read_timeout: float = 5, max_attempts: int = 3,
                 addressing_style: str | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        config = Config(
            connect_timeout=connect_timeout, read_timeout=read_timeout,
            # "standard" retries connection errors, throttling and 5xx with
            # jittered backoff; few attempts so an outage surfaces in seconds
            # and the caller's own (durable) retry takes over.
            # total_max_attempts counts the first try; botocore's max_attempts
            # would count retries only.
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            # Custom endpoints (MinIO in docker-compose) rarely resolve
            # bucket subdomains, so path style is the default there.
            s3={"addressing_style": addressing_style or ("path" if endpoint_url else "auto"),
                # Every put carries the body's SHA-256 as x-amz-checksum-sha256,
                # a signed header the store checks the bytes against; signing
                # the payload as well (botocore does over plain HTTP) would
                # only read and hash the whole file a second time.
                "payload_signing_enabled": False},
            # We re-hash whatever we read ourselves.
            response_checksum_validation="when_required",
            signature_version="s3v4",
        )
        session = boto3.session.Session(
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
            region_name=region or "us-east-1")
        self._client = session.client("s3", endpoint_url=endpoint_url, config=config)
        # Presigned URLs must name a host the downloader can reach, which may
        # differ from the master's internal endpoint (http://minio:9000).
        self._presigner = (session.client("s3", endpoint_url=public_endpoint_url, config=config)
                           if public_endpoint_url else self._client)

    @classmethod
    def from_config(cls, config: dict) -> S3ObjectStore:
        def opt(name, default=None):
            value = config.get(name)
            return default if value in (None, "") else value
        return cls(
            bucket=str(config["S3_BUCKET"]), endpoint_url=opt("S3_ENDPOINT_URL"),
            region=opt("S3_REGION"), access_key_id=opt("S3_ACCESS_KEY_ID"),
            secret_access_key=opt("S3_SECRET_ACCESS_KEY"), prefix=str(opt("S3_PREFIX", "")),
            public_endpoint_url=opt("S3_PUBLIC_ENDPOINT_URL"),
            connect_timeout=float(opt("S3_CONNECT_TIMEOUT", 3)),
            read_timeout=float(opt("S3_READ_TIMEOUT", 5)),
            max_attempts=int(opt("S3_MAX_ATTEMPTS", 3)),
            addressing_style=opt("S3_ADDRESSING_STYLE"))

    def __repr__(self) -> str:
        return f"S3ObjectStore(bucket={self.bucket!r}, prefix={self.prefix!r})"

    def _name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def put_file(self, key: str, path: str, *, sha256_hex: str, size: int,
                 source_hashed: bool = False) -> PutResult:
        digest = check_digest(sha256_hex)
        name = self._name(key)
        # A missing source propagates as OSError. A caller-hashed source is
        # only measured: the put below carries its SHA-256 for the server.
        if source_hashed:
            actual = (digest, os.stat(path).st_size)
        else:
            with open(path, "rb") as src:
                actual = hash_stream(src)
        if actual != (digest, size):
            raise source_mismatch(key, actual, digest, size)
        if self.exists(key):
            return verify_existing(key, self.sha256_of(key), digest, size)
        with open(path, "rb") as body, _mapped(f"put {name}"):
            try:
                self._client.put_object(
                    Bucket=self.bucket, Key=name, Body=body, ContentLength=size,
                    ContentType=mimetypes.guess_type(key)[0] or "application/octet-stream",
                    # The algorithm header too: without it moto (and some
                    # S3-compatibles) do not record the checksum on the object.
                    ChecksumAlgorithm="SHA256",
                    ChecksumSHA256=base64.b64encode(bytes.fromhex(digest)).decode(),
                    IfNoneMatch="*")
                return PutResult(key=key, existed=False)
            except ClientError as exc:
                # 412: someone else wrote the key since our HEAD (or our own
                # earlier attempt succeeded but its response was lost).
                if _code(exc)[0] not in _PRECONDITION_CODES:
                    raise
        return verify_existing(key, self.sha256_of(key), digest, size)

    def exists(self, key: str) -> bool:
        name = self._name(key)
        try:
            with _mapped(f"head {name}"):
                self._client.head_object(Bucket=self.bucket, Key=name)
        except ObjectNotFound:
            return False
        return True

    def open(self, key: str) -> BinaryIO:
        name = self._name(key)
        with _mapped(f"get {name}"):
            body = self._client.get_object(Bucket=self.bucket, Key=name)["Body"]
        return io.BufferedReader(_Stream(body, f"get {name}"), CHUNK)

    def delete(self, key: str) -> None:
        name = self._name(key)
        with _mapped(f"delete {name}"):
            self._client.delete_object(Bucket=self.bucket, Key=name)

    def presigned_url(self, key: str, expires_s: int) -> str | None:
        with _mapped(f"presign {key}"):
            return self._presigner.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._name(key)},
                ExpiresIn=int(expires_s))

    def _checksum(self, name: str) -> tuple[str | None, int, str]:
        """(base64 SHA-256 the store recorded or None, size, ETag) of an object."""
        with _mapped(f"head {name}"):
            head = self._client.head_object(Bucket=self.bucket, Key=name, ChecksumMode="ENABLED")
        return head.get("ChecksumSHA256"), int(head["ContentLength"]), head["ETag"]

    def list_keys(self, prefix: str) -> Iterator[tuple[str, float]]:
        start = self.prefix + prefix
        paginator = self._client.get_paginator("list_objects_v2")
        with _mapped(f"list {start}"):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=start):
                for item in page.get("Contents", ()):
                    yield item["Key"][len(self.prefix):], item["LastModified"].timestamp()

    def copy(self, source_key: str, key: str, *, sha256_hex: str, size: int) -> PutResult:
        digest = check_digest(sha256_hex)
        source, name = self._name(source_key), self._name(key)
        expected = base64.b64encode(bytes.fromhex(digest)).decode()
        # The staged object was put with its SHA-256, which the store keeps:
        # comparing that is a HEAD, not a download.
        checksum, actual_size, etag = self._checksum(source)
        if (checksum, actual_size) != (expected, size):
            found = base64.b64decode(checksum).hex() if checksum else "unknown"
            raise source_mismatch(key, (found, actual_size), digest, size)
        if self.exists(key):
            return verify_existing(key, self.sha256_of(key), digest, size)
        # S3 carries the source's checksum over to a copy that names no
        # algorithm, so the store need not read the bytes again to hash them,
        # and names it in its answer (a store that does not is asked by a
        # HEAD). A store that drops it is asked once more, to compute SHA-256.
        for algorithm in (None, "SHA256"):
            with _mapped(f"copy {source} to {name}"):
                answer = self._client.copy_object(
                    Bucket=self.bucket, Key=name, CopySource={"Bucket": self.bucket, "Key": source},
                    CopySourceIfMatch=etag,
                    ContentType=mimetypes.guess_type(key)[0] or "application/octet-stream",
                    **({"ChecksumAlgorithm": algorithm} if algorithm else {}))
            checksum = answer.get("CopyObjectResult", {}).get("ChecksumSHA256")
            if checksum is None:
                checksum, actual_size, _ = self._checksum(name)
                if actual_size != size:
                    raise StorageUnavailable(f"s3 copy {source} to {name}: the copy has "
                                             f"{actual_size} bytes, not {size}")
            if checksum is not None:
                break
        if checksum != expected:
            raise StorageUnavailable(f"s3 copy {source} to {name}: the copy does not verify")
        return PutResult(key=key, existed=False)

    def check(self) -> None:
        # Any failure means the store is unusable right now, including a
        # missing bucket or bad credentials (fixed by an operator, not code).
        try:
            with _mapped(f"head bucket {self.bucket}"):
                self._client.head_bucket(Bucket=self.bucket)
        except StorageUnavailable:
            raise
        except StorageError as exc:
            raise StorageUnavailable(f"s3 bucket {self.bucket}: {exc}") from exc
