"""The ``eventhub`` system's producer over the unmodified `azure-eventhub` SDK.

Events are packed into SDK batches up to the hub's size limit. `send` refuses records too big for an empty
batch with `RecordTooLargeError` before sending anything (each reason says how big the record is and the hub's
limit); the Spark sink sends them to the dead-letter stream with the reason. Sends retry exactly what the
error table (`weirflow_azure.eventhubs.errors`) calls transient; a fenced send makes one attempt, within
`FENCED_ATTEMPT_S`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from azure.eventhub import EventData
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential, wait_random

from weirflow.base.errors import InvalidArgumentError, PartitionNotFoundError, RecordTooLargeError
from weirflow.interfaces.system import FENCED_ATTEMPT_S, RECORD_ID_PROPERTY, OutgoingRecord, SystemProducer
from weirflow_azure.eventhubs.errors import EventTooLargeError, hub_errors, is_transient
from weirflow_azure.eventhubs.hub_clients import HubClients
from weirflow_azure.eventhubs.lookup3 import partition_for_key
from weirflow_azure.eventhubs.settings import EventHubsSettings

log = logging.getLogger("weirflow.eventhub")


class EventHubSystemProducer(SystemProducer):
    def __init__(self, settings: EventHubsSettings) -> None:
        self._settings = settings
        self._clients = HubClients(settings)
        self._counts: dict[str, int] = {}
        self._next_partition: dict[str, int] = {}

    def _destination(self, record: OutgoingRecord, count: int) -> tuple[int, dict[str, str]]:
        """(partition, batch arguments). Keyed records under ``hash`` keep their key (the service routes it;
        lookup3 tells us where, so records can be grouped per partition); records without a key or pinned
        partition are spread round robin here, record by record (the service would put a whole batch on
        one partition)."""
        if record.partition is not None:
            return record.partition, {"partition_id": str(record.partition)}
        method = self._settings.partition_method
        if record.key is not None and method == "hash":
            key = record.key.decode("utf-8", "replace")
            return partition_for_key(key, count), {"partition_key": key}
        if record.key is not None and method == "key_as_partition":
            try:
                partition = int(record.key)
            except ValueError:
                raise InvalidArgumentError(
                    f"key {record.key!r} is not a partition number (partition.method key_as_partition)"
                ) from None
            return partition, {"partition_id": str(partition)}
        partition = self._next_partition.get(record.stream, 0)
        self._next_partition[record.stream] = (partition + 1) % count
        return partition, {"partition_id": str(partition)}

    def max_record_bytes(self, stream: str) -> int | None:
        """The hub's batch limit less room for one event's AMQP framing (sent to a pinned partition)."""
        with hub_errors(self._settings.system, stream):
            return self._clients.producer(stream).create_batch().max_size_in_bytes - 1024

    def _too_large(self, records: Sequence[OutgoingRecord]) -> None:
        """Raise `RecordTooLargeError` before sending anything when a record cannot fit even an empty batch."""
        offending, reasons = [], []
        limits: dict[str, int] = {}
        for record in records:
            if record.stream not in limits:
                with hub_errors(self._settings.system, record.stream):
                    limits[record.stream] = self._clients.producer(record.stream).create_batch().max_size_in_bytes
            if len(record.value) + len(record.key or b"") + 512 < limits[record.stream]:
                continue  # clearly fits: skip the encoding check
            with hub_errors(self._settings.system, record.stream):
                probe = self._clients.producer(record.stream).create_batch()
            try:
                probe.add(EventData(record.value))
            except ValueError:
                offending.append(record)
                reasons.append(str(EventTooLargeError(record.stream, len(record.value), limits[record.stream])))
        if offending:
            raise RecordTooLargeError(offending, reasons)

    def send(self, records: Sequence[OutgoingRecord]) -> None:
        """Group by hub and partition (keeping each partition's order), then send runs of records that share
        batch arguments, filling each SDK batch to the hub's limit. A record too large for the hub raises
        `RecordTooLargeError` before anything is sent."""
        self._send(records, None)

    def send_fenced(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None]) -> None:
        """`send`, with ``before_attempt`` called right before each SDK batch is sent and before each retry."""
        self._send(records, before_attempt)

    def _send(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None] | None) -> None:
        for hub in {r.stream for r in records}:
            self._partition_count(hub)  # a missing hub fails first, naming it
        self._too_large(records)
        runs: dict[tuple[str, int], list[tuple[dict[str, str], list[OutgoingRecord]]]] = {}
        for record in records:
            count = self._partition_count(record.stream)
            partition, dest = self._destination(record, count)
            if not 0 <= partition < count:
                raise PartitionNotFoundError(
                    f"partition {partition} of event hub '{record.stream}' does not exist ({count})"
                )
            group = runs.setdefault((record.stream, partition), [])
            if group and group[-1][0] == dest:
                group[-1][1].append(record)
            else:
                group.append((dest, [record]))
        for (hub, _), group in runs.items():
            for dest, items in group:
                with hub_errors(self._settings.system, hub):
                    self._pack_and_send(hub, dest, items, before_attempt)

    def _partition_count(self, hub: str) -> int:
        if hub not in self._counts:
            with hub_errors(self._settings.system, hub):
                self._counts[hub] = len(self._clients.producer(hub).get_partition_ids())
        return self._counts[hub]

    def _pack_and_send(
        self,
        hub: str,
        dest: dict[str, str],
        items: list[OutgoingRecord],
        before_attempt: Callable[[], None] | None,
    ) -> None:
        client = self._clients.producer(hub)
        batch = client.create_batch(**dest)
        for record in items:
            event = EventData(record.value)
            if record.id is not None:
                event.properties = {RECORD_ID_PROPERTY: record.id}
            try:
                batch.add(event)
                continue
            except ValueError:
                pass
            if len(batch) == 0:
                raise EventTooLargeError(hub, len(record.value), batch.max_size_in_bytes)
            self._send_batch(client, hub, batch, before_attempt)
            batch = client.create_batch(**dest)
            try:
                batch.add(event)
            except ValueError:
                raise EventTooLargeError(hub, len(record.value), batch.max_size_in_bytes) from None
        if len(batch):
            self._send_batch(client, hub, batch, before_attempt)

    def _send_batch(self, client: Any, hub: str, batch: Any, before_attempt: Callable[[], None] | None) -> None:
        """Send one batch; transient failures (connection lost, timeouts, busy service: `is_transient`, the
        error table's verdict) are retried with bounded exponential backoff; the last one is then raised and
        mapped by the caller's `hub_errors` to a `ServiceUnavailableError` naming the hub. ``before_attempt``
        runs right before every attempt, and what it raises ends the send at once (never retried)."""

        def attempt() -> None:
            if before_attempt is not None:
                before_attempt()
            client.send_batch(batch, timeout=None if before_attempt is None else FENCED_ATTEMPT_S)  # in the margin

        retrying = Retrying(
            stop=stop_after_attempt(self._settings.send_attempts),
            wait=wait_exponential(multiplier=0.2, max=5) + wait_random(0, 0.2),
            retry=retry_if_exception(is_transient),
            reraise=True,
            before_sleep=lambda state: log.warning(
                "send to event hub %s failed (attempt %d): %s; retrying",
                hub,
                state.attempt_number,
                state.outcome.exception() if state.outcome else "?",
            ),
        )
        retrying(attempt)

    def close(self) -> None:
        self._clients.close()
