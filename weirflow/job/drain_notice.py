"""Drain notifications: the request, written to the job's metadata store, that a running deployment drain.

A drain stops a pipeline with nothing in flight (docs/drain.md): sources stop at a cut, every open window is
emitted, intermediate streams are read to the end, and every task writes a final checkpoint. The
request is a `DrainNotification` document under ``drain/<uuid>`` in the `MetadataStore` (SQLite or Blob
Storage), so every processor of the job sees it with one small read per poll. It names the deployment it is
meant for (``run_id``, the job's `app.run.id`): a notification for another run is ignored, so a drained job
restarted under a new run id for its upgrade is not drained again by the old request.

`DrainUtils` writes, reads and removes notifications (named after Samza's ``DrainUtils``); the leader removes the
notification of its run once every task drained. A malformed document under ``drain/`` (not a notification of
this format: ``{}``, a field of the wrong type) is reported once (`weirflow.base.malformed`) and skipped by every
read: it neither drains the job nor fails the processors that poll for notifications.
"""

from __future__ import annotations

import enum
import uuid as uuid_module
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weirflow.base import clock, malformed
from weirflow.base.errors import InvalidArgumentError, MalformedDocumentError
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.metadata import MetadataStore

PREFIX = "drain/"
DEFAULT_RUN_ID = "default"
FORMAT = 1


class DrainMode(str, enum.Enum):
    """How to drain. ``DEFAULT``: stop taking input at a cut, flush every window and pending state, stop."""

    DEFAULT = "DEFAULT"


def run_id_of(config: ConfigView) -> str:
    """The deployment's run id: `app.run.id`, or ``default`` when it is unset. A processor's config carries the
    run it resolved at start (`weirflow.job.runs`); a command's, where the config sets none, is read from the job's
    run record (`weirflow.job.runs.current_run_id`)."""
    return str(config.get("app.run.id") or DEFAULT_RUN_ID)


def drain_flag_path(config: ConfigView) -> Path:
    """The local file a processor creates once it has seen a drain notification for its deployment; the Spark
    sources of its input streams (which run in processes of their own on the same host) fix their drain cut at
    their next planned batch once it exists. One per job and run id on a host: every processor of the
    deployment there drains anyway."""
    job = f"{config.get('job.name')}-{config.get('job.id')}"
    return Path(config.state_dir()) / "drain" / f"{job}.{run_id_of(config)}.draining"


@dataclass(frozen=True)
class DrainNotification:
    """One drain request: ``uuid`` names it, ``run_id`` the deployment it is for, ``created_ms`` when it was
    written (epoch ms, the writer's clock; informational)."""

    uuid: str
    run_id: str
    mode: DrainMode = DrainMode.DEFAULT
    created_ms: int = 0

    @classmethod
    def create(cls, run_id: str, mode: DrainMode = DrainMode.DEFAULT) -> DrainNotification:
        if not run_id:
            raise InvalidArgumentError("a drain notification needs the run id of the deployment to drain")
        return cls(uuid_module.uuid4().hex, run_id, mode, clock.now_ms())

    @property
    def key(self) -> str:
        return f"{PREFIX}{self.uuid}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "uuid": self.uuid,
            "run-id": self.run_id,
            "mode": self.mode.value,
            "created-ms": self.created_ms,
        }

    @classmethod
    def from_json(cls, data: Any) -> DrainNotification:
        """The notification of a stored document; `MalformedDocumentError` for anything that is not one (the
        ``uuid`` and ``run-id`` strings are required; ``mode`` and ``created-ms`` default)."""
        if not isinstance(data, dict):
            raise MalformedDocumentError(f"not a drain notification: a JSON object is needed, not {data!r:.200}")
        missing = [name for name in ("uuid", "run-id") if not isinstance(data.get(name), str) or not data[name]]
        if missing:
            raise MalformedDocumentError(
                f"not a drain notification: {' and '.join(missing)} must be non-empty strings in {data!r:.200}"
            )
        created = data.get("created-ms", 0)
        if isinstance(created, bool) or not isinstance(created, int):
            raise MalformedDocumentError(f"not a drain notification: created-ms {created!r:.90} is no integer")
        try:
            mode = DrainMode(data.get("mode", DrainMode.DEFAULT.value))
        except ValueError as exc:
            mode_text = f"{data.get('mode')!r:.100}"
            raise MalformedDocumentError(f"not a drain notification: mode {mode_text} is unknown") from exc
        return cls(uuid=data["uuid"], run_id=data["run-id"], mode=mode, created_ms=created)


class DrainUtils:
    """Write, read and clean up drain notifications in one job's metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    def write(self, run_id: str, mode: DrainMode = DrainMode.DEFAULT) -> DrainNotification:
        """Ask deployment ``run_id`` to drain; returns the notification written (a new uuid each call)."""
        notification = DrainNotification.create(run_id, mode)
        self._metadata.put(notification.key, notification.to_json(), if_none_match=True)
        return notification

    def all(self) -> list[DrainNotification]:
        """Every notification stored, oldest first (one listing of the ``drain/`` prefix). A malformed document
        is reported (`weirflow.base.malformed.report`, logged once) and left out."""
        found = []
        for doc in self._metadata.list(PREFIX):
            try:
                found.append(DrainNotification.from_json(doc.value))
            except MalformedDocumentError as exc:
                malformed.report(doc.key, exc, doc.value, action="skipped (it drains nothing)")
        return sorted(found, key=lambda n: (n.created_ms, n.uuid))

    def for_run(self, run_id: str) -> DrainNotification | None:
        """The oldest notification for deployment ``run_id``, or None: what a processor of that run acts on."""
        return next((n for n in self.all() if n.run_id == run_id), None)

    def cleanup(self, notification: DrainNotification | None = None, *, run_id: str | None = None) -> int:
        """Remove one notification, or every one for ``run_id``; returns how many were removed."""
        if notification is not None:
            targets = [notification]
        elif run_id is not None:
            targets = [n for n in self.all() if n.run_id == run_id]
        else:
            raise InvalidArgumentError("cleanup needs a notification or a run id")
        for target in targets:
            self._metadata.delete(target.key)
        return len(targets)
