"""Processor lifecycle states and the transitions the protocol allows.

    NEW -> STARTED -> IN_REBALANCE -> RUNNING -> IN_REBALANCE -> RUNNING ... -> STOPPING -> STOPPED
                                                                    any -> FAILED (a background error)

A state change that is not listed is a bug in the protocol and raises at once rather than hiding it.
"""

from __future__ import annotations

import enum


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
    """Raise `RuntimeError` for a transition the protocol does not allow (FAILED is reachable from anywhere)."""
    if new is ProcessorState.FAILED or new is current:
        return
    if new not in ALLOWED[current]:
        raise RuntimeError(f"illegal processor state change {current.value} -> {new.value}")
