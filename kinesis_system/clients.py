"""Admin and consumer of a ``kinesis`` system, and the boto3 clients they and the producer
(`weirflow_kinesis.producer`) share, through the unmodified boto3 client.

A stream's partitions are its **virtual tasks** (``systems.<name>.virtual.tasks``), not its shards: partition k
is slice k of the MD5 hash space (`weirflow_kinesis.hashing`), and its offsets are positions across the
shards feeding it (`weirflow_kinesis.positions`). Reading goes through the processor's spool
(`weirflow_kinesis.spool`) so each shard is read once however many tasks it feeds.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

from weirflow.base.clock import now_ms
from weirflow.base.errors import (
    StreamExistsError,
    StreamNotFoundError,
)
from weirflow.interfaces.system import (
    FENCED_ATTEMPT_S,
    IncomingRecord,
    PartitionMetadata,
    ReadPlan,
    RecordColumns,
    RecordField,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemStreamPartition,
)
from weirflow_kinesis import positions
from weirflow_kinesis.errors import (
    KinesisStreamInUseError,
    kinesis_errors,
)
from weirflow_kinesis.hashing import key_hash, partition_key, slice_of
from weirflow_kinesis.keys import MIN_RETENTION_HOURS
from weirflow_kinesis.reader import SliceReader, Walk
from weirflow_kinesis.settings import KinesisSettings
from weirflow_kinesis.shards import Shard, ShardMap
from weirflow_kinesis.spool import Spool
from weirflow_kinesis.spool_rows import raw_get_records

log = logging.getLogger("weirflow.kinesis.clients")

# The stream tag holding a stream's virtual task count (docs/kinesis.md).
VIRTUAL_TASKS_TAG = "weirflow.virtual.tasks"
_HOUR_MS = 3_600_000
# A count of records read (`KinesisSystemAdmin.records_read`) is bounded by its end offset, not by a number
_COUNT_LIMIT = 1 << 40

RECORD_FIELDS = (
    RecordField("partition_key", "string", "The record's Kinesis partition key."),
    RecordField("sequence_number", "string", "Its sequence number in its shard."),
    RecordField("shard_id", "string", "The shard it was read from."),
    RecordField("approximate_arrival_time", "timestamp", "When Kinesis received it (its arrival timestamp)."),
)


class KinesisClients:
    """One boto3 client, the shard listings and the spools of one system, shared by its admin, consumer and
    producer in a process."""

    def __init__(self, settings: KinesisSettings) -> None:
        self.settings = settings
        self._client: Any = None
        self._probe_client: Any = None
        self._fenced_client: Any = None
        self._guard = threading.Lock()
        self._maps: dict[str, tuple[float, ShardMap]] = {}
        self._readers: dict[str, SliceReader] = {}
        self._virtual: dict[str, int] = {}

    def virtual_tasks(self, stream: str) -> int:
        """The stream's virtual task count: its ``weirflow.virtual.tasks`` tag (set when weirflow created it),
        else ``systems.<name>.virtual.tasks``. Fixed for the stream's life, so asked once per process."""
        found = self._virtual.get(stream)
        if found is None:
            with self.errors(stream):
                tags = self.client.list_tags_for_stream(StreamName=stream).get("Tags", [])
            value = next((t.get("Value") for t in tags if t.get("Key") == VIRTUAL_TASKS_TAG), None)
            found = self._virtual[stream] = int(value) if value else self.settings.virtual_tasks
        return found

    def _make_client(self, read_timeout_s: float, attempts: int, connect_timeout_s: float = 5) -> Any:
        import boto3
        from botocore.config import Config as BotoConfig

        return boto3.client(
            "kinesis",
            region_name=self.settings.region,
            endpoint_url=self.settings.endpoint,
            config=BotoConfig(
                retries={"total_max_attempts": attempts, "mode": "standard"},
                connect_timeout=connect_timeout_s,
                read_timeout=read_timeout_s,
                max_pool_connections=32,
            ),
        )

    @property
    def client(self) -> Any:
        """The client of every call; boto3 retries transient errors itself (``standard`` mode, 5 attempts)."""
        with self._guard:
            if self._client is None:
                self._client = self._make_client(30, 5)
                self._client.meta.events.register("before-parse.kinesis.GetRecords", raw_get_records)
            return self._client

    @property
    def fenced_client(self) -> Any:
        """The client of fenced sends (`KinesisProducer.send_fenced`): one attempt per call, so that the fence
        is checked before every attempt (boto3's own retries would not check it), and an attempt bounded by
        `FENCED_ATTEMPT_S` (1 s to connect, the rest to answer), which the fence's margin covers."""
        with self._guard:
            if self._fenced_client is None:
                self._fenced_client = self._make_client(FENCED_ATTEMPT_S - 1, 1, connect_timeout_s=1)
            return self._fenced_client

    @property
    def probe_client(self) -> Any:
        """A client whose calls give up after 2 s, for looking up a start time (`Spool.resolve_time`)."""
        with self._guard:
            if self._probe_client is None:
                self._probe_client = self._make_client(2, 1)
            return self._probe_client

    def errors(self, stream: str) -> AbstractContextManager[None]:
        """botocore's errors as weirflow's, through the one table (`weirflow_kinesis.errors.KINESIS_ERRORS`): a
        missing stream names it, an unreachable service names the endpoint (boto3 has retried it already,
        `standard` mode)."""
        return kinesis_errors(self.settings, stream)

    def shard_map(self, stream: str, force: bool = False) -> ShardMap:
        """The stream's shards, listed at most every ``shard.refresh.ms`` unless ``force``."""
        now = time.monotonic()
        cached = self._maps.get(stream)
        if cached is not None and not force and now - cached[0] < self.settings.shard_refresh_ms / 1000:
            return cached[1]
        shards: list[Shard] = []
        with self.errors(stream):
            response = self.client.list_shards(StreamName=stream)
            while True:
                shards.extend(Shard.from_api(s) for s in response.get("Shards", []))
                token = response.get("NextToken")
                if not token:
                    break
                response = self.client.list_shards(NextToken=token)
        found = ShardMap(shards)
        self._maps[stream] = (now, found)
        return found

    def reader(self, stream: str) -> SliceReader:
        with self._guard:
            reader = self._readers.get(stream)
        if reader is None:
            virtual = self.virtual_tasks(stream)
            client, probe_client = self.client, self.probe_client  # (each takes the guard)
            with self._guard:
                reader = self._readers.get(stream)
                if reader is None:
                    spool = Spool(
                        self.settings.spool_dir,
                        stream,
                        client,
                        virtual,
                        self.settings.read_interval_ms,
                        self.settings.spool_retention_ms,
                        probe_client,
                        self.settings.spool_max_bytes,
                    )
                    reader = self._readers[stream] = SliceReader(
                        spool, lambda force: self.shard_map(stream, force), virtual, self.settings.read_failures
                    )
        return reader

    def forget(self, stream: str) -> None:
        """Drop what is cached of ``stream`` (it was just created)."""
        self._virtual.pop(stream, None)
        self._maps.pop(stream, None)

    def close(self) -> None:
        with self._guard:
            for reader in self._readers.values():
                reader.close()
            self._readers.clear()


