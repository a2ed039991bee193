"""The fence on the output side: a Spark task writes a micro-batch only while its processor holds the lock.

The sink's ``write`` runs in Spark's Python workers, which are children of the JVM, not of the processor's
Python process: when that process is paused (SIGSTOP, a long GC, a frozen VM) its Spark keeps running the
task's query. So before a worker sends anything of a batch, it asks the coordination backend itself whether
the lock of every task the query runs is still held by the processor run that started the query (the pair
owner and instance; a holder keeps its epoch while it holds the lock), and refuses the batch with
`LockLostError` when one is not: the batch fails, nothing of it was sent, and the query stops.

One check per task per Arrow batch sent (up to `spark.sql.execution.arrow.maxRecordsPerBatch` rows): a
partition's rows can take long to arrive (a slow transform upstream), and the lock can move meanwhile, so a
check at the partition's start would not cover its later sends. A small read per batch, never per row.
Between a check and its send lie only the send itself; the next holder can take the lock only once the lease
expired, and then still has to start its query before it writes.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass
from typing import Any

from weirflow.errors import LockLostError

_lock = threading.Lock()
_coordination: dict[tuple[str, str, str], Any] = {}


@dataclass(frozen=True)
class LockRef:
    """What a worker needs to ask whether the query's processor still holds a task's lock."""

    name: str
    owner: str
    instance: str
    epoch: int

    @classmethod
    def of(cls, lock: Any) -> LockRef:
        return cls(lock.name, lock.owner, str(getattr(lock, "instance", "") or ""), int(getattr(lock, "epoch", 0)))


def encode(refs: list[LockRef]) -> str:
    return json.dumps([asdict(r) for r in refs])


def decode(text: str | None) -> list[LockRef]:
    return [LockRef(**item) for item in json.loads(text or "[]")]


def _coordination_for(snapshot: str, owner: str, instance: str) -> Any:
    key = (snapshot, owner, instance)
    with _lock:
        utils = _coordination.get(key)
        if utils is None:
            from weirflow.config.loader import Config
            from weirflow.factories import coordinator_factory

            config = Config.from_snapshot(snapshot)
            utils = _coordination[key] = coordinator_factory(config).get_coordination_utils(
                config, owner, instance=instance
            )
        return utils


def check(snapshot: str, refs: list[LockRef]) -> None:
    """Raise `LockLostError` unless every lock in ``refs`` is still held by its holder, in the tenure (epoch)
    the query started in: a query its processor abandoned is refused even after the processor took the task
    back."""
    for ref in refs:
        lock = _coordination_for(snapshot, ref.owner, ref.instance).lock(ref.name)
        if not (lock.is_held_in(ref.epoch) if ref.epoch else lock.is_held()):
            raise LockLostError(ref.name, ref.owner)
