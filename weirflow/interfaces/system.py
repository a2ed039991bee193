"""Streams and the systems that hold them: `SystemFactory`, `SystemAdmin`, `SystemConsumer`, `SystemProducer`.

A *system* (Samza's word) is a place where partitioned, ordered logs live: the embedded SQLite log, Event Hubs,
Kinesis. The runtime never talks to a system directly; it asks the configured `SystemFactory`
(`systems.<name>.factory`) for an admin, a consumer or a producer. These are plain-value interfaces so a new
system needs nothing but this module's docstrings.

**Offsets** are strings defined by the system: an offset names a place in one SSP to read from. Coordination
and checkpoints treat them as opaque and store the *next offset to read*, which every system can resume from.
Everything else that must reason about offsets asks the system's admin, as Samza's
``SystemAdmin.offsetComparator`` does: `SystemAdmin.compare_offsets` (which of two is further),
`SystemAdmin.records_between` (lag, when countable) and `SystemAdmin.plan_read` (where a read of at most n
records from an offset ends: how the Spark data plane plans micro-batches). Two kinds of offsets exist:

* **dense** (``SystemAdmin.dense_offsets`` True, the default): decimal sequence numbers, one per record, dense
  within a partition (a record at offset n is followed by n + 1): the embedded log, Event Hubs. Hot paths
  may do arithmetic on them (the Spark source plans budgets by subtraction, without a round trip per SSP).
* **positions** (False): any other string, compared and advanced only through the admin. Kinesis's offsets
  are JSON of shard id → last sequence number processed, since a virtual task reads several shards whose
  sequence numbers are not contiguous (docs/kinesis.md). ``PartitionMetadata.newest`` is then None and
  ``upcoming`` is a position at the partition's end *now*, not the offset the next record will carry.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.table import TableWriter


@dataclass(frozen=True, order=True)
class SystemStream:
    """A stream on a system: ``system`` is the config name (`systems.<name>`), ``stream`` the physical name."""

    system: str
    stream: str

    def __str__(self) -> str:
        return f"{self.system}.{self.stream}"


@dataclass(frozen=True, order=True)
class SystemStreamPartition:
    """One partition of a stream (an SSP). JSON shape: ``{"system": str, "stream": str, "partition": int}``."""

    system: str
    stream: str
    partition: int

    @property
    def system_stream(self) -> SystemStream:
        return SystemStream(self.system, self.stream)

    def to_json(self) -> dict[str, Any]:
        return {"system": self.system, "stream": self.stream, "partition": self.partition}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SystemStreamPartition:
        return cls(str(data["system"]), str(data["stream"]), int(data["partition"]))

    def key(self) -> str:
        """Stable string form ``system.stream.partition``, used as a row/column key by stores."""
        return f"{self.system}.{self.stream}.{self.partition}"

    @classmethod
    def parse(cls, text: str) -> SystemStreamPartition:
        system, rest = text.split(".", 1)
        stream, partition = rest.rsplit(".", 1)
        return cls(system, stream, int(partition))

    def __str__(self) -> str:
        return self.key()


@dataclass(frozen=True)
class StreamSpec:
    """What to create: a stream's physical name, its partition count and system-specific properties."""

    stream: str
    partitions: int
    properties: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PartitionMetadata:
    """Offsets of one partition.

    ``oldest`` is the offset of the first readable record and ``upcoming`` the offset the next appended record
    will get. The partition is empty when ``oldest == upcoming``. ``newest`` is the offset of the last record,
    or None when empty. All are strings in the system's own format.
    """

    oldest: str
    newest: str | None
    upcoming: str
    # The system's own description of the newest record (Event Hubs: its ``offset`` and ``sequence_number``),
    # carried into checkpoints' ``positions`` for systems whose native checkpoint layout needs it.
    newest_position: Mapping[str, str] | None = None


