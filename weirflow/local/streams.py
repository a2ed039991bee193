"""The embedded partitioned log: streams of a `local` system in one SQLite file.

Records get per-partition sequence offsets 0, 1, 2, ... (decimal strings). A producer picks the partition
from the record's explicit partition, else ``crc32(key) % partitions`` (stable across processes and runs),
else round robin. Appends compute the next offset inside a ``BEGIN IMMEDIATE`` transaction, so concurrent
producer processes never reuse an offset.

A record sent with an id (`OutgoingRecord.id`) keeps it in its row (``records.id``, read back as
`IncomingRecord.id`), and the stream's ids (``record_ids``) make a send of an id the stream already holds a
no-op: a replay is dropped where it is written (docs/guarantees.md). Databases made before ids were kept in
the rows gain the column when opened (their older records have none).
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weirflow.base import clock
from weirflow.base.errors import (
    InvalidArgumentError,
    PartitionNotFoundError,
    RecordsDeletedError,
    StreamExistsError,
    StreamNotFoundError,
)
from weirflow.base.sqlite import Database
from weirflow.interfaces.system import (
    IncomingRecord,
    OffsetRange,
    OutgoingRecord,
    PartitionMetadata,
    RecordColumns,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemProducer,
    SystemStreamPartition,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS streams (
    name TEXT PRIMARY KEY, partitions INTEGER NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (stream TEXT NOT NULL, partition INTEGER NOT NULL, offset INTEGER NOT NULL,
    key BLOB, value BLOB NOT NULL, timestamp_ms INTEGER NOT NULL, id TEXT,
    PRIMARY KEY (stream, partition, offset)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS record_ids (stream TEXT NOT NULL, id TEXT NOT NULL,
    PRIMARY KEY (stream, id)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS partition_starts (stream TEXT NOT NULL, partition INTEGER NOT NULL,
    start INTEGER NOT NULL, PRIMARY KEY (stream, partition)) WITHOUT ROWID;
"""
_ENDS = (
    "SELECT (SELECT MIN(offset) FROM records WHERE stream = ? AND partition = ?), "
    "(SELECT MAX(offset) FROM records WHERE stream = ? AND partition = ?), "
    "(SELECT start FROM partition_starts WHERE stream = ? AND partition = ?)"
)
_START = "SELECT start FROM partition_starts WHERE stream = ? AND partition = ?"


def first_held(conn: Any, stream: str, partition: int) -> int:
    """The first offset a partition may still hold: 0 unless records below were deleted (`trim`)."""
    row = conn.execute(_START, (stream, partition)).fetchone()
    return int(row[0]) if row is not None else 0


class SqliteStreamStore:
    """The shared database of one `local` system; admin, consumer and producer wrap it."""

    def __init__(self, db_path: Path, busy_timeout_ms: int = 10000) -> None:
        self.path = Path(db_path)
        self.db = Database(self.path, SCHEMA, busy_timeout_ms)
        self._add_id_column()

    def _add_id_column(self) -> None:
        """Give a database made before records kept their ids the column (idempotent, safe when several
        processes open the file at once)."""
        with self.db.transaction() as conn:
            columns = {row[1] for row in conn.execute("PRAGMA table_info(records)")}
            if "id" not in columns:
                conn.execute("ALTER TABLE records ADD COLUMN id TEXT")

    def partitions(self, stream: str) -> int:
        row = self.db.connection().execute("SELECT partitions FROM streams WHERE name = ?", (stream,)).fetchone()
        if row is None:
            raise StreamNotFoundError(
                f"stream '{stream}' does not exist in {self.path}; create it with "
                f"`weirflow streams create CONFIG {stream} --partitions N`"
            )
        return int(row[0])

    def close(self) -> None:
        self.db.close()


@dataclass(frozen=True)
class StreamRetention:
    """What a stream of the embedded log keeps (`streams.<id>.retention`, `streams.<id>.retention.bytes`), and
    the key that says so, for messages."""

    ms: int | None
    bytes: int | None
    key: str

    def describe(self) -> Retention:
        return Retention(self.ms, self.key)


