"""Opening the embedded SQLite databases so that several processes on one machine can share them.

WAL lets readers proceed while one writer writes; read-modify-write sequences run in ``BEGIN IMMEDIATE``
transactions, which take the write lock up front so two processes cannot both read the old state and both
act on it. Each thread gets its own connection (sqlite3 connections must not be shared across threads).
A transaction failing in SQLite itself (busy past the timeout, a full disk, a corrupt file) and a retry of the
switch to WAL are counted for ``GET /metrics`` (`weirflow.base.telemetry`, ``store="sqlite"``).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_random

from weirflow.base import telemetry


class Database:
    """A SQLite file with per-thread connections; ``schema`` runs once per connection (idempotent DDL).

    A connection outlives its thread until the next thread opens one: then the connections of every thread that
    has ended are closed. A long-running processor keeps starting threads (each of the leader's trim rounds runs on
    one), and each connection holds a page cache of its own: kept, they grew a processor without end
    (docs/operations.md, "Running for months")."""

    def __init__(self, path: Path, schema: str, busy_timeout_ms: int = 10000) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._schema = schema
        self._busy_timeout_ms = busy_timeout_ms
        self._local = threading.local()
        # Each with the thread it serves and the process that opened it: a forked child's copies are its parent's
        # (SQLite's locks are per process), never closed by the child.
        self._all: list[tuple[threading.Thread, sqlite3.Connection, int]] = []
        self._guard = threading.Lock()
        self.connection().executescript(schema)

    def connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, timeout=self._busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
            )
            conn.execute(f"PRAGMA busy_timeout={int(self._busy_timeout_ms)}")
            self._use_wal(conn)
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
            with self._guard:
                me = os.getpid()
                ended = [held for thread, held, pid in self._all if pid == me and not thread.is_alive()]
                self._all = [(t, held, pid) for t, held, pid in self._all if pid != me or t.is_alive()]
                self._all.append((threading.current_thread(), conn, me))
            for held in ended:  # their threads are gone, so no query runs on them
                held.close()
        return conn

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL once. The switch needs the database to itself, and SQLite reports "database
        is locked" at once instead of waiting when another process holds it (two processors opening a new
        job database together did): it is retried for up to the busy timeout."""
        if str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
            return
        for attempt in Retrying(
            retry=retry_if_exception(lambda e: isinstance(e, sqlite3.OperationalError) and "locked" in str(e)),
            wait=wait_random(0.01, 0.1),
            stop=stop_after_delay(self._busy_timeout_ms / 1000),
            reraise=True,
            before_sleep=lambda _: telemetry.count(telemetry.STORAGE_RETRIES, store="sqlite", operation="use wal"),
        ):
            with attempt:
                conn.execute("PRAGMA journal_mode=WAL")

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error)."""
        conn = self.connection()
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
        except sqlite3.Error:  # the database failed (the caller's own errors are not counted)
            telemetry.count(telemetry.STORAGE_ERRORS, store="sqlite", operation="transaction")
            raise

    def close(self) -> None:
        """Close this thread's connection and those of threads that have ended; let go of the others.

        Another live thread may be running a query on its connection right now, and closing a connection
        under a running query crashes the interpreter (sqlite3 does not guard against it). Such a connection
        is dropped instead: its thread finishes what it runs, its next `connection` opens a new one, and the
        old one closes when the last reference to it goes."""
        me = threading.current_thread()
        with self._guard:
            owned, self._all = self._all, []
            self._local = threading.local()
        for thread, conn, _ in owned:
            if thread is me or not thread.is_alive():
                try:
                    conn.close()
                except sqlite3.ProgrammingError:
                    pass
