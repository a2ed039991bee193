"""Tasks' Spark checkpoint directories kept in Blob Storage (``task.spark.checkpoint.store: azure``, the default
on the Azure coordinator), so a stateful task that moves to another machine keeps its operator state.

Layout, in the job's container::

    spark-state/<task>/files/<path in the Spark checkpoint directory>   one blob per file, sent once
    spark-state/<task>/manifest                                          JSON: batch, epoch, history, files
                                                                         (path -> size), modified (path -> ns)

A mirror sends the files of the committed batch that are not stored yet, then replaces the manifest, then
deletes stored files the new manifest no longer lists (Spark purged them locally). A file is stored when the
manifest lists it with its size and modification time (nanoseconds) in the same Spark history (the query id
in Spark's metadata): a file of another history, or one rewritten under its name (a batch Spark ran again),
is sent again even when its size repeats. A restore gives every file the modification time the manifest
records, so what it fetched is not sent back. A restore reads the
manifest and fetches exactly the files it lists, so a mirror cut short (files sent, manifest not yet
replaced) leaves the previous manifest and its complete set of files in force.

Fencing: the manifest carries the lock epoch of the holder that wrote it, and is replaced with If-Match on
the ETag this store last read or wrote (it reads the manifest once per task, at restore or first mirror); a
holder whose epoch is lower than the stored one is refused (`FencedOffError`) before it sends anything, and a
manifest another holder wrote since makes its replace fail. The
runner mirrors only under a confirmed lease (its self-fence), like every checkpoint write.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

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
from weirflow_azure.coordinator.storage import Storage

T = TypeVar("T")

log = logging.getLogger("weirflow.spark.state")

PREFIX = "spark-state"
_IF_MATCH = MatchConditions.IfNotModified
_THREADS = 8  # files of one batch are sent (and fetched) this many at a time


class BlobSparkStateStore(SparkStateStore):
    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        # task -> the manifest as this store last read or wrote it: ETag, epoch, files (path -> (size, mtime in
        # ns)), Spark history
        self._known: dict[str, tuple[str | None, int, dict[str, tuple[int, int]], str | None]] = {}
        self._pool = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="spark-state")

    def _call(self, operation: str, resource: str, fn: Callable[[], T]) -> T:
        return self._storage.call(operation, resource, self._storage.blob_endpoint, fn)

    @staticmethod
    def _file_blob(task: str, rel: str) -> str:
        return f"{PREFIX}/{task}/files/{rel}"

    @staticmethod
    def _manifest_blob(task: str) -> str:
        return f"{PREFIX}/{task}/manifest"

    def _read_manifest(self, task: str) -> tuple[dict[str, Any] | None, str | None]:
        blob = self._storage.container.get_blob_client(self._manifest_blob(task))

        def read() -> tuple[dict[str, Any] | None, str | None]:
            try:
                downloader = blob.download_blob()
            except ResourceNotFoundError:
                return None, None
            return json.loads(downloader.readall()), downloader.properties.etag

        return self._call("read Spark state manifest", self._manifest_blob(task), read)

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
        # stat before the files are read: a file rewritten meanwhile is recorded older than it is, and sent again
        versions = local_versions(local, committed_files(local, batch))
        # a file of another Spark history is another file, whatever its name and size: send them all
        same = history == stored_history
        sizes = self._send(
            task, local, [rel for rel, version in versions.items() if not same or stored.get(rel) != version]
        )
        for rel in [rel for rel, size in sizes.items() if size < 0]:  # purged by Spark since the listing
            versions.pop(rel, None)
        try:
            manifest = {
                "batch": batch,
                "epoch": epoch,
                "files": {rel: size for rel, (size, _) in versions.items()},
                "modified": {rel: ns for rel, (_, ns) in versions.items()},
                "history": history,
            }
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
        container = self._storage.container

        def send(rel: str) -> int:
            try:
                data = (local / rel).read_bytes()
            except FileNotFoundError:
                return -1
            blob = container.get_blob_client(self._file_blob(task, rel))
            self._call(
                "store Spark state file",
                self._file_blob(task, rel),
                lambda: blob.upload_blob(data, overwrite=True),
            )
            return len(data)

        return dict(zip(names, self._pool.map(send, names), strict=True))

    def _replace_manifest(self, task: str, etag: str | None, epoch: int, manifest: dict[str, Any]) -> str:
        """Create the manifest, or replace the one with ETag ``etag``; a change since is a fence. Returns the
        new ETag."""
        body = json.dumps(manifest).encode()
        blob = self._storage.container.get_blob_client(self._manifest_blob(task))

        def replace() -> str:
            try:
                if etag is None:
                    result = blob.upload_blob(body, overwrite=False)
                else:
                    result = blob.upload_blob(body, overwrite=True, etag=etag, match_condition=_IF_MATCH)
            except (ResourceModifiedError, ResourceExistsError) as exc:
                raise FencedOffError(task, epoch, -1) from exc
            return str(result["etag"])

        return self._call("write Spark state manifest", self._manifest_blob(task), replace)

    def _delete(self, task: str, rel: str) -> None:
        blob = self._storage.container.get_blob_client(self._file_blob(task, rel))

        def remove() -> None:
            try:
                blob.delete_blob()
            except ResourceNotFoundError:
                pass

        self._call("delete Spark state file", self._file_blob(task, rel), remove)

    def restore(self, task: str, local: Path) -> int | None:
        manifest, etag = self._read_manifest(task)
        if manifest is None:
            return None
        history = manifest.get("history")
        self._known[task] = etag, int(manifest.get("epoch", 0)), manifest_versions(manifest), history
        batch = int(manifest["batch"])
        have = last_committed_batch(local) if local.exists() else None
        # a local directory as far on is kept only if it is the same history: batch numbers of two histories
        # say nothing about each other (a directory left from before a drain, or before the task moved away)
        if have is not None and have >= batch and (history is None or history_of(local) == history):
            return batch
        began = time.monotonic()
        staging = local.with_name(local.name + ".restoring")
        shutil.rmtree(staging, ignore_errors=True)
        container = self._storage.container
        modified = manifest.get("modified", {})

        def fetch(rel: str) -> int:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            blob = container.get_blob_client(self._file_blob(task, rel))
            data = self._call(
                "fetch Spark state file", self._file_blob(task, rel), lambda: blob.download_blob().readall()
            )
            target.write_bytes(data)
            if rel in modified:  # as stored: the next mirror sends only what changes from here
                os.utime(target, ns=(int(modified[rel]), int(modified[rel])))
            return len(data)

        fetched = sum(self._pool.map(fetch, manifest["files"]))
        shutil.rmtree(local, ignore_errors=True)
        staging.rename(local)
        log.info(
            "task %s: restored its Spark state as of batch %d from Blob Storage (%d files, %d bytes, "
            "%.2f s; local copy was at %s)",
            task,
            batch,
            len(manifest["files"]),
            fetched,
            time.monotonic() - began,
            have,
        )
        return batch

    def discard(self, task: str) -> None:
        container = self._storage.container

        def remove_all() -> None:
            for blob in container.list_blobs(name_starts_with=f"{PREFIX}/{task}/"):
                try:
                    container.delete_blob(blob.name)
                except ResourceNotFoundError:
                    pass

        self._call("delete Spark state of", f"{PREFIX}/{task}/", remove_all)
        self._known.pop(task, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self._storage.close()


class BlobSparkStateStoreFactory(SparkStateStoreFactory):
    def get_spark_state_store(self, config: ConfigView) -> SparkStateStore:
        return BlobSparkStateStore(Storage.from_config(config))
