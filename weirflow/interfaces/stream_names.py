"""How streams are named: a stream id resolved to its system and physical name, and the name of its dead letters.

A *stream id* is the name used in config and code (`streams.<id>.*`); its *physical name* is what the system
calls it (`streams.<id>.physical.name`, default the id). Its system is `streams.<id>.system`, default
`job.default.system` (itself `local` by default, the embedded SQLite log). A pipeline's intermediate stream
resolves differently (`stream_ref`), and every stream's dead letters go to `dead_letter_stream`.

These naming rules live here and only here (`stream_ref`, `stream_id_of`, `dead_letter_stream`,
`dead_letter_ref`): the CLI, the planners, the Spark source and sink and the plugins all call them, so a stream
is never found under one name by one component and written under another by the next. Pure functions of
config, and a public helper for plugins (docs/architecture.md, "The dependency rule").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemStream


@dataclass(frozen=True)
class StreamRef:
    """A stream id resolved: ``system`` (config name) and ``physical`` (name on the system)."""

    stream_id: str
    system: str
    physical: str

    @property
    def system_stream(self) -> SystemStream:
        return SystemStream(self.system, self.physical)


def stream_ref(config: ConfigView, stream_id: str, *, intermediate: bool = False) -> StreamRef:
    """Stream id -> system and physical name: the one rule.

    A declared stream is on `streams.<id>.system` (default `job.default.system`) and called
    `streams.<id>.physical.name` (default the id). An ``intermediate`` stream (a pipeline's ``partition_by``)
    is on `job.intermediate.system` (default `job.default.system`) and called `streams.<id>.physical.name`
    (default ``<job.name>-<job.id>-<id>``: weirflow creates and owns it, so two jobs must not share it).
    """
    physical = config.get(f"streams.{stream_id}.physical.name")
    if intermediate:
        system = config.get("job.intermediate.system") or config.get("job.default.system")
        physical = physical or f"{config.get('job.name')}-{config.get('job.id')}-{stream_id}"
    else:
        system = config.get(f"streams.{stream_id}.system") or config.get("job.default.system")
        physical = physical or stream_id
    return StreamRef(stream_id, system, physical)


def declared_streams(config: ConfigView) -> list[StreamRef]:
    """Every stream declared under `streams.<id>`, resolved by `stream_ref`."""
    return [stream_ref(config, stream_id) for stream_id in config.names("streams")]


def stream_id_of(refs: Iterable[StreamRef], system: str, physical: str) -> str:
    """The inverse of `stream_ref` over ``refs``: the id of the stream called ``physical`` on ``system``. A
    stream none of them names is its own id (its physical name), as an undeclared stream id is."""
    for ref in refs:
        if ref.system == system and ref.physical == physical:
            return ref.stream_id
    return physical


DEAD_LETTER_SUFFIX = ".dlq"


def dead_letter_stream(physical: str) -> str:
    """Physical name of the dead-letter stream of the stream called ``physical``: ``<physical>.dlq``, on the
    same system and partition. The planner creates it for every input, the source and the sink write to it
    and `weirflow streams consume` reads it, so all of them must spell it this one way."""
    return f"{physical}{DEAD_LETTER_SUFFIX}"


def dead_letter_ref(config: ConfigView, stream_id: str) -> StreamRef | None:
    """The dead-letter stream that ``<id>.dlq`` names when ``<id>`` is a declared stream and ``<id>.dlq`` is not
    declared itself: on ``<id>``'s system, called `dead_letter_stream` of its physical name. None otherwise."""
    base = stream_id.removesuffix(DEAD_LETTER_SUFFIX)
    declared = config.names("streams")
    if base == stream_id or stream_id in declared or base not in declared:
        return None
    ref = stream_ref(config, base)
    return StreamRef(stream_id, ref.system, dead_letter_stream(ref.physical))
