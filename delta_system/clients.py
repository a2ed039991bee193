"""The ``delta`` system's admin, consumer and producer: what ``weirflow streams list | consume | produce`` and a
job reading a Delta stream use. A Spark sink writing a Delta output commits through the `TableWriter`
(`weirflow_delta.writer`) instead.

* Admin: a table is a stream of **one partition**; its offsets are positions (`weirflow_delta.positions`),
  compared and counted here. Delta keeps rows until someone deletes or vacuums them, so `retention` is None.
  `create_stream` creates nothing: a table's columns come from its first commit's rows, and that commit creates
  it (module docstring of `weirflow_delta.writer`); it answers whether that is still to come.
* Consumer: each row as a JSON record (`weirflow_delta.json_rows`), with its id from the id column
  (`IncomingRecord.id`) and its commit's time as its timestamp.
* Producer: JSON lines appended as rows of the table's own schema, one commit per `send` (at least once: a
  `send` that failed may have committed, and sending again appends again). The table must exist: JSON cannot
  say its columns' types.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow.fs as pafs

from weirflow.base.errors import (
    DecodeError,
    InvalidArgumentError,
    PartitionNotFoundError,
    StreamExistsError,
    StreamNotFoundError,
)
from weirflow.interfaces.system import (
    IncomingRecord,
    OutgoingRecord,
    PartitionMetadata,
    ReadPlan,
    RecordField,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemProducer,
    SystemStreamPartition,
)
from weirflow_delta.json_rows import from_json, to_json
from weirflow_delta.positions import Position
from weirflow_delta.reader import TableReader
from weirflow_delta.tables import arrow_schema
from weirflow_delta.writer import DeltaTableWriter

log = logging.getLogger("weirflow.delta")

PARTITIONS = 1
# The attribute (and system column) naming a record's table partition, the ordered sequence it was read from.
TABLE_PARTITION = "table_partition"
RECORD_FIELDS = (
    RecordField(
        TABLE_PARTITION,
        "string",
        "The Delta partition of the row's file, as its directory is named (`day=2026-11-20`; empty for an "
        "unpartitioned table).",
    ),
)


def _one_partition(stream: str, partition: int) -> None:
    if partition != 0:
        raise PartitionNotFoundError(f"Delta stream '{stream}' has one partition (0), not {partition}")


def _next(version: int, row: int, rows: int) -> Position:
    """The position after row ``row`` of a commit of ``rows`` rows: the next commit's first after its last."""
    return Position(version, row + 1) if row + 1 < rows else Position(version + 1, 0)


class DeltaSystemAdmin(SystemAdmin):
    dense_offsets = False
    # Rows reach a reader in the order they were committed within each table partition (`read_sequence`): a
    # commit's files of one partition hold its rows in the order they were given (`weirflow_delta.writer`
    # hands delta-rs one Arrow batch, whose order it keeps; tests/unit/test_delta_table.py checks it).
    ordered_partitions = True

    def __init__(self, reader: TableReader) -> None:
        self.reader = reader

    def partition_count(self, stream: str) -> int:
        self.reader.require(stream)
        return PARTITIONS

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        latest = self.reader.require(stream)
        oldest = Position(self.reader.oldest(stream), 0)
        return {0: PartitionMetadata(str(oldest), None, str(Position(latest + 1, 0)))}

    def create_stream(self, spec: StreamSpec) -> bool:
        """True when the table does not exist yet, and nothing more is needed before its first commit creates
        it; False when it exists. Nothing is made now: a Delta table's columns come from the rows."""
        exists = self.reader.latest(spec.stream) >= 0
        if spec.partitions != PARTITIONS:
            said = f"Delta table '{spec.stream}' {'exists' if exists else 'is a stream'} with one partition"
            if exists:
                raise StreamExistsError(f"{said}, not {spec.partitions}: set streams.<id>.partitions: 1")
            raise InvalidArgumentError(f"{said}, not {spec.partitions}: set streams.<id>.partitions: 1")
        if not exists:
            log.info(
                "Delta table %s does not exist yet: its first commit creates it, with the columns of its rows",
                self.reader.tables.uri(spec.stream),
            )
        return not exists

    def list_streams(self) -> dict[str, int]:
        """The tables directly under the system's path (directories holding a Delta log)."""
        tables = self.reader.tables
        root = tables.settings.root.uri

        def listed() -> dict[str, int]:
            from deltalake import DeltaTable
            from deltalake.exceptions import TableNotFoundError
            from deltalake.fs import DeltaStorageHandler

            options = tables.settings.storage_options()
            try:
                infos = DeltaStorageHandler(root, options).get_file_info_selector(
                    pafs.FileSelector("", allow_not_found=True)
                )
            except TableNotFoundError:  # a local path that does not exist yet: no tables
                return {}
            names = sorted(
                i.path.rstrip("/").rsplit("/", 1)[-1] for i in infos if i.type == pafs.FileType.Directory
            )
            return {n: PARTITIONS for n in names if DeltaTable.is_deltatable(f"{root}/{n}", options)}

        return tables.call_root("list the tables of", listed)

    def compare_offsets(self, a: str, b: str) -> int | None:
        x, y = Position.parse(a), Position.parse(b)
        return (x > y) - (x < y)

    def records_between(self, stream: str, partition: int, start: str, end: str) -> int | None:
        """Counted from the log's statistics of the commits in between (no data is read); None when a commit has
        none."""
        _one_partition(stream, partition)
        first, last = Position.parse(start), Position.parse(end)
        if last <= first:
            return 0
        total = 0
        for entry in self.reader.entries(stream, first.version):
            if entry.version > last.version:
                break
            if entry.records is None:
                return None
            upper = last.row if entry.version == last.version else entry.records
            lower = first.row if entry.version == first.version else 0
            total += max(0, min(upper, entry.records) - lower)
        return total

    def plan_read(self, stream: str, partition: int, start: str, max_records: int) -> ReadPlan:
        _one_partition(stream, partition)
        at, taken = self.reader.start(stream, Position.parse(start)), 0
        for entry in self.reader.entries(stream, at.version):
            rows = self.reader.count(stream, entry)
            row = at.row if entry.version == at.version else 0
            take = max(0, min(rows - row, max_records - taken))
            taken += take
            if taken >= max_records:
                end = Position(entry.version, row + take)
                return ReadPlan(str(end if end.row < rows else Position(entry.version + 1, 0)), taken, False)
            at = Position(entry.version + 1, 0)
        return ReadPlan(str(at), taken, True)

    def read_sequence(self, record: IncomingRecord) -> str:
        """The record's table partition: a partitioned table's commit writes each partition's rows in order,
        but one partition's files after another's."""
        return str(record.attributes.get(TABLE_PARTITION, ""))

    def record_fields(self) -> Sequence[RecordField]:
        return RECORD_FIELDS

    def retention(self, stream: str) -> Retention | None:
        """Delta keeps every row until someone deletes it or vacuums the files a rewrite left behind."""
        return None

    def close(self) -> None:
        self.reader.tables.close()


