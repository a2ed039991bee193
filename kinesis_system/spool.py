"""The spool: each shard read once per processor, its records kept for every virtual task it feeds.

Several Spark queries of one processor (one per task) plan and read the same shards in separate Python
processes, and `GetRecords` is limited to 5 calls and 2 MB per second per shard for all readers together. So
no query reads Kinesis for itself: each asks the spool, a SQLite file per stream under
``systems.<name>.spool.dir`` shared by every process of the processor (and of the machine), for the records
of its slice after its position. The spool keeps, per shard, one contiguous run of records
(``lo`` < sequence ≤ ``hi``) with every record's virtual task precomputed, and extends it with one
`GetRecords` call at a time, under a per-shard file lock and at most once per ``read.interval.ms``. A task
asking for records before the run starts (it moved here with an older checkpoint) restarts the run there;
records older than ``spool.retention.ms`` are trimmed. After a call that read n bytes the shard's next call waits
at least n / 2 MiB seconds (the service's 2 MB/s per shard). Losing the spool costs reads, never records: every
position a task checkpoints is a Kinesis sequence number.
"""

from __future__ import annotations

import binascii
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from weirflow.clock import now_ms
from weirflow.local.database import Database
from weirflow_kinesis import positions
from weirflow_kinesis.hashing import key_hash, slice_of

log = logging.getLogger("weirflow.kinesis.spool")

SCHEMA = """
CREATE TABLE IF NOT EXISTS records (shard TEXT NOT NULL, seq TEXT NOT NULL, task INTEGER NOT NULL,
    sequence_number TEXT NOT NULL, partition_key TEXT NOT NULL, data BLOB NOT NULL, arrival_ms INTEGER NOT NULL,
    read_ms INTEGER NOT NULL, PRIMARY KEY (shard, seq)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS records_by_task ON records (shard, task, seq);
CREATE TABLE IF NOT EXISTS runs (shard TEXT PRIMARY KEY, lo TEXT NOT NULL, hi TEXT NOT NULL,
    ended INTEGER NOT NULL, iterator TEXT, iterator_ms INTEGER NOT NULL, next_call_ms INTEGER NOT NULL,
    caught_up INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS probes (shard TEXT NOT NULL, at_ms INTEGER NOT NULL, found TEXT,
    next_call_ms INTEGER NOT NULL, PRIMARY KEY (shard, at_ms)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS losses (shard TEXT NOT NULL, after TEXT NOT NULL, oldest TEXT NOT NULL,
    detected_ms INTEGER NOT NULL, PRIMARY KEY (shard, after)) WITHOUT ROWID;
"""
# Kinesis shard iterators expire after 5 minutes; one older than this is replaced before use.
_ITERATOR_TTL_MS = 240_000
_GET_RECORDS_LIMIT = 10_000
# GetRecords calls spent looking for a shard's oldest record (`Spool._oldest`).
_OLDEST_PROBES = 20
# The service's read limit per shard (all readers together): after a call that read n bytes the next waits at
# least n / this many seconds, so a processor alone stays within it.
_BYTES_PER_S = 2 * 1024 * 1024
_TRIM_EVERY_S = 30.0
# Where `raw_get_records` puts a GetRecords response's records.
RAW_RECORDS = "WeirflowRawRecords"
# Part of the spool file's name: a spool written by another layout is not read (it is a cache).
SPOOL_VERSION = "s2"


def _order(state: str) -> tuple[str, int]:
    """Sort key of a run's lower bound or a task's state in a shard: the beginning ("") first, then "at q"
    before "after q"."""
    if not state:
        return ("", 0)
    if state.startswith("<"):
        return (positions.sequence_key(state[1:]), 0)
    return (positions.sequence_key(state), 1)


def _records(response: dict[str, Any]) -> list[tuple[str, str, bytes, int]]:
    """(sequence number, partition key, data, arrival ms) of a `GetRecords` response: from the raw JSON records
    when the client kept them (`raw_get_records`), else from botocore's parsed ones."""
    raw = response.get(RAW_RECORDS)
    if raw is not None:
        return [
            (
                r["SequenceNumber"],
                r["PartitionKey"],
                binascii.a2b_base64(r["Data"]),
                int(float(r["ApproximateArrivalTimestamp"]) * 1000),
            )
            for r in raw
        ]
    return [
        (
            r["SequenceNumber"],
            r["PartitionKey"],
            bytes(r["Data"]),
            int(r["ApproximateArrivalTimestamp"].timestamp() * 1000),
        )
        for r in response.get("Records", [])
    ]


