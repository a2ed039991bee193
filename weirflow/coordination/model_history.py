"""Why and when tasks last moved: the leader's record of its job model publications, the JSON document
``job-model-history`` in the MetadataStore (docs/endpoints.md, "Status page and metrics").

The job model says where tasks run now, not how they got there; after a failover the status page must show
that a processor went silent and which tasks moved where. The leader knows both at the moment it publishes:
the processors it counts now against the model's, and the old and new assignment. It records them right
after the model, through the same fenced store (`LeaderDuties._publish`), in a document of its own, so the
model every processor polls stays small and its format unchanged. The store has no transactions across
documents: a leader that loses its lease or its store between the two writes leaves one publication
unrecorded, which the history shows as a gap in the versions, never as a change that did not happen.

Only the leader writes it, conditionally on the etag it read. Shape::

    {"format": 1,
     "failovers": 3,                    # publications caused by a processor that went silent, since the job began
     "changes": [                       # the last `KEEP` publications, oldest first
       {"version": 7,                   # the job model version published
        "at_ms": 1763820221000,         # epoch ms of publication (the model's created_ms)
        "leader": "p1",                 # who published it
        "reason": {"joined": ["p2"],    # processors counted now that the previous model did not have
                   "left": [],          # processors that said they stopped (STOPPING, STOPPED, FAILED)
                   "silent": ["p0"],    # processors silent past the liveness timeout (`went_silent`)
                   "latch_timed_out": false},  # republished because a processor never joined the latch
        "moved": {"main-3": ["p0", "p1"]}}]}   # task -> [previous owner, new owner]; null: none
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from weirflow.base import malformed
from weirflow.base.errors import EtagMismatchError, MalformedDocumentError
from weirflow.coordination.state import went_silent
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.interfaces.metadata import MetadataStore
from weirflow.job.model import JobModel

log = logging.getLogger("weirflow.leader")

HISTORY_KEY = "job-model-history"
FORMAT = 1
KEEP = 20  # changes kept: enough to see a burst of failovers, small enough to read on every status request


@dataclass(frozen=True)
class ModelChange:
    """One publication of the job model: why (``joined``, ``left``, ``silent``, ``latch_timed_out``) and which
    tasks moved (task -> (previous owner, new owner), None for no owner)."""

    version: int
    at_ms: int
    leader: str
    joined: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    silent: tuple[str, ...] = ()
    latch_timed_out: bool = False
    moved: dict[str, tuple[str | None, str | None]] = field(default_factory=dict)

    @property
    def failover(self) -> bool:
        """A processor went silent: its tasks moved without it handing them over."""
        return bool(self.silent)

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "at_ms": self.at_ms,
            "leader": self.leader,
            "reason": {
                "joined": list(self.joined),
                "left": list(self.left),
                "silent": list(self.silent),
                "latch_timed_out": self.latch_timed_out,
            },
            "moved": {task: list(self.moved[task]) for task in sorted(self.moved)},
        }

    @classmethod
    def from_json(cls, data: Any) -> ModelChange:
        try:
            reason = data["reason"]
            moved = {}
            for task, pair in data["moved"].items():
                before, after = pair
                moved[_text(task)] = (_owner(before), _owner(after))
            return cls(
                _integer(data["version"]),
                _integer(data["at_ms"]),
                _text(data["leader"]),
                _names(reason["joined"]),
                _names(reason["left"]),
                _names(reason["silent"]),
                bool(reason["latch_timed_out"]),
                moved,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise MalformedDocumentError(f"malformed job model change {data!r:.200}: {exc}") from exc


@dataclass(frozen=True)
class ModelHistory:
    """The last `KEEP` changes, oldest first, and the count of failovers since the job began."""

    changes: tuple[ModelChange, ...] = ()
    failovers: int = 0

    def with_change(self, change: ModelChange, keep: int = KEEP) -> ModelHistory:
        """This history with ``change`` recorded; a change of a version already recorded (a publication retried
        after a lost response) replaces it and is not counted twice."""
        earlier = [c for c in self.changes if c.version != change.version]
        counted = any(c.version == change.version and c.failover for c in self.changes)
        failovers = self.failovers + (1 if change.failover and not counted else 0)
        return ModelHistory(tuple([*earlier, change][-keep:]), failovers)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "failovers": self.failovers, "changes": [c.to_json() for c in self.changes]}

    @classmethod
    def from_json(cls, data: Any) -> ModelHistory:
        """The history of a stored document; `MalformedDocumentError` for anything else."""
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise MalformedDocumentError(f"job model history is not a format-{FORMAT} JSON object: {data!r:.200}")
        changes = data.get("changes")
        if not isinstance(changes, list):
            raise MalformedDocumentError(f"job model history: changes must be a JSON array, not {changes!r:.100}")
        try:
            failovers = _integer(data.get("failovers"))
        except (TypeError, ValueError) as exc:
            raise MalformedDocumentError(f"job model history: {exc}") from exc
        return cls(tuple(ModelChange.from_json(c) for c in changes), failovers)


def describe_change(
    old: JobModel,
    new: JobModel,
    rows: list[ProcessorInfo],
    liveness_timeout_ms: int,
    latch_timed_out: bool = False,
) -> ModelChange:
    """What publishing ``new`` in place of ``old`` changed, given the registry ``rows`` the leader read: the
    processors that joined, left or went silent (a processor of ``old`` the registry no longer lists left: only
    the leader removes rows, long after it stopped counting them), and every task whose owner changed."""
    by_id = {row.processor_id: row for row in rows}
    before, after = set(old.processors), set(new.processors)
    gone = sorted(before - after)
    silent = tuple(p for p in gone if p in by_id and went_silent(by_id[p], new.created_ms, liveness_timeout_ms))
    moved = {
        task: (old.owner_of(task), new.owner_of(task))
        for task in sorted(set(old.tasks) | set(new.tasks))
        if old.owner_of(task) != new.owner_of(task)
    }
    return ModelChange(
        new.version,
        new.created_ms,
        new.leader,
        joined=tuple(sorted(after - before)),
        left=tuple(p for p in gone if p not in silent),
        silent=silent,
        latch_timed_out=latch_timed_out,
        moved=moved,
    )


def read_history_or_report(store: MetadataStore) -> tuple[ModelHistory, str | None]:
    """The stored history and its etag; an empty one before the first record. A malformed document is reported
    (`weirflow.base.malformed`) and read as empty: the next publication's record replaces it."""
    try:
        document = store.get(HISTORY_KEY)
    except MalformedDocumentError as exc:  # not JSON
        malformed.report(HISTORY_KEY, exc, action=_MALFORMED_ACTION)
        return ModelHistory(), None
    if document is None:
        return ModelHistory(), None
    try:
        return ModelHistory.from_json(document.value), document.etag
    except MalformedDocumentError as exc:
        malformed.report(HISTORY_KEY, exc, document.value, action=_MALFORMED_ACTION)
        return ModelHistory(), document.etag


