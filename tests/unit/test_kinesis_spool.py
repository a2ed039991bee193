"""The Kinesis spool and its reader (docs/kinesis.md, "Reading: one spool per processor"): a record's ordinal
is the same in every walk that reaches it, a run never claims records it does not hold, trimming never takes
what a read still needs, a replay numbers records as its first attempt did (or reports the loss) however
much retention dropped meanwhile, read-ahead failures reach the task, read-ahead stays within
``spool.max.bytes`` and a corrupt spool file is rebuilt.

Kinesis is `FakeShards`, an in-memory stand-in for the part of a Kinesis client the spool calls
(`get_shard_iterator`, `get_records`, ``exceptions``); the races are driven through the spool's hooks
(`before_store`, `after_ensure`, `on_lock_wait`), not timing.
"""

from __future__ import annotations

import itertools
import logging
import sqlite3
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from weirflow.base.clock import now_ms
from weirflow.testing import wait_until
from weirflow_kinesis import positions
from weirflow_kinesis.errors import ReadAheadError
from weirflow_kinesis.hashing import HASH_SPACE
from weirflow_kinesis.reader import SliceReader
from weirflow_kinesis.shards import Shard, ShardMap
from weirflow_kinesis.spool import Spool

SHARD = "shardId-000000000000"
SEQ = [str(10_000 + i) for i in range(20)]  # the shard's records' sequence numbers, in order


class FakeShards:
    """One open shard holding ``len(SEQ)`` records of ``size`` bytes; each `get_records` returns at most
    ``per_call`` of them. ``failures`` are raised by the next calls, one each."""

    class exceptions:
        class ExpiredIteratorException(Exception):
            pass

        class ProvisionedThroughputExceededException(Exception):
            pass

        class LimitExceededException(Exception):
            pass

    def __init__(self, per_call: int = 5, size: int = 10) -> None:
        self.per_call = per_call
        self.data = [bytes([i]) * size for i in range(len(SEQ))]
        self.calls = 0
        self.failures: list[BaseException] = []
        self.first = 0  # records below this index are dropped by the stream's retention (`trim`)
        self.closed = False  # a closed shard (split or merged): its last read gives no next iterator

    def trim(self, records: int) -> None:
        """Retention drops the oldest ``records`` records: an iterator from before them starts after them."""
        self.first = records

    def get_shard_iterator(
        self, StreamName: str, ShardId: str, ShardIteratorType: str, **kw: Any
    ) -> dict[str, Any]:
        assert ShardId == SHARD
        start = {"TRIM_HORIZON": 0, "AT_SEQUENCE_NUMBER": 0, "AFTER_SEQUENCE_NUMBER": 1}[ShardIteratorType]
        if "StartingSequenceNumber" in kw:
            start += SEQ.index(kw["StartingSequenceNumber"])
        return {"ShardIterator": str(max(start, self.first))}

    def get_records(self, ShardIterator: str, Limit: int) -> dict[str, Any]:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        start = max(int(ShardIterator), self.first)
        end = min(len(SEQ), start + min(Limit, self.per_call))
        arrival = datetime.now(tz=UTC)
        return {
            "Records": [
                {
                    "SequenceNumber": SEQ[i],
                    "PartitionKey": f"k{i}",
                    "Data": self.data[i],
                    "ApproximateArrivalTimestamp": arrival,
                }
                for i in range(start, end)
            ],
            "NextShardIterator": None if self.closed and end == len(SEQ) else str(end),
            "MillisBehindLatest": 0 if end == len(SEQ) else 1000,
        }


def _spool(tmp_path: Path, kinesis: FakeShards, retention_ms: int = 600_000, max_bytes: int = 1 << 30) -> Spool:
    return Spool(tmp_path, "views", kinesis, 1, 0, retention_ms, max_bytes=max_bytes)


def _reader(spool: Spool, **kw: Any) -> SliceReader:
    shards = ShardMap([Shard(SHARD, 0, HASH_SPACE - 1, (), SEQ[0], None)])
    return SliceReader(spool, lambda force: shards, 1, **kw)


def _after(seq: str | None) -> str:
    return positions.encode({SHARD: seq}) if seq else positions.EARLIEST


def _read(reader: SliceReader, after: str | None) -> list[str]:
    """Every record of virtual task 0 after ``after``, read the way a task's poll reads (patient)."""
    return [r.sequence_number for r in reader.walk(0, _after(after), 1000, patient=True).records]


