"""Which deployment a processor belongs to: the job's run id, chosen per deployment when the config sets none.

A run id names one deployment of a job (docs/drain.md): drain notifications, drain control messages and the
``drained`` mark of a task's checkpoint all carry it, so a drained job started again under a *new* run id reads
on from its cut, while the same run id finishes at once. Samza's runner makes a new run id for every deployment;
a job config that has to name one by hand (`app.run.id`) invites the forgetful upgrade: drain, change the job,
start it again with the old run id, and watch it finish at once without reading anything.

So without `app.run.id` the run id lives in the job's metadata store, in the document ``run``::

    {"format": 1, "run-id": "r20261127T013000-3fa2", "deployment": "<fingerprint>", "started-ms": ...,
     "ended": null, "previous-run-id": "default", "previous-deployment": "<fingerprint>"}

and every processor resolves its run when it starts (`resolve_run`):

* no record yet: the job's first deployment, run id ``default`` (the run id of every job before this record
  existed, so their checkpoints keep their meaning);
* the recorded run has not ended: adopt it (another processor of this deployment, or a restart);
* it ended (the leader marks it when every task drained or finished, `mark_ended`) and this processor's
  deployment is the one that ended: adopt it, and the job finishes at once, as a restarted drained deployment
  always did (a container platform restarting a drained replica does not start the old code again);
* it ended and this is another deployment (new code or config): start a new run. Two processors starting at once
  race on the document's etag; the loser adopts the winner's run.
* the recorded run is a successor of this processor's ended deployment: this processor is an old replica that
  outlived its upgrade. It is told so (`RunDecision.superseded`) and exits 0 without touching the new run.

A *deployment* is what `deployment_of` fingerprints: `app.deployment.id` when set (on Container Apps, the
revision), else this weirflow's version, the job's config (but for the keys that differ between processors of
one deployment: ``processor.*``, ``endpoints.*``, ``job.state.dir``) and the source of the job's code (the module
of `app.pipeline` or `task.function`, or every module of its top-level package).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from weirflow.base import clock, malformed
from weirflow.base.errors import EtagMismatchError, InvalidArgumentError, MalformedDocumentError
from weirflow.base.version import __version__
from weirflow.config.loader import Config
from weirflow.interfaces.metadata import Document, MetadataStore
from weirflow.job.drain_notice import DEFAULT_RUN_ID
from weirflow.job.user_code import make_importable

log = logging.getLogger("weirflow.job.runs")

RUN_KEY = "run"
RUN_RECORD_SOURCE = "<the job's run record>"  # where a resolved run id came from (`weirflow config` shows it)
FORMAT = 1
# Keys that may differ between the processors of one deployment (where each listens, its id, its disk).
_PER_PROCESS = ("processor.", "endpoints.", "job.state.dir", "app.run.id", "app.deployment.id")
_CODE_KEYS = ("app.pipeline", "task.function")


@dataclass(frozen=True)
class RunRecord:
    """The job's current run: ``ended`` is None while it runs, else ``drained`` or ``finished``."""

    run_id: str
    deployment: str
    started_ms: int
    ended: str | None = None
    previous_run_id: str | None = None
    previous_deployment: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "run-id": self.run_id,
            "deployment": self.deployment,
            "started-ms": self.started_ms,
            "ended": self.ended,
            "previous-run-id": self.previous_run_id,
            "previous-deployment": self.previous_deployment,
        }

    @classmethod
    def from_json(cls, data: Any) -> RunRecord:
        if not isinstance(data, dict) or not isinstance(data.get("run-id"), str) or not data["run-id"]:
            raise MalformedDocumentError(f"not a run record: a non-empty run-id is needed in {data!r:.200}")
        ended = data.get("ended")
        if ended not in (None, "drained", "finished"):
            raise MalformedDocumentError(f"not a run record: ended {ended!r:.60} is not drained or finished")
        return cls(
            run_id=data["run-id"],
            deployment=str(data.get("deployment", "")),
            started_ms=int(data.get("started-ms", 0)),
            ended=ended,
            previous_run_id=data.get("previous-run-id"),
            previous_deployment=data.get("previous-deployment"),
        )