class KinesisSystemAdmin(SystemAdmin):
    dense_offsets = False
    record_ordinals = True  # each shard is a lane; ordinals travel in the positions (`positions.ordinal_of`)
    task_prefix = "v"  # tasks are <stage>-v<k>: virtual task k
    # A send's records reach a shard in no fixed order (`_rounds` by partition key, retried entries); a virtual
    # task's shards are read one after another, so a reader's order holds per shard only (`read_sequence`).
    ordered_partitions = False

    def __init__(self, clients: KinesisClients) -> None:
        self.clients = clients
        self.settings = clients.settings

    def partition_count(self, stream: str) -> int:
        return self.clients.virtual_tasks(stream)

    def read_sequence(self, record: IncomingRecord) -> str:
        """The shard ``record`` was read from (`read` gives every record its ``shard_id``)."""
        return str(record.attributes.get("shard_id") or "")

    @staticmethod
    def _now_position(shards: ShardMap, partition: int, virtual: int, at_ms: int) -> str:
        """Every shard feeding ``partition``: closed ones processed, open ones from ``at_ms``."""
        feeding = shards.feeding(partition, virtual)
        return positions.encode({s.id: positions.ENDED if s.closed else positions.at_time(at_ms) for s in feeding})

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        return self.partition_metadata_of(stream, range(self.partition_count(stream)))

    def partition_metadata_of(self, stream: str, partitions: Collection[int]) -> dict[int, PartitionMetadata]:
        # Arrival times are whole milliseconds: a record that arrived in this very millisecond is before "now".
        now = now_ms() + 1
        shards, virtual = self.clients.shard_map(stream, force=True), self.clients.virtual_tasks(stream)
        return {
            p: PartitionMetadata(positions.EARLIEST, None, self._now_position(shards, p, virtual, now))
            for p in partitions
        }

    def create_stream(self, spec: StreamSpec) -> bool:
        """Create the stream with ``systems.<name>.shards`` shards (or ``spec.properties["shards"]``) and
        ``systems.<name>.retention.hours`` of retention, and tag it with its virtual task count,
        ``spec.partitions``; an existing stream must have that count (its retention is left as it is)."""
        client = self.clients.client
        shards = int(spec.properties.get("shards", self.settings.shards))
        created = creating = False
        if not self._exists(spec.stream):  # asked first, so a deployed stream needs no right to create one
            creating = True
            try:
                with self.clients.errors(spec.stream):
                    client.create_stream(StreamName=spec.stream, ShardCount=shards)
                created = True
            except KinesisStreamInUseError:
                pass  # created by another processor a moment ago
        if creating:
            with self.clients.errors(spec.stream):
                client.get_waiter("stream_exists").wait(StreamName=spec.stream, WaiterConfig={"Delay": 1})
        if created:
            with self.clients.errors(spec.stream):
                client.add_tags_to_stream(StreamName=spec.stream, Tags={VIRTUAL_TASKS_TAG: str(spec.partitions)})
                if self.settings.retention_hours > MIN_RETENTION_HOURS:
                    client.increase_stream_retention_period(
                        StreamName=spec.stream, RetentionPeriodHours=self.settings.retention_hours
                    )
        self.clients.forget(spec.stream)
        existing = self.clients.virtual_tasks(spec.stream)
        if existing != spec.partitions:
            raise StreamExistsError(
                f"Kinesis stream '{spec.stream}' has {existing} virtual tasks (its partitions), "
                f"not {spec.partitions}"
            )
        return created

    def _exists(self, stream: str) -> bool:
        """Whether ``stream`` exists (in any state), asked of it alone: one call the processor policy allows."""
        try:
            with self.clients.errors(stream):
                self.clients.client.describe_stream_summary(StreamName=stream)
        except StreamNotFoundError:
            return False
        return True

    def list_streams(self) -> dict[str, int]:
        names: list[str] = []
        with self.clients.errors("*"):
            response = self.clients.client.list_streams()
            while True:
                names.extend(response.get("StreamNames", []))
                if not response.get("HasMoreStreams") or not names:
                    break
                response = self.clients.client.list_streams(ExclusiveStartStreamName=names[-1])
        return {name: self.clients.virtual_tasks(name) for name in names}

    def retention(self, stream: str) -> Retention:
        """The stream's ``RetentionPeriodHours`` (`DescribeStreamSummary`); for a stream that does not exist yet,
        ``systems.<name>.retention.hours``, which `create_stream` gives it. Kinesis deletes every record once it
        is that old, read or not, so there is always a retention."""
        try:
            with self.clients.errors(stream):
                summary = self.clients.client.describe_stream_summary(StreamName=stream)
        except StreamNotFoundError:
            key = f"systems.{self.settings.system}.retention.hours"
            return Retention(self.settings.retention_hours * _HOUR_MS, f"{key}, which weirflow creates it with")
        hours = int(summary["StreamDescriptionSummary"]["RetentionPeriodHours"])
        return Retention(hours * _HOUR_MS, "the stream's RetentionPeriodHours")

    def record_fields(self) -> Sequence[RecordField]:
        return RECORD_FIELDS

    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        virtual = self.clients.virtual_tasks(stream)
        shards = self.clients.shard_map(stream, force=True).feeding(partition, virtual)
        return positions.encode({s.id: positions.at_time(timestamp_ms) for s in shards})

    def partition_for_key(self, stream: str, key: bytes) -> int | None:
        return slice_of(key_hash(partition_key(key)), self.clients.virtual_tasks(stream))

    def compare_offsets(self, a: str, b: str) -> int | None:
        return positions.compare(a, b)

    def lanes_live(self, stream: str, partition: int, offset: str) -> set[int] | None:
        """The lanes of the shards feeding virtual task ``partition`` that a read from position ``offset`` may
        still read: every shard not processed to its end (`ShardMap.done`); a shard expired from the stream is
        none of them. Listed afresh: a shard created since the last listing may hold a live lane."""
        with self.clients.errors(stream):
            shards = self.clients.shard_map(stream, force=True)
        virtual, position = self.clients.virtual_tasks(stream), positions.decode(offset)
        pruned = shards.pruned_shards(position, partition, virtual)
        return {
            positions.lane(s.id)
            for s in shards.feeding(partition, virtual)
            if s.id not in pruned and position.get(s.id) != positions.ENDED
        }

    def pin_starts(self, stream: str, starts: Mapping[int, str]) -> dict[int, str]:
        """Each virtual task's start with the shards it would read from where the stream starts now pinned at
        that record (`SliceReader.pin`): a replay then numbers the records as the first read did."""
        oldest: dict[str, str | None] = {}
        with self.clients.errors(stream):
            reader = self.clients.reader(stream)
            return {task: reader.pin(task, start, oldest) for task, start in starts.items()}

    def lost_ranges(self, stream: str) -> list[tuple[str, str, str]]:
        """The ranges of ``stream`` this processor found dropped by retention before a task read them: (shard,
        last sequence number read, oldest sequence number still held); each is also logged as a warning."""
        return self.clients.reader(stream).spool.lost_ranges()

    def records_between(self, stream: str, partition: int, start: str, end: str) -> int | None:
        return 0 if start == end else None  # sequence numbers count nothing (docs/kinesis.md)

    def records_read(self, stream: str, partition: int, start: str, end: str) -> int | None:
        """Counted from the spool, which holds the records the task has just read: a walk from ``start`` to
        ``end`` without values (no call to Kinesis while the spool still covers the range; no read-ahead
        started, since only planners read ahead)."""
        if start == end:
            return 0
        with self.clients.errors(stream):
            walk = self.clients.reader(stream).walk(partition, start, _COUNT_LIMIT, end, values=False)
        return len(walk.records)

    def plan_read(self, stream: str, partition: int, start: str, max_records: int) -> ReadPlan:
        with self.clients.errors(stream):
            walk = self.clients.reader(stream).walk(partition, start, max_records, values=False, patient=False)
        return ReadPlan(walk.end, len(walk.records), walk.at_end)

    def close(self) -> None:
        self.clients.close()


