"""The fence on the output side: a Spark task writes a micro-batch only while its processor holds the lock.

The sink's ``write`` runs in Spark's Python workers, which are children of the JVM, not of the processor's
Python process: when that process is paused (SIGSTOP, a long GC, a frozen VM) its Spark keeps running the
task's query. So right before a worker sends anything, and again before every retry of a send, it checks
two things (`Fence.check`) and refuses with `LockLostError` when either fails: the batch fails, nothing more
of it is sent, and the query stops.

1. **The keeper's deadline**, on this machine's monotonic clock. The processor's lease keeper knows, for
   every lock it holds, when the lease may expire at the earliest (`weirflow.coordination.keeper`); the
   runner publishes ``deadline - margin`` of each held lock to a small file (`LeaseBoard`) that the workers
   read. A paused processor publishes nothing, so its workers stop sending at the same moment its keeper
   would have fenced the task, before the lease can expire and anyone else can take it. No store call; the
   workers run on the processor's machine (Spark's local mode), whose monotonic clock is one for every
   process, so no two clocks are compared.
2. **The lock in the store**, in the tenure the query started in (`Lock.is_held_in` its epoch): a lock lost
   or released, and a query its processor abandoned even when the processor took the task back since, are
   refused.

Checked per Arrow batch sent (up to `spark.sql.execution.arrow.maxRecordsPerBatch` rows) and per retry,
never per row: a partition's rows can take long to arrive (a slow transform upstream), and a retry can come
seconds after the first attempt, so one check at the partition's start would not cover what follows.
Between a check and its send lies only that one attempt, which the margin covers.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from weirflow.base.errors import LockLostError

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


@dataclass(frozen=True)
class Fence:
    """The locks a query's sends need, and the file where its processor publishes their deadlines ("":
    none is published, and only the store is asked)."""

    locks: list[LockRef] = field(default_factory=list)
    leases_file: str = ""

    def check(self, snapshot: str) -> None:
        """Raise `LockLostError` unless every lock is within its keeper's deadline and still held in the
        store in the tenure (epoch) the query started in."""
        if self.leases_file:
            valid_until = LeaseBoard.read(self.leases_file)
            now = time.monotonic()
            for ref in self.locks:
                until = valid_until.get(ref.name)
                if until is None or now >= until:
                    raise LockLostError(
                        ref.name,
                        ref.owner,
                        f"lock '{ref.name}' of '{ref.owner}' was not renewed in time (its processor is paused, "
                        "stopping or cut off from the store); the task must stop",
                    )
        for ref in self.locks:
            lock = _coordination_for(snapshot, ref.owner, ref.instance).lock(ref.name)
            if not (lock.is_held_in(ref.epoch) if ref.epoch else lock.is_held()):
                raise LockLostError(ref.name, ref.owner)


def encode(refs: list[LockRef], leases_file: str | Path | None = None) -> str:
    return json.dumps({"locks": [asdict(r) for r in refs], "leases_file": str(leases_file or "")})


def decode(text: str | None) -> Fence:
    data = json.loads(text or "{}")
    return Fence([LockRef(**item) for item in data.get("locks", [])], data.get("leases_file", ""))


class LeaseBoard:
    """The file where a processor publishes, per lock it holds, the monotonic time its sends must stop by
    (the keeper's ``deadline - margin``). Replaced whole on every change (write and rename), so a reader sees
    one version or the next, never a mix."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._published: dict[str, float] | None = None
        self._guard = threading.Lock()

    def publish(self, valid_until: Mapping[str, float]) -> None:
        """Publish ``valid_until`` (lock name -> monotonic s); a lock left out is refused from now on."""
        values = dict(valid_until)
        with self._guard:
            if values == self._published:
                return
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(values))
            os.replace(tmp, self.path)
            self._published = values

    def close(self) -> None:
        with self._guard:
            self.path.unlink(missing_ok=True)
            self._published = None

    @staticmethod
    def read(path: str | Path) -> dict[str, float]:
        """The published deadlines; none (every lock refused) when the file is gone: its processor stopped."""
        try:
            return {str(k): float(v) for k, v in json.loads(Path(path).read_text()).items()}
        except FileNotFoundError:
            return {}


def _coordination_for(snapshot: str, owner: str, instance: str) -> Any:
    key = (snapshot, owner, instance)
    with _lock:
        utils = _coordination.get(key)
        if utils is None:
            from weirflow.config.loader import Config
            from weirflow.interfaces.plugins import coordinator_factory

            config = Config.from_snapshot(snapshot)
            utils = _coordination[key] = coordinator_factory(config).get_coordination_utils(
                config, owner, instance=instance
            )
        return utils
