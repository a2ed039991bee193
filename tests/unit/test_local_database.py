"""Several processes opening one new embedded database at the same moment (processors started together)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from weirflow.local.database import Database

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
