"""The leader's self-fence: once its leadership lease was not confirmed by ``deadline - margin``, a leader
writes nothing more as leader.

The leader loop checks the deadline between rounds, but one round of `LeaderDuties.tick` makes several store
calls, and a round that began in time can reach its write after the store was unreachable for a while (a
partition that heals mid-round). The leader's duties therefore see the store through these wrappers, which
check the deadline right before every write the leader makes — publishing the job model, completing or
timing out a latch, removing a registry row — and raise `LockLostError` for the ``leader`` lease instead.
Reads pass through. The deadline is the processor's (`weirflow.coordination.keeper` explains how it is
kept); a write that passes the check is one store call, bounded by the storage deadline, which is shorter
than the margin. Metadata writes go through `MetadataStore.put_as_holder`, so a store that keeps the leases
beside its documents (the embedded one) also checks the ``leader`` lease inside the write's transaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from weirflow.base.errors import LockLostError
from weirflow.interfaces.coordination import (
    CoordinationUtils,
    Latch,
    LatchState,
    LeaderElector,
    Lock,
    ProcessorInfo,
    ProcessorRegistry,
)
from weirflow.interfaces.metadata import Document, LeaseHolder, MetadataStore


class LeaderFence:
    """``valid_until()`` is the monotonic time after which the leader must not write (deadline - margin);
    ``instance`` is the run of the processor that holds the ``leader`` lease."""

    def __init__(
        self,
        owner: str,
        valid_until: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        instance: str = "",
    ):
        self.owner = owner
        self.instance = instance
        self._valid_until = valid_until
        self._clock = clock

    def check(self) -> None:
        if self._clock() >= self._valid_until():
            raise LockLostError("leader", self.owner)


class FencedMetadataStore(MetadataStore):
    def __init__(self, inner: MetadataStore, fence: LeaderFence) -> None:
        self._inner = inner
        self._fence = fence

    def get(self, key: str) -> Document | None:
        return self._inner.get(key)

    def put(
        self, key: str, value: dict[str, Any], *, if_match: str | None = None, if_none_match: bool = False
    ) -> str:
        self._fence.check()
        # and, where the store can see the lease, checked again in the write's own transaction
        holder = LeaseHolder("leader", self._fence.owner, self._fence.instance)
        return self._inner.put_as_holder(key, value, holder, if_match=if_match, if_none_match=if_none_match)

    def delete(self, key: str, *, if_match: str | None = None) -> None:
        self._fence.check()
        self._inner.delete(key, if_match=if_match)

    def list(self, prefix: str = "") -> list[Document]:
        return self._inner.list(prefix)


class _FencedLatch(Latch):
    def __init__(self, inner: Latch, fence: LeaderFence) -> None:
        self.name = inner.name
        self._inner = inner
        self._fence = fence

    def join(self, participant: str) -> None:
        self._inner.join(participant)

    def participants(self) -> set[str]:
        return self._inner.participants()

    def complete(self) -> None:
        self._fence.check()
        self._inner.complete()

    def time_out(self) -> None:
        self._fence.check()
        self._inner.time_out()

    def state(self) -> LatchState:
        return self._inner.state()


class _FencedRegistry(ProcessorRegistry):
    def __init__(self, inner: ProcessorRegistry, fence: LeaderFence) -> None:
        self._inner = inner
        self._fence = fence

    def heartbeat(self, info: ProcessorInfo) -> None:
        self._inner.heartbeat(info)

    def processors(self) -> list[ProcessorInfo]:
        return self._inner.processors()

    def unregister(self, processor_id: str) -> None:
        self._fence.check()
        self._inner.unregister(processor_id)


class FencedCoordination(CoordinationUtils):
    """The leader's view of the coordination primitives: latch and registry writes are fenced."""

    def __init__(self, inner: CoordinationUtils, fence: LeaderFence) -> None:
        self._inner = inner
        self._fence = fence

    def leader_elector(self) -> LeaderElector:
        return self._inner.leader_elector()

    def lock(self, name: str) -> Lock:
        return self._inner.lock(name)

    def latch(self, name: str) -> Latch:
        return _FencedLatch(self._inner.latch(name), self._fence)

    def processor_registry(self) -> ProcessorRegistry:
        return _FencedRegistry(self._inner.processor_registry(), self._fence)

    def __getattr__(self, name: str) -> Any:  # backend extras a leader may use (read-only helpers)
        return getattr(self._inner, name)