def _fill(spool: Spool) -> None:
    spool.ensure(SHARD, "")
    while spool.fetch(SHARD, wait=True):
        pass


def test_a_restart_waits_for_a_read_in_flight_so_the_run_never_claims_records_it_lacks(tmp_path: Path) -> None:
    kinesis = FakeShards()
    spool = _spool(tmp_path, kinesis)
    spool.ensure(SHARD, SEQ[4])
    assert spool.fetch(SHARD, wait=True)  # the run holds records 5..9
    waiting = threading.Event()
    spool.on_lock_wait = lambda shard: waiting.set()
    restarts: list[threading.Thread] = []

    def restart_meanwhile(shard: str) -> None:
        """A task asks for records from 2 while the read of records 10..14 is in flight."""
        spool.before_store = None
        restart = threading.Thread(target=spool.ensure, args=(SHARD, SEQ[1]))
        restart.start()
        restarts.append(restart)
        wait_until(lambda: waiting.is_set() or not restart.is_alive(), 10, "the restart to finish or wait")

    spool.before_store = restart_meanwhile
    spool.fetch(SHARD, wait=True)
    assert restarts, "the hook ran"
    restarts[0].join(timeout=10)
    assert _read(_reader(spool), SEQ[1]) == SEQ[2:], "records 2..9 read again, none skipped"
    assert waiting.is_set(), "the restart waited for the shard's lock"


def test_a_read_whose_run_changed_meanwhile_stores_nothing(tmp_path: Path) -> None:
    kinesis = FakeShards()
    spool = _spool(tmp_path, kinesis)
    spool.ensure(SHARD, SEQ[4])
    assert spool.fetch(SHARD, wait=True)

    def restart_without_the_lock(shard: str) -> None:
        """Another writer restarts the run from record 2 (as one not holding the shard's lock would)."""
        spool.before_store = None
        with sqlite3.connect(spool.path) as other:
            other.execute("DELETE FROM records")
            other.execute("UPDATE runs SET lo = ?, hi = '', iterator = NULL", (SEQ[1],))

    spool.before_store = restart_without_the_lock
    assert not spool.fetch(SHARD, wait=True), "the read of 10..14 was not stored into the restarted run"
    run = spool.run(SHARD)
    assert run is not None and run.lo == SEQ[1] and run.hi == ""
    assert _read(_reader(spool), SEQ[1]) == SEQ[2:]


def test_a_trim_keeps_what_a_reader_s_mark_holds_and_a_read_after_an_unmarked_trim_says_so(tmp_path: Path) -> None:
    spool = _spool(tmp_path, FakeShards(), retention_ms=0)
    _fill(spool)
    filled = now_ms()
    wait_until(lambda: now_ms() > filled, 5, "a millisecond to pass", interval_s=0.001)  # all past retention
    spool.ensure(SHARD, SEQ[9], task=0)  # a reader about to read after record 9 holds its mark there
    assert spool.trim(every_s=0) > 0
    assert spool.records(SHARD, 0, "", 100) is None, "the records before the mark were dropped"
    taken = spool.records(SHARD, 0, SEQ[9], 100)
    assert taken is not None and [r.sequence_number for r in taken] == SEQ[10:]

    unmarked = _spool(tmp_path / "other", FakeShards(), retention_ms=0)
    _fill(unmarked)
    filled = now_ms()
    wait_until(lambda: now_ms() > filled, 5, "a millisecond to pass", interval_s=0.001)
    unmarked.ensure(SHARD, SEQ[9])  # no mark: the trim may take everything ...
    unmarked.trim(every_s=0)
    # ... and the read that relied on `ensure` learns its run no longer covers it, instead of taking a part
    assert unmarked.records(SHARD, 0, SEQ[9], 100) is None


def test_a_walk_whose_run_is_dropped_after_ensure_reads_it_again(tmp_path: Path) -> None:
    spool = _spool(tmp_path, FakeShards())
    _fill(spool)
    dropped: list[str] = []

    def forget_once(shard: str) -> None:
        if not dropped:
            dropped.append(shard)
            spool.forget([shard])  # the shard's run goes between the walk's ensure and its read

    spool.after_ensure = forget_once
    assert _read(_reader(spool), SEQ[3]) == SEQ[4:]
    assert dropped == [SHARD]


