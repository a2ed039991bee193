"""The versioned job model: which tasks exist (with their SSPs) and which processor runs each.

Stored as the JSON document ``job-model`` in the MetadataStore; only the leader writes it. Shape::

    {"format": 1,                       # document format; readers reject others
     "version": 7,                      # increases by one per publication
     "created_ms": 1763820000000,       # epoch ms of publication
     "leader": "host-4242-a1b2c3",      # who published it
     "tasks": {"main-0": {"stage": "main",
                          "ssps": [{"system": "local", "stream": "page-views", "partition": 0}]}},
     "assignment": {"host-4242-a1b2c3": ["main-0"]}}   # processor id -> sorted task names
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.system import SystemStreamPartition

FORMAT = 1


@dataclass(frozen=True)
class TaskModel:
    name: str
    stage: str
    ssps: tuple[SystemStreamPartition, ...]

    def to_json(self) -> dict[str, Any]:
        return {"stage": self.stage, "ssps": [s.to_json() for s in self.ssps]}


@dataclass(frozen=True)
class JobModel:
    version: int
    tasks: dict[str, TaskModel] = field(default_factory=dict)
    assignment: dict[str, tuple[str, ...]] = field(default_factory=dict)
    created_ms: int = 0
    leader: str = ""

    @classmethod
    def empty(cls) -> JobModel:
        return cls(version=0)

    @property
    def processors(self) -> tuple[str, ...]:
        return tuple(sorted(self.assignment))

    def tasks_of(self, processor_id: str) -> tuple[str, ...]:
        return self.assignment.get(processor_id, ())

    def owner_of(self, task: str) -> str | None:
        for processor, tasks in self.assignment.items():
            if task in tasks:
                return processor
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": self.version,
            "created_ms": self.created_ms,
            "leader": self.leader,
            "tasks": {name: self.tasks[name].to_json() for name in sorted(self.tasks)},
            "assignment": {p: sorted(self.assignment[p]) for p in sorted(self.assignment)},
        }

    @classmethod
    def from_json(cls, data: Any) -> JobModel:
        """The model of a stored document; `MalformedDocumentError` for anything that is not one of this format
        (the processor then keeps the model it has: `weirflow.coordination.processor`)."""
        if not isinstance(data, dict):
            raise MalformedDocumentError(f"job model document is not a JSON object: {data!r:.200}")
        if data.get("format") != FORMAT:
            raise MalformedDocumentError(
                f"job model document has format {data.get('format')!r:.100}; this weirflow reads {FORMAT}"
            )
        try:
            tasks = {
                _text(name, "task name"): TaskModel(
                    name,
                    _text(_field(t, "stage"), "stage"),
                    tuple(SystemStreamPartition.from_json(s) for s in _list(_field(t, "ssps"), "ssps")),
                )
                for name, t in _object(data["tasks"], "tasks").items()
            }
            assignment = {
                _text(p, "processor id"): tuple(sorted(_text(t, "task name") for t in _list(ts, "assigned tasks")))
                for p, ts in _object(data["assignment"], "assignment").items()
            }
            model = cls(
                _integer(data["version"], "version"),
                tasks,
                assignment,
                _integer(data["created_ms"], "created_ms"),
                _text(data["leader"], "leader"),
            )
        except MalformedDocumentError:
            raise
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError) as exc:
            raise MalformedDocumentError(f"malformed job model document: missing or bad field {exc}") from exc
        seen: dict[str, str] = {}
        for processor, names in assignment.items():
            for name in names:
                if name in seen:
                    raise MalformedDocumentError(
                        f"malformed job model: task {name} assigned to {seen[name]} and {processor}"
                    )
                if name not in tasks:
                    raise MalformedDocumentError(
                        f"malformed job model: {processor} is assigned unknown task {name}"
                    )
                seen[name] = processor
        return model


def _field(value: Any, name: str) -> Any:
    return _object(value, "task")[name]


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise MalformedDocumentError(f"malformed job model: {what} must be a JSON object, not {value!r:.100}")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise MalformedDocumentError(f"malformed job model: {what} must be a JSON array, not {value!r:.100}")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise MalformedDocumentError(f"malformed job model: {what} must be a string, not {value!r:.100}")
    return value


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedDocumentError(f"malformed job model: {what} must be an integer, not {value!r:.100}")
    return value
