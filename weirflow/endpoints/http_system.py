"""``http``: request/response as a system (docs/endpoints.md "Request/response").

A stream on an ``http`` system is a job's conversation with its HTTP clients. Clients connect to any processor
(``POST /rpc/<stream>``, ``POST /http/<stream>``, ``WS /http/<stream>``); what they send enters the job as
**records of the stream**, and whatever the job writes **to the same system and stream name** goes back to the
client. Each connection is a stream of its own: its records carry the connection's id, all
of them go to one partition (so one task sees a conversation whole, in order), and it begins with a
``connect`` record and ends with a ``disconnect`` record. A response whose ``close`` is true disconnects the
client.

Record columns (`REQUEST_SCHEMA`): ``connection`` (id), ``kind`` (``connect`` | ``request`` | ``disconnect``),
``request`` (the request's id within its connection), ``body`` (the request as JSON text), ``partition`` and
``tasks`` (for a fan-out: which of how many tasks this copy is for). A response is any row with
``connection``, optionally ``request``, ``body`` (anything JSON) and ``close``.

**Where records live.** Every processor must reach every request and response, so an ``http`` system keeps
them on a *backing* system (``systems.<name>.backing``, default `job.default.system`): the requests of stream
``<physical>`` in ``<physical>``, responses in ``<physical>.responses`` (partitioned by connection), dead
letters in ``<physical>.dlq``. The processor a client is connected to reads the responses stream while it has
clients waiting and hands each response to its connection.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Collection, Sequence
from typing import Any

from weirflow.interfaces.config import ConfigKey, ConfigView
from weirflow.interfaces.system import (
    IncomingRecord,
    OutgoingRecord,
    PartitionMetadata,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
    SystemStreamPartition,
)
from weirflow.job.systems import DEAD_LETTER_SUFFIX, HTTP_REQUEST_SCHEMA, dead_letter_stream

REQUEST_SCHEMA = HTTP_REQUEST_SCHEMA  # defined with `is_http_stream`: the data plane reads it from there
RESPONSES_SUFFIX = ".responses"
SECTION = "Request/response (`http`)"

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "systems.<name>.backing",
        "str",
        None,
        "The system an `http` system keeps its requests and responses on (every processor must reach it); "
        "default `job.default.system`, or `local` when that is this system.",
        SECTION,
        system="http",
    ),
)


def backing_system(config: ConfigView, system_name: str) -> str:
    backing = config.get(f"systems.{system_name}.backing") or config.get("job.default.system")
    return "local" if not backing or backing == system_name else str(backing)


def responses_stream(physical: str) -> str:
    return f"{physical}{RESPONSES_SUFFIX}"


def connection_partition(connection: str, partitions: int) -> int:
    """Every record of a connection, request or response, goes to this partition."""
    return zlib.crc32(connection.encode("utf-8")) % partitions


def request_record(
    physical: str,
    connection: str,
    kind: str,
    partition: int,
    request: str = "",
    body: Any = None,
    share: int = 0,
    tasks: int = 1,
) -> OutgoingRecord:
    """A client's record, in ``partition`` of the requests; ``share`` of ``tasks`` says which copy of a fan-out
    it is (0 of 1 for a request to one task)."""
    text = None if body is None else json.dumps(body)
    value = {
        "connection": connection,
        "kind": kind,
        "request": request,
        "body": text,
        "partition": share,
        "tasks": tasks,
    }
    return OutgoingRecord(physical, json.dumps(value).encode(), key=connection.encode(), partition=partition)


class _Backed:
    def __init__(self, system_name: str, config: ConfigView) -> None:
        from weirflow.interfaces.plugins import system_factory

        self.backing = backing_system(config, system_name)
        self.factory = system_factory(config, self.backing)


class HttpSystemAdmin(SystemAdmin):
    def __init__(self, system_name: str, config: ConfigView) -> None:
        backed = _Backed(system_name, config)
        self.inner = backed.factory.get_admin(backed.backing, config)

    def partition_count(self, stream: str) -> int:
        return self.inner.partition_count(stream)

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        return self.inner.partition_metadata(stream)

    def partition_metadata_of(self, stream: str, partitions: Collection[int]) -> dict[int, PartitionMetadata]:
        return self.inner.partition_metadata_of(stream, partitions)

    def create_stream(self, spec: StreamSpec) -> bool:
        created = self.inner.create_stream(spec)
        if not spec.stream.endswith(DEAD_LETTER_SUFFIX):
            self.inner.create_stream(StreamSpec(responses_stream(spec.stream), spec.partitions))
        return created

    def list_streams(self) -> dict[str, int]:
        return {s: n for s, n in self.inner.list_streams().items() if not s.endswith(RESPONSES_SUFFIX)}

    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        return self.inner.offset_for_time(stream, partition, timestamp_ms)

    def retention(self, stream: str) -> Retention | None:
        """The backing system's: it holds the records."""
        return self.inner.retention(stream)

    def close(self) -> None:
        self.inner.close()