class LocalSystemAdmin(SystemAdmin):
    trims = True

    def __init__(self, store: SqliteStreamStore, retentions: Mapping[str, StreamRetention] | None = None) -> None:
        self._store = store
        self._retentions = dict(retentions or {})  # by physical name

    def partition_count(self, stream: str) -> int:
        return self._store.partitions(stream)

    def partition_for_key(self, stream: str, key: bytes) -> int | None:
        return zlib.crc32(key) % self._store.partitions(stream)  # as LocalSystemProducer places keyed records

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        return self.partition_metadata_of(stream, range(self._store.partitions(stream)))

    def partition_metadata_of(self, stream: str, partitions: Collection[int]) -> dict[int, PartitionMetadata]:
        """Two index probes per partition (the primary key is ``(stream, partition, offset)``): the cost does not
        grow with the records the stream holds. One statement with both MIN and MAX would scan the partition."""
        count = self._store.partitions(stream)
        conn = self._store.db.connection()
        result = {}
        for p in partitions:
            if not 0 <= p < count:
                raise PartitionNotFoundError(f"stream '{stream}' has no partition {p} (it has {count})")
            lo, hi, start = conn.execute(_ENDS, (stream, p, stream, p, stream, p)).fetchone()
            start = start or 0
            result[p] = (
                PartitionMetadata(str(start), None, str(start))
                if hi is None
                else PartitionMetadata(str(max(lo, start)), str(hi), str(hi + 1))
            )
        return result

    def trim(self, stream: str, partition: int, before: str) -> int:
        """Delete the partition's records below ``before`` (never past the last one: the next append keeps its
        offset) and remember where the partition now starts, so that offsets stay as they were and a read
        below it raises `RecordsDeletedError`. The pages freed are reused by later appends: the file stops
        growing rather than shrinking (docs/guarantees.md, "Trimming")."""
        count = self._store.partitions(stream)
        if not 0 <= partition < count:
            raise PartitionNotFoundError(f"stream '{stream}' has no partition {partition} (it has {count})")
        with self._store.db.transaction() as conn:
            start = first_held(conn, stream, partition)
            hi = conn.execute(
                "SELECT MAX(offset) FROM records WHERE stream = ? AND partition = ?", (stream, partition)
            ).fetchone()[0]
            upto = min(int(before), (hi + 1) if hi is not None else start)
            if upto <= start:
                return 0
            deleted = conn.execute(
                "DELETE FROM records WHERE stream = ? AND partition = ? AND offset < ?", (stream, partition, upto)
            ).rowcount
            conn.execute(
                "INSERT INTO partition_starts VALUES (?, ?, ?) "
                "ON CONFLICT (stream, partition) DO UPDATE SET start = excluded.start",
                (stream, partition, upto),
            )
            return int(deleted)

    def create_stream(self, spec: StreamSpec) -> bool:
        if spec.partitions < 1:
            raise InvalidArgumentError(
                f"stream '{spec.stream}' needs at least one partition, not {spec.partitions}"
            )
        with self._store.db.transaction() as conn:
            row = conn.execute("SELECT partitions FROM streams WHERE name = ?", (spec.stream,)).fetchone()
            if row is not None:
                if row[0] != spec.partitions:
                    raise StreamExistsError(
                        f"stream '{spec.stream}' already exists in {self._store.path} with {row[0]} partitions, "
                        f"not {spec.partitions}"
                    )
                return False
            conn.execute("INSERT INTO streams VALUES (?, ?, ?)", (spec.stream, spec.partitions, clock.now_ms()))
            return True

    def offset_for_time(self, stream: str, partition: int, timestamp_ms: int) -> str:
        """Records are stamped when appended, so per partition the stamps rise with the offsets (a backwards
        clock step aside); the first offset stamped at or after ``timestamp_ms`` is where that time begins."""
        self._store.partitions(stream)
        conn = self._store.db.connection()
        row = conn.execute(
            "SELECT MIN(offset) FROM records WHERE stream = ? AND partition = ? AND timestamp_ms >= ?",
            (stream, partition, timestamp_ms),
        ).fetchone()
        if row[0] is not None:
            return str(row[0])
        return self.partition_metadata_of(stream, [partition])[partition].upcoming

    def close(self) -> None:
        self._store.close()

    def list_streams(self) -> dict[str, int]:
        rows = self._store.db.connection().execute("SELECT name, partitions FROM streams ORDER BY name").fetchall()
        return {name: count for name, count in rows}

    def retention(self, stream: str) -> Retention | None:
        """None unless the stream's config gives it a retention: then the embedded log deletes records past it
        (`apply_retention`), read or not."""
        found = self._retentions.get(stream)
        return found.describe() if found is not None else None

    def compact(self, stream: str) -> int:
        """One delete per partition, in one transaction each: a keyed record goes when a later record of its key
        is in the partition. A reader reading the partition meanwhile still ends with the latest value per key
        (what it skips has a later record it has not read yet)."""
        deleted = 0
        for partition in range(self._store.partitions(stream)):
            with self._store.db.transaction() as conn:
                deleted += conn.execute(
                    "DELETE FROM records WHERE stream = ? AND partition = ? AND key IS NOT NULL AND offset NOT IN "
                    "(SELECT MAX(offset) FROM records WHERE stream = ? AND partition = ? AND key IS NOT NULL "
                    "GROUP BY key)",
                    (stream, partition, stream, partition),
                ).rowcount
        return deleted

    def forget_ids(self, stream: str, keep: Callable[[str], bool]) -> int:
        """Reads the stream's ids once and deletes, in one transaction, those ``keep`` refuses: the records keep
        their ids (``records.id``, what readers see); only the table that drops a send of a held id shrinks."""
        conn = self._store.db.connection()
        ids = [row[0] for row in conn.execute("SELECT id FROM record_ids WHERE stream = ?", (stream,))]
        gone = [(stream, i) for i in ids if not keep(i)]
        if gone:
            with self._store.db.transaction() as conn:
                conn.executemany("DELETE FROM record_ids WHERE stream = ? AND id = ?", gone)
        return len(gone)

    def apply_retention(self) -> dict[str, int]:
        """Per stream with a retention: below the first record appended within ``ms``, and below the oldest
        records whose keys and values together pass ``bytes`` per partition, counted from the newest."""
        deleted: dict[str, int] = {}
        existing = self.list_streams()
        now = clock.now_ms()
        for stream, kept in self._retentions.items():
            for partition in range(existing.get(stream, 0)):
                cut = 0
                if kept.ms is not None:
                    cut = int(self.offset_for_time(stream, partition, now - kept.ms))
                if kept.bytes is not None:
                    cut = max(cut, self._bytes_cut(stream, partition, kept.bytes))
                if cut and (count := self.trim(stream, partition, str(cut))):
                    deleted[stream] = deleted.get(stream, 0) + count
        return deleted

    def _bytes_cut(self, stream: str, partition: int, limit: int) -> int:
        """The first offset to keep so that the partition holds at most ``limit`` bytes of keys and values (0: it
        holds less). Reads the newest records until the sum passes the limit, not the whole partition."""
        row = (
            self._store.db.connection()
            .execute(
                "SELECT offset FROM (SELECT offset, SUM(LENGTH(value) + IFNULL(LENGTH(key), 0)) "
                "OVER (ORDER BY offset DESC) AS held FROM records WHERE stream = ? AND partition = ?) "
                "WHERE held > ? LIMIT 1",
                (stream, partition, limit),
            )
            .fetchone()
        )
        return int(row[0]) + 1 if row is not None else 0


