"""Processor lifecycle states and the transitions the protocol allows.

    NEW -> STARTED -> IN_REBALANCE -> RUNNING -> IN_REBALANCE -> RUNNING ... -> STOPPING -> STOPPED
                                                                    any -> FAILED (a background error)

A state change that is not listed is a bug in the protocol and raises at once rather than hiding it.

This module is also the one home of **who counts as alive** (`is_live`): the leader's membership and `weirflow
status` both ask it, so a processor is never dropped by one and shown live by the other.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from weirflow.base.errors import StateError

if TYPE_CHECKING:
    from weirflow.interfaces.coordination import ProcessorInfo


class ProcessorState(str, enum.Enum):
    NEW = "NEW"
    STARTED = "STARTED"
    IN_REBALANCE = "IN_REBALANCE"
    RUNNING = "RUNNING"
    STOPPING = "STOPPING"
    STOPPED = "STOPPED"
    FAILED = "FAILED"


ALLOWED: dict[ProcessorState, frozenset[ProcessorState]] = {
    ProcessorState.NEW: frozenset({ProcessorState.STARTED, ProcessorState.STOPPING}),
    ProcessorState.STARTED: frozenset({ProcessorState.IN_REBALANCE, ProcessorState.STOPPING}),
    ProcessorState.IN_REBALANCE: frozenset({ProcessorState.RUNNING, ProcessorState.STOPPING}),
    ProcessorState.RUNNING: frozenset({ProcessorState.IN_REBALANCE, ProcessorState.STOPPING}),
    ProcessorState.STOPPING: frozenset({ProcessorState.STOPPED}),
    ProcessorState.STOPPED: frozenset(),
    ProcessorState.FAILED: frozenset({ProcessorState.STOPPING, ProcessorState.STOPPED}),
}


def check_transition(current: ProcessorState, new: ProcessorState) -> None:
    """Raise `StateError` for a transition the protocol does not allow (FAILED is reachable from anywhere)."""
    if new is ProcessorState.FAILED or new is current:
        return
    if new not in ALLOWED[current]:
        raise StateError(f"illegal processor state change {current.value} -> {new.value}")


# A processor in one of these states has left the group, however fresh its heartbeat: a STOPPING one is
# handing its tasks back (they must move now, not a liveness timeout later), a STOPPED or FAILED one runs
# nothing.
DEPARTED: frozenset[ProcessorState] = frozenset(
    {ProcessorState.STOPPING, ProcessorState.STOPPED, ProcessorState.FAILED}
)
_DEPARTED_VALUES = frozenset(state.value for state in DEPARTED)


def has_departed(state: str | ProcessorState) -> bool:
    """Whether a registry row's ``state`` says the processor left the group (see `DEPARTED`)."""
    return (state.value if isinstance(state, ProcessorState) else state) in _DEPARTED_VALUES


def is_silent(info: ProcessorInfo, now_ms: int, liveness_timeout_ms: int) -> bool:
    """Not heard from within the liveness timeout, whatever its state: such a processor has given up every
    lease (its keeper's heartbeat fence), so others may break them (`weirflow.coordination.silence`)."""
    return now_ms - info.heartbeat_ms > liveness_timeout_ms


# A row in one of these states is the processor's last word: it ended, and saying so is not going silent.
_ENDED_VALUES = frozenset({ProcessorState.STOPPED.value, ProcessorState.FAILED.value})


def went_silent(info: ProcessorInfo, now_ms: int, liveness_timeout_ms: int) -> bool:
    """Silent past the liveness timeout without having said it ended (STOPPED, FAILED): it crashed, hangs or is
    cut off from storage, and its row shows a state it is no longer in. The leader records such a departure
    as a failover (`weirflow.coordination.model_history`) and `weirflow status` shows the processor as
    ``SILENT`` instead of its last reported state."""
    return is_silent(info, now_ms, liveness_timeout_ms) and info.state not in _ENDED_VALUES


def is_live(info: ProcessorInfo, now_ms: int, liveness_timeout_ms: int) -> bool:
    """A processor is live when it was heard from within the liveness timeout and has not departed — except
    that a STOPPING processor whose row still lists tasks is live: it is handing them over (final checkpoints
    under locks it still renews), and moving them now would only make their next owner wait for the locks.
    Once its row lists none (it released them) or it went silent, it is gone.

    The one definition of liveness: the leader counts members with it and `weirflow status` shows it. The
    heartbeat is compared with the reader's clock, which assumes processors' clocks agree to well under the
    liveness timeout.
    """
    if is_silent(info, now_ms, liveness_timeout_ms):
        return False
    if info.state == ProcessorState.STOPPING.value and info.tasks:
        return True
    return not has_departed(info.state)