@dataclass(frozen=True)
class RecordField:
    """A system-specific column a source can add beside the user's (`streams.<id>.system-columns`).

    ``type`` is Spark DDL (``string``, ``bigint``, ``timestamp``, ``map<string,string>``) so this module needs
    no Spark; values come from `IncomingRecord.attributes` (timestamps as aware ``datetime``)."""

    name: str
    type: str
    description: str


@dataclass(frozen=True)
class IncomingRecord:
    """A record read from an SSP. ``offset`` is its own offset; ``next_offset`` the offset to resume after it.

    ``attributes`` holds the system's own description of the record, keyed by the names of
    `SystemAdmin.record_fields` (Event Hubs: properties, partition key, enqueued time, sequence number,
    offset); systems without such fields leave it empty.

    ``id`` is the id the record was sent with (`OutgoingRecord.id`), where the system keeps it (the embedded
    log: a column; Event Hubs: the ``weirflow-id`` property; Kinesis: the JSON field it was written into), else
    None. Readers of a job's outputs drop replays by it (`weirflow.results`)."""

    ssp: SystemStreamPartition
    offset: str
    next_offset: str
    key: bytes | None
    value: bytes
    timestamp_ms: int
    attributes: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


class OffsetRange(Sequence[str]):
    """The offsets of ``length`` consecutive records of a system of dense offsets, from ``first``: what
    `RecordColumns.offsets` holds without a string per record (a reader that wants numbers takes ``first``)."""

    __slots__ = ("first", "length")

    def __init__(self, first: int, length: int) -> None:
        self.first = first
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [str(self.first + i) for i in range(*index.indices(self.length))]
        if index < 0:
            index += self.length
        if not 0 <= index < self.length:
            raise IndexError(index)
        return str(self.first + index)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, OffsetRange):
            return (self.first, self.length) == (other.first, other.length)
        return isinstance(other, Sequence) and list(self) == list(other)

    def __hash__(self) -> int:
        return hash((self.first, self.length))

    def __repr__(self) -> str:
        return f"OffsetRange({self.first}, {self.length})"


@dataclass(frozen=True)
class RecordColumns:
    """Consecutive records of one SSP, column by column: what `SystemConsumer.read_columns` returns.

    Index *i* of every sequence describes one record, with the meaning of `IncomingRecord`'s fields;
    ``next_offset`` is the offset to resume after the last record. ``attributes`` is empty unless the caller
    asked for them (it holds one mapping per record then). The Spark source decodes whole columns at once,
    so it reads this shape rather than one `IncomingRecord` object per record.

    ``offsets`` name the records (the Spark source puts them in dead letters only; reads resume from
    ``next_offset``): with dense offsets they are `read`'s, consecutive ones best as an `OffsetRange`; a system
    of positions may name each record by its own identity instead (Kinesis: ``<shard>/<sequence number>``).

    ``lanes`` and ``ordinals`` (a system of positions with `SystemAdmin.record_ordinals`; empty otherwise) say
    where each record sits in the partition as a replay must see it again: the **lane** is the ordered log
    within the partition it came from (a Kinesis shard: a number, at most 2**31 - 2), the **ordinal** its
    place in that lane, increasing, and the same in every read that reaches the record from any offset at or
    before it. The Spark data plane positions rows by them (docs/guarantees.md), as it does by dense offsets,
    so a batch replayed after a crash is dropped downstream instead of counted twice."""

    offsets: Sequence[str]
    keys: Sequence[bytes | None]
    values: Sequence[bytes]
    timestamps_ms: Sequence[int]
    next_offset: str
    attributes: Sequence[Mapping[str, Any]] = ()
    lanes: Sequence[int] = ()
    ordinals: Sequence[int] = ()

    def __len__(self) -> int:
        return len(self.values)

    @classmethod
    def of(cls, records: Sequence[IncomingRecord], start: str, attributes: bool = False) -> RecordColumns:
        """The columns of ``records`` (read from offset ``start``)."""
        return cls(
            offsets=[r.offset for r in records],
            keys=[r.key for r in records],
            values=[r.value for r in records],
            timestamps_ms=[r.timestamp_ms for r in records],
            next_offset=records[-1].next_offset if records else start,
            attributes=[r.attributes for r in records] if attributes else (),
        )