class LocalSystemConsumer(SystemConsumer):
    def __init__(self, store: SqliteStreamStore) -> None:
        self._store = store

    def _rows(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None, columns: str
    ) -> list[Any]:
        upper = int(end) if end is not None else 2**62
        conn = self._store.db.connection()
        rows = conn.execute(
            f"SELECT {columns} FROM records WHERE stream = ? AND partition = ? "
            "AND offset >= ? AND offset < ? ORDER BY offset LIMIT ?",
            (ssp.stream, ssp.partition, int(start), upper, max_records),
        ).fetchall()
        if (not rows or rows[0][0] != int(start)) and int(start) < (
            held := first_held(conn, ssp.stream, ssp.partition)
        ):
            raise RecordsDeletedError(
                f"{ssp}: offset {start} was deleted (records below {held} were trimmed or outlived their "
                f'retention); the first offset held is {held} (docs/operations.md, "Running for months")'
            )
        return rows

    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        rows = self._rows(ssp, start, max_records, end, "offset, key, value, timestamp_ms, id")
        return [IncomingRecord(ssp, str(o), str(o + 1), k, v, ts, id=i) for o, k, v, ts, i in rows]

    def read_columns(
        self,
        ssp: SystemStreamPartition,
        start: str,
        max_records: int,
        end: str | None = None,
        *,
        attributes: bool = False,
    ) -> RecordColumns:
        # no ids (readers of columns never use them) and, offsets being consecutive, no string per record
        rows = self._rows(ssp, start, max_records, end, "offset, key, value, timestamp_ms")
        if not rows:
            return RecordColumns([], [], [], [], start)
        offsets, keys, values, stamps = zip(*rows, strict=True)
        first, last = offsets[0], offsets[-1]
        return RecordColumns(
            offsets=OffsetRange(first, len(rows)) if last - first == len(rows) - 1 else list(map(str, offsets)),
            keys=keys,
            values=values,
            timestamps_ms=stamps,
            next_offset=str(offsets[-1] + 1),
            attributes=[{}] * len(rows) if attributes else (),
        )

    def close(self) -> None:
        self._store.close()


