"""What an Event Hubs offset is to weirflow: the event's sequence number, so the offset after an event is its
sequence number + 1 (`weirflow.interfaces.system`: dense offsets). The one place that turns one into the other
outside the system's admin (docs/architecture.md, "Rules with one home")."""

from __future__ import annotations


def sequence_number_before(next_offset: str) -> str:
    """The sequence number of the last event read, given the offset to resume from."""
    return str(int(next_offset) - 1)