# The record property that carries `OutgoingRecord.id` on systems that keep properties (docs/guarantees.md).
RECORD_ID_PROPERTY = "weirflow-id"


@dataclass(frozen=True)
class OutgoingRecord:
    """A record to send. ``partition`` pins the partition; else ``key`` is hashed; else the system chooses.

    ``id`` (optional) names the record deterministically: a replay of the batch that wrote it sends the same id
    again (docs/guarantees.md). A system that can drop a record whose id its stream already holds does so
    (the embedded log); one that keeps record properties carries it for consumers (Event Hubs: the
    ``weirflow-id`` application property); others ignore it."""

    stream: str
    value: bytes
    key: bytes | None = None
    partition: int | None = None
    id: str | None = None


_PERIODS = (("days", 86_400_000), ("hours", 3_600_000), ("minutes", 60_000), ("seconds", 1000))


def _period(ms: int) -> str:
    """``ms`` in the largest unit that divides it: 24 hours, 7 days, 90 minutes."""
    for unit, size in _PERIODS:
        if ms >= size and ms % size == 0:
            count = ms // size
            return f"{count} {unit if count != 1 else unit[:-1]}"
    return f"{ms} ms"


@dataclass(frozen=True)
class Retention:
    """How long a stream keeps a record before its system may delete it, whether or not anything read it
    (`SystemAdmin.retention`). ``ms`` None: the system may delete records, but how soon is not known.
    ``source`` is where the figure comes from, or why there is none, for the messages that quote it (the
    stream's ``RetentionPeriodHours``, a config key)."""

    ms: int | None
    source: str = ""

    def __str__(self) -> str:
        said = f"drops records after {_period(self.ms)}" if self.ms is not None else "may drop records"
        return f"{said} ({self.source})" if self.source else said


class ReadPlan(NamedTuple):
    """Where a read from an offset ends (`SystemAdmin.plan_read`): the offset after it and how many records it
    holds. ``at_end`` is True when the read reaches what the partition holds now."""

    end: str
    records: int
    at_end: bool