class HttpSystemConsumer(SystemConsumer):
    """Reads requests (and, for the processors serving clients, responses) from the backing system."""

    def __init__(self, system_name: str, config: ConfigView) -> None:
        backed = _Backed(system_name, config)
        self.inner = backed.factory.get_consumer(backed.backing, config)
        self.backing = backed.backing

    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        inner = SystemStreamPartition(self.backing, ssp.stream, ssp.partition)
        return [_as(record, ssp) for record in self.inner.read(inner, start, max_records, end)]

    def close(self) -> None:
        self.inner.close()


def _as(record: IncomingRecord, ssp: SystemStreamPartition) -> IncomingRecord:
    return IncomingRecord(
        ssp, record.offset, record.next_offset, record.key, record.value, record.timestamp_ms, record.attributes
    )


class HttpSystemProducer(SystemProducer):
    """What a job sends to an ``http`` stream is a response: it goes to the stream's responses, in the
    partition of its connection. A record without a connection is a dead letter, with the reason."""

    def __init__(self, system_name: str, config: ConfigView) -> None:
        backed = _Backed(system_name, config)
        self.inner = backed.factory.get_producer(backed.backing, config)
        self.admin = backed.factory.get_admin(backed.backing, config)
        self._partitions: dict[str, int] = {}

    def send(self, records: Sequence[OutgoingRecord]) -> None:
        out = []
        for record in records:
            if record.stream.endswith(DEAD_LETTER_SUFFIX):
                out.append(record)
                continue
            connection = _connection_of(record)
            if connection is None:
                reason = "a response to an http stream needs a 'connection' column (the request's connection)"
                out.append(
                    OutgoingRecord(
                        dead_letter_stream(record.stream),
                        json.dumps(
                            {
                                "error": reason,
                                "stream": record.stream,
                                "head_base64": base64.b64encode(record.value[:1024]).decode(),
                            }
                        ).encode(),
                    )
                )
                continue
            stream = responses_stream(record.stream)
            if stream not in self._partitions:
                self._partitions[stream] = self.admin.partition_count(stream)
            partition = connection_partition(connection, self._partitions[stream])
            out.append(OutgoingRecord(stream, record.value, key=connection.encode(), partition=partition))
        self.inner.send(out)

    def max_record_bytes(self, stream: str) -> int | None:
        return self.inner.max_record_bytes(stream)

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()
        self.admin.close()


def _connection_of(record: OutgoingRecord) -> str | None:
    try:
        value = json.loads(record.value)
    except ValueError:
        value = None
    if isinstance(value, dict) and value.get("connection"):
        return str(value["connection"])
    return record.key.decode("utf-8", "replace") if record.key else None


class HttpSystemFactory(SystemFactory):
    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        return HttpSystemAdmin(system_name, config)

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        return HttpSystemConsumer(system_name, config)

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        return HttpSystemProducer(system_name, config)
