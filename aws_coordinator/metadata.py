"""`MetadataStore` in S3: ``<aws.s3.prefix>metadata/<key>`` in the job's bucket, the object's ETag as the
document's etag.

Conditions map onto S3's conditional writes, which S3 evaluates atomically: ``if_match`` is
``If-Match: <etag>`` (on puts and deletes), ``if_none_match`` is ``If-None-Match: *``. A failed precondition (412,
or 409 when a concurrent conditional write won) becomes `EtagMismatchError`.

S3's ETag of a single-part object is the MD5 of its body, so the same body written twice would get the same
etag, and a writer holding a stale etag could overwrite a document changed and changed back since. Every body
is therefore an envelope that carries a fresh write id beside the document (``{"write": ..., "value": ...}``):
etags of one key never repeat, as the contract requires.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

from weirflow_aws.clients import Aws
from weirflow_aws.errors import is_condition_failure

from weirflow.base import malformed
from weirflow.base.errors import EtagMismatchError, MalformedDocumentError, error_code
from weirflow.interfaces.metadata import Document, MetadataStore, decode_value

T = TypeVar("T")

FOLDER = "metadata/"
_MISSING = ("NoSuchKey", "404", "NotFound")


def envelope(value: dict[str, Any]) -> bytes:
    return json.dumps({"write": uuid.uuid4().hex, "value": value}).encode()


def unwrap(key: str, raw: bytes) -> dict[str, Any]:
    data = decode_value(key, raw)
    if not isinstance(data, dict) or "value" not in data:
        raise MalformedDocumentError(f"metadata document {key} is not a weirflow document envelope")
    value = data["value"]
    if not isinstance(value, dict):
        raise MalformedDocumentError(f"metadata document {key} holds {type(value).__name__}, not an object")
    return value


class S3MetadataStore(MetadataStore):
    def __init__(self, aws: Aws) -> None:
        self._aws = aws
        self._prefix = aws.settings.s3_prefix + FOLDER

    def start(self) -> None:
        self._aws.bucket()

    def _call(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        resource = f"s3://{self._aws.settings.bucket}/{self._prefix}{key}"
        return self._aws.call(operation, resource, self._aws.s3_endpoint, fn)

    def get(self, key: str) -> Document | None:
        def read() -> tuple[bytes, str] | None:
            try:
                reply = self._aws.s3.get_object(Bucket=self._aws.bucket(), Key=self._prefix + key)
            except Exception as exc:
                if error_code(exc) in _MISSING:
                    return None
                raise
            return reply["Body"].read(), str(reply["ETag"])

        found = self._call("read", key, read)
        if found is None:
            return None
        return Document(key, unwrap(key, found[0]), found[1])

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        kwargs: dict[str, Any] = {"ContentType": "application/json"}
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        elif if_none_match:
            kwargs["IfNoneMatch"] = "*"

        def write() -> str:
            try:
                reply = self._aws.s3.put_object(
                    Bucket=self._aws.bucket(), Key=self._prefix + key, Body=envelope(value), **kwargs
                )
            except Exception as exc:
                if is_condition_failure(exc) or (if_match is not None and error_code(exc) in _MISSING):
                    raise EtagMismatchError(key, if_match) from exc
                raise
            return str(reply["ETag"])

        return self._call("write", key, write)

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        kwargs: dict[str, Any] = {"IfMatch": if_match} if if_match is not None else {}

        def remove() -> None:
            if if_match is not None:
                try:  # S3 deletes a missing key without a word, so a stale etag must be caught here
                    self._aws.s3.head_object(Bucket=self._aws.bucket(), Key=self._prefix + key)
                except Exception as exc:
                    if error_code(exc) in _MISSING:
                        raise EtagMismatchError(key, if_match) from exc
                    raise
            try:
                self._aws.s3.delete_object(Bucket=self._aws.bucket(), Key=self._prefix + key, **kwargs)
            except Exception as exc:
                if is_condition_failure(exc) or (if_match is not None and error_code(exc) in _MISSING):
                    raise EtagMismatchError(key, if_match) from exc
                raise

        self._call("delete", key, remove)

    def list(self, prefix: str = "") -> list[Document]:
        def names() -> list[str]:
            pages = self._aws.s3.get_paginator("list_objects_v2").paginate(
                Bucket=self._aws.bucket(), Prefix=self._prefix + prefix
            )
            return sorted(o["Key"][len(self._prefix) :] for page in pages for o in page.get("Contents", []))

        documents = []
        for key in self._call("list", prefix + "*", names):
            try:
                doc = self.get(key)
            except MalformedDocumentError as exc:  # one unreadable document does not hide the others
                malformed.report(key, exc, action="skipped")
                continue
            if doc is not None:  # deleted between the listing and the read
                documents.append(doc)
        return documents

    def stop(self) -> None:
        self._aws.close()
