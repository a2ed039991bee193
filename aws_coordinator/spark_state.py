"""Tasks' Spark checkpoint directories kept in S3 (``task.spark.checkpoint.store: aws``, the default on the
``aws`` coordinator), so a stateful task that moves to another machine keeps its operator state.

The mirror, the restore, the layout (``spark-state/<task>/...`` under ``s3://<aws.s3.bucket>/<aws.s3.prefix>``)
and the fence are `weirflow.interfaces.spark_state_mirror`'s, written once for every object store; this module
is only its `ObjectStore` on the job's bucket: one object per name, each call under the suite's retry policy
(`Aws.call`). The manifest is replaced with S3's ``If-Match`` on its ETag (``If-None-Match: *`` when there was
none). S3's ETag is a hash of the content (`S3Objects.content_tags`), so the mirror puts a fresh write id in
each manifest, and its ETag never repeats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from weirflow_aws.clients import Aws, require_bucket
from weirflow_aws.errors import is_condition_failure

from weirflow.base.errors import FencedOffError, error_code
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.spark_state import SparkStateStore, SparkStateStoreFactory
from weirflow.interfaces.spark_state_mirror import ObjectSparkStateStore, ObjectStore

T = TypeVar("T")

_MISSING = ("NoSuchKey", "404", "NotFound")


class S3Objects(ObjectStore):
    """The job's bucket as the mirror's `ObjectStore`: a name is a key under ``aws.s3.prefix``."""

    where = "S3"
    content_tags = True

    def __init__(self, aws: Aws) -> None:
        self._aws = aws

    def _key(self, name: str) -> str:
        return f"{self._aws.settings.s3_prefix}{name}"

    def _call(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        return self._aws.call(operation, f"s3://{self._aws.settings.bucket}/{key}", self._aws.s3_endpoint, fn)

    def read(self, operation: str, name: str) -> tuple[bytes | None, str | None]:
        key = self._key(name)

        def read() -> tuple[bytes | None, str | None]:
            try:
                reply = self._aws.s3.get_object(Bucket=self._aws.bucket(), Key=key)
            except Exception as exc:
                if error_code(exc) in _MISSING:
                    return None, None
                raise
            return reply["Body"].read(), str(reply["ETag"])

        return self._call(operation, key, read)

    def fetch(self, operation: str, name: str) -> bytes:
        bucket, key = self._aws.bucket(), self._key(name)
        return self._call(operation, key, lambda: self._aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    def put(self, operation: str, name: str, data: bytes) -> None:
        bucket, key = self._aws.bucket(), self._key(name)
        self._call(operation, key, lambda: self._aws.s3.put_object(Bucket=bucket, Key=key, Body=data))

    def replace(self, operation: str, name: str, data: bytes, tag: str | None, fenced: FencedOffError) -> str:
        key = self._key(name)
        condition = {"IfMatch": tag} if tag is not None else {"IfNoneMatch": "*"}

        def replace() -> str:
            try:
                reply = self._aws.s3.put_object(Bucket=self._aws.bucket(), Key=key, Body=data, **condition)
            except Exception as exc:
                # a manifest gone since (discarded) fails its If-Match as a missing key: another holder's doing
                if is_condition_failure(exc) or error_code(exc) in _MISSING:
                    raise fenced from exc
                raise
            return str(reply["ETag"])

        return self._call(operation, key, replace)

    def delete(self, operation: str, name: str) -> None:
        key = self._key(name)
        self._call(operation, key, lambda: self._aws.s3.delete_object(Bucket=self._aws.bucket(), Key=key))

    def delete_folder(self, operation: str, folder: str) -> None:
        prefix = self._key(folder)

        def remove_all() -> None:
            bucket = self._aws.bucket()
            pages = self._aws.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                for start in range(0, len(keys), 1000):
                    self._aws.s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000]})

        self._call(operation, prefix, remove_all)

    def close(self) -> None:
        self._aws.close()


class S3SparkStateStore(ObjectSparkStateStore):
    """The mirror on the job's bucket (`S3Objects` over ``aws``)."""

    def __init__(self, aws: Aws) -> None:
        super().__init__(S3Objects(aws))


class S3SparkStateStoreFactory(SparkStateStoreFactory):
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore:
        aws = Aws.from_config(config)
        require_bucket(config, aws.settings)
        return S3SparkStateStore(aws)