class DeltaSystemConsumer(SystemConsumer):
    def __init__(self, reader: TableReader) -> None:
        self.reader = reader

    def read(
        self, ssp: SystemStreamPartition, start: str, max_records: int, end: str | None = None
    ) -> list[IncomingRecord]:
        _one_partition(ssp.stream, ssp.partition)
        table, id_column = ssp.stream, self.reader.tables.id_column
        at = self.reader.start(table, Position.parse(start))
        stop = Position.parse(end) if end is not None else None
        records: list[IncomingRecord] = []
        for entry in self.reader.entries(table, at.version):
            if len(records) >= max_records or (stop is not None and Position(entry.version, 0) >= stop):
                break
            if not entry.files:
                continue
            commit = self.reader.rows(table, entry)
            rows = commit.table
            first = at.row if entry.version == at.version else 0
            last = min(rows.num_rows, first + max_records - len(records))
            if stop is not None and stop.version == entry.version:
                last = min(last, stop.row)
            if last <= first:
                continue
            chunk = rows.slice(first, last - first)
            ids = chunk.column(id_column).to_pylist() if id_column in chunk.column_names else [None] * len(chunk)
            for index, (value, record_id) in enumerate(zip(to_json(chunk), ids, strict=True)):
                row = first + index
                records.append(
                    IncomingRecord(
                        ssp=ssp,
                        offset=str(Position(entry.version, row)),
                        next_offset=str(_next(entry.version, row, rows.num_rows)),
                        key=None,
                        value=value,
                        timestamp_ms=entry.timestamp_ms,
                        attributes={TABLE_PARTITION: commit.partition_of(row)},
                        id=None if record_id is None else str(record_id),
                    )
                )
        return records

    def close(self) -> None:
        self.reader.tables.close()


class DeltaSystemProducer(SystemProducer):
    def __init__(self, writer: DeltaTableWriter) -> None:
        self.writer = writer

    def send(self, records: Sequence[OutgoingRecord]) -> None:
        self._send(records, None)

    def send_fenced(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None]) -> None:
        self._send(records, before_attempt)

    def _send(self, records: Sequence[OutgoingRecord], before_attempt: Callable[[], None] | None) -> None:
        """One commit per stream, in the order the records came."""
        by_stream: dict[str, list[OutgoingRecord]] = {}
        for record in records:
            if record.partition not in (None, 0):
                raise PartitionNotFoundError(
                    f"Delta stream '{record.stream}' has one partition (0), not {record.partition}"
                )
            by_stream.setdefault(record.stream, []).append(record)
        for stream, batch in by_stream.items():
            self._append(stream, batch, before_attempt)

    def _append(self, table: str, batch: list[OutgoingRecord], before_attempt: Callable[[], None] | None) -> None:
        tables = self.writer.tables
        loaded = tables.call("read", table, lambda: tables.load(table))
        if loaded is None:
            raise StreamNotFoundError(
                f"Delta table '{table}' does not exist at {tables.uri(table)}: JSON cannot be its first write, "
                "since JSON does not say its columns' types (1 may be a bigint or a double, a string a date); "
                "its first commit, from a job's rows or from deltalake (write_deltalake), creates it "
                "(docs/delta.md)"
            )
        objects = [self._object(table, record) for record in batch]
        rows = from_json(objects, arrow_schema(loaded), table)
        self.writer.commit(table, rows, {}, int(loaded.version()), before_attempt)

    def _object(self, table: str, record: OutgoingRecord) -> dict[str, Any]:
        try:
            value = json.loads(record.value)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"a record for Delta table '{table}' is not JSON: {exc}") from exc
        if not isinstance(value, dict):
            raise DecodeError(f"a record for Delta table '{table}' is not a JSON object (a row): {value!r:.80}")
        id_column = self.writer.id_column
        if record.id is not None and value.get(id_column) is None:
            value[id_column] = record.id
        return value

    def close(self) -> None:
        self.writer.close()
