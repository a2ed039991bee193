"""The producer of a ``kinesis`` system, through the unmodified boto3 client.

It sends by partition key (Kinesis routes by its MD5) in `PutRecords` calls within the service limits (500
records, 5 MiB, 1 MiB per record; a larger record raises `RecordTooLargeError` before anything is sent, which
the data plane turns into a dead letter). A key appears at most once per call, so a failed entry is retried
(throttling, internal errors; exponential backoff) before the key's next record is sent: retries never reorder
a key's records.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Callable, Iterator, Sequence

from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from weirflow.base.errors import (
    PartitionNotFoundError,
    RecordTooLargeError,
    ServiceUnavailableError,
    WeirflowError,
    error_code,
)
from weirflow.interfaces.system import OutgoingRecord, SystemProducer
from weirflow_kinesis.clients import KinesisClients
from weirflow_kinesis.errors import KinesisThrottledError
from weirflow_kinesis.hashing import partition_key, pinning_key

log = logging.getLogger("weirflow.kinesis.clients")

# PutRecords limits (AWS documentation, "Quotas and limits").
MAX_RECORDS_PER_CALL = 500
MAX_BYTES_PER_CALL = 5 * 1024 * 1024
MAX_RECORD_BYTES = 1024 * 1024  # data + partition key


class _NotWritten(WeirflowError):
    """Some entries of a `PutRecords` call were not written (retried)."""


def _with_id(record: OutgoingRecord, field: str) -> OutgoingRecord:
    """``record`` with its id as field ``field`` of its JSON object (the last one: nothing else moves); a
    record without an id, or whose value is not a JSON object (packed intermediate rows), unchanged."""
    value = record.value
    if record.id is None or not value.startswith(b"{") or not value.rstrip().endswith(b"}"):
        return record
    body = value.rstrip()[:-1].rstrip()
    member = json.dumps(field).encode() + b":" + json.dumps(record.id).encode()
    joined = body + (b"" if body == b"{" else b",") + member + b"}"
    return dataclasses.replace(record, value=joined)


class KinesisSystemProducer(SystemProducer):
    def __init__(self, clients: KinesisClients) -> None:
        self.clients = clients
        self.settings = clients.settings

    def max_record_bytes(self, stream: str) -> int | None:
        return MAX_RECORD_BYTES - 256  # room for the longest partition key

    def _partition_key(self, record: OutgoingRecord) -> str:
        if record.partition is not None:
            virtual = self.clients.virtual_tasks(record.stream)
            if not 0 <= record.partition < virtual:
                raise PartitionNotFoundError(
                    f"partition {record.partition} of Kinesis stream '{record.stream}' does not "
                    f"exist ({virtual} virtual tasks)"
                )
            return pinning_key(record.partition, virtual)
        if record.key:
            return partition_key(record.key)
        return uuid.uuid4().hex  # no key: Kinesis spreads the records

    def send(self, records: Sequence[OutgoingRecord]) -> None:
        """Send by stream in rounds (round r holds the r-th record of every partition key, so a retried entry
        never lands after a later record of its key), each round in calls within the service limits."""
        self._send(records, None)

    def send_fenced(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None]) -> None:
        """`send`, with ``before_attempt`` called right before each `PutRecords` call, retries included."""
        self._send(records, before_attempt)

    def _send(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None] | None) -> None:
        field = self.settings.record_id_field
        sent = [_with_id(r, field) for r in records] if field else list(records)
        entries: list[tuple[OutgoingRecord, str]] = [(r, self._partition_key(r)) for r in sent]
        too_large = [
            (
                original,  # the caller's record: it tells refused records apart by identity
                f"record of {len(r.value) + len(k.encode())} bytes (data and partition key) exceeds Kinesis's "
                f"{MAX_RECORD_BYTES} byte limit",
            )
            for original, (r, k) in zip(records, entries, strict=True)
            if len(r.value) + len(k.encode()) > MAX_RECORD_BYTES
        ]
        if too_large:
            raise RecordTooLargeError([r for r, _ in too_large], [reason for _, reason in too_large])
        by_stream: dict[str, list[tuple[OutgoingRecord, str]]] = {}
        for record, key in entries:
            by_stream.setdefault(record.stream, []).append((record, key))
        for stream, items in by_stream.items():
            for round_ in _rounds(items):
                for call in _calls(round_):
                    self._put(stream, call, before_attempt)

    def _put(
        self, stream: str, call: list[tuple[OutgoingRecord, str]], before_attempt: Callable[[], None] | None = None
    ) -> None:
        """One `PutRecords` call, its failed entries (and throttled calls) retried with exponential backoff
        (tenacity) until all are written, or `ServiceUnavailableError` after ``send.attempts`` tries.
        ``before_attempt`` runs right before every call; what it raises ends the send (never retried). A fenced
        call goes through the client of one attempt (`KinesisClients.fenced_client`), and its transient
        failures are retried here, each after the fence was checked again."""
        pending = call
        client = self.clients.client if before_attempt is None else self.clients.fenced_client

        def attempt() -> None:
            nonlocal pending
            if before_attempt is not None:
                before_attempt()
            try:
                with self.clients.errors(stream):
                    response = client.put_records(
                        StreamName=stream, Records=[{"Data": r.value, "PartitionKey": k} for r, k in pending]
                    )
                results = response["Records"]
            except KinesisThrottledError as exc:  # the whole call refused: every entry failed
                cause = exc.__cause__ or exc
                results = [{"ErrorCode": error_code(cause), "ErrorMessage": str(cause)}] * len(pending)
            except ServiceUnavailableError as exc:
                if before_attempt is None:  # boto3 retried it already
                    raise
                raise _NotWritten(str(exc)) from exc  # one attempt of a fenced send: retried after a check
            failed = [(entry, res) for entry, res in zip(pending, results, strict=True) if "ErrorCode" in res]
            if failed:
                pending = [entry for entry, _ in failed]
                raise _NotWritten(f"{failed[0][1]['ErrorCode']}: {failed[0][1].get('ErrorMessage', '')}")

        def before_sleep(state: RetryCallState) -> None:
            log.info(
                "kinesis %s: %d of %d record(s) not written (%s); retrying in %.1fs",
                stream,
                len(pending),
                len(call),
                state.outcome.exception() if state.outcome else "",
                state.upcoming_sleep,
            )

        retrying = Retrying(
            retry=retry_if_exception_type(_NotWritten),
            wait=wait_exponential(multiplier=0.1, max=5),
            stop=stop_after_attempt(self.settings.send_attempts),
            before_sleep=before_sleep,
            reraise=True,
        )
        try:
            retrying(attempt)
        except _NotWritten as exc:
            raise ServiceUnavailableError(
                f"Kinesis at {self.settings.where} refused {len(pending)} record(s) of stream '{stream}' "
                f"{self.settings.send_attempts} times ({exc}); raise systems.{self.settings.system}.send.attempts "
                "or the stream's shards"
            ) from exc

    def close(self) -> None:
        self.clients.close()


def _rounds(items: list[tuple[OutgoingRecord, str]]) -> Iterator[list[tuple[OutgoingRecord, str]]]:
    """Round r: the r-th record of every partition key, in their original order."""
    seen: dict[str, int] = {}
    rounds: list[list[tuple[OutgoingRecord, str]]] = []
    for item in items:
        n = seen.get(item[1], 0)
        seen[item[1]] = n + 1
        if n == len(rounds):
            rounds.append([])
        rounds[n].append(item)
    yield from rounds


def _calls(items: list[tuple[OutgoingRecord, str]]) -> Iterator[list[tuple[OutgoingRecord, str]]]:
    """Consecutive runs of at most 500 records and 5 MiB."""
    call: list[tuple[OutgoingRecord, str]] = []
    size = 0
    for record, key in items:
        n = len(record.value) + len(key.encode())
        if call and (len(call) == MAX_RECORDS_PER_CALL or size + n > MAX_BYTES_PER_CALL):
            yield call
            call, size = [], 0
        call.append((record, key))
        size += n
    if call:
        yield call
