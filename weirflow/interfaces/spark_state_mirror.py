"""`SparkStateStore` over any object store: public, for plugins that keep tasks' Spark state in one.

A backend implements one small thing, an object store (`ObjectStore`: read, fetch, put, replace under a
condition, delete, with its SDK's calls, its retry policy and its error table); the mirror and the restore are
the same algorithm over every such store, kept here once, in the interfaces, so that a plugin (the Azure suite
on block blobs, the AWS suite on S3) builds its `SparkStateStore` from it without importing core
(docs/architecture.md, "The dependency rule"), and the layout and the fence cannot drift apart between backends.

Layout, under the store's root (the job's container; ``<aws.s3.prefix>`` in the job's bucket)::

    spark-state/<task>/files/<path in the Spark checkpoint directory>   one object per file, sent once
    spark-state/<task>/manifest                                          JSON: batch, epoch, history, files
                                                                         (path -> size), modified (path -> ns)

A mirror sends the files of the committed batch that are not stored yet, then replaces the manifest, then
deletes stored files the new manifest no longer lists (Spark purged them locally). A file is stored when the
manifest lists it with its size and modification time (nanoseconds) in the same Spark history (the query id
in Spark's metadata): a file of another history, or one rewritten under its name (a batch Spark ran again),
is sent again even when its size repeats. A restore gives every file the modification time the manifest
records, so what it fetched is not sent back. A restore reads the manifest and fetches exactly the files it
lists, so a mirror cut short (files sent, manifest not yet replaced) leaves the previous manifest and its
complete set of files in force.

Fencing: the manifest carries the lock epoch of the holder that wrote it, and is replaced on the condition that
its tag (ETag) is still the one this store last read or wrote (it reads the manifest once per task, at restore
or first mirror; that there is none, when it read none); a holder whose epoch is lower than the stored one is
refused (`FencedOffError`) before it sends anything, and a manifest another holder wrote since makes its
replace fail. That needs a tag that never repeats: a store whose tags are hashes of the bytes
(`ObjectStore.content_tags`) gets a fresh write id in each manifest. The runner mirrors only under a confirmed
lease (its self-fence), like every checkpoint write.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from abc import ABC, abstractmethod
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from weirflow.base.errors import FencedOffError
from weirflow.interfaces.spark_checkpoint import (
    committed_files,
    history_of,
    last_committed_batch,
    local_versions,
    manifest_versions,
)
from weirflow.interfaces.spark_state import MirrorReport, SparkStateStore

log = logging.getLogger("weirflow.spark.state")

FOLDER = "spark-state"
_THREADS = 8  # files of one batch are sent (and fetched) this many at a time

# the manifest as a store last read or wrote it: tag, epoch, files (path -> (size, mtime in ns)), Spark history
Known = tuple[str | None, int, dict[str, tuple[int, int]], str | None]


class ObjectStore(ABC):
    """The job's objects in one store, named by their path under its root (the layout above). Each method is
    one call to the service under the backend's retry policy, named ``operation`` in its logs, errors and
    metrics; an error not named here is raised as the backend's error table maps it. Called from several
    threads at once."""

    where: str = ""  # the store as a log line names it ("Blob Storage", "S3")
    content_tags: bool = False  # whether an object's tag is a hash of its bytes (S3's ETag), so may repeat

    @abstractmethod
    def read(self, operation: str, name: str) -> tuple[bytes | None, str | None]:
        """The bytes of ``name`` and its tag, or ``(None, None)`` when there is no such object."""

    @abstractmethod
    def fetch(self, operation: str, name: str) -> bytes:
        """The bytes of ``name``, which a manifest lists: a missing object is an error."""

    @abstractmethod
    def put(self, operation: str, name: str, data: bytes) -> None:
        """Write ``data`` as ``name``, replacing any object of that name."""

    @abstractmethod
    def replace(self, operation: str, name: str, data: bytes, tag: str | None, fenced: FencedOffError) -> str:
        """Write ``data`` as ``name`` only while its tag is ``tag`` (only while there is none, when ``tag`` is
        None), and return the new tag. When the condition fails, raise ``fenced`` from the service's error: the
        store decides which of its answers mean that another writer came first."""

    @abstractmethod
    def delete(self, operation: str, name: str) -> None:
        """Delete ``name``; nothing happens when there is no such object."""

    @abstractmethod
    def delete_folder(self, operation: str, folder: str) -> None:
        """Delete every object whose name starts with ``folder``."""

    @abstractmethod
    def close(self) -> None:
        """Release clients. Idempotent."""


class ObjectSparkStateStore(SparkStateStore):
    """Tasks' Spark checkpoint directories as objects of ``objects`` (the layout and the fence above)."""

    def __init__(self, objects: ObjectStore) -> None:
        self.objects = objects
        # task -> the manifest as this store last read or wrote it
        self._known: dict[str, Known] = {}
        self._pool = ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="spark-state")

    @staticmethod
    def _file(task: str, rel: str) -> str:
        return f"{FOLDER}/{task}/files/{rel}"

    @staticmethod
    def _manifest(task: str) -> str:
        return f"{FOLDER}/{task}/manifest"

    def _read_manifest(self, task: str) -> tuple[dict[str, Any] | None, str | None]:
        data, tag = self.objects.read("read Spark state manifest", self._manifest(task))
        if data is None:
            return None, None
        return json.loads(data), tag

    def mirror(self, task: str, local: Path, batch: int, epoch: int) -> MirrorReport:
        """The manifest is read only when this store has not read or written it yet: after that its tag is
        known, and a manifest someone else wrote since fails the condition of the replace (the fence)."""
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
        manifest = {
            "batch": batch,
            "epoch": epoch,
            "files": {rel: size for rel, (size, _) in versions.items()},
            "modified": {rel: ns for rel, (_, ns) in versions.items()},
            "history": history,
        }
        if self.objects.content_tags:  # else two equal manifests have one tag, and a stale condition holds
            manifest["write"] = uuid.uuid4().hex
        try:
            written = self.objects.replace(
                "write Spark state manifest",
                self._manifest(task),
                json.dumps(manifest).encode(),
                etag,
                FencedOffError(task, epoch, -1),
            )
        except FencedOffError:
            self._known.pop(task, None)
            raise
        gone = [rel for rel in stored if rel not in versions]
        list(
            self._pool.map(lambda rel: self.objects.delete("delete Spark state file", self._file(task, rel)), gone)
        )
        self._known[task] = written, epoch, versions, history
        sent = [size for size in sizes.values() if size >= 0]
        return MirrorReport(len(sent), sum(sent), len(gone), time.monotonic() - began)

    def _send(self, task: str, local: Path, names: list[str]) -> dict[str, int]:
        """Upload ``names`` (relative to ``local``) at most `_THREADS` at a time; size sent per name, -1 for a
        file that is gone (Spark's maintenance purged it since the listing)."""

        def send(rel: str) -> int:
            try:
                data = (local / rel).read_bytes()
            except FileNotFoundError:
                return -1
            self.objects.put("store Spark state file", self._file(task, rel), data)
            return len(data)

        return dict(zip(names, self._pool.map(send, names), strict=True))

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
        modified = manifest.get("modified", {})

        def fetch(rel: str) -> int:
            target = staging / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            data = self.objects.fetch("fetch Spark state file", self._file(task, rel))
            target.write_bytes(data)
            if rel in modified:  # as stored: the next mirror sends only what changes from here
                os.utime(target, ns=(int(modified[rel]), int(modified[rel])))
            return len(data)

        fetched = sum(self._pool.map(fetch, manifest["files"]))
        shutil.rmtree(local, ignore_errors=True)
        staging.rename(local)
        log.info(
            "task %s: restored its Spark state as of batch %d from %s (%d files, %d bytes, %.2f s; local copy "
            "was at %s)",
            task,
            batch,
            self.objects.where,
            len(manifest["files"]),
            fetched,
            time.monotonic() - began,
            have,
        )
        return batch

    def discard(self, task: str) -> None:
        self.objects.delete_folder("delete Spark state of", f"{FOLDER}/{task}/")
        self._known.pop(task, None)

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.objects.close()
