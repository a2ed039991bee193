"""Coordination primitives: `LeaderElector`, `Latch`, `Lock`, `ProcessorRegistry`, and their factory.

The job-coordination protocol (`weirflow.coordination`) is written once against these interfaces; the
embedded backend implements them on SQLite (`weirflow.local`), the Azure suite on lease blobs and Table rows.

Design rules every implementation keeps:

* **No background threads inside a primitive.** Renewals are driven by the caller (the processor's lease
  keeper), so a failure surfaces in the processor's state instead of dying in a hidden timer.
* **Leases are time-bounded.** A holder that stops renewing loses the lease after ``lease_ms``; another
  owner can then take it. A holder learns of a loss on its next ``renew`` (returns False) or ``is_held``.
* **Owners are strings** (the processor id). Calls are idempotent for the same owner.
* Transient backend failures are retried inside the implementation with bounded backoff; what still fails
  is raised (`ServiceUnavailableError` naming the endpoint), never swallowed.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from typing import Any

from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.timings import CoordinationTimings


class LeaderElector(ABC):
    """One leader per job, chosen by whoever takes a lease first.

    Example (what the processor's lease keeper does)::

        if elector.try_become_leader():      # takes the free/expired lease, or renews our own
            ...act as leader...
        # every renew interval while leading:
        if not elector.renew():
            ...step down at once...
        elector.resign()                      # on stop: frees the lease so a successor need not wait
    """

    @abstractmethod
    def try_become_leader(self) -> bool:
        """Take the leadership lease if nobody holds it (or its lease expired); if we already hold it, renew it.
        Return whether this owner is the leader now. Never blocks for longer than one backend round trip."""

    @abstractmethod
    def renew(self) -> bool:
        """Extend our lease. Return False (and stop being leader) if we no longer hold it."""

    @abstractmethod
    def resign(self) -> None:
        """Give up the lease if we hold it. Idempotent."""

    @property
    @abstractmethod
    def is_leader(self) -> bool:
        """What the last call established (no round trip)."""

    @abstractmethod
    def current_leader(self) -> str | None:
        """The owner of the unexpired lease, or None (a round trip; for status and tests)."""

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        """End the leadership lease at once if (``owner``, ``instance``) holds it; whether it was ended. Called
        only for a holder silent past the liveness timeout (self-fenced by then), so that a dead leader is
        replaced without waiting for its lease to expire. A backend that cannot break leases keeps this
        default: the lease then expires as usual."""
        return False


class Lock(ABC):
    """A named lease held by one owner: one per task, taken before a task starts and checked as a fence
    before every checkpoint write.

    ``try_acquire`` is non-blocking and re-entrant for the same holder. ``is_held`` asks the backend (it is
    the fence: a paused process that lost its lease must learn it here before writing anything).

    The holder is the pair (``owner``, ``instance``): the processor id and the id of this run of it, so two
    processes started with one processor id are two holders and never both hold a lease.

    ``epoch`` is the **fencing token** of the current tenure, set by a successful ``try_acquire``: strictly
    greater than the epoch of every earlier tenure of this lock name, whoever held it; an acquire by the
    holder that already has it (unexpired) keeps it, and an acquire after a release or an expiry starts a new
    tenure even for the same holder; 0 before the first acquire. Checkpoint writes carry it
    (`weirflow.interfaces.checkpoint.Checkpoint.epoch`), so a store refuses a late write of an older holder.
    """

    name: str
    owner: str
    instance: str = ""
    epoch: int = 0

    @abstractmethod
    def try_acquire(self) -> bool: ...

    @abstractmethod
    def renew(self) -> bool:
        """Extend the lease; False when it is no longer ours."""

    @abstractmethod
    def release(self) -> None:
        """Free the lease if ours. Idempotent."""

    @abstractmethod
    def is_held(self) -> bool: ...

    def is_held_in(self, epoch: int) -> bool:
        """Whether this holder holds the lock in tenure ``epoch``: the fence of a writer that knows the tenure
        it started in (a Spark worker of a query), which must be refused once that tenure ended, even when the
        same holder took the lock back since. A backend that keeps epochs answers from its store; this default
        only asks `is_held`, which the lock contract (`weirflow.testing`) finds too weak."""
        return self.is_held()

    def current_holder(self) -> str | None:
        """The owner of the unexpired lease, or None (a round trip). None also when the backend cannot tell."""
        return None

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        """End the lease at once if (``owner``, ``instance``) holds it; whether it was ended. Called only for a
        holder silent past the liveness timeout (self-fenced by then: `weirflow.coordination.keeper`), so its
        tasks move without waiting for its leases to expire. A backend that cannot break leases keeps this
        default: the lease then expires as usual."""
        return False


class LatchState(str, enum.Enum):
    OPEN = "open"
    COMPLETE = "complete"
    TIMED_OUT = "timed_out"


class Latch(ABC):
    """A barrier for the processors of one job-model version.

    Participants ``join``; the leader watches ``participants()`` and calls ``complete()`` once every expected
    processor joined, or ``time_out()`` after the latch timeout (then it publishes a new version). Processors
    wait for ``state()`` to leave OPEN. Joining twice is harmless; ``complete``/``time_out`` are final (the
    first one wins).
    """

    name: str

    @abstractmethod
    def join(self, participant: str) -> None: ...

    @abstractmethod
    def participants(self) -> set[str]: ...

    @abstractmethod
    def complete(self) -> None: ...

    @abstractmethod
    def time_out(self) -> None: ...

    @abstractmethod
    def state(self) -> LatchState: ...


@dataclass
class ProcessorInfo:
    """A processor's row in the registry. JSON/table shape = these fields.

    * ``processor_id`` — unique per process lifetime (`processor.id` or ``<host>-<pid>-<random>``)
    * ``host``, ``pid`` — where it runs
    * ``state`` — `ProcessorState` value (NEW, STARTED, IN_REBALANCE, RUNNING, STOPPING, STOPPED, FAILED)
    * ``job_model_version`` — the model it runs (-1 before the first)
    * ``tasks`` — task names it runs now
    * ``endpoint`` — advertised ``http://host:port`` or ""
    * ``heartbeat_ms`` — epoch ms of the last heartbeat. The writer sets its own clock; a registry whose store
      has a clock (Table Storage) returns it **on the reader's clock, measured by the store's**: the reader's
      now minus the age the store measured, so hosts whose clocks disagree still agree on who is alive
    * ``started_ms`` — epoch ms it registered (joined the group), returned the same way
    * ``error`` — last error in a background thread, or ""
    * ``instance`` — the id of this run of the processor (a process started with the same ``processor_id``
      has another one), or ""
    * ``beat`` — how many heartbeats this run wrote: it changes with every write, so a reader can tell a
      writing process from a dead one without comparing anybody's clock
    """

    processor_id: str
    host: str
    pid: int
    state: str
    job_model_version: int = -1
    tasks: list[str] = field(default_factory=list)
    endpoint: str = ""
    heartbeat_ms: int = 0
    started_ms: int = 0
    error: str = ""
    instance: str = ""
    beat: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> ProcessorInfo:
        """The row of a stored JSON object (unknown fields ignored); `MalformedDocumentError` when it is not one
        of a processor: ``processor_id``, ``host``, ``pid`` and ``state`` missing, or a field of the wrong type
        (a registry reader skips such a row and reports it, `weirflow.base.malformed`)."""
        if not isinstance(data, dict):
            raise MalformedDocumentError(f"processor row is not a JSON object: {data!r:.200}")
        row = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        missing = [name for name in ("processor_id", "host", "pid", "state") if name not in row]
        if missing:
            raise MalformedDocumentError(f"processor row lacks {', '.join(missing)}: {data!r:.200}")
        for name, value in row.items():
            expected = _ROW_TYPES[name]
            if expected is list:
                good = isinstance(value, list) and all(isinstance(t, str) for t in value)
            else:
                good = isinstance(value, expected) and not isinstance(value, bool)
            if not good:
                raise MalformedDocumentError(
                    f"processor row field {name} must be {_ROW_TYPE_NAMES[expected]}, not {value!r:.100}"
                )
        return cls(**row)


_ROW_TYPES: dict[str, type] = {
    "processor_id": str,
    "host": str,
    "pid": int,
    "state": str,
    "job_model_version": int,
    "tasks": list,
    "endpoint": str,
    "heartbeat_ms": int,
    "started_ms": int,
    "error": str,
    "instance": str,
    "beat": int,
}
_ROW_TYPE_NAMES: dict[type, str] = {str: "a string", int: "an integer", list: "a list of task names"}


class ProcessorRegistry(ABC):
    """Who is alive. Contract:
    * ``heartbeat(info)`` upserts the row (``info.heartbeat_ms`` is set by the caller, on its clock).
    * ``processors()`` returns every row, live or not, sorted by processor id, with ``heartbeat_ms`` and
      ``started_ms`` on the reader's clock (`weirflow.base.clock.now_ms`). A backend whose store stamps writes
      measures ages on that clock and converts (see `ProcessorInfo`); one that cannot returns the writer's
      values, and then its processors' clocks must agree to well under the liveness timeout (the embedded
      backend: one host, one clock).
    * ``unregister`` removes a row; idempotent.
    Liveness is decided by the reader, by the protocol's one rule (`weirflow.coordination.state.is_live`:
    heard from within the liveness timeout and not STOPPING, STOPPED or FAILED); a backend never decides it.
    """

    @abstractmethod
    def heartbeat(self, info: ProcessorInfo) -> None: ...

    @abstractmethod
    def processors(self) -> list[ProcessorInfo]: ...

    @abstractmethod
    def unregister(self, processor_id: str) -> None: ...


class CoordinationUtils(ABC):
    """The primitives of one job (`job.name` + `job.id`) for one owner (the processor id).

    Names passed to ``lock``/``latch`` are ``[A-Za-z0-9._-]+``; implementations map them onto their
    resources. ``close`` releases connections (not leases: resign/release do that).
    """

    @abstractmethod
    def leader_elector(self) -> LeaderElector: ...

    @abstractmethod
    def lock(self, name: str) -> Lock: ...

    @abstractmethod
    def latch(self, name: str) -> Latch: ...

    @abstractmethod
    def processor_registry(self) -> ProcessorRegistry: ...

    def close(self) -> None:
        """Release connections. Idempotent."""


class JobCoordinatorFactory(ABC):
    """Named by `job.coordinator.factory` (aliases ``local``, ``azure``); constructed with no arguments.

    ``owner`` is the processor id, or a read-only observer name (``weirflow status``); ``instance`` the id of
    this run of the processor: leases are held by the pair (see `Lock`). ``timings`` are the protocol's
    timings as the core read them from ``config`` (lease duration, renew margin...): a backend sizes its leases
    and checks its own deadlines against them. None when a caller opens one backend alone (a tool, a contract
    test): the backend reads them from ``config`` (`CoordinationTimings.from_config`) if it needs them."""

    @abstractmethod
    def get_coordination_utils(
        self, config: ConfigView, owner: str, instance: str = "", timings: CoordinationTimings | None = None
    ) -> CoordinationUtils: ...


def latch_name(version: int) -> str:
    """The name of the latch on which the processors of job model ``version`` say they run it."""
    return f"jobmodel-{version}"


def task_lock_name(task: str) -> str:
    """The name of the lock a processor holds while it runs ``task``: part of the contract, since a backend's
    checkpoint store may fence its writes by that lock's tenure (the embedded one does)."""
    return f"task-{task}"