class SystemAdmin(ABC):
    """Metadata and stream management for one system.

    Thread-safety: one admin may be used from several threads of one process. Every method may be called
    from several processes at once; ``create_stream`` must be idempotent across them.
    """

    # Whether offsets are dense decimal sequence numbers (the module docstring); False: opaque positions.
    dense_offsets: ClassVar[bool] = True
    # For a system of positions: whether `SystemConsumer.read_columns` gives every record its lane and ordinal
    # (`RecordColumns`), which make a replay recognisable downstream. Without them, between stages is at least
    # once on this system (docs/guarantees.md).
    record_ordinals: ClassVar[bool] = False
    # Put before a task's partition number in its name (`weirflow.job.grouper`): Kinesis's virtual tasks are "v".
    task_prefix: ClassVar[str] = ""
    # Whether a reader gets the records of each partition (of each `read_sequence`) in the order they were sent.
    # True (the embedded log, Event Hubs): a reader of a job's outputs keeps one mark per lane to leave replays
    # out. False (Kinesis: its producer reorders the records of one send): it keeps a window of a send's rows
    # (`weirflow.results.ReplayFilter.for_job`; docs/guarantees.md, "Reading results once").
    ordered_partitions: ClassVar[bool] = True
    # Whether `trim` deletes records on request (the embedded log); False: the system's retention deletes.
    trims: ClassVar[bool] = False

    @abstractmethod
    def partition_count(self, stream: str) -> int:
        """Number of partitions of ``stream``; raise `StreamNotFoundError` (naming the stream) when absent."""

    @abstractmethod
    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        """Oldest / newest / upcoming offsets of every partition of ``stream``."""

    def partition_metadata_of(self, stream: str, partitions: Collection[int]) -> dict[int, PartitionMetadata]:
        """`partition_metadata` of some partitions only. The Spark source asks this before every micro-batch
        for the task's own partitions, so a system should answer it without touching the others and in time
        that does not grow with the data the stream holds. The default filters `partition_metadata`."""
        everything = self.partition_metadata(stream)
        return {p: everything[p] for p in partitions}

    @abstractmethod
    def create_stream(self, spec: StreamSpec) -> bool:
        """Create the stream if missing. Return True if created, False if it already existed with the same
        partition count; raise `weirflow.base.errors.StreamExistsError` (a `ValueError`) if it exists with a
        different count."""

    @abstractmethod
    def list_streams(self) -> dict[str, int]:
        """Physical stream names and their partition counts."""

    def compare_offsets(self, a: str, b: str) -> int | None:
        """Negative, 0 or positive as offset ``a`` of one SSP is before, at or after ``b``; None when neither is
        (a position ahead in one shard and behind in another). The default compares dense offsets."""
        x, y = int(a), int(b)
        return (x > y) - (x < y)

    def lanes_live(self, stream: str, partition: int, offset: str) -> set[int] | None:
        """The lanes (`RecordColumns.lanes`) a read of ``partition`` from ``offset`` may still read, for a system
        whose partitions are made of lanes (`record_ordinals`); a lane not listed is read to its end and is never
        read again from there, so a consumer may forget its mark once it has read past its rows
        (`weirflow.spark.lane_marks`). None (the default): the partition is one lane, nothing to forget."""
        return None

    def pin_starts(self, stream: str, starts: Mapping[int, str]) -> dict[int, str]:
        """The start offsets of tasks about to read ``stream`` (partition → offset), each in the form a replay
        from it reads exactly the records a read from it now reads, numbered alike. The runtime checkpoints
        them before the tasks' first read when they change. The default returns them as they are: a dense
        offset names its record, whatever the system's retention drops. A system of positions whose start may
        mean "the oldest record held" pins it to that record (Kinesis: `positions.pinned`)."""
        return dict(starts)

    def records_between(self, stream: str, partition: int, start: str, end: str) -> int | None:
        """Records from offset ``start`` up to ``end`` (lag, record counts), or None when the system cannot count
        them without reading. The default subtracts dense offsets."""
        return max(0, int(end) - int(start))

    def records_read(self, stream: str, partition: int, start: str, end: str) -> int | None:
        """Records a task has just read from offset ``start`` up to ``end`` (one micro-batch's range: the
        task's ``records_in``). Unlike `records_between`, which answers lag over a whole backlog and so must not
        read, this range was read a moment ago, and a system of positions may count it from what it kept of
        that read (the Kinesis spool does). None when it cannot count. The default is `records_between`."""
        return self.records_between(stream, partition, start, end)

    def plan_read(self, stream: str, partition: int, start: str, max_records: int) -> ReadPlan:
        """Where a read of at most ``max_records`` records from ``start`` ends, given what the partition holds
        now. The Spark source plans each micro-batch with it (the range must then read back exactly the same
        records); a system of positions may read ahead to answer. The default uses `partition_metadata_of`."""
        upcoming = int(self.partition_metadata_of(stream, [partition])[partition].upcoming)
        position = int(start)
        take = max(0, min(max_records, upcoming - position))
        return ReadPlan(str(position + take), take, position + take >= upcoming)

    def read_sequence(self, record: IncomingRecord) -> str:
        """Which ordered sequence of its partition ``record`` was read from: the records of one sequence reach a
        reader in the order they were sent (up to the reordering within a send that `ordered_partitions` False
        allows), those of two sequences in no order a reader can rely on. The default, "", makes the partition
        one sequence; Kinesis answers the shard. `weirflow streams consume` leaves replays out per sequence."""
        return ""

    def record_fields(self) -> Sequence[RecordField]:
        """The system-specific columns its records carry in `IncomingRecord.attributes` (none by default)."""
        return ()

    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        """Offset of the partition's first record stamped at or after ``timestamp_ms`` (epoch ms), or its
        upcoming offset when there is none yet; backs ``streams.<id>.start: <ISO time>``. Systems that
        cannot seek by time raise `NotImplementedError` (the runtime turns it into a config error)."""
        raise NotImplementedError(f"{type(self).__name__} cannot seek by time")

    def partition_for_key(self, stream: str, key: bytes) -> int | None:
        """The partition a record sent with ``key`` (and no partition) lands in, or None when the system cannot
        say. Routes lookups of a record job's served tables (docs/endpoints.md) to the task holding the key."""
        return None

    def native_position(self, record: IncomingRecord) -> Mapping[str, str] | None:
        """The system's own description of where ``record`` is (Event Hubs: its ``offset`` and
        ``sequence_number``), for checkpoints' ``positions`` when the system's native checkpoint layout needs
        more than weirflow's offset; None (the default) when it needs nothing."""
        return None

    def offset_after_native_checkpoint(self, stream: str, partition: int) -> str | None:
        """The offset after the last record that a consumer written with the system's own client library
        checkpointed for this partition (Event Hubs: the SDKs' checkpoint blobs), or None when it checkpointed
        none; backs ``streams.<id>.start: sdk-checkpoint``. Systems without such checkpoints raise
        `NotImplementedError` (the runtime turns it into a config error)."""
        raise NotImplementedError(f"{type(self).__name__} has no checkpoints of its own client library")

    def retention(self, stream: str) -> Retention | None:
        """How long ``stream`` keeps a record, read or not: None when the system never deletes one while the
        stream exists (the embedded log), else a `Retention`. A stream that does not exist yet answers what
        `create_stream` would give it: the runtime asks before it creates the streams a job reads back whole (a
        record task's table changelogs, a pipeline's intermediate streams) and refuses to start when one may
        lose records, unless ``systems.<name>.retention.loss.allowed`` accepts it (docs/guarantees.md).

        The default answers that the system may drop records, how soon unknown. A system that does not say is not
        taken to keep everything: that guess, when wrong, loses table rows and changes results with no error at
        all, which is what the check exists to prevent; the cautious answer, when wrong, costs one config line
        at start, with the reason in the error. Override it when the system can tell."""
        return Retention(None, f"{type(self).__name__} does not say how long it keeps records")

    def trim(self, stream: str, partition: int, before: str) -> int | None:
        """Delete the records of ``partition`` below offset ``before``, for a job that will never read them
        again (docs/guarantees.md, "Trimming"). Offsets stay as they are: the partition's ``oldest`` moves up to
        ``before``, and a read below it raises `RecordsDeletedError` rather than skipping. Returns how many
        records were deleted, or None when the system does not delete on request (Event Hubs, Kinesis: their
        retention deletes)."""
        return None

    def compact(self, stream: str) -> int | None:
        """Delete every keyed record of ``stream`` that a later record of the same key and partition supersedes,
        as a compacted Kafka topic keeps only the latest value per key: a table's changelog is read back whole and
        only its latest row per key counts (docs/guarantees.md, "Trimming"). Offsets stay as they are, so a
        partition has gaps. Returns how many records were deleted, or None when the system does not compact (the
        default)."""
        return None

    def forget_ids(self, stream: str, keep: Callable[[str], bool]) -> int | None:
        """Forget the output ids of ``stream`` (`OutgoingRecord.id`) for which ``keep`` is False: a later send of
        one is written again instead of dropped. The job's leader forgets those no replay can send again
        (docs/guarantees.md, "Output ids"). Returns how many were forgotten, or None when the system keeps no ids
        (the default)."""
        return None

    def apply_retention(self) -> dict[str, int] | None:
        """Delete what each stream's retention no longer keeps, on a system that has no service of its own to do
        it (the embedded log: `streams.<id>.retention`, `streams.<id>.retention.bytes`); the job's leader calls it
        every `job.trim.interval.ms`. Returns the records deleted per stream, or None when the system's own
        service applies its retention (the default)."""
        return None

    def close(self) -> None:
        """Release connections. Idempotent."""