@dataclass(frozen=True)
class RunDecision:
    """What `resolve_run` chose: the run id to run under, how it was chosen (for the log), and whether this
    processor's deployment was superseded by an upgrade (then it must not run)."""

    run_id: str
    how: str
    superseded: bool = False


def current_run_id(config: Config, metadata: MetadataStore) -> str:
    """The run a command addresses (`weirflow drain`, `status`): the config's `app.run.id`, else the recorded
    run (``default`` before any processor started)."""
    explicit = config.get("app.run.id")
    return str(explicit) if explicit else RunBook(metadata).current()


def new_run_id() -> str:
    """A fresh run id: readable (when it was made) and unique (a random suffix)."""
    return "r" + datetime.now(UTC).strftime("%Y%m%dT%H%M%S") + "-" + uuid.uuid4().hex[:6]


def deployment_of(config: Config) -> str:
    """The fingerprint of the deployment ``config`` describes: `app.deployment.id` when set, else a digest of
    weirflow's version, the job-wide config and the job's code (see the module's docstring)."""
    explicit = config.get("app.deployment.id")
    if explicit:
        return str(explicit)
    digest = hashlib.sha256()
    digest.update(f"weirflow {__version__}\n".encode())
    values = {k: v for k, v in config.effective().items() if not k.startswith(_PER_PROCESS)}
    digest.update(json.dumps(values, sort_keys=True, default=str).encode())
    for path in _code_files(config):
        digest.update(f"\n{path.name}\n".encode())
        digest.update(path.read_bytes())
    return "sha256:" + digest.hexdigest()[:16]


def _code_files(config: Config) -> list[Path]:
    """The source files of the job's code: the module named by `app.pipeline` / `task.function`, or every
    ``.py`` file of its top-level package. Nothing is imported but parent packages (`importlib.util.find_spec`)."""
    files: set[Path] = set()
    for key in _CODE_KEYS:
        target = config.get(key)
        if not target or ":" not in str(target):
            continue
        top = str(target).split(":", 1)[0].split(".", 1)[0]
        make_importable(config)
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None or not spec.has_location:
            continue
        origin = Path(spec.origin)
        if spec.submodule_search_locations:  # a package: all of it
            files.update(p for p in origin.parent.rglob("*.py") if "__pycache__" not in p.parts)
        else:
            files.add(origin)
    return sorted(files)


