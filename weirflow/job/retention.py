"""The streams a job reads back whole, checked against their systems' retention when a processor starts.

Two kinds of stream are written by the job and read back by it, and nothing else holds what they hold: a record
task's table **changelogs** (`weirflow.tasks.record_tables`: a task that starts rebuilds its table from them)
and a pipeline's **intermediate streams** (`partition_by`: every row from one stage to the next). A system that
deletes records after a retention period (Kinesis: 24 hours unless raised; Event Hubs: the hub's retention)
deletes them whether or not a task has read them. A task stopped, failing or behind for longer then rebuilds a
table without the rows it lost, or the next stage computes without rows it never saw, and nothing reports it:
table state lost, results changed, the exactly-once contract broken (docs/guarantees.md).

So `check_retention` refuses to start a processor with such a stream on a system whose admin says it may drop
records (`SystemAdmin.retention`), with a config error naming ``systems.<name>.retention.loss.allowed`` and what
to do, unless that key accepts the risk; then it logs a warning per stream, naming it, its system and its
retention, at every start. The key is per system because the decision is: whether that system's retention
(how its operators set it) outlasts the longest a task of the job may ever be stopped or behind.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import Retention
from weirflow.job.systems import StreamRef, Systems

log = logging.getLogger("weirflow.job.retention")

GUIDE = 'docs/guarantees.md, "Streams read back whole"'


def allowed_key(system: str) -> str:
    """The key accepting that ``system`` may drop records of streams the job reads back whole."""
    return f"systems.{system}.retention.loss.allowed"


@dataclass(frozen=True)
class ReadBackStream:
    """A stream the job writes and must read back whole. ``what`` names it for people ("the changelog of table
    'x'"), ``placed_by`` is the key that puts it on its system, and ``loss`` what dropped records cost ("the
    table then loses rows")."""

    ref: StreamRef
    what: str
    placed_by: str
    loss: str


def check_retention(config: ConfigView, systems: Systems, streams: Iterable[ReadBackStream]) -> None:
    """Raise a `ConfigError` naming ``systems.<name>.retention.loss.allowed`` of the first system that may drop
    records of ``streams`` and does not set it; log a WARNING for each such stream of a system that does. Asks
    each stream's admin (`SystemAdmin.retention`), before the stream is created: a refused job creates nothing."""
    dropping: dict[str, list[tuple[ReadBackStream, Retention]]] = {}
    for stream in streams:
        retention = systems.admin(stream.ref.system).retention(stream.ref.physical)
        if retention is not None:
            dropping.setdefault(stream.ref.system, []).append((stream, retention))
    for system, found in dropping.items():
        key = allowed_key(system)
        if not config.get(key):
            raise config.error(key, _refusal(system, found))
        for stream, retention in found:
            log.warning(
                "%s ('%s') is on system '%s', which %s: a task stopped or behind for longer loses its records "
                "before reading them, and %s, without any error; allowed by %s (%s)",
                stream.what,
                stream.ref.physical,
                system,
                retention,
                stream.loss,
                key,
                GUIDE,
            )


def _refusal(system: str, found: list[tuple[ReadBackStream, Retention]]) -> str:
    streams = "; ".join(
        f"{s.what} ('{s.ref.physical}', on '{system}' by {s.placed_by}) {retention}" for s, retention in found
    )
    losses = "; ".join(dict.fromkeys(s.loss for s, _ in found))
    placed_by = " or ".join(sorted({s.placed_by for s, _ in found}))
    return (
        f"is not set to true, and system '{system}' may drop records of a stream this job must read back whole: "
        f"{streams}. It drops them whether or not a task has read them, so a task stopped or behind for longer "
        f"loses them without any error: {losses}. Put the stream on a system that keeps every record "
        f"({placed_by}), or raise the stream's retention past the longest a task may ever be stopped or behind "
        f"and set {allowed_key(system)}: true to accept the rest of the risk ({GUIDE})"
    )