class LocalSystemProducer(SystemProducer):
    def __init__(self, store: SqliteStreamStore) -> None:
        self._store = store
        self._round_robin = itertools.count()

    def _partition(self, record: OutgoingRecord, partitions: int) -> int:
        if record.partition is not None:
            if not 0 <= record.partition < partitions:
                raise PartitionNotFoundError(
                    f"stream '{record.stream}' has no partition {record.partition} (it has {partitions})"
                )
            return record.partition
        if record.key is not None:
            return zlib.crc32(record.key) % partitions
        return next(self._round_robin) % partitions

    def close(self) -> None:
        self._store.close()

    def send(self, records: Sequence[OutgoingRecord]) -> None:
        self._send(records, None)

    def send_fenced(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None]) -> None:
        """`send`, checking the fence once the log's write lock is held, right before the records are written:
        taking the lock can wait out the busy timeout behind another process's write (10 s, longer than the
        fence's margin), and a check made before that wait would let a writer whose lease ran out meanwhile
        write after the task's next holder read back what was written (docs/guarantees.md)."""
        self._send(records, before_attempt)

    def _send(self, records: Sequence[OutgoingRecord], before_write: Callable[[], None] | None) -> None:
        if not records:
            if before_write is not None:
                before_write()
            return
        counts = {stream: self._store.partitions(stream) for stream in {r.stream for r in records}}
        placed = [(r, self._partition(r, counts[r.stream])) for r in records]
        timestamp = clock.now_ms()
        with self._store.db.transaction() as conn:
            if before_write is not None:  # the write lock is ours: nothing can delay the write from here on
                before_write()
            next_offsets: dict[tuple[str, int], int] = {}
            rows = []
            for record, partition in placed:
                if record.id is not None:  # a replay of a record the stream holds: dropped (docs/guarantees.md)
                    taken = conn.execute(
                        "INSERT OR IGNORE INTO record_ids VALUES (?, ?)", (record.stream, record.id)
                    )
                    if taken.rowcount == 0:
                        continue
                slot = (record.stream, partition)
                if slot not in next_offsets:
                    row = conn.execute(
                        "SELECT MAX(offset) FROM records WHERE stream = ? AND partition = ?", slot
                    ).fetchone()
                    next_offsets[slot] = (row[0] + 1) if row[0] is not None else first_held(conn, *slot)
                rows.append(
                    (record.stream, partition, next_offsets[slot], record.key, record.value, timestamp, record.id)
                )
                next_offsets[slot] += 1
            conn.executemany(
                "INSERT INTO records (stream, partition, offset, key, value, timestamp_ms, id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