def raw_get_records(response_dict: dict[str, Any], customized_response_dict: dict[str, Any], **_: Any) -> None:
    """botocore's ``before-parse.kinesis.GetRecords`` hook: hands the records over as the service's JSON
    (under `RAW_RECORDS`) and lets botocore parse the rest. Its generic shape walk costs more per record than
    reading Kinesis does (py-spy, docs/kinesis.md); Data stays base64 and arrival times epoch seconds."""
    if response_dict.get("status_code") != 200:
        return
    body = json.loads(response_dict["body"])
    customized_response_dict[RAW_RECORDS] = body.pop("Records", [])
    response_dict["body"] = json.dumps(body).encode()


@dataclass(frozen=True)
class Run:
    lo: str  # "" = from the shard's beginning, "<q" = from q inclusive, "q" = after q
    hi: str  # the last sequence number read ("" when none yet)
    ended: bool  # read to SHARD_END: nothing after hi, ever
    caught_up: bool = False  # the last read reached what the shard held then (a bounded read may end here)

    def covers(self, state: str) -> bool:
        return _order(state) >= _order(self.lo)


@dataclass(frozen=True)
class SpooledRecord:
    sequence_number: str
    partition_key: str
    data: bytes
    arrival_ms: int
    task: int


class Spool:
    """The spool of one stream. ``client`` is a boto3 Kinesis client; ``virtual_tasks`` fixes the slices."""

    def __init__(
        self,
        directory: Path,
        stream: str,
        client: Any,
        virtual_tasks: int,
        read_interval_ms: int,
        retention_ms: int,
        probe_client: Any = None,
    ) -> None:
        self.directory = Path(directory)
        self.stream = stream
        self.client = client
        self.virtual_tasks = virtual_tasks
        self.read_interval_ms = read_interval_ms
        self.retention_ms = retention_ms
        self.db = Database(self.directory / f"{stream}.v{virtual_tasks}.{SPOOL_VERSION}.sqlite", SCHEMA)
        self.probe_client = probe_client  # a client with a short read timeout, for `resolve_time`
        self._last_trim = time.monotonic()

    # --- what is there ------------------------------------------------------------------------------------
    def run(self, shard: str) -> Run | None:
        row = (
            self.db.connection()
            .execute("SELECT lo, hi, ended, caught_up FROM runs WHERE shard = ?", (shard,))
            .fetchone()
        )
        return Run(row[0], row[1], bool(row[2]), bool(row[3])) if row else None

    def records(
        self,
        shard: str,
        task: int,
        after: str,
        limit: int,
        upto: str | None = None,
        values: bool = True,
        inclusive: bool = True,
    ) -> list[SpooledRecord]:
        """Spooled records of ``task``'s slice in ``shard`` after state ``after`` ("" = from the beginning, "<q" =
        from q inclusive, "q" = after q), up to sequence number ``upto`` (inclusive or not), in order."""
        low, after_it = _order(after)
        clauses = ["shard = ?", "task = ?", "seq >= ?" if after_it == 0 else "seq > ?"]
        args: list[Any] = [shard, task, low]
        if upto is not None:
            clauses.append("seq <= ?" if inclusive else "seq < ?")
            args.append(positions.sequence_key(upto))
        columns = "sequence_number, partition_key, data, arrival_ms" if values else "sequence_number, '', x'', 0"
        rows = (
            self.db.connection()
            .execute(
                f"SELECT {columns} FROM records WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?", (*args, limit)
            )
            .fetchall()
        )
        return [SpooledRecord(r[0], r[1], bytes(r[2]), int(r[3]), task) for r in rows]

    # --- reading Kinesis ------------------------------------------------------------------------------------
    def ensure(self, shard: str, state: str) -> Run:
        """The shard's run, restarted at ``state`` when it starts after it (its records are dropped)."""
        run = self.run(shard)
        if run is not None and run.covers(state):
            return run
        with self.db.transaction() as conn:
            row = conn.execute("SELECT lo FROM runs WHERE shard = ?", (shard,)).fetchone()
            if row is None or _order(state) < _order(row[0]):
                if row is not None:
                    log.info(
                        "kinesis spool %s/%s: a task needs records from %r, before the spooled run (%r); "
                        "reading the shard again from there",
                        self.stream,
                        shard,
                        state,
                        row[0],
                    )
                conn.execute("DELETE FROM records WHERE shard = ?", (shard,))
                conn.execute(
                    "INSERT OR REPLACE INTO runs (shard, lo, hi, ended, iterator, iterator_ms, next_call_ms, "
                    "caught_up) VALUES (?, ?, '', 0, NULL, 0, 0, 0)",
                    (shard, state),
                )
        run = self.run(shard)
        assert run is not None
        return run

    def fetch(self, shard: str, wait: bool) -> bool:
        """One `GetRecords` call extending the shard's run (which `ensure` made). Without ``wait`` it gives up
        at once when another process is reading the shard or the shard was read less than
        ``read.interval.ms`` ago. Returns whether the run changed (records or its end)."""
        with self._locked(shard, wait) as locked:
            if not locked:
                return False
            conn = self.db.connection()
            row = conn.execute(
                "SELECT lo, hi, ended, iterator, iterator_ms, next_call_ms FROM runs WHERE shard = ?", (shard,)
            ).fetchone()
            if row is None or row[2]:
                return False
            lo, hi, _, iterator, iterator_ms, next_call_ms = row
            pause = next_call_ms - now_ms()
            if pause > 0:
                if not wait:
                    return False
                time.sleep(pause / 1000)
            now = now_ms()
            resuming = not iterator and not hi and positions.is_sequence(lo)
            if not iterator or now - iterator_ms > _ITERATOR_TTL_MS:
                iterator = self._iterator(shard, lo, hi)
            if resuming:  # the first read after a checkpointed record: has retention dropped what followed it?
                self._check_retention(shard, lo)
            response = self._get_records(shard, iterator, lo, hi)
            if response is None:  # throttled: try again a second later
                conn.execute("UPDATE runs SET next_call_ms = ? WHERE shard = ?", (now_ms() + 1000, shard))
                return False
            records = _records(response)
            following = response.get("NextShardIterator")
            # nothing more was there: fewer records than asked for and none behind (AWS may return fewer while
            # more wait, with MillisBehindLatest > 0)
            caught_up = following is None or (
                len(records) < _GET_RECORDS_LIMIT and int(response.get("MillisBehindLatest") or 0) == 0
            )
            now = now_ms()
            rows = [
                (
                    shard,
                    positions.sequence_key(seq),
                    slice_of(key_hash(key), self.virtual_tasks),
                    seq,
                    key,
                    data,
                    arrival,
                    now,
                )
                for seq, key, data, arrival in records
            ]
            with self.db.transaction() as tx:
                tx.executemany("INSERT OR IGNORE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                tx.execute(
                    "UPDATE runs SET hi = ?, ended = ?, iterator = ?, iterator_ms = ?, next_call_ms = ?, "
                    "caught_up = ? WHERE shard = ?",
                    (
                        records[-1][0] if records else hi,
                        int(following is None),
                        following,
                        now,
                        now + max(self.read_interval_ms, sum(len(r[2]) for r in records) * 1000 // _BYTES_PER_S),
                        int(caught_up),
                        shard,
                    ),
                )
        self._trim()
        return bool(records) or following is None

    def _check_retention(self, shard: str, after: str) -> None:
        """Report records lost to the stream's retention: when a read resumes after sequence number ``after``
        and that record is itself older than the oldest record the shard still holds, whatever arrived between
        them was dropped before any task read it. Kinesis would silently start at the oldest record; the range
        is logged as lost and kept in the spool (`lost_ranges`). Sequence numbers cannot say how many records
        the range held, so the count is of ranges."""
        oldest = self._oldest(shard)
        if oldest is None or positions.sequence_key(oldest) <= positions.sequence_key(after):
            return
        with self.db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO losses VALUES (?, ?, ?, ?)", (shard, after, oldest, now_ms()))
            count = conn.execute("SELECT COUNT(*) FROM losses").fetchone()[0]
        log.warning(
            "kinesis %s/%s: records after sequence number %s up to %s were dropped by the stream's retention "
            "before they were read: lost (%d lost range(s) in this stream so far)",
            self.stream,
            shard,
            after,
            oldest,
            count,
        )

    def _oldest(self, shard: str) -> str | None:
        """The sequence number of the oldest record ``shard`` still holds (None when it holds none)."""
        iterator = self.client.get_shard_iterator(
            StreamName=self.stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(_OLDEST_PROBES):  # a service may answer a few empty reads before the first record
            if not iterator:
                return None
            response = dict(self.client.get_records(ShardIterator=iterator, Limit=1000))
            records = _records(response)
            if records:
                return records[0][0]
            if int(response.get("MillisBehindLatest") or 0) == 0 and not response.get("NextShardIterator"):
                return None
            iterator = response.get("NextShardIterator")
        return None

    def lost_ranges(self) -> list[tuple[str, str, str]]:
        """(shard, last sequence number read, oldest sequence number still held) of every range found lost to
        the stream's retention."""
        return [
            tuple(r)
            for r in self.db.connection()
            .execute("SELECT shard, after, oldest FROM losses ORDER BY detected_ms")
            .fetchall()
        ]

    def _iterator(self, shard: str, lo: str, hi: str) -> str:
        if hi:
            kind = {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": hi}
        elif not lo:
            kind = {"ShardIteratorType": "TRIM_HORIZON"}
        elif lo.startswith("<"):
            kind = {"ShardIteratorType": "AT_SEQUENCE_NUMBER", "StartingSequenceNumber": lo[1:]}
        else:
            kind = {"ShardIteratorType": "AFTER_SEQUENCE_NUMBER", "StartingSequenceNumber": lo}
        return str(self.client.get_shard_iterator(StreamName=self.stream, ShardId=shard, **kind)["ShardIterator"])

    def _get_records(self, shard: str, iterator: str, lo: str, hi: str) -> dict[str, Any] | None:
        errors = self.client.exceptions
        try:
            return dict(self.client.get_records(ShardIterator=iterator, Limit=_GET_RECORDS_LIMIT))
        except errors.ExpiredIteratorException:
            iterator = self._iterator(shard, lo, hi)
            return dict(self.client.get_records(ShardIterator=iterator, Limit=_GET_RECORDS_LIMIT))
        except (errors.ProvisionedThroughputExceededException, errors.LimitExceededException):
            log.info("kinesis %s/%s: GetRecords throttled; reading it again in a second", self.stream, shard)
            return None

    def resolve_time(self, shard: str, at_ms: int) -> str | None:
        """The state "at the first record of ``shard`` that arrived at or after ``at_ms``": ``"<q"`` once such a
        record exists, ``"E"`` when the shard ended without one, None while there is none yet (or another process
        is reading the shard). One probe (`GetShardIterator` AT_TIMESTAMP + `GetRecords`) per
        ``read.interval.ms`` for all processes; the answer, once found, never changes and is kept."""
        conn = self.db.connection()
        row = conn.execute(
            "SELECT found, next_call_ms FROM probes WHERE shard = ? AND at_ms = ?", (shard, at_ms)
        ).fetchone()
        if row is not None and (row[0] or row[1] > now_ms()):
            return str(row[0]) if row[0] else None
        with self._locked(shard, wait=False) as locked:
            if not locked:
                return None
            found = self._probe(shard, at_ms)
            conn.execute(
                "INSERT OR REPLACE INTO probes (shard, at_ms, found, next_call_ms) VALUES (?, ?, ?, ?)",
                (shard, at_ms, found, now_ms() + self.read_interval_ms),
            )
        return found

    def _probe(self, shard: str, at_ms: int) -> str | None:
        """One AT_TIMESTAMP look at ``shard``, on the short-timeout client: a service that does not answer in
        time (kinesalite never answers while no record is at or after the time) counts as "none yet"."""
        from botocore.exceptions import ReadTimeoutError

        if at_ms > now_ms():
            return None  # a time still to come: no record yet (Kinesis refuses the question)
        client = self.probe_client or self.client
        try:
            iterator = client.get_shard_iterator(
                StreamName=self.stream, ShardId=shard, ShardIteratorType="AT_TIMESTAMP", Timestamp=at_ms / 1000
            )["ShardIterator"]
            while iterator:  # a few empty reads may come before the first record
                response = client.get_records(ShardIterator=iterator, Limit=1)
                if response.get("Records"):
                    return "<" + response["Records"][0]["SequenceNumber"]
                if response.get("NextShardIterator") is None:
                    return positions.ENDED
                if response.get("MillisBehindLatest", 0) == 0:
                    return None  # caught up with the shard: nothing there yet
                iterator = response.get("NextShardIterator")
        except ReadTimeoutError:
            return None
        except client.exceptions.InvalidArgumentException as exc:
            if "timestamp" not in str(exc).lower():
                raise
            return None  # the service's clock is behind ours: the time is still to come there
        return None

    @contextmanager
    def _locked(self, shard: str, wait: bool) -> Iterator[bool]:
        path = self.directory / f"{self.stream}.{shard}.lock"
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)  # releases the lock

    def _trim(self) -> None:
        """Drop records read longer than the retention ago; each run then starts after its last dropped record."""
        if time.monotonic() - self._last_trim < _TRIM_EVERY_S:
            return
        self._last_trim = time.monotonic()
        cutoff = now_ms() - self.retention_ms
        with self.db.transaction() as conn:
            for shard, seq in conn.execute(
                "SELECT shard, MAX(seq) FROM records WHERE read_ms < ? GROUP BY shard", (cutoff,)
            ).fetchall():
                last = conn.execute(
                    "SELECT sequence_number FROM records WHERE shard = ? AND seq = ?", (shard, seq)
                ).fetchone()[0]
                conn.execute("DELETE FROM records WHERE shard = ? AND seq <= ?", (shard, seq))
                conn.execute("UPDATE runs SET lo = ? WHERE shard = ?", (last, shard))

    def forget(self, shards: Sequence[str]) -> None:
        """Drop the runs of shards that left the stream (expired)."""
        with self.db.transaction() as conn:
            for shard in shards:
                conn.execute("DELETE FROM records WHERE shard = ?", (shard,))
                conn.execute("DELETE FROM runs WHERE shard = ?", (shard,))

    def close(self) -> None:
        self.db.close()