def _denied() -> ClientError:
    error = {"Error": {"Code": "AccessDeniedException", "Message": "not authorized to perform kinesis:GetRecords"}}
    return ClientError(error, "GetRecords")


def test_read_ahead_failures_are_logged_and_the_task_fails_with_the_last_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kinesis = FakeShards()
    kinesis.failures = [_denied() for _ in range(1000)]
    reader = _reader(_spool(tmp_path, kinesis), read_failures=3, retry_s=0.01)
    raised: list[ReadAheadError] = []

    def plan_fails() -> bool:
        try:
            reader.walk(0, positions.EARLIEST, 10, patient=False)  # a planner: starts reading ahead
        except ReadAheadError as exc:
            raised.append(exc)
        return bool(raised)

    try:
        with caplog.at_level(logging.WARNING, logger="weirflow.kinesis.reader"):
            wait_until(plan_fails, 30, "a plan to fail with the read-ahead error", interval_s=0.01)
    finally:
        reader.close()
    assert SHARD in str(raised[0]) and "AccessDeniedException" in str(raised[0])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and SHARD in r.getMessage()]
    assert len(warnings) >= 3


def test_transient_read_ahead_failures_are_retried_without_failing_the_task(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    kinesis = FakeShards()
    kinesis.failures = [_denied(), OSError("a transient failure")]
    reader = _reader(_spool(tmp_path, kinesis), read_failures=3, retry_s=0.01)
    planned: list[int] = []

    def plan_all() -> bool:
        planned.append(len(reader.walk(0, positions.EARLIEST, len(SEQ), patient=False).records))
        return planned[-1] == len(SEQ)

    try:
        with caplog.at_level(logging.WARNING, logger="weirflow.kinesis.reader"):
            wait_until(plan_all, 30, "the read-ahead to get past two failures", interval_s=0.01)
    finally:
        reader.close()
    assert [r for r in caplog.records if "a transient failure" in r.getMessage() and SHARD in r.getMessage()]


def test_read_ahead_stops_at_max_bytes_demand_reads_go_on_and_passed_records_make_room(tmp_path: Path) -> None:
    kinesis = FakeShards(per_call=2, size=1000)
    spool = _spool(tmp_path, kinesis, max_bytes=3500)
    reader = _reader(spool)
    reader.full_trim_every_s = 0
    spool.ensure(SHARD, "", task=0)  # a planner at the shard's beginning holds everything
    assert reader.fetch_ahead(SHARD) and reader.fetch_ahead(SHARD)
    assert spool.size() == 4000
    calls = kinesis.calls
    assert not reader.fetch_ahead(SHARD), "full: no read ahead"
    assert kinesis.calls == calls and spool.size() == 4000, "nothing the mark holds was dropped"
    # the task reads on past what is spooled: its own read goes to Kinesis, and its mark moves past record 3
    walk = reader.walk(0, _after(SEQ[3]), 2, patient=True)
    assert [r.sequence_number for r in walk.records] == SEQ[4:6] and kinesis.calls == calls + 1
    assert reader.fetch_ahead(SHARD), "records 0..2 passed by every reader were dropped: room again"
    assert spool.records(SHARD, 0, "", 10) is None
    taken = spool.records(SHARD, 0, SEQ[3], 10)
    assert taken is not None and [r.sequence_number for r in taken] == SEQ[4:8]


def test_a_corrupt_spool_file_is_moved_aside_and_recreated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = _spool(tmp_path, FakeShards())
    path = first.path
    first.close()
    path.write_bytes(b"not a database at all " * 200)
    with caplog.at_level(logging.WARNING, logger="weirflow.kinesis.spool"):
        spool = _spool(tmp_path, FakeShards())
    assert [r for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]
    assert path.with_name(path.name + ".corrupt").read_bytes().startswith(b"not a database")
    assert _read(_reader(spool), None) == SEQ


def test_a_spool_file_corrupted_while_open_is_rebuilt_by_the_next_walk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    spool = _spool(tmp_path, FakeShards())
    reader = _reader(spool)
    assert _read(reader, None) == SEQ
    for suffix in ("", "-wal", "-shm"):
        spool.path.with_name(spool.path.name + suffix).write_bytes(b"garbage " * 4096)
    with caplog.at_level(logging.WARNING, logger="weirflow.kinesis.spool"):
        assert _read(reader, SEQ[9]) == SEQ[10:]
    assert [r for r in caplog.records if str(spool.path) in r.getMessage()]


def _walked(reader: SliceReader, start: str, sizes: list[int]) -> tuple[list[tuple[str, int]], str]:
    """(sequence number, ordinal) of every record after ``start``, walked in reads of ``sizes`` records each
    (cycled), each from the position the last one ended at; and the position after the last record."""
    taken, position = [], start
    for size in itertools.cycle(sizes):
        walk = reader.walk(0, position, size, patient=True)
        if not walk.records:
            return taken, position
        taken += [(r.sequence_number, n) for r, n in zip(walk.records, walk.ordinals, strict=True)]
        position = walk.end


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 8), min_size=1, max_size=6), st.integers(0, len(SEQ)))
def test_a_record_s_ordinal_is_the_same_in_every_walk_that_reaches_it(sizes: list[int], resume_after: int) -> None:
    """What lets a replay be recognised downstream (docs/guarantees.md): walks of any sizes, and a walk resumed
    from any position one of them ended at (as the next holder of a task resumes from its checkpoint), give
    each record the ordinal it has in one walk of the whole shard."""
    with tempfile.TemporaryDirectory() as directory:
        spool = _spool(Path(directory), FakeShards(per_call=3))
        reader = _reader(spool)
        try:
            _fill(spool)  # the whole shard spooled: every walk below reads what the spool holds
            whole = reader.walk(0, positions.EARLIEST, 1000, patient=True)
            expected = [(seq, i + 1) for i, seq in enumerate(SEQ)]
            assert list(zip([r.sequence_number for r in whole.records], whole.ordinals, strict=True)) == expected
            chunked, end = _walked(reader, positions.EARLIEST, sizes)
            assert chunked == expected and end == whole.end
            checkpoint = (
                reader.walk(0, positions.EARLIEST, resume_after, patient=True).end if resume_after else None
            )
            resumed, _ = _walked(reader, checkpoint or positions.EARLIEST, [len(SEQ)])
            assert resumed == expected[resume_after:]
            assert positions.ordinal_of(positions.decode(end)[SHARD]) == len(SEQ)
        finally:
            reader.close()


