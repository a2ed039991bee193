"""System contract (admin, consumer, producer): streams, exact offsets, key routing, concurrent producers.

Offsets are checked as `weirflow.interfaces.system` defines them: dense sequence numbers exactly, positions
(``SystemAdmin.dense_offsets`` False) through the admin's comparisons and planned reads."""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from weirflow.base.errors import RecordsDeletedError, StreamExistsError, StreamNotFoundError
from weirflow.interfaces.system import (
    OutgoingRecord,
    RecordColumns,
    Retention,
    StreamSpec,
    SystemStreamPartition,
)
from weirflow.testing.backend import Backend, SystemClients
from weirflow.testing.contracts._base import Contract, require_processes


@dataclass
class SystemUnderTest:
    """`SystemClients` and the backend's way to make a stream exist (``declare``)."""

    clients: SystemClients
    backend: Backend

    @property
    def name(self) -> str:
        return self.clients.name

    @property
    def admin(self):
        return self.clients.admin

    @property
    def consumer(self):
        return self.clients.consumer

    @property
    def producer(self):
        return self.clients.producer

    @property
    def creates_streams(self) -> bool:
        return self.backend.creates_streams

    def declare(self, stream: str, partitions: int) -> None:
        self.backend.declare_stream(self.admin, stream, partitions)


def _produce(backend: Backend, writer: int) -> None:
    """In a spawned process: 1,000 records to partition 0 of ``shared``, in batches of 100."""
    clients = backend.system()
    try:
        for batch in range(10):
            clients.producer.send(
                [OutgoingRecord("shared", f"{writer}-{batch * 100 + i}".encode(), partition=0) for i in range(100)]
            )
    finally:
        clients.close()


