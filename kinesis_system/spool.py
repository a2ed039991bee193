"""The spool: each shard read once per processor, its records kept for every virtual task it feeds.

Several Spark queries of one processor (one per task) plan and read the same shards in separate Python
processes, and `GetRecords` is limited to 5 calls and 2 MB per second per shard for all readers together. So
no query reads Kinesis for itself: each asks the spool, a SQLite file per stream under
``systems.<name>.spool.dir`` shared by every process of the processor (and of the machine), for the records
of its slice after its position. The spool keeps, per shard, one contiguous run of records
(``lo`` < sequence ≤ ``hi``) with every record's virtual task precomputed, and extends it with one
`GetRecords` call at a time, under a per-shard file lock and at most once per ``read.interval.ms``. After a
call that read n bytes the shard's next call waits at least n / 2 MiB seconds (the service's 2 MB/s per shard).

A run changes only under its shard's lock: `ensure` restarts it there (a task asking for records before it
starts, e.g. one that moved here with an older checkpoint), `fetch` extends it there and stores its records
only if the run is still the one it read (a compare-and-set on ``lo`` and ``hi``), and `trim` moves its start
there. So a run never claims records it does not hold. Every reader holds a **read mark** per shard and task
(the position it last asked for, kept `_MARK_TTL_MS`): `trim` drops only records below every fresh mark, once
they were read longer than ``spool.retention.ms`` ago, or at once while the spool holds more than
``spool.max.bytes``. `records` checks the run still covers the position it reads after in the same snapshot
as it reads, and says so when it does not (the caller ensures the run again): what a read takes is complete.

Losing the spool costs reads, never records: every position a task checkpoints is a Kinesis sequence number.
So a spool file SQLite finds corrupt is moved aside (``<file>.corrupt``) and recreated (`Spool.rebuild`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

from weirflow.base import telemetry
from weirflow.base.clock import now_ms
from weirflow.base.sqlite import Database
from weirflow_kinesis import positions
from weirflow_kinesis.hashing import key_hash, slice_of
from weirflow_kinesis.spool_rows import (
    SCHEMA,
    SPOOL_VERSION,
    Run,
    SpooledRecord,
    is_corrupt,
    order,
    read_floor,
    records_of,
)

log = logging.getLogger("weirflow.kinesis.spool")

# Kinesis shard iterators expire after 5 minutes; one older than this is replaced before use.
_ITERATOR_TTL_MS = 240_000
_GET_RECORDS_LIMIT = 10_000
# GetRecords calls spent looking for a shard's oldest record (`Spool.oldest`).
_OLDEST_PROBES = 20
# The service's read limit per shard (all readers together): after a call that read n bytes the next waits at
# least n / this many seconds, so a processor alone stays within it.
_BYTES_PER_S = 2 * 1024 * 1024
_TRIM_EVERY_S = 30.0
# A read mark older than this is a reader gone (or idle): it no longer holds records back. Refreshed by every
# `ensure` of its reader at least every `_MARK_REFRESH_S`, so a reader busy with a long micro-batch keeps it.
_MARK_TTL_MS = 120_000
_MARK_REFRESH_S = 5.0
# Bytes of record data a spool holds before its prefetcher stops reading ahead (`spool.max.bytes`' default).
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
# What ``GET /metrics`` shows of each stream's spool (`weirflow.base.telemetry`).
SPOOL_BYTES = telemetry.declare(
    telemetry.Metric(
        "weirflow_kinesis_spool_bytes",
        "gauge",
        "Bytes of record data the processor's Kinesis spool of a stream holds (bounded by spool.max.bytes)",
        ("stream",),
    )
)


class Spool:
    """The spool of one stream. ``client`` is a boto3 Kinesis client (the spool calls its `get_shard_iterator`
    and `get_records` and catches its ``exceptions``); ``virtual_tasks`` fixes the slices; ``max_bytes`` bounds
    the record data kept (`spool.max.bytes`)."""

    def __init__(
        self,
        directory: Path,
        stream: str,
        client: Any,
        virtual_tasks: int,
        read_interval_ms: int,
        retention_ms: int,
        probe_client: Any = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.directory = Path(directory)
        self.stream = stream
        self.client = client
        self.virtual_tasks = virtual_tasks
        self.read_interval_ms = read_interval_ms
        self.retention_ms = retention_ms
        self.max_bytes = max_bytes
        self.path = self.directory / f"{stream}.v{virtual_tasks}.{SPOOL_VERSION}.sqlite"
        self.probe_client = probe_client  # a client with a short read timeout, for `resolve_time`
        self._last_trim = time.monotonic()
        # (shard, task, thread) → (floor, when written) of the read marks this spool wrote: a mark is a reader's,
        # and a planner and a task's read of the same task may run in two threads of one process
        self._marks: dict[tuple[str, int, int], tuple[str, float]] = {}
        self._guard = threading.Lock()
        # Test hooks, called at the two points where another process's change would race: `fetch` between
        # its GetRecords call and storing what it read (holding the shard's lock); `ensure` after it made the
        # run cover the asked state; `_locked` when it is about to wait for a shard's lock held elsewhere.
        self.before_store: Callable[[str], None] | None = None
        self.after_ensure: Callable[[str], None] | None = None
        self.on_lock_wait: Callable[[str], None] | None = None
        self._inode = 0
        self.db = self._open()
        # its size on ``GET /metrics`` while open (a query of the runs table: a row per shard)
        self._unregister = telemetry.gauge(SPOOL_BYTES, self.size, stream=stream)

    # --- the file ---------------------------------------------------------------------------------------------
    def _open(self) -> Database:
        try:
            db = Database(self.path, SCHEMA)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            self._move_aside(exc)
            db = Database(self.path, SCHEMA)
        self._inode = os.stat(self.path).st_ino
        return db

    def _move_aside(self, exc: BaseException) -> None:
        aside = self.path.with_name(self.path.name + ".corrupt")
        log.warning(
            "kinesis spool %s is corrupt (%s): moved aside to %s and recreated; it is only a cache, so the "
            "records it held are read from Kinesis again",
            self.path,
            exc,
            aside,
        )
        os.replace(self.path, aside)  # the last corrupt copy only: kept to look at, bounded on disk
        for suffix in ("-wal", "-shm"):  # a WAL of the old file must not be replayed into the new one
            self.path.with_name(self.path.name + suffix).unlink(missing_ok=True)

    def rebuild(self, exc: BaseException, seen: Database | None = None) -> None:
        """Replace a spool file SQLite found corrupt (`is_corrupt`) with an empty one; ``seen`` is the database
        the failing call used (`db` before it). Every process of the processor shares the file, so the first
        to find it corrupt moves it aside (under a lock); the others find the file at the path is no longer the
        one they opened and only reopen, and a thread whose database was already replaced does nothing."""
        lock = os.open(self.directory / f"{self.stream}.rebuild.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with self._guard:
                if seen is not None and seen is not self.db:
                    return
                try:
                    same = os.stat(self.path).st_ino == self._inode
                except FileNotFoundError:
                    same = False
                if same:
                    self._move_aside(exc)
                old, self.db = self.db, self._open()
                self._marks.clear()
            old.close()
        finally:
            os.close(lock)

    # --- what is there ------------------------------------------------------------------------------------
    def run(self, shard: str) -> Run | None:
        row = (
            self.db.connection()
            .execute("SELECT lo, hi, ended, caught_up FROM runs WHERE shard = ?", (shard,))
            .fetchone()
        )
        return Run(row[0], row[1], bool(row[2]), bool(row[3])) if row else None

    def size(self) -> int:
        """Bytes of record data the spool holds (what `spool.max.bytes` bounds)."""
        return int(self.db.connection().execute("SELECT COALESCE(SUM(bytes), 0) FROM runs").fetchone()[0])

    def records(
        self,
        shard: str,
        task: int,
        after: str,
        limit: int,
        upto: str | None = None,
        values: bool = True,
        inclusive: bool = True,
    ) -> list[SpooledRecord] | None:
        """Spooled records of ``task``'s slice in ``shard`` after state ``after`` ("" = from the beginning, "<q" =
        from q inclusive, "q" = after q), up to sequence number ``upto`` (inclusive or not), in order; None when
        the shard's run no longer covers ``after`` (trimmed or restarted since `ensure`): the caller ensures it
        again, since what the run holds would not be all the records after ``after``."""
        taken = self.take(shard, task, after, limit, upto, values, inclusive)
        return None if taken is None else taken[0]

    def take(
        self,
        shard: str,
        task: int,
        after: str,
        limit: int,
        upto: str | None = None,
        values: bool = True,
        inclusive: bool = True,
    ) -> tuple[list[SpooledRecord], Run] | None:
        """`records` and the run they were taken from, in one snapshot: a run said caught up or ended holds
        exactly the records taken (read separately, a read ahead committed in between would make a run caught
        up whose last records were not taken, and a bounded input would end early)."""
        low, after_it = order(after)
        clauses = ["shard = ?", "task = ?", "seq >= ?" if after_it == 0 else "seq > ?"]
        args: list[Any] = [shard, task, low]
        if upto is not None:
            clauses.append("seq <= ?" if inclusive else "seq < ?")
            args.append(positions.sequence_key(upto))
        columns = "sequence_number, partition_key, data, arrival_ms" if values else "sequence_number, '', x'', 0"
        conn = self.db.connection()
        conn.execute("BEGIN")  # one snapshot: the run and its records read together
        try:
            row = conn.execute("SELECT lo, hi, ended, caught_up FROM runs WHERE shard = ?", (shard,)).fetchone()
            covered = row is not None and order(after) >= order(row[0])
            query = f"SELECT {columns} FROM records WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?"
            rows = conn.execute(query, (*args, limit)).fetchall() if covered else []
        except BaseException:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        if not covered:
            return None
        run = Run(row[0], row[1], bool(row[2]), bool(row[3]))
        return [SpooledRecord(r[0], r[1], bytes(r[2]), int(r[3]), task) for r in rows], run

    # --- reading Kinesis ------------------------------------------------------------------------------------
    def ensure(self, shard: str, state: str, task: int | None = None) -> Run:
        """The shard's run, restarted at ``state`` when it starts after it (its records are dropped, under the
        shard's lock, so no `fetch` in flight can store a read of the old run into the new one). With ``task``
        the reader's read mark for the task moves to ``state`` first, so `trim` keeps what it is about to read.
        """
        if task is not None:
            self._mark(shard, task, state)
        run = self.run(shard)
        if run is None or not run.covers(state):
            with self._locked(shard, wait=True), self.db.transaction() as conn:
                row = conn.execute("SELECT lo FROM runs WHERE shard = ?", (shard,)).fetchone()
                if row is None or order(state) < order(row[0]):
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
                        "caught_up, bytes) VALUES (?, ?, '', 0, NULL, 0, 0, 0, 0)",
                        (shard, state),
                    )
            run = self.run(shard)
            assert run is not None
        if self.after_ensure is not None:
            self.after_ensure(shard)
        return run

    def _mark(self, shard: str, task: int, state: str) -> None:
        """Hold this reader's read mark of ``task`` in ``shard`` at ``state``: written when it moves and
        refreshed every `_MARK_REFRESH_S` while it stays (a mark left lower a moment is only conservative)."""
        floor, now, thread = read_floor(state), time.monotonic(), threading.get_ident()
        with self._guard:
            written = self._marks.get((shard, task, thread))
            if written is not None and written[0] == floor and now - written[1] < _MARK_REFRESH_S:
                return
            self._marks[(shard, task, thread)] = (floor, now)
        reader = f"{os.getpid()}.{id(self):x}.{thread}"
        self.db.connection().execute(
            "INSERT OR REPLACE INTO marks VALUES (?, ?, ?, ?, ?)", (shard, task, reader, floor, now_ms())
        )

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
            resuming = not iterator and not hi and (positions.is_sequence(lo) or positions.is_pinned(lo))
            if not iterator or now - iterator_ms > _ITERATOR_TTL_MS:
                iterator = self._iterator(shard, lo, hi)
            if resuming:  # the first read after a checkpointed record or from a pinned start: anything dropped?
                self._check_retention(shard, lo)
            response = self._get_records(shard, iterator, lo, hi)
            if self.before_store is not None:
                self.before_store(shard)
            if response is None:  # throttled: try again a second later
                conn.execute("UPDATE runs SET next_call_ms = ? WHERE shard = ?", (now_ms() + 1000, shard))
                return False
            records = records_of(response)
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
            size = sum(len(r[2]) for r in records)
            with self.db.transaction() as tx:
                # extend the run only if it is still the one read (lo, hi): one restarted or trimmed meanwhile
                # must not claim records this read never stored
                stored = tx.execute(
                    "UPDATE runs SET hi = ?, ended = ?, iterator = ?, iterator_ms = ?, next_call_ms = ?, "
                    "caught_up = ?, bytes = bytes + ? WHERE shard = ? AND lo = ? AND hi = ?",
                    (
                        records[-1][0] if records else hi,
                        int(following is None),
                        following,
                        now,
                        now + max(self.read_interval_ms, size * 1000 // _BYTES_PER_S),
                        int(caught_up),
                        size,
                        shard,
                        lo,
                        hi,
                    ),
                ).rowcount
                if stored:
                    tx.executemany("INSERT OR IGNORE INTO records VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
            if not stored:
                log.info(
                    "kinesis spool %s/%s: the run changed while a read of it was in flight; that read is dropped",
                    self.stream,
                    shard,
                )
                return False
        self.trim()
        return bool(records) or following is None

    def _check_retention(self, shard: str, after: str) -> None:
        """Report records lost to the stream's retention: when a read resumes after sequence number ``after``
        (or from it, a pinned start ``"<q"``) and that record is itself older than the oldest record the shard
        still holds, whatever arrived between them was dropped before this read. Kinesis would silently start
        at the oldest record; the range is logged as lost and kept in the spool (`lost_ranges`). Sequence
        numbers cannot say how many records the range held, so the count is of ranges. Ordinals go on counting
        from ``after``: if an earlier attempt of the task read part of the range, as many of the records after
        it are taken for its replays downstream (docs/guarantees.md, "Kinesis retention")."""
        oldest = self.oldest(shard)
        first = after[1:] if positions.is_pinned(after) else after
        if oldest is None or positions.sequence_key(oldest) <= positions.sequence_key(first):
            return
        with self.db.transaction() as conn:
            conn.execute("INSERT OR IGNORE INTO losses VALUES (?, ?, ?, ?)", (shard, after, oldest, now_ms()))
            count = conn.execute("SELECT COUNT(*) FROM losses").fetchone()[0]
        log.warning(
            "kinesis %s/%s: records %s sequence number %s up to %s were dropped by the stream's retention "
            "before this read: lost (%d lost range(s) in this stream so far)",
            self.stream,
            shard,
            "from" if first != after else "after",
            first,
            oldest,
            count,
        )

    def oldest(self, shard: str) -> str | None:
        """The sequence number of the oldest record ``shard`` still holds (None when it holds none)."""
        iterator = self.client.get_shard_iterator(
            StreamName=self.stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        for _ in range(_OLDEST_PROBES):  # a service may answer a few empty reads before the first record
            # a whole page a call: a service that filters expired records per read (kinesalite) steps over a page
            if not iterator:
                return None
            response = dict(self.client.get_records(ShardIterator=iterator, Limit=1000))
            records = records_of(response)
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
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    yield False
                    return
                if self.on_lock_wait is not None:
                    self.on_lock_wait(shard)
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield True
        finally:
            os.close(fd)  # releases the lock

    def trim(self, every_s: float = _TRIM_EVERY_S) -> int:
        """Drop records no reader needs (at most once per ``every_s``): those below every fresh read mark of
        their shard, once read longer than ``spool.retention.ms`` ago, or whatever their age while the spool
        holds more than ``spool.max.bytes``. A shard with no fresh mark has no reader: its records go by age
        alone. Each run then starts after its last dropped record; a shard being read (its lock held) is left
        for the next trim. Returns the bytes dropped."""
        if time.monotonic() - self._last_trim < every_s:
            return 0
        self._last_trim = time.monotonic()
        now = now_ms()
        fresh = now - _MARK_TTL_MS
        cutoff = now + 1 if self.size() > self.max_bytes else now - self.retention_ms
        conn = self.db.connection()
        conn.execute("DELETE FROM marks WHERE asked_ms < ?", (fresh,))
        dropped = 0
        for (shard,) in conn.execute("SELECT shard FROM runs").fetchall():
            with self._locked(shard, wait=False) as locked:
                if not locked:
                    continue
                with self.db.transaction() as tx:
                    floor = tx.execute(
                        "SELECT MIN(floor) FROM marks WHERE shard = ? AND asked_ms >= ?", (shard, fresh)
                    ).fetchone()[0]
                    below = "" if floor is None else " AND seq < ?"
                    last = tx.execute(
                        f"SELECT seq, sequence_number FROM records WHERE shard = ? AND read_ms < ?{below} "
                        "ORDER BY seq DESC LIMIT 1",
                        (shard, cutoff) if floor is None else (shard, cutoff, floor),
                    ).fetchone()
                    if last is None:
                        continue
                    size = tx.execute(
                        "SELECT COALESCE(SUM(LENGTH(data)), 0) FROM records WHERE shard = ? AND seq <= ?",
                        (shard, last[0]),
                    ).fetchone()[0]
                    tx.execute("DELETE FROM records WHERE shard = ? AND seq <= ?", (shard, last[0]))
                    tx.execute(
                        "UPDATE runs SET lo = ?, bytes = MAX(bytes - ?, 0) WHERE shard = ?", (last[1], size, shard)
                    )
                    dropped += int(size)
        return dropped

    def forget(self, shards: Sequence[str]) -> None:
        """Drop the runs of shards that left the stream (expired)."""
        with self.db.transaction() as conn:
            for shard in shards:
                conn.execute("DELETE FROM records WHERE shard = ?", (shard,))
                conn.execute("DELETE FROM runs WHERE shard = ?", (shard,))

    def close(self) -> None:
        self._unregister()
        self.db.close()