def _numbered(walk: Any) -> list[tuple[str, int]]:
    return list(zip([r.sequence_number for r in walk.records], walk.ordinals, strict=True))


def test_a_replay_after_retention_dropped_what_its_first_attempt_read_first_keeps_every_ordinal(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A task with nothing checkpointed in a shard reads its first batch (records 1-5); retention then drops
    records 1-2 before the batch is replayed on another processor. The replay must give records 3-5 the
    ordinals 3-5 the first attempt gave them, or record 6 takes ordinal 4 and is dropped downstream as a
    replay of what was written (docs/guarantees.md, "Kinesis retention").

    A replay of the planned batch (its end names its last record's ordinal) counts back from that end; a
    replay from the checkpoint, which the runtime pins to the shard's oldest record before the first read
    (`SliceReader.pin`), counts from there, and the pinned record's loss is reported, never silent."""
    kinesis = FakeShards()
    first = _reader(_spool(tmp_path / "first", kinesis))
    try:
        pinned = first.pin(0, positions.EARLIEST)
        assert positions.decode(pinned) == {SHARD: positions.pinned(SEQ[0])}
        assert positions.compare(pinned, positions.EARLIEST) == 0, "a pin moves nothing forward"
        planned = first.walk(0, pinned, 5, values=False)
        attempt = first.walk(0, pinned, 1000, end=planned.end)
        assert _numbered(attempt) == [(SEQ[i], i + 1) for i in range(5)]
        assert _numbered(first.walk(0, positions.EARLIEST, 5)) == _numbered(attempt), "pinned or not, alike"
    finally:
        first.close()

    kinesis.trim(2)
    for replay_start in (positions.EARLIEST, pinned):  # the checkpoint without a pin, and with one
        moved = _reader(_spool(tmp_path / f"moved-{len(replay_start)}", kinesis))
        try:
            with caplog.at_level(logging.WARNING, logger="weirflow.kinesis"):
                replay = moved.walk(0, replay_start, 1000, end=planned.end)
            assert _numbered(replay) == [(SEQ[i], i + 1) for i in range(2, 5)], "counted back from the end"
            assert replay.end == planned.end
            after = moved.walk(0, replay.end, 1000)
            assert _numbered(after)[0] == (SEQ[5], 6)
            assert "no longer held" in caplog.text
        finally:
            moved.close()
        caplog.clear()

    # planned anew from the checkpoint (a stateless stage's query restarts with a fresh Spark checkpoint): only
    # the pin says where counting began, and its record is gone, so the loss is reported
    moved = _reader(_spool(tmp_path / "replanned", kinesis))
    try:
        with caplog.at_level(logging.WARNING, logger="weirflow.kinesis"):
            replanned = moved.walk(0, pinned, 1000)
        assert _numbered(replanned)[0] == (SEQ[2], 1)
        assert moved.spool.lost_ranges() == [(SHARD, positions.pinned(SEQ[0]), SEQ[2])]
        assert f"records from sequence number {SEQ[0]} up to {SEQ[2]}" in caplog.text
    finally:
        moved.close()


def test_a_pinned_start_is_read_from_its_record_and_reports_that_record_s_loss_only(tmp_path: Path) -> None:
    kinesis = FakeShards()
    kinesis.trim(3)
    reader = _reader(_spool(tmp_path, kinesis))
    try:
        pinned = reader.pin(0, positions.EARLIEST)
        assert positions.decode(pinned) == {SHARD: positions.pinned(SEQ[3])}, "the oldest record still held"
        assert reader.pin(0, pinned) == pinned, "pinning is idempotent"
        walk = reader.walk(0, pinned, 1000)
        assert _numbered(walk) == [(SEQ[i], i - 2) for i in range(3, len(SEQ))]
        assert reader.spool.lost_ranges() == [], "the pinned record is held: nothing lost"
    finally:
        reader.close()


def test_a_read_up_to_a_planned_end_ends_exactly_there_whatever_its_listing_prunes(tmp_path: Path) -> None:
    """The planner's listing no longer holds a shard the task read to its end (it expired), so the planned end
    has it pruned (`ShardMap.prune`); the reader's listing, a moment older, still holds it. The read ends at
    the planned end exactly: the Spark source reads a batch until its position equals the planned end, and an
    end pruned otherwise would never equal it (the batch would fail as unreadable, on every retry)."""
    kinesis = FakeShards()
    expired = Shard("shardId-000000000099", 0, HASH_SPACE - 1, (), "1", "2")
    shard = Shard(SHARD, 0, HASH_SPACE - 1, (), SEQ[0], None)
    spool = _spool(tmp_path, kinesis)
    planner = SliceReader(spool, lambda force: ShardMap([shard]), 1)
    reader = SliceReader(spool, lambda force: ShardMap([expired, shard]), 1)
    start = positions.encode({expired.id: positions.ENDED})
    planned = planner.walk(0, start, 5, values=False)
    assert positions.decode(planned.end) == {SHARD: positions.processed(SEQ[4], 5), positions.PRUNED: "1"}
    read = reader.walk(0, start, 1000, end=planned.end)
    assert [r.sequence_number for r in read.records] == SEQ[:5]
    assert read.end == planned.end
    assert positions.compare(positions.encode({expired.id: "E", SHARD: f"{SEQ[4]}#5"}), planned.end) == 0
    planner.close()


def test_a_replay_of_a_planned_read_that_finished_a_shard_reads_that_shard_to_its_end(tmp_path: Path) -> None:
    """The planner read a closed shard to its end within one batch and pruned it from the batch's end
    (`ShardMap.prune`: its children take over). A replay of that batch, from a start that holds the shard part
    way, reads the shard's remaining records and ends exactly at the planned end. Taking the shard's absence
    from the end for "nothing to read" left those records out of the replay (or, with children in the end, left
    the replay waiting for them forever, since they are read only after their parent)."""
    kinesis = FakeShards()
    kinesis.closed = True
    closed = Shard(SHARD, 0, HASH_SPACE - 1, (), SEQ[0], SEQ[-1])
    spool = _spool(tmp_path, kinesis)
    reader = SliceReader(spool, lambda force: ShardMap([closed]), 1)
    start = positions.encode({SHARD: positions.processed(SEQ[4], 5)})
    planned_end = positions.encode({positions.PRUNED: "1"})
    read = reader.walk(0, start, 1000, end=planned_end)
    assert [r.sequence_number for r in read.records] == SEQ[5:]
    assert read.at_end and read.end == planned_end
    reader.close()
