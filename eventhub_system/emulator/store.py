"""The emulator's event log: hubs of partitions of events, in memory or appended to files.

An event keeps the AMQP message exactly as the producer encoded it (for a batch, each inner message) plus
what the service stamps on it: a per-partition sequence number from 0, an offset (the byte position of the
event in the partition, as a decimal string on the wire), the enqueue time and the partition key.
Consumers get the stored message back with those stamped as message annotations.

Durability (``data_dir``): one append-only file per partition, ``<data_dir>/<hub>/<partition>.log``, each
record a fixed header (sequence number, offset, enqueue ms, key length, message length) then the key and
the message, flushed on every append. Reopening the directory restores every partition.

Each event also keeps its wire form, the message with the service's annotations stamped on (`stamped`), built
at its first delivery and kept: a consumer is sent those bytes as they are. An event is read many times
(every consumer group, every re-read after a failover or a restart), and stamping it anew at each delivery was
a quarter of the emulator's CPU under a running job.
"""

from __future__ import annotations

import bisect
import functools
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from weirflow.base import clock
from weirflow_azure.eventhubs.emulator.messages import stamped

_RECORD = struct.Struct(">qqqII")


@dataclass(frozen=True)
class StoredEvent:
    sequence_number: int
    offset: int
    enqueued_ms: int
    partition_key: str | None
    message: bytes  # the encoded AMQP message as sent

    @functools.cached_property
    def wire(self) -> bytes:
        """``message`` stamped with the four fields above, what consumers receive: built at the first
        delivery and kept (an event never read, e.g. one reloaded from its file, is never stamped)."""
        return stamped(self.message, self.sequence_number, self.offset, self.enqueued_ms, self.partition_key)


class Partition:
    """One partition's events, ordered by sequence number (= list index)."""

    def __init__(self, path: Path | None) -> None:
        self.events: list[StoredEvent] = []
        self._offsets: list[int] = []
        self._times: list[int] = []
        self._next_offset = 0
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.exists():
                self._load(path.read_bytes())
            self._file = open(path, "ab")

    def _load(self, data: bytes) -> None:
        at = 0
        while at + _RECORD.size <= len(data):
            seq, offset, enqueued, key_len, msg_len = _RECORD.unpack_from(data, at)
            start = at + _RECORD.size
            if start + key_len + msg_len > len(data):
                break  # a torn last record (crash mid-append): ignore it
            key = data[start : start + key_len].decode() if key_len else None
            message = data[start + key_len : start + key_len + msg_len]
            self._append(StoredEvent(seq, offset, enqueued, key, message))
            at = start + key_len + msg_len

    def _append(self, event: StoredEvent) -> None:
        self.events.append(event)
        self._offsets.append(event.offset)
        self._times.append(event.enqueued_ms)
        self._next_offset = event.offset + len(event.message)

    def append(self, message: bytes, partition_key: str | None, now_ms: int) -> StoredEvent:
        event = StoredEvent(len(self.events), self._next_offset, now_ms, partition_key, message)
        if self._file is not None:
            key = (partition_key or "").encode()
            self._file.write(_RECORD.pack(event.sequence_number, event.offset, now_ms, len(key), len(message)))
            self._file.write(key + message)
            self._file.flush()
        self._append(event)
        return event

    # --- positions ----------------------------------------------------------------------------------------
    def index_after_offset(self, offset: int, inclusive: bool) -> int:
        """Index of the first event with offset ``>`` (or ``>=``) ``offset``."""
        find = bisect.bisect_left if inclusive else bisect.bisect_right
        return find(self._offsets, offset)

    def index_after_time(self, enqueued_ms: int, inclusive: bool) -> int:
        find = bisect.bisect_left if inclusive else bisect.bisect_right
        return find(self._times, enqueued_ms)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


class Hub:
    def __init__(self, name: str, partition_count: int, data_dir: Path | None) -> None:
        self.name = name
        self.created_ms = clock.now_ms()
        self.partitions = [
            Partition(data_dir / name / f"{p}.log" if data_dir is not None else None)
            for p in range(partition_count)
        ]


class EventStore:
    """Every hub of one emulator. Thread-safe (one lock; the emulator's loop is the only writer)."""

    def __init__(self, hubs: dict[str, int], data_dir: Path | None = None) -> None:
        self.data_dir = Path(data_dir) if data_dir is not None else None
        self.lock = threading.Lock()
        self.hubs = {name: Hub(name, count, self.data_dir) for name, count in hubs.items()}

    def hub(self, name: str) -> Hub | None:
        return self.hubs.get(name)

    def add_hub(self, name: str, partition_count: int) -> bool:
        """Serve another hub (tests declare hubs as they go). False if it exists with that partition count."""
        with self.lock:
            existing = self.hubs.get(name)
            if existing is not None:
                if len(existing.partitions) != partition_count:
                    raise ValueError(f"hub '{name}' exists with {len(existing.partitions)} partitions")
                return False
            self.hubs = {**self.hubs, name: Hub(name, partition_count, self.data_dir)}  # readers never lock
            return True

    def append(self, hub: str, partition: int, message: bytes, partition_key: str | None) -> StoredEvent:
        with self.lock:
            return self.hubs[hub].partitions[partition].append(message, partition_key, clock.now_ms())

    def close(self) -> None:
        for hub in self.hubs.values():
            for partition in hub.partitions:
                partition.close()
