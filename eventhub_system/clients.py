"""The ``eventhub`` system's admin and consumer over the unmodified `azure-eventhub` SDK.

Offsets are **sequence numbers** (decimal strings): every partition counts from its first event, so
``next_offset = sequence number + 1`` and ranges are exact. The Event Hubs byte ``offset`` of each event
travels beside it for the SDKs' checkpoint layout.

Records carry the event's own description in `IncomingRecord.attributes` (`RECORD_FIELDS`), which the Spark
source turns into columns when `streams.<id>.system-columns` asks for them.

* Admin: hubs are not created by weirflow (Bicep creates them); `create_stream` checks that the hub exists
  with the partitions the job needs and fails naming the hub otherwise.
* Consumer: the SDK only pushes events, so each SSP gets a `_PartitionReader`: one receiver kept open
  across reads, positioned by sequence number, buffering what it receives. A read that continues where the
  last one stopped costs no reconnect, nor does one up to a thousand events further on: the receiver skips
  forward to it. A reader's client names its one partition to the SDK, which otherwise lists the hub's
  partitions before attaching (~0.35 s) and spins a core meanwhile.
* Producer: `weirflow_azure.eventhubs.producer`.
* Errors: every SDK call runs under `weirflow_azure.eventhubs.errors.hub_errors`, which maps the SDK's
  exception types (and the service's AMQP condition, for a missing hub) to weirflow's errors through one
  table; sends retry exactly what that table calls transient.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from weirflow.base.errors import (
    StreamExistsError,
    StreamNotFoundError,
)
from weirflow.interfaces.system import (
    RECORD_ID_PROPERTY,
    IncomingRecord,
    PartitionMetadata,
    RecordColumns,
    RecordField,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemStreamPartition,
)
from weirflow_azure.eventhubs.errors import EventsNotReceivedError, hub_errors
from weirflow_azure.eventhubs.hub_clients import HubClients
from weirflow_azure.eventhubs.lookup3 import partition_for_key
from weirflow_azure.eventhubs.settings import EventHubsSettings

if TYPE_CHECKING:
    from weirflow_azure.eventhubs.checkpoint_blobs import BlobCheckpoints
    from weirflow_azure.eventhubs.checkpoint_layout import EventHubsSystem

log = logging.getLogger("weirflow.eventhub")


def body_bytes(event: Any) -> bytes:
    body = event.body
    if isinstance(body, bytes | bytearray):
        return bytes(body)
    if isinstance(body, str):
        return body.encode()
    return b"".join(part if isinstance(part, bytes | bytearray) else str(part).encode() for part in body)


RECORD_FIELDS = (
    RecordField(
        "properties",
        "map<string,string>",
        "The event's application properties; numbers and booleans as JSON text, binary values that "
        "are not UTF-8 as base64.",
    ),
    RecordField("partition_key", "string", "The partition key the event was sent with (null without one)."),
    RecordField("enqueued_time", "timestamp", "When the service accepted the event."),
    RecordField("sequence_number", "bigint", "The event's sequence number in its partition."),
    RecordField("offset", "string", "The event's Event Hubs offset in its partition."),
)


def _text(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            return base64.b64encode(bytes(value)).decode()
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def event_id(event: Any) -> str | None:
    """The ``weirflow-id`` property an event was sent with (`OutgoingRecord.id`), else None. Received events
    carry AMQP property names and string values as bytes."""
    properties = event.properties or {}
    value = properties.get(RECORD_ID_PROPERTY.encode(), properties.get(RECORD_ID_PROPERTY))
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


def event_attributes(event: Any) -> dict[str, Any]:
    """`RECORD_FIELDS` of one received event (the SDK hands AMQP strings over as bytes)."""
    key = event.partition_key
    return {
        "properties": {_text(k): _text(v) for k, v in (event.properties or {}).items()},
        "partition_key": _text(key) if key is not None else None,
        "enqueued_time": event.enqueued_time,
        "sequence_number": event.sequence_number,
        "offset": str(event.offset),
    }


class EventHubSystemAdmin(SystemAdmin):
    """``sdk_checkpoints`` opens the SDK-layout checkpoint blobs (and names this system as the SDKs do) for
    ``streams.<id>.start: sdk-checkpoint``; the factory always gives one."""

    def __init__(
        self,
        settings: EventHubsSettings,
        configured: dict[str, int] | None = None,
        sdk_checkpoints: Callable[[], tuple[BlobCheckpoints, EventHubsSystem]] | None = None,
    ) -> None:
        self._clients = HubClients(settings)
        self._configured = configured or {}
        self._sdk_checkpoints = sdk_checkpoints

    def partition_count(self, stream: str) -> int:
        """Partitions of hub ``stream``; a hub that does not exist is a `StreamNotFoundError` naming it."""
        with hub_errors(self._clients.settings.system, stream):
            client = self._clients.producer(stream)
            probed = self._clients.probed_partitions(stream)
            return probed if probed is not None else len(client.get_partition_ids())

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        return self.partition_metadata_of(stream, range(self.partition_count(stream)))

    def partition_for_key(self, stream: str, key: bytes) -> int | None:
        """Where the service puts a record with partition key ``key`` (lookup3, as the producer predicts it);
        None under ``partition.method: key_as_partition`` or ``round_robin``."""
        if self._clients.settings.partition_method != "hash":
            return None
        return partition_for_key(key.decode("utf-8", "replace"), self.partition_count(stream))

    def partition_metadata_of(self, stream: str, partitions: Collection[int]) -> dict[int, PartitionMetadata]:
        """One management round trip per partition asked for, all at once: the SDK opens a management link
        per call and polls it ready in 50 ms steps (~0.35 s each on the emulator), so N partitions one after
        another would cost N times that on every trigger that needs them."""
        client = self._clients.producer(stream)
        wanted = [str(pid) for pid in partitions]
        with hub_errors(self._clients.settings.system, stream):
            if len(wanted) > 1:
                with ThreadPoolExecutor(max_workers=min(8, len(wanted)), thread_name_prefix="eh-metadata") as pool:
                    found = dict(zip(wanted, pool.map(client.get_partition_properties, wanted), strict=True))
            else:
                found = {pid: client.get_partition_properties(pid) for pid in wanted}
        out = {}
        for pid in partitions:
            props = found[str(pid)]
            begin, last = int(props["beginning_sequence_number"]), int(props["last_enqueued_sequence_number"])
            if props["is_empty"] or last < begin:
                out[pid] = PartitionMetadata(str(max(begin, last + 1)), None, str(max(begin, last + 1)))
            else:
                position = {"offset": str(props["last_enqueued_offset"]), "sequence_number": str(last)}
                out[pid] = PartitionMetadata(str(begin), str(last), str(last + 1), position)
        return out

    def create_stream(self, spec: StreamSpec) -> bool:
        """Event hubs are infrastructure: check, never create."""
        count = self.partition_count(spec.stream)
        if count != spec.partitions:
            raise StreamExistsError(
                f"event hub '{spec.stream}' has {count} partitions, the job needs {spec.partitions}; "
                "change streams.<id>.partitions or the hub (partition counts of event hubs are fixed at creation)"
            )
        return False

    def retention(self, stream: str) -> Retention:
        """Every event hub deletes events once they are older than its retention, read or not (at most 1 day on
        the Basic tier, 7 on Standard, 90 on Premium and Dedicated), so there is always one. How long is not
        known here: the Event Hubs SDK reads a hub's partitions, not its retention, which only the management
        plane (ARM) shows."""
        return Retention(
            None,
            "an event hub deletes events after the retention set on it, up to 90 days by tier, which the "
            "Event Hubs SDK cannot read",
        )

    def record_fields(self) -> Sequence[RecordField]:
        return RECORD_FIELDS

    def native_position(self, record: IncomingRecord) -> Mapping[str, str] | None:
        attributes = record.attributes
        if "offset" not in attributes or "sequence_number" not in attributes:
            return None
        return {"offset": str(attributes["offset"]), "sequence_number": str(attributes["sequence_number"])}

    def offset_after_native_checkpoint(self, stream: str, partition: int) -> str | None:
        """The sequence number after the one in the partition's SDK checkpoint blob (what
        ``BlobCheckpointStore`` wrote for this namespace, hub and consumer group); a checkpoint older than the
        partition's retention starts at its oldest event, with a warning counting the events lost."""
        if self._sdk_checkpoints is None:
            raise NotImplementedError(
                f"Event Hubs system '{self._clients.settings.system}' was given no SDK checkpoint store"
            )
        blobs, system = self._sdk_checkpoints()
        found = blobs.read(system.fully_qualified_namespace, stream, system.consumer_group).get(str(partition))
        if found is None:
            return None
        upcoming = int(found.sequence_number) + 1
        oldest = int(self.partition_metadata_of(stream, [partition])[partition].oldest)
        if upcoming < oldest:
            log.warning(
                "event hub '%s' partition %d: its SDK checkpoint (sequence number %s) is older than the "
                "partition's retention; starting at its oldest event %d: %d events were lost before this job",
                stream,
                partition,
                found.sequence_number,
                oldest,
                oldest - upcoming,
            )
            return str(oldest)
        return str(upcoming)

    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        """Sequence number of the first event enqueued at or after ``timestamp_ms``: the service answers a
        receiver positioned by enqueued time, so one event is received; none that late → the upcoming one."""
        with hub_errors(self._clients.settings.system, stream):
            props = self._clients.producer(stream).get_partition_properties(str(partition))
        upcoming = int(props["last_enqueued_sequence_number"]) + 1
        last_time = props.get("last_enqueued_time_utc")
        if props["is_empty"] or last_time is None or last_time.timestamp() * 1000 < timestamp_ms:
            return str(max(upcoming, int(props["beginning_sequence_number"])))
        when = dt.datetime.fromtimestamp(timestamp_ms / 1000, tz=dt.UTC)
        reader = _PartitionReader(
            self._clients.settings, SystemStreamPartition(self._clients.settings.system, stream, partition), when
        )
        try:
            events = reader.take(1, None, EventHubSystemConsumer.END_WAIT_S)
        finally:
            reader.close()
        if not events:
            raise EventsNotReceivedError(
                f"event hub '{stream}' partition {partition}: no event at or after {when.isoformat()} was "
                f"received within {EventHubSystemConsumer.END_WAIT_S:.0f} s, though the partition has some"
                + (f" ({reader.error})" if reader.error else "")
            )
        return str(events[0].sequence_number)

    def list_streams(self) -> dict[str, int]:
        found = {}
        for hub in sorted(self._configured):
            try:
                found[hub] = self.partition_count(hub)
            except StreamNotFoundError:
                continue
        return found

    def close(self) -> None:
        self._clients.close()