class RunBook:
    """Reads and writes the ``run`` record of one job's metadata store."""

    def __init__(self, metadata: MetadataStore) -> None:
        self._metadata = metadata

    def read(self) -> tuple[RunRecord | None, Document | None]:
        """The record and its document; (None, None) when none was written. A malformed record is reported and
        read as none (the next processor to start writes a good one over it)."""
        try:
            document = self._metadata.get(RUN_KEY)
        except MalformedDocumentError as exc:
            malformed.report(RUN_KEY, exc, action="read as no run recorded")
            return None, None
        if document is None:
            return None, None
        try:
            return RunRecord.from_json(document.value), document
        except (MalformedDocumentError, TypeError, ValueError) as exc:
            malformed.report(RUN_KEY, exc, document.value, action="read as no run recorded")
            return None, document

    def current(self) -> str:
        """The run id a job without `app.run.id` runs under now (``default`` before any processor started)."""
        record, _ = self.read()
        return record.run_id if record is not None else DEFAULT_RUN_ID

    def resolve(self, deployment: str, explicit: str | None = None) -> RunDecision:
        """The run a processor of ``deployment`` joins (see the module's docstring). ``explicit``: the config's
        `app.run.id`, which always wins; it is recorded when no run is recorded or the recorded one ended (so
        `weirflow drain` without a run id finds it), never over a run still going."""
        for _ in range(10):  # each retry follows another processor's write: a handful settles any start
            record, document = self.read()
            etag = document.etag if document is not None else None
            if explicit:
                if record is not None and (record.run_id == explicit or record.ended is None):
                    return RunDecision(explicit, "set by app.run.id")  # recorded, or another run still going
                chosen = RunRecord(explicit, deployment, clock.now_ms(), None, *_previous(record))
                if self._write(chosen, etag):
                    return RunDecision(explicit, "set by app.run.id")
                continue
            if record is None:
                if self._write(RunRecord(DEFAULT_RUN_ID, deployment, clock.now_ms()), etag):
                    return RunDecision(DEFAULT_RUN_ID, "the job's first run")
                continue
            if record.ended is None:
                if record.previous_deployment == deployment and record.deployment != deployment:
                    return RunDecision(record.run_id, f"superseded by run {record.run_id}", superseded=True)
                return RunDecision(record.run_id, "joined the running deployment")
            if record.deployment == deployment:
                return RunDecision(record.run_id, f"this deployment's run ({record.ended})")
            fresh = RunRecord(new_run_id(), deployment, clock.now_ms(), None, record.run_id, record.deployment)
            if self._write(fresh, etag):
                return RunDecision(fresh.run_id, f"a new deployment after run {record.run_id} {record.ended}")
        raise EtagMismatchError(RUN_KEY, None)  # ten writes by others while this one chose: not a start-up race

    def start_next(
        self, drained: str, drained_deployment: str, run_id: str | None = None, deployment: str = ""
    ) -> RunRecord:
        """Record the run after run ``drained`` (`weirflow upgrade`, once it drained): processors of
        ``drained_deployment`` that start again are then superseded, and every other one joins ``run_id`` (made
        up when None). `InvalidArgumentError` when another run than ``drained`` is recorded (it started since)."""
        record, document = self.read()
        if record is not None and record.run_id != drained:
            raise InvalidArgumentError(
                f"the job now runs as run {record.run_id}, not {drained}: it started after the drain "
                "(see `weirflow status`); nothing was changed"
            )
        if record is not None:
            drained_deployment = record.deployment
        fresh = RunRecord(run_id or new_run_id(), deployment, clock.now_ms(), None, drained, drained_deployment)
        if not self._write(fresh, document.etag if document is not None else None):
            raise EtagMismatchError(RUN_KEY, document.etag if document is not None else None)
        return fresh

    def mark_ended(self, run_id: str, how: str) -> None:
        """Record that run ``run_id`` drained or finished (the leader, once every task is done). A record of
        another run is left alone: a newer run started meanwhile."""
        record, document = self.read()
        if record is None or document is None or record.run_id != run_id or record.ended == how:
            return
        ended = dataclasses.replace(record, ended=how)
        try:
            self._metadata.put(RUN_KEY, ended.to_json(), if_match=document.etag)
        except EtagMismatchError:  # someone recorded a newer run: that one has not ended
            log.info("run record changed while marking run %r %s; left as it is", run_id, how)

    def _write(self, record: RunRecord, etag: str | None) -> bool:
        try:
            if etag is None:
                self._metadata.put(RUN_KEY, record.to_json(), if_none_match=True)
            else:
                self._metadata.put(RUN_KEY, record.to_json(), if_match=etag)
        except EtagMismatchError:
            return False
        return True


def _previous(record: RunRecord | None) -> tuple[str | None, str | None]:
    """(previous run id, previous deployment) of a run recorded after ``record``: the drained deployment when it
    ended, else what it superseded (a new explicit run id while the old still runs supersedes nothing)."""
    if record is None:
        return None, None
    if record.ended is not None:
        return record.run_id, record.deployment
    return record.previous_run_id, record.previous_deployment
