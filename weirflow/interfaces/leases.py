"""`LeaderElector` and `Lock` over any backend's named lease: public, for coordination backends.

A backend implements one small thing, a lease (`Lease`: acquire, renew, release, held, holder for one owner);
the leader election and task locks every backend offers are the same thin layer over it, kept here once, in
the interfaces, so that a backend (the embedded one in `weirflow.local`, a plugin such as the Azure suite)
builds its `CoordinationUtils` from it without importing the protocol (docs/architecture.md, "The dependency
rule").
"""

from __future__ import annotations

from typing import Protocol

from weirflow.interfaces.coordination import LeaderElector, Lock


class Lease(Protocol):
    """One named, time-bounded lease seen by one owner."""

    owner: str
    instance: str
    epoch: int  # the fencing token of our tenure, set by a successful acquire (see `Lock.epoch`)

    def acquire(self) -> bool:
        """Take it if free or expired, or extend it if ours; whether we hold it now. A new tenure gets an
        epoch greater than every earlier tenure's; an acquire by the holder that has it keeps its epoch."""

    def renew(self) -> bool:
        """Extend it; False when it is no longer ours."""

    def release(self) -> None:
        """Free it if ours. Idempotent."""

    def held(self, epoch: int | None = None) -> bool:
        """Ask the backend whether it is ours and unexpired (the fence), and in tenure ``epoch`` when given."""

    def holder(self) -> str | None:
        """Owner of the unexpired lease, or None."""

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        """End the lease at once if its unexpired holder is (``owner``, ``instance``), so another can take it
        without waiting for it to expire; whether it was ended. The caller has established that this holder is
        silent past the liveness timeout (`weirflow.coordination.silence`), hence self-fenced."""


class LeaseLeaderElector(LeaderElector):
    def __init__(self, lease: Lease) -> None:
        self._lease = lease
        self._leader = False

    def try_become_leader(self) -> bool:
        self._leader = self._lease.acquire()
        return self._leader

    def renew(self) -> bool:
        self._leader = self._lease.renew()
        return self._leader

    def resign(self) -> None:
        self._lease.release()
        self._leader = False

    @property
    def is_leader(self) -> bool:
        return self._leader

    def current_leader(self) -> str | None:
        return self._lease.holder()

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        return self._lease.break_if_held_by(owner, instance)


class LeaseLock(Lock):
    def __init__(self, name: str, lease: Lease) -> None:
        self.name = name
        self.owner = lease.owner
        self.instance = lease.instance
        self._lease = lease

    @property
    def epoch(self) -> int:  # type: ignore[override]
        return self._lease.epoch

    def try_acquire(self) -> bool:
        return self._lease.acquire()

    def renew(self) -> bool:
        return self._lease.renew()

    def release(self) -> None:
        self._lease.release()

    def is_held(self) -> bool:
        return self._lease.held()

    def is_held_in(self, epoch: int) -> bool:
        return self._lease.held(epoch)

    def current_holder(self) -> str | None:
        return self._lease.holder()

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        return self._lease.break_if_held_by(owner, instance)