class SystemConsumer(ABC):
    """Reads ranges of SSPs. Stateless about positions: the caller passes the start offset every time."""

    @abstractmethod
    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        """Records of ``ssp`` from offset ``start`` (inclusive) in offset order, at most ``max_records`` and
        stopping before ``end`` when given. Returns an empty list when nothing is there yet; never blocks
        for long. ``start`` older than the partition's oldest offset reads from the oldest, except on a system
        that knows the records between were deleted (`SystemAdmin.trim`, the embedded log's retention): it
        raises `RecordsDeletedError`, since the reader would skip them."""

    def read_columns(
        self,
        ssp: SystemStreamPartition,
        start: str,
        max_records: int,
        end: str | None = None,
        *,
        attributes: bool = False,
    ) -> RecordColumns:
        """What `read` returns, as `RecordColumns` (``attributes`` only when asked for). The default builds
        it from `read`; a system whose client hands rows over in bulk should override it, since the Spark
        source reads every record through this method."""
        return RecordColumns.of(self.read(ssp, start, max_records, end), start, attributes)

    def warm(self, ssp: SystemStreamPartition, start: str, end: str | None = None) -> bool:
        """Begin, in the background, whatever reading ``ssp`` from ``start`` (up to ``end``, the whole range
        about to be read) will wait for, such as a network receiver attaching, so that the read starts at
        once. True when the system does so: the Spark source then gives each of Spark's tasks several
        partitions, warms them all and reads them in turn, instead of one Spark task per partition whose
        receivers attach one wave of tasks after another. The default does nothing and returns False (local
        reads have nothing to wait for)."""
        return False

    def close(self) -> None:
        """Release connections. Idempotent."""