_MALFORMED_ACTION = "read as empty: the leader's next job model publication replaces it"


def record_change(store: MetadataStore, change: ModelChange) -> ModelHistory:
    """Add ``change`` to the stored history, conditionally on the etag read (one retry after a concurrent
    write: only a deposed leader's could be one); returns the history written. Raises what the store raises
    (`EtagMismatchError` after the retry, `LockLostError` from the leader's fence)."""
    for attempt in (1, 2):
        history, etag = read_history_or_report(store)
        updated = history.with_change(change)
        try:
            if etag is None:
                store.put(HISTORY_KEY, updated.to_json(), if_none_match=True)
            else:
                store.put(HISTORY_KEY, updated.to_json(), if_match=etag)
            return updated
        except EtagMismatchError:
            if attempt == 2:
                raise
            log.warning("job model history changed while recording v%d; re-reading", change.version)
    raise AssertionError("unreachable")


def _integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedDocumentError(f"{value!r:.100} is not an integer")
    return value


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise MalformedDocumentError(f"{value!r:.100} is not a string")
    return value


def _owner(value: Any) -> str | None:
    return None if value is None else _text(value)


def _names(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise MalformedDocumentError(f"{value!r:.100} is not a list of processor ids")
    return tuple(_text(v) for v in value)