class SystemContract(Contract):
    """`weirflow.interfaces.system` (`SystemAdmin`, `SystemConsumer`, `SystemProducer`), through
    ``Backend.system`` and ``Backend.declare_stream``. ``Backend.system()`` must return a system holding no
    streams yet (so define ``weirflow_backend`` with function scope); the concurrent-producers test spawns
    three processes that call ``system()`` on the (pickled) backend and must reach the same system."""

    @pytest.fixture
    def system(self, weirflow_backend: Backend) -> Iterator[SystemUnderTest]:
        sut = SystemUnderTest(weirflow_backend.system(), weirflow_backend)
        yield sut
        sut.clients.close()

    def test_create_stream_is_idempotent_and_rejects_another_partition_count(self, system) -> None:
        if not system.creates_streams:
            system.declare("views", 4)
            existing = system.admin.create_stream(StreamSpec("views", 4))
            assert existing is False, "an existing stream is only checked"
            with pytest.raises(StreamExistsError, match="views"):
                system.admin.create_stream(StreamSpec("views", 8))
            return  # a missing stream: test_a_missing_stream_is_an_error_naming_it
        assert system.admin.create_stream(StreamSpec("views", 4)) is True
        assert system.admin.create_stream(StreamSpec("views", 4)) is False
        with pytest.raises(StreamExistsError, match="views"):
            system.admin.create_stream(StreamSpec("views", 8))
        assert system.admin.partition_count("views") == 4
        assert system.admin.list_streams() == {"views": 4}

    def test_a_missing_stream_is_an_error_naming_it(self, system) -> None:
        with pytest.raises(StreamNotFoundError, match="nowhere"):
            system.admin.partition_count("nowhere")
        with pytest.raises(StreamNotFoundError, match="nowhere"):
            system.producer.send([OutgoingRecord("nowhere", b"x")])

    def test_retention_is_answered_before_a_stream_exists_and_after(self, system) -> None:
        """The runtime asks `SystemAdmin.retention` of a job's changelogs and intermediate streams before it
        creates them (docs/guarantees.md, "Streams read back whole"): a missing stream is answered, not an
        error."""
        before = system.admin.retention("kept")
        system.declare("kept", 2)
        for answer in (before, system.admin.retention("kept")):
            assert answer is None or isinstance(answer, Retention), answer
            assert answer is None or answer.ms is None or answer.ms > 0, "a retention is a positive time"

    def test_records_read_back_with_exact_offsets_in_order_within_bounds(self, system) -> None:
        system.declare("views", 2)
        system.producer.send([OutgoingRecord("views", f"v{i}".encode(), partition=1) for i in range(10)])
        ssp = SystemStreamPartition(system.name, "views", 1)
        meta = system.admin.partition_metadata("views")
        everything = system.consumer.read(ssp, meta[1].oldest, 100)
        assert [r.value for r in everything] == [f"v{i}".encode() for i in range(10)]
        assert all(r.next_offset == nxt.offset for r, nxt in zip(everything, everything[1:], strict=False))
        if system.admin.dense_offsets:
            assert everything[-1].next_offset == meta[1].upcoming
            assert meta[1].newest == everything[-1].offset
        else:  # positions: the end is known by reading, and ordered by the admin
            assert meta[1].newest is None
            assert system.admin.compare_offsets(everything[0].offset, everything[-1].next_offset) == -1
            assert system.admin.compare_offsets(everything[-1].next_offset, everything[3].offset) == 1
            plan = system.admin.plan_read("views", 1, meta[1].oldest, 4)
            assert plan.records == 4 and plan.end == everything[4].offset, "a planned read ends after 4 records"

        middle = system.consumer.read(ssp, everything[3].offset, 4)
        assert [r.value for r in middle] == [b"v3", b"v4", b"v5", b"v6"]
        bounded = system.consumer.read(ssp, everything[3].offset, 100, end=everything[5].offset)
        assert [r.value for r in bounded] == [b"v3", b"v4"]
        assert system.consumer.read(ssp, meta[1].upcoming, 100) == []

    def test_a_trimmed_partition_keeps_its_offsets_and_refuses_reads_below_its_start(self, system) -> None:
        """`SystemAdmin.trim`: records below the offset go, the rest keep their offsets, appends go on from the
        last offset (also after everything was trimmed), and a read below the start says so instead of
        skipping. A system that does not delete on request answers None and keeps every record."""
        system.declare("trimmed", 2)
        system.producer.send([OutgoingRecord("trimmed", f"v{i}".encode(), partition=1) for i in range(10)])
        ssp = SystemStreamPartition(system.name, "trimmed", 1)
        meta = system.admin.partition_metadata("trimmed")[1]
        everything = system.consumer.read(ssp, meta.oldest, 100)
        deleted = system.admin.trim("trimmed", 1, everything[4].offset)
        if deleted is None:
            assert [r.value for r in system.consumer.read(ssp, meta.oldest, 100)] == [r.value for r in everything]
            return
        assert deleted == 4
        assert system.admin.partition_metadata("trimmed")[1].oldest == everything[4].offset
        kept = system.consumer.read(ssp, everything[4].offset, 100)
        assert [(r.offset, r.value) for r in kept] == [(r.offset, r.value) for r in everything[4:]]
        assert system.admin.trim("trimmed", 1, everything[2].offset) == 0, "a trim never moves the start back"
        with pytest.raises(RecordsDeletedError, match=f"first offset held is {everything[4].offset}"):
            system.consumer.read(ssp, everything[1].offset, 100)
        with pytest.raises(RecordsDeletedError):
            system.consumer.read_columns(ssp, everything[1].offset, 100)
        assert system.admin.trim("trimmed", 1, "1000000") == 6, "never past the last record"
        after = system.admin.partition_metadata("trimmed")[1]
        assert after.oldest == after.upcoming == everything[-1].next_offset and after.newest is None
        assert system.consumer.read(ssp, after.upcoming, 10) == []
        system.producer.send([OutgoingRecord("trimmed", b"next", partition=1)])
        (appended,) = system.consumer.read(ssp, after.upcoming, 10)
        assert appended.offset == everything[-1].next_offset, "an append after a full trim keeps the offsets"
        assert system.admin.partition_metadata("trimmed")[0].oldest == "0", "other partitions untouched"

    def test_an_empty_partition_has_no_newest_offset(self, system) -> None:
        system.declare("views", 2)
        meta = system.admin.partition_metadata("views")
        assert set(meta) == {0, 1}
        assert meta[0].newest is None
        if system.admin.dense_offsets:
            assert meta[0].oldest == meta[0].upcoming
        ssp = SystemStreamPartition(system.name, "views", 0)
        assert system.consumer.read(ssp, meta[0].oldest, 10) == []
        assert system.admin.plan_read("views", 0, meta[0].oldest, 10).records == 0

    def test_a_key_always_lands_on_the_same_partition(self, system) -> None:
        system.declare("views", 8)
        system.producer.send(
            [OutgoingRecord("views", str(i).encode(), key=f"user-{i % 5}".encode()) for i in range(100)]
        )
        partitions_by_key: dict[bytes, set[int]] = {}
        for partition, meta in system.admin.partition_metadata("views").items():
            ssp = SystemStreamPartition(system.name, "views", partition)
            for record in system.consumer.read(ssp, meta.oldest, 1000):
                partitions_by_key.setdefault(record.key, set()).add(partition)
        assert len(partitions_by_key) == 5
        assert all(len(p) == 1 for p in partitions_by_key.values())

    def test_concurrent_producer_processes_never_reuse_or_skip_an_offset(self, weirflow_backend, system) -> None:
        require_processes(weirflow_backend)
        system.declare("shared", 1)
        ctx = multiprocessing.get_context("spawn")
        procs = [ctx.Process(target=_produce, args=(weirflow_backend, w)) for w in range(3)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
            assert proc.exitcode == 0
        ssp = SystemStreamPartition(system.name, "shared", 0)
        records = system.consumer.read(ssp, system.admin.partition_metadata("shared")[0].oldest, 10_000)
        assert len(records) == 3000
        assert len({r.offset for r in records}) == 3000, "an offset was reused"
        assert all(r.next_offset == nxt.offset for r, nxt in zip(records, records[1:], strict=False)), (
            "an offset gap"
        )
        assert sorted(r.value for r in records) == sorted(
            f"{w}-{i}".encode() for w in range(3) for i in range(1000)
        )

    def test_a_start_time_maps_to_the_first_record_stamped_at_or_after_it(self, system) -> None:
        system.declare("timed", 2)
        system.producer.send([OutgoingRecord("timed", f"a{i}".encode(), partition=1) for i in range(5)])
        ssp = SystemStreamPartition(system.name, "timed", 1)
        first = system.consumer.read(ssp, system.admin.partition_metadata("timed")[1].oldest, 100)
        cutoff = first[-1].timestamp_ms + 1
        while time.time() * 1000 <= cutoff:  # the next records must be stamped after the cutoff
            time.sleep(0.001)
        system.producer.send([OutgoingRecord("timed", f"b{i}".encode(), partition=1) for i in range(3)])
        meta = system.admin.partition_metadata("timed")

        at = system.admin.offset_for_time("timed", 1, cutoff)
        assert [r.value for r in system.consumer.read(ssp, at, 100)] == [b"b0", b"b1", b"b2"]
        from_a2 = system.consumer.read(ssp, system.admin.offset_for_time("timed", 1, first[2].timestamp_ms), 100)
        assert [r.value for r in from_a2][-6:] == [b"a2", b"a3", b"a4", b"b0", b"b1", b"b2"]
        if system.admin.dense_offsets:
            assert system.admin.offset_for_time("timed", 1, 0) == meta[1].oldest
            assert system.admin.offset_for_time("timed", 1, cutoff + 3_600_000) == meta[1].upcoming
            assert system.admin.offset_for_time("timed", 0, 0) == meta[0].upcoming, "an empty partition"
        from_zero = system.consumer.read(ssp, system.admin.offset_for_time("timed", 1, 0), 100)
        assert [r.value for r in from_zero] == [r.value for r in system.consumer.read(ssp, meta[1].oldest, 100)]
        assert system.consumer.read(ssp, system.admin.offset_for_time("timed", 1, cutoff + 3_600_000), 100) == []
        empty = SystemStreamPartition(system.name, "timed", 0)
        assert system.consumer.read(empty, system.admin.offset_for_time("timed", 0, 0), 100) == []

    # --- read_columns: the path the Spark source reads every record through ---------------------------------
    def _assert_same_records(self, system, ssp, start: str, max_records: int, end: str | None = None) -> int:
        """``read_columns`` and ``read`` over one range agree column by column, with and without attributes;
        returns how many records the range held."""
        records = system.consumer.read(ssp, start, max_records, end)
        for attributes in (False, True):
            columns = system.consumer.read_columns(ssp, start, max_records, end, attributes=attributes)
            expected = RecordColumns.of(records, start, attributes)
            where = f"read_columns({start!r}, {max_records}, end={end!r}, attributes={attributes})"
            assert list(columns.values) == list(expected.values), where
            assert list(columns.keys) == list(expected.keys), where
            assert list(columns.timestamps_ms) == list(expected.timestamps_ms), where
            if system.admin.dense_offsets:
                assert list(columns.offsets) == list(expected.offsets), where
            else:  # positions: a name per record, maybe the system's own (`RecordColumns`)
                assert len(set(columns.offsets)) == len(records), f"{where}: one distinct offset per record"
            assert len(columns) == len(records), where
            if records:
                assert columns.next_offset == expected.next_offset, where
            if attributes:
                assert [dict(a) for a in columns.attributes] == [dict(a) for a in expected.attributes], where
            else:
                assert not columns.attributes, f"{where}: attributes only when asked for"
        return len(records)

    def test_read_columns_hold_what_read_returns(self, system) -> None:
        system.declare("columns", 2)
        system.producer.send(
            [OutgoingRecord("columns", f"v{i}".encode(), key=f"k{i}".encode(), partition=1) for i in range(10)]
            + [OutgoingRecord("columns", b"no key", partition=1)]
        )
        ssp = SystemStreamPartition(system.name, "columns", 1)
        oldest = system.admin.partition_metadata("columns")[1].oldest
        everything = system.consumer.read(ssp, oldest, 100)
        assert len(everything) == 11
        assert self._assert_same_records(system, ssp, oldest, 100) == 11
        assert self._assert_same_records(system, ssp, everything[3].offset, 4) == 4, "at most max_records"
        assert self._assert_same_records(system, ssp, everything[3].offset, 100, everything[5].offset) == 2, (
            "stopping before end"
        )
        assert self._assert_same_records(system, ssp, everything[9].offset, 100) == 2, "a record without a key"

    def test_read_columns_resumed_at_next_offset_read_every_record_once(self, system) -> None:
        system.declare("columns", 2)
        system.producer.send([OutgoingRecord("columns", f"v{i}".encode(), partition=0) for i in range(10)])
        ssp = SystemStreamPartition(system.name, "columns", 0)
        meta = system.admin.partition_metadata("columns")[0]
        everything = system.consumer.read(ssp, meta.oldest, 100)
        end = everything[-1].next_offset
        values: list[bytes] = []
        position = meta.oldest
        for _ in range(20):  # the Spark source's loop over a planned range, in chunks of 3
            if position == end:
                break
            chunk = system.consumer.read_columns(ssp, position, 3, end)
            assert len(chunk) <= 3
            assert len(chunk) or chunk.next_offset != position, f"no progress at {position!r}"
            values += chunk.values
            position = chunk.next_offset
        assert position == end
        assert values == [f"v{i}".encode() for i in range(10)]

    def test_a_record_s_lane_and_ordinal_are_the_same_from_any_offset_before_it(self, system) -> None:
        """`SystemAdmin.record_ordinals`: every record read has a lane and an ordinal, ordinals grow within a
        lane, and a read from any earlier record's offset gives each record the same pair (what lets the
        Spark data plane recognise a replay, docs/guarantees.md). A system without them returns none."""
        system.declare("lanes", 2)
        system.producer.send([OutgoingRecord("lanes", f"v{i}".encode(), partition=0) for i in range(12)])
        ssp = SystemStreamPartition(system.name, "lanes", 0)
        start = system.admin.partition_metadata("lanes")[0].oldest
        everything = system.consumer.read(ssp, start, 100)
        whole = system.consumer.read_columns(ssp, start, 100, everything[-1].next_offset)
        if not system.admin.record_ordinals:
            assert list(whole.lanes) == [] and list(whole.ordinals) == []
            return
        pairs = dict(zip(whole.values, zip(whole.lanes, whole.ordinals, strict=True), strict=True))
        assert len(pairs) == 12, "one lane and ordinal per record"
        last: dict[int, int] = {}
        for lane, ordinal in pairs.values():
            assert ordinal > last.get(lane, -1), f"lane {lane}: ordinals do not grow"
            last[lane] = ordinal
        for record in everything[1::3]:  # reads resumed where an earlier one ended, as after a checkpoint
            again = system.consumer.read_columns(ssp, record.offset, 100, everything[-1].next_offset)
            assert list(again.values) == list(whole.values)[everything.index(record) :]
            resumed = dict(zip(again.values, zip(again.lanes, again.ordinals, strict=True), strict=True))
            assert all(pairs[v] == pair for v, pair in resumed.items()), f"different ordinals from {record.offset}"

    def test_records_read_counts_the_records_of_a_range_just_read(self, system) -> None:
        """A task's ``records_in`` after each micro-batch (`SystemAdmin.records_read`): every system counts
        the records of a range it has just read, positions included."""
        system.declare("counted", 2)
        system.producer.send([OutgoingRecord("counted", f"v{i}".encode(), partition=1) for i in range(10)])
        ssp = SystemStreamPartition(system.name, "counted", 1)
        start = system.admin.partition_metadata("counted")[1].oldest
        first = system.consumer.read(ssp, start, 4)
        rest = system.consumer.read(ssp, first[-1].next_offset, 100)
        assert system.admin.records_read("counted", 1, start, first[-1].next_offset) == 4
        assert system.admin.records_read("counted", 1, first[-1].next_offset, rest[-1].next_offset) == 6
        assert system.admin.records_read("counted", 1, start, rest[-1].next_offset) == 10
        assert system.admin.records_read("counted", 1, start, start) == 0

    def test_read_columns_of_an_empty_range_are_empty(self, system) -> None:
        system.declare("columns", 2)
        system.producer.send([OutgoingRecord("columns", f"v{i}".encode(), partition=1) for i in range(3)])
        ssp = SystemStreamPartition(system.name, "columns", 1)
        meta = system.admin.partition_metadata("columns")
        records = system.consumer.read(ssp, meta[1].oldest, 100)
        at_end = system.consumer.read_columns(ssp, records[-1].next_offset, 100, attributes=True)
        assert len(at_end) == 0 and list(at_end.offsets) == [] and list(at_end.keys) == []
        assert list(at_end.timestamps_ms) == [] and not at_end.attributes
        start = records[1].offset
        for empty in (
            system.consumer.read_columns(ssp, start, 100, end=start),
            system.consumer.read_columns(ssp, start, 0),
        ):
            assert len(empty) == 0 and list(empty.values) == [] and empty.next_offset == start
        if system.admin.dense_offsets:
            assert at_end.next_offset == records[-1].next_offset
        untouched = SystemStreamPartition(system.name, "columns", 0)
        nothing = system.consumer.read_columns(untouched, meta[0].oldest, 100)
        assert len(nothing) == 0 and list(nothing.values) == []
        if system.admin.dense_offsets:
            assert nothing.next_offset == meta[0].oldest