class _PartitionReader:
    """One open receiver on one partition, buffering events from a start sequence number on."""

    # How far ahead of its position a receiver is moved by dropping the events in between (`skip_to`) rather than
    # replaced. A receiver that holds the next events serves a read without asking where the partition ends (a
    # management request, ~0.35 s); a new one needs that, and an attach. Receiving 1,000 small events through an
    # open receiver took about 0.1 s on the emulator (5,000: 0.3-0.6 s and 0.3 CPU-s).
    SKIP_MAX_EVENTS = 1000

    def __init__(
        self,
        settings: EventHubsSettings,
        ssp: SystemStreamPartition,
        start: int | dt.datetime,
        prefetch: int | None = None,
    ) -> None:
        self.ssp = ssp
        self.start = start  # a sequence number, or an enqueued time (only to find where a time begins)
        self.next_seq = start if isinstance(start, int) else -1  # sequence number of the next event to hand out
        self._buffer: deque[Any] = deque()
        self._arrived = threading.Condition()
        self.error: BaseException | None = None
        self._client = settings.consumer(ssp.stream)
        # `receive_batch` lists the hub's partitions (a management request: ~0.35 s of the SDK's 50 ms polls)
        # before it attaches the receiver, and its loop spins a core until then. This client reads one partition,
        # which the consumer has already asked the service about (`_upcoming`) or the admin has planned from
        # (`warm`): naming it here attaches the receiver in about 20 ms instead of 0.7-0.9 s of a busy core
        # (measured on the emulator).
        self._client.get_partition_ids = lambda: [str(ssp.partition)]
        # The SDK's receive loop reads up to `prefetch` frames before handing any over (it stops early only
        # when the stream pauses), so a small link credit keeps a busy partition's reads prompt.
        self.prefetch = max(prefetch if prefetch is not None else settings.prefetch, 1)
        self._thread = threading.Thread(
            target=self._run, args=(settings.receive_batch_size,), name=f"eh-reader-{ssp}", daemon=True
        )
        self._thread.start()

    def _run(self, batch_size: int) -> None:
        def on_batch(_ctx: Any, events: list[Any]) -> None:
            if events:
                with self._arrived:
                    self._buffer.extend(events)
                    self._arrived.notify_all()

        def on_error(_ctx: Any, error: BaseException) -> None:
            self.error = error
            log.warning("receiver of %s: %s", self.ssp, error)

        try:
            self._client.receive_batch(
                on_event_batch=on_batch,
                on_error=on_error,
                partition_id=str(self.ssp.partition),
                starting_position=self.start,
                starting_position_inclusive=True,
                max_batch_size=batch_size,
                prefetch=self.prefetch,
            )
        except Exception as exc:
            self.error = exc

    def buffered(self) -> int:
        with self._arrived:
            self._drop_passed()
            return len(self._buffer)

    def skip_to(self, start: int) -> bool:
        """Whether the reader is at sequence number ``start`` now: it was, or ``start`` was at most
        `SKIP_MAX_EVENTS` ahead and it moved there (the events before it are dropped, those buffered now and
        those still arriving). False (nothing changes) when ``start`` is behind it or further ahead."""
        with self._arrived:
            if not 0 <= self.next_seq <= start <= self.next_seq + self.SKIP_MAX_EVENTS:
                return self.next_seq == start
            self.next_seq = start
            self._drop_passed()
        return True

    def _drop_passed(self) -> None:
        """Drop buffered events before ``next_seq`` (left by `skip_to`); the caller holds ``_arrived``."""
        while self._buffer and self._buffer[0].sequence_number < self.next_seq:
            self._buffer.popleft()

    def take(self, max_records: int, end: int | None, wait_s: float) -> list[Any]:
        """Up to ``max_records`` events from ``next_seq``, stopping before ``end``; wait up to ``wait_s`` for
        the first one (or, with ``end``, for all of them: they exist)."""
        wanted = max_records if end is None else min(max_records, end - self.next_seq)
        if wanted <= 0:
            return []
        deadline = time.monotonic() + wait_s
        with self._arrived:
            self._drop_passed()
            while len(self._buffer) < (wanted if end is not None else 1):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._arrived.wait(remaining)
                self._drop_passed()
            out: list[Any] = []
            while self._buffer and len(out) < wanted:
                out.append(self._buffer.popleft())
        if out:
            self.next_seq = out[-1].sequence_number + 1
        return out

    def close(self, join: bool = True) -> None:
        self._client.close()
        if join:
            self.join(10)

    def join(self, timeout_s: float) -> None:
        """Wait for the receive loop to notice the close (it finishes the frames it is reading first)."""
        self._thread.join(max(timeout_s, 0))