# How long one attempt of a fenced send may take at most, from its fence check to the system's answer: each
# system bounds an attempt's connect and wait by it (the embedded log checks once its write lock is held), so
# the fence's margin (a third of the lease by default: 5 s) covers the time between a check and the write it
# lets through (docs/guarantees.md).
FENCED_ATTEMPT_S = 4.0


class SystemProducer(ABC):
    """Appends records to streams. ``send`` is durable when it returns (at-least-once)."""

    @abstractmethod
    def send(self, records: Sequence[OutgoingRecord]) -> None:
        """Append ``records``; records for one partition keep their order. Raise on failure: nothing returns
        normally unless everything was written."""

    def send_fenced(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None]) -> None:
        """`send`, calling ``before_attempt`` right before every attempt to write, the first and each retry;
        it raises to stop the send. The Spark sink passes its fence here, so a worker whose processor lost the
        task's lock writes nothing more, however long a retry waited (docs/guarantees.md). The default calls
        it once, then `send`; a system whose ``send`` retries or waits overrides this to call it before each
        attempt, and bounds one attempt by `FENCED_ATTEMPT_S`."""
        before_attempt()
        self.send(records)

    def max_record_bytes(self, stream: str) -> int | None:
        """Largest record ``stream`` takes (key and value), or None without a limit. Writers that pack many
        rows into one record stay under it."""
        return None

    def flush(self) -> None:
        """Make previously sent records durable (no-op for systems whose ``send`` is synchronous)."""

    def close(self) -> None:
        """Flush and release connections. Idempotent."""


class SystemFactory(ABC):
    """Entry point of a system plugin, named by `systems.<name>.factory` (alias or ``module:Class``).

    Constructed with no arguments; each method receives the system's config name and the whole job config
    (a `ConfigView`, `weirflow.interfaces.config`) so it can read `systems.<name>.*` keys. The keys a system
    plugin reads are its own: it declares them (``ConfigKey(..., system=<its alias>)``) and registers them
    under the ``weirflow.config_keys`` entry-point group.
    """

    @abstractmethod
    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin: ...

    @abstractmethod
    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer: ...

    @abstractmethod
    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer: ...

    def get_table_writer(self, system_name: str, config: ConfigView) -> TableWriter | None:
        """The system's `TableWriter` when its streams are tables (`weirflow.interfaces.table`: the Spark sink
        then writes a micro-batch's rows of an output stream as one atomic commit), else None (the default)."""
        return None
