"""The embedded database under concurrency: processes opening one new file at the same moment (processors
started together), a close while another thread runs a query, the connections of threads that ended, and a
forked child's inherited ones."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from weirflow.base.sqlite import Database

SCHEMA = "CREATE TABLE IF NOT EXISTS t (a INTEGER);"


def _open(path: str, barrier: object, results: object) -> None:
    barrier.wait()  # type: ignore[attr-defined]
    try:
        Database(Path(path), SCHEMA).connection().execute("INSERT INTO t VALUES (1)")
        results.put("ok")  # type: ignore[attr-defined]
    except Exception as exc:
        results.put(repr(exc))  # type: ignore[attr-defined]


def test_processes_opening_a_new_database_together_all_succeed(tmp_path: Path) -> None:
    """Switching a new file to WAL needs it alone, and SQLite says "database is locked" at once instead of
    waiting; before the retry, 6 of 160 processes failed this way (4 at a time, 40 rounds)."""
    # forkserver: children fork from a fresh single-threaded server. Forked straight from the test process,
    # which by then runs the threads of earlier tests' clients, a child could inherit a lock held by one of
    # them and hang (it did once, in a full run).
    context = mp.get_context("forkserver")
    context.set_forkserver_preload([__name__])
    outcomes = []
    for round_ in range(20):
        path = tmp_path / f"job-{round_}.db"
        barrier, results = context.Barrier(4), context.Queue()
        procs = [context.Process(target=_open, args=(str(path), barrier, results)) for _ in range(4)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(30)
        outcomes += [results.get(timeout=5) for _ in procs]
        rows = Database(path, SCHEMA).connection().execute("SELECT COUNT(*) FROM t").fetchone()[0]
        assert rows == 4
    assert outcomes == ["ok"] * 80


_CLOSE_DURING_A_QUERY = textwrap.dedent(
    """
    import sys, threading
    from pathlib import Path
    from weirflow.base.sqlite import Database

    db = Database(Path(sys.argv[1]), "CREATE TABLE IF NOT EXISTS t (a INTEGER);")
    counted, started = [], threading.Event()

    def query():
        conn = db.connection()
        started.set()
        counted.append(conn.execute(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2000000) "
            "SELECT COUNT(*) FROM c").fetchone()[0])

    for _ in range(3):
        started.clear()
        thread = threading.Thread(target=query)
        thread.start()
        started.wait()
        db.close()  # while the other thread's query runs
        thread.join()
    db.connection().execute("INSERT INTO t VALUES (1)")  # and the database opens again after a close
    print(counted)
    """
)


def test_a_close_while_another_thread_runs_a_query_lets_the_query_finish(tmp_path: Path) -> None:
    """Closing every thread's connection crashed the interpreter (a segmentation fault: sqlite3 freed the
    connection under the running query) when a request's executor thread was still reading; in a subprocess,
    so that a crash fails this test and not the run."""
    done = subprocess.run(
        [sys.executable, "-c", _CLOSE_DURING_A_QUERY, str(tmp_path / "job.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-2000:]}"
    assert done.stdout.strip() == str([2_000_000] * 3), "each query ran to its end"


def test_the_connections_of_ended_threads_are_closed_and_a_live_thread_s_is_kept(tmp_path: Path) -> None:
    """Each thread gets a connection of its own, and a processor keeps starting threads (a trim round runs on
    one): the connections of ended threads were kept for the database's life, each with its page cache, and
    grew a long-running processor by megabytes a minute."""
    db = Database(tmp_path / "job.db", SCHEMA)
    live_opened, release = threading.Event(), threading.Event()
    opened: list[sqlite3.Connection] = []

    def use(wait: bool) -> None:
        conn = db.connection()
        conn.execute("INSERT INTO t VALUES (1)")
        opened.append(conn)
        if wait:
            live_opened.set()
            release.wait(60)
            conn.execute("INSERT INTO t VALUES (2)")  # still open: its thread was alive throughout

    live = threading.Thread(target=use, args=(True,))
    live.start()
    assert live_opened.wait(60)
    for _ in range(20):
        short = threading.Thread(target=use, args=(False,))
        short.start()
        short.join()
    newest = opened[-1]
    for conn in opened[1:-1]:  # every ended thread's but the newest (closed when the next thread opens one)
        with pytest.raises(sqlite3.ProgrammingError, match="closed"):
            conn.execute("SELECT 1")
    assert newest.execute("SELECT COUNT(*) FROM t").fetchone() == (21,)
    release.set()
    live.join(60)
    assert db.connection().execute("SELECT a, COUNT(*) FROM t GROUP BY a").fetchall() == [(1, 21), (2, 1)]


def _in_a_forked_child(db: Database, inherited: sqlite3.Connection, results: object) -> None:
    own = threading.Thread(target=lambda: db.connection().execute("SELECT 1"))  # opens the child's own
    own.start()
    own.join()
    try:
        inherited.execute("SELECT 1")
        results.put("open")  # type: ignore[attr-defined]
    except sqlite3.ProgrammingError as exc:
        results.put(str(exc))  # type: ignore[attr-defined]


def test_a_forked_child_leaves_the_connections_it_inherited_to_its_parent(tmp_path: Path) -> None:
    """A child forked from a processor inherits its parent's connections, threads of the parent that are not
    its own among them: closing those copies is the parent's business (SQLite's locks are per process)."""
    db = Database(tmp_path / "job.db", SCHEMA)
    opened: list[sqlite3.Connection] = []
    ended = threading.Thread(target=lambda: opened.append(db.connection()))
    ended.start()
    ended.join()
    results = mp.get_context("fork").Queue()
    child = mp.get_context("fork").Process(target=_in_a_forked_child, args=(db, opened[0], results))
    child.start()
    child.join(60)
    assert results.get(timeout=10) == "open"