class EventHubSystemConsumer(SystemConsumer):
    """Reads exact sequence-number ranges, keeping one receiver per SSP open between reads."""

    END_WAIT_S = 60.0

    def __init__(self, settings: EventHubsSettings) -> None:
        self._settings = settings
        self._readers: dict[SystemStreamPartition, _PartitionReader] = {}
        # End of the latest planned read of each SSP (`warm`): reads before it are that plan's tail.
        self._planned_ends: dict[SystemStreamPartition, int] = {}
        self._guard = threading.Lock()
        self._properties = HubClients(settings)

    def _upcoming(self, ssp: SystemStreamPartition) -> int:
        """Sequence number the next event of the partition will get (one management round trip)."""
        with hub_errors(self._settings.system, ssp.stream):
            props = self._properties.producer(ssp.stream).get_partition_properties(str(ssp.partition))
        return int(props["last_enqueued_sequence_number"]) + 1

    def _reader(
        self, ssp: SystemStreamPartition, start: int, backlog: int, tail: bool = False
    ) -> _PartitionReader:
        """The open receiver of ``ssp`` at ``start``, opened if needed. ``backlog``: events from ``start`` to
        the partition's end (or a whole planned read, see `warm`). A receiver opened for a backlog of at
        least `catch_up_prefetch` events gets that much link credit (catching up: round trips count); one
        holding more credit than `prefetch` is replaced once the backlog is smaller (the partition is live
        now, and the SDK's bursts of that many events would delay it) -- but not on the ``tail`` of a read
        or of a planned read: a receiver positioned at ``start`` there has the events in flight (its
        buffer merely ran dry, as on a busy machine), and reopening it would cost an attach mid-read; one
        that must be reopened there (it failed) keeps its credit.

        A receiver a little behind ``start`` skips forward to it (`_PartitionReader.skip_to`) instead of being
        replaced. That is the usual case in a Spark job: a partition's successive ranges go to whichever Python
        worker is free, and each worker keeps its own receivers, so the one that read a range before last
        finds its receiver behind by the range another worker read since."""
        settings = self._settings
        catching_up = settings.catch_up_prefetch > settings.prefetch and backlog >= settings.catch_up_prefetch
        with self._guard:
            reader = self._readers.get(ssp)
            credit = settings.catch_up_prefetch if catching_up else settings.prefetch
            if reader is not None and (
                reader.error is not None
                or (not catching_up and not tail and reader.prefetch > settings.prefetch)
                or not reader.skip_to(start)
            ):
                if tail:  # a receiver that failed on a tail is reopened with the credit it had
                    credit = max(credit, reader.prefetch)
                reader.close(join=False)
                reader = None
            if reader is None:
                reader = _PartitionReader(settings, ssp, start, credit)
                self._readers[ssp] = reader
            return reader

    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        return self._records(ssp, self._events(ssp, start, max_records, end))

    def warm(self, ssp: SystemStreamPartition, start: str, end: str | None = None) -> bool:
        """Open (or keep) the receiver at ``start``: the SDK takes about a second to attach one."""
        if end is not None:
            self._reader(ssp, int(start), int(end) - int(start))
            with self._guard:
                self._planned_ends[ssp] = int(end)
        return True

    def read_columns(
        self,
        ssp: SystemStreamPartition,
        start: str,
        max_records: int,
        end: str | None = None,
        *,
        attributes: bool = False,
    ) -> RecordColumns:
        """The events' columns straight from the SDK's event objects (no record object per event); their
        attributes (`RECORD_FIELDS`) only when asked for."""
        events = self._events(ssp, start, max_records, end)
        if not events:
            return RecordColumns([], [], [], [], start)
        sequence = [event.sequence_number for event in events]
        return RecordColumns(
            offsets=[str(n) for n in sequence],
            keys=[event.partition_key for event in events],
            values=[body_bytes(event) for event in events],
            timestamps_ms=[int(event.enqueued_time.timestamp() * 1000) for event in events],
            next_offset=str(sequence[-1] + 1),
            attributes=[event_attributes(event) for event in events] if attributes else (),
        )

    def _events(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None, tail: bool = False
    ) -> list[Any]:
        """SDK events of ``ssp`` from sequence number ``start`` (see `SystemConsumer.read`); ``tail``: the
        rest of a read that began before ``start``."""
        first = int(start)
        bound = int(end) if end is not None else None
        if max_records <= 0 or (bound is not None and first >= bound):
            return []
        with self._guard:
            current = self._readers.get(ssp)
        if current is not None and current.skip_to(first) and current.buffered():
            # The common case: the receiver already holds what comes next; no round trip.
            events = current.take(max_records, bound, 0)
            if events:
                done = events[-1].sequence_number + 1
                if bound is None or done >= min(bound, first + max_records):
                    return events
                return events + self._events(ssp, str(done), max_records - len(events), end, tail=True)
        # Otherwise read what exists now: the partition's end bounds the read, so the call returns at once
        # when there is nothing and waits only for events known to be there (a receiver attaching).
        upcoming = self._upcoming(ssp)
        last = min(int(end), upcoming) if end is not None else upcoming
        if first >= last or max_records <= 0:
            return []
        with self._guard:
            planned = first < self._planned_ends.get(ssp, first)
        reader = self._reader(ssp, first, upcoming - first, tail=tail or planned)
        events = reader.take(max_records, last, self.END_WAIT_S)
        expected = min(last, first + max_records)
        if not events or events[-1].sequence_number + 1 < expected:
            raise EventsNotReceivedError(
                f"{ssp}: events {first}..{expected - 1} exist but were not received within {self.END_WAIT_S:.0f} s"
                + (f" ({reader.error})" if reader.error else "")
            )
        return events

    @staticmethod
    def _records(ssp: SystemStreamPartition, events: list[Any]) -> list[IncomingRecord]:
        return [
            IncomingRecord(
                ssp=ssp,
                offset=str(event.sequence_number),
                next_offset=str(event.sequence_number + 1),
                key=event.partition_key,
                value=body_bytes(event),
                timestamp_ms=int(event.enqueued_time.timestamp() * 1000),
                attributes=event_attributes(event),
                id=event_id(event),
            )
            for event in events
        ]

    def close(self) -> None:
        with self._guard:
            readers, self._readers = list(self._readers.values()), {}
        for reader in readers:  # close all, then wait for all: shutdown costs one receive loop, not one each
            reader.close(join=False)
        deadline = time.monotonic() + 10
        for reader in readers:
            reader.join(deadline - time.monotonic())
        self._properties.close()
