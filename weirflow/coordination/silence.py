"""Breaking the leases of a silent processor, so that failover does not wait for them to expire.

A killed processor's leases (the leadership, its task locks) would block everyone until they expire: a lease
duration after its last renewal, 15 s by default, the floor of a lease-based failover. But the registry knows
sooner: a processor silent past the liveness timeout, judged on the store's clock (the registry's
``heartbeat_ms`` is the reader's "now" minus the row's age *as the store measures it*, so no two hosts' clocks
are compared), has given up every lease by then. Its keeper keeps an alive deadline, the send time of its last
confirmed heartbeat plus ``liveness - liveness margin``, and abandons its tasks and leadership when it passes
(`weirflow.coordination.keeper`). The store stamped that heartbeat no earlier than it was sent, so the holder
gave up before any reader can see it silent.

So a processor that is refused a lease looks at the holder: if the holder's registry row (same processor id
*and* the same run, ``instance``) is silent past the liveness timeout, it breaks the lease
(`Lock.break_if_held_by`, `LeaderElector.break_if_held_by`) and takes it at once. The epoch fence stays the
last word: the new tenure's epoch is greater, so a write the silent holder sent before it fenced itself and
that lands late is refused by the checkpoint store all the same (`weirflow.runtime.fencing`).

A row judged here is read *after* the "now" it is compared with, so a row's measured age never exceeds its
true age: a reader errs on the side of waiting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from weirflow.base import clock as wall_clock
from weirflow.coordination.state import is_silent
from weirflow.interfaces.coordination import ProcessorInfo, ProcessorRegistry

log = logging.getLogger("weirflow.coordination")


class SilentHolders:
    """Which processors are silent past the liveness timeout, and the break of a lease one of them holds."""

    def __init__(
        self,
        registry: ProcessorRegistry,
        liveness_timeout_ms: int,
        me: str,
        clock: Callable[[], int] | None = None,
    ) -> None:
        self._registry = registry
        self._liveness_ms = liveness_timeout_ms
        self._me = me
        self._clock = clock if clock is not None else lambda: wall_clock.now_ms()

    def silent(self) -> dict[str, ProcessorInfo]:
        """The registry rows silent past the liveness timeout, by processor id (one registry read)."""
        now = self._clock()  # before the read: a row's age is then never over-estimated
        return {
            row.processor_id: row
            for row in self._registry.processors()
            if row.processor_id != self._me and is_silent(row, now, self._liveness_ms)
        }

    def break_lease(
        self,
        what: str,
        holder: str | None,
        silent: dict[str, ProcessorInfo],
        breaker: Callable[[str, str], bool],
    ) -> bool:
        """Break ``what`` (a lease held by ``holder``) if the holder is among the ``silent`` rows; whether it
        was broken. ``breaker(owner, instance)`` ends the lease only if that very run of the holder has it."""
        row = silent.get(holder) if holder is not None else None
        if row is None:
            return False
        if not breaker(row.processor_id, row.instance):
            return False
        log.warning(
            "broke %s held by %s, silent for %.1f s (liveness timeout %.1f s): it gave its leases up by then",
            what,
            row.processor_id,
            (self._clock() - row.heartbeat_ms) / 1000,
            self._liveness_ms / 1000,
        )
        return True
