"""Tasks' Spark checkpoint directories kept in S3 (``task.spark.checkpoint.store: aws``, the default on the
``aws`` coordinator), so a stateful task that moves to another machine keeps its operator state.

Layout, under ``s3://<aws.s3.bucket>/<aws.s3.prefix>``::

    spark-state/<task>/files/<path in the Spark checkpoint directory>   one object per file, sent once
    spark-state/<task>/manifest                                          JSON: batch, epoch, history, files
                                                                         (path -> size), modified (path -> ns)

A mirror sends the files of the committed batch that are not stored yet, then replaces the manifest, then
deletes stored files the new manifest no longer lists (Spark purged them locally). A file is stored when the
manifest lists it with its size and modification time in the same Spark history; a restore gives every file
the modification time the manifest records, so what it fetched is not sent back. A restore reads the manifest
and fetches exactly the files it lists, so a mirror cut short (files sent, manifest not yet replaced) leaves
the previous manifest and its complete set of files in force.

Fencing: the manifest carries the lock epoch of the holder that wrote it, and is replaced with S3's
``If-Match`` on the ETag this store last read or wrote (``If-None-Match: *`` when there was none); a holder whose
epoch is lower than the stored one is refused (`FencedOffError`) before it sends anything, and a manifest
another holder wrote since makes its replace fail. Each manifest carries a fresh write id, so its ETag never
repeats. The runner mirrors only under a confirmed lease (its self-fence), like every checkpoint write.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from weirflow_aws.clients import Aws, require_bucket
from weirflow_aws.errors import error_code, is_condition_failure

from weirflow.base.errors import FencedOffError
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.spark_checkpoint import (
    committed_files,
    history_of,
    last_committed_batch,
    local_versions,
    manifest_versions,
)
from weirflow.interfaces.spark_state import MirrorReport, SparkStateStore, SparkStateStoreFactory

T = TypeVar("T")

log = logging.getLogger("weirflow.spark.state")

FOLDER = "spark-state"
_THREADS = 8  # files of one batch are sent (and fetched) this many at a time
_MISSING = ("NoSuchKey", "404", "NotFound")

Known = tuple[str | None, int, dict[str, tuple[int, int]], str | None]


class S3SparkStateStore(SparkStateStore):
    def __init__(self, aws: Aws) -> None:
        self._aws = aws
        # task -> the manifest as this store last read or wrote it: ETag, epoch, files (path -> (size, mtime in
        # ns)), Spark history
        self._known: dict[str, Known] = {}
        self._pool = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="spark-state")

    def _key(self, task: str, rest: str) -> str:
        return f"{self._aws.settings.s3_prefix}{FOLDER}/{task}/{rest}"

    def _call(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        return self._aws.call(operation, f"s3://{self._aws.settings.bucket}/{key}", self._aws.s3_endpoint, fn)

    def _read_manifest(self, task: str) -> tuple[dict[str, Any] | None, str | None]:
        key = self._key(task, "manifest")

        def read() -> tuple[dict[str, Any] | None, str | None]:
            try:
                reply = self._aws.s3.get_object(Bucket=self._aws.bucket(), Key=key)
            except Exception as exc:
                if error_code(exc) in _MISSING:
                    return None, None
                raise
            return json.loads(reply["Body"].read()), str(reply["ETag"])

        return self._call("read Spark state manifest", key, read)

    def mirror(self, task: str, local: Path, batch: int, epoch: int) -> MirrorReport:
        """The manifest is read only when this store has not read or written it yet: after that its ETag is
        known, and a manifest someone else wrote since fails the If-Match of the replace (the fence)."""
        began = time.monotonic()
        known = self._known.get(task)
        if known is None:
            manifest, etag = self._read_manifest(task)
            manifest = manifest or {}
            known = etag, int(manifest.get("epoch", 0)), manifest_versions(manifest), manifest.get("history")
        etag, stored_epoch, stored, stored_history = known
        if stored_epoch > epoch:
            raise FencedOffError(task, epoch, stored_epoch)
        history = history_of(local)
        versions = local_versions(local, committed_files(local, batch))
        same = history == stored_history
        sizes = self._send(
            task, local, [rel for rel, version in versions.items() if not same or stored.get(rel) != version]
        )
        for rel in [rel for rel, size in sizes.items() if size < 0]:  # purged by Spark since the listing
            versions.pop(rel, None)
        manifest = {
            "batch": batch,
            "epoch": epoch,
            "files": {rel: size for rel, (size, _) in versions.items()},
            "modified": {rel: ns for rel, (_, ns) in versions.items()},
            "history": history,
            "write": uuid.uuid4().hex,
        }
        try:
            written = self._replace_manifest(task, etag, epoch, manifest)
        except FencedOffError:
            self._known.pop(task, None)
            raise
        gone = [rel for rel in stored if rel not in versions]
        list(self._pool.map(lambda rel: self._delete(task, rel), gone))
        self._known[task] = written, epoch, versions, history
        sent = [size for size in sizes.values() if size >= 0]
        return MirrorReport(len(sent), sum(sent), len(gone), time.monotonic() - began)

    def _send(self, task: str, local: Path, names: list[str]) -> dict[str, int]:
        """Upload ``names`` (relative to ``local``) at most `_THREADS` at a time; size sent per name, -1 for a
        file that is gone (Spark's maintenance purged it since the listing)."""
        bucket = self._aws.bucket()

        def send(rel: str) -> int:
            try:
                data = (local / rel).read_bytes()
            except FileNotFoundError:
                return -1
            key = self._key(task, f"files/{rel}")
            self._call(
                "store Spark state file", key, lambda: self._aws.s3.put_object(Bucket=bucket, Key=key, Body=data)
            )
            return len(data)

        return dict(zip(names, self._pool.map(send, names), strict=True))

    def _replace_manifest(self, task: str, etag: str | None, epoch: int, manifest: dict[str, Any]) -> str:
        key = self._key(task, "manifest")
        condition = {"IfMatch": etag} if etag is not None else {"IfNoneMatch": "*"}

        def replace() -> str:
            try:
                reply = self._aws.s3.put_object(
                    Bucket=self._aws.bucket(), Key=key, Body=json.dumps(manifest).encode(), **condition
                )
            except Exception as exc:
                if is_condition_failure(exc) or error_code(exc) in _MISSING:
                    raise FencedOffError(task, epoch, -1) from exc
                raise
            return str(reply["ETag"])

        return self._call("write Spark state manifest", key, replace)

    def _delete(self, task: str, rel: str) -> None:
        key = self._key(task, f"files/{rel}")
        self._call(
            "delete Spark state file", key, lambda: self._aws.s3.delete_object(Bucket=self._aws.bucket(), Key=key)
        )

    def restore(self, task: str, local: Path) -> int | None:
        manifest, etag = self._read_manifest(task)
        if manifest is None:
            return None
        history = manifest.get("history")
        self._known[task] = etag, int(manifest.get("epoch", 0)), manifest_versions(manifest), history
        batch = int(manifest["batch"])
        have = last_committed_batch(local) if local.exists() else None
        # a local directory as far on is kept only if it is the same history (see the Azure store's reasons)
        if have is not None and have >= batch and (history is None or history_of(local) == history):
            return batch
        began = time.monotonic()
        staging = local.with_name(local.name + ".restoring")
        shutil.rmtree(staging, ignore_errors=True)
        bucket = self._aws.bucket()
        modified = manifest.get("modified", {})

        def fetch(rel: str) -> int:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            key = self._key(task, f"files/{rel}")
            data = self._call(
                "fetch Spark state file",
                key,
                lambda: self._aws.s3.get_object(Bucket=bucket, Key=key)["Body"].read(),
            )
            target.write_bytes(data)
            if rel in modified:  # as stored: the next mirror sends only what changes from here
                os.utime(target, ns=(int(modified[rel]), int(modified[rel])))
            return len(data)

        fetched = sum(self._pool.map(fetch, manifest["files"]))
        shutil.rmtree(local, ignore_errors=True)
        staging.rename(local)
        log.info(
            "task %s: restored its Spark state as of batch %d from S3 (%d files, %d bytes, %.2f s; local copy "
            "was at %s)",
            task,
            batch,
            len(manifest["files"]),
            fetched,
            time.monotonic() - began,
            have,
        )
        return batch

    def discard(self, task: str) -> None:
        prefix = self._key(task, "")

        def remove_all() -> None:
            bucket = self._aws.bucket()
            pages = self._aws.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            for page in pages:
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                for start in range(0, len(keys), 1000):
                    self._aws.s3.delete_objects(Bucket=bucket, Delete={"Objects": keys[start : start + 1000]})

        self._call("delete Spark state of", prefix, remove_all)
        self._known.pop(task, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._aws.close()


class S3SparkStateStoreFactory(SparkStateStoreFactory):
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore:
        aws = Aws.from_config(config)
        require_bucket(config, aws.settings)
        return S3SparkStateStore(aws)