class KinesisSystemConsumer(SystemConsumer):
    def __init__(self, clients: KinesisClients) -> None:
        self.clients = clients

    def _walk(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None, before: bool
    ) -> Walk:
        with self.clients.errors(ssp.stream):
            return self.clients.reader(ssp.stream).walk(
                ssp.partition, start, max_records, end, positions_before=before
            )

    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        walk = self._walk(ssp, start, max_records, end, before=True)
        after = walk.before[1:] + [walk.end] if walk.records else []
        return [
            IncomingRecord(
                ssp=ssp,
                offset=offset,
                next_offset=following,
                key=r.partition_key.encode(),
                value=r.data,
                timestamp_ms=r.arrival_ms,
                attributes=_attributes(r, shard),
                id=record_id(r.data, self.clients.settings.record_id_field),
            )
            for r, shard, offset, following in zip(walk.records, walk.shards, walk.before, after, strict=True)
        ]

    def read_columns(
        self,
        ssp: SystemStreamPartition,
        start: str,
        max_records: int,
        end: str | None = None,
        *,
        attributes: bool = False,
    ) -> RecordColumns:
        walk = self._walk(ssp, start, max_records, end, before=False)
        records = walk.records
        return RecordColumns(
            # a record's own offset (dead letters name it): its shard and sequence number
            offsets=[f"{shard}/{r.sequence_number}" for r, shard in zip(records, walk.shards, strict=True)],
            keys=[r.partition_key.encode() for r in records],
            values=[r.data for r in records],
            timestamps_ms=[r.arrival_ms for r in records],
            next_offset=walk.end,
            attributes=[_attributes(r, s) for r, s in zip(records, walk.shards, strict=True)] * attributes,
            lanes=[positions.lane(s) for s in walk.shards],
            ordinals=walk.ordinals,
        )

    def warm(self, ssp: SystemStreamPartition, start: str, end: str | None = None) -> bool:
        """Nothing to start: the processor's spool holds the range (it was read ahead to plan it). True, so that
        the Spark source reads many virtual tasks per Spark task instead of one each (16 small Spark tasks
        per micro-batch cost more than the reads)."""
        return True

    def close(self) -> None:
        self.clients.close()


def _attributes(record: Any, shard: str) -> Mapping[str, Any]:
    return {
        "partition_key": record.partition_key,
        "sequence_number": record.sequence_number,
        "shard_id": shard,
        "approximate_arrival_time": datetime.fromtimestamp(record.arrival_ms / 1000, tz=UTC),
    }


def record_id(value: bytes, field: str) -> str | None:
    """The id the producer wrote into ``value`` as its JSON object's last field ``field``
    (`weirflow_kinesis.producer._with_id`), else None (no field configured, a value that is not a JSON object,
    or one that does not end with the field)."""
    if not field:
        return None
    text = value.rstrip()
    if not text.startswith(b"{") or not text.endswith(b'"}'):
        return None
    name = json.dumps(field).encode() + b":"
    at = text.rfind(name)
    if at < 0:
        return None
    try:
        found = json.loads(text[at + len(name) : -1])
    except ValueError:
        return None
    return found if isinstance(found, str) else None
