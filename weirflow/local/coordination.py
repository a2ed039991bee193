"""Coordination primitives on SQLite: leases (leader and task locks) with a history, latches, processor rows.

Tables (in the job database):

* ``leases(name PK, owner, expires_ms, instance, epoch)`` — the leader lease is ``leader``; task locks are
  ``lock/<name>``; the holder is (owner, instance); ``epoch`` is the tenure's fencing token.
* ``lease_epochs(name PK, epoch)`` — the last epoch given out per lease name, kept across releases.
* ``lease_history(name, owner, acquired_ms, ended_ms, end_reason)`` — every tenure of every lease, closed
  with reason ``released``, ``expired`` (``ended_ms`` = the lease's expiry when a new owner took over an
  expired lease) or ``broken`` (ended by another processor because its holder went silent). Tests use it to
  prove that no lock was ever held by two owners at once.
* ``latches(name PK, state)`` and ``latch_participants(name, participant)``.
* ``processors(processor_id PK, info JSON)``.

All time is wall-clock epoch ms, shared by every process on the machine.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from weirflow.base import clock, malformed
from weirflow.base.sqlite import Database
from weirflow.interfaces.coordination import (
    CoordinationUtils,
    Latch,
    LatchState,
    LeaderElector,
    Lock,
    ProcessorInfo,
    ProcessorRegistry,
)
from weirflow.interfaces.leases import LeaseLeaderElector, LeaseLock

SCHEMA = """
CREATE TABLE IF NOT EXISTS leases (name TEXT PRIMARY KEY, owner TEXT NOT NULL, expires_ms INTEGER NOT NULL,
    instance TEXT NOT NULL DEFAULT '', epoch INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS lease_epochs (name TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS lease_history (
    name TEXT NOT NULL, owner TEXT NOT NULL, acquired_ms INTEGER NOT NULL, ended_ms INTEGER, end_reason TEXT);
CREATE INDEX IF NOT EXISTS lease_history_open ON lease_history (name, owner, ended_ms);
CREATE TABLE IF NOT EXISTS latches (name TEXT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS latch_participants (name TEXT NOT NULL, participant TEXT NOT NULL,
    PRIMARY KEY (name, participant));
CREATE TABLE IF NOT EXISTS processors (processor_id TEXT PRIMARY KEY, info TEXT NOT NULL);
"""

LEADER_LEASE = "leader"


def _close_history(conn: sqlite3.Connection, name: str, owner: str, ended_ms: int, reason: str) -> None:
    conn.execute(
        "UPDATE lease_history SET ended_ms = ?, end_reason = ? WHERE name = ? AND owner = ? AND ended_ms IS NULL",
        (ended_ms, reason, name, owner),
    )


class _Lease:
    """A named lease row; the shared mechanics of the leader lease and task locks.

    The holder is (``owner``, ``instance``). ``lease_epochs`` keeps each name's last epoch across releases,
    so a new tenure's epoch is always greater than every earlier one's."""

    def __init__(self, db: Database, name: str, owner: str, lease_ms: int, instance: str = "") -> None:
        self._db = db
        self.lease_name = name
        self.owner = owner
        self.instance = instance
        self.lease_ms = lease_ms
        self.epoch = 0

    def _ours(self, row: Any) -> bool:
        return row is not None and row[0] == self.owner and row[2] == self.instance

    def acquire(self) -> bool:
        now = clock.now_ms()
        with self._db.transaction() as conn:
            row = conn.execute(
                "SELECT owner, expires_ms, instance, epoch FROM leases WHERE name = ?", (self.lease_name,)
            ).fetchone()
            if row is not None and not self._ours(row) and row[1] > now:
                return False
            if self._ours(row) and row[1] > now:
                epoch = int(row[3])  # re-entrant: the same tenure goes on
            else:
                if row is not None:
                    _close_history(conn, self.lease_name, row[0], min(row[1], now), "expired")
                conn.execute(
                    "INSERT INTO lease_history (name, owner, acquired_ms) VALUES (?, ?, ?)",
                    (self.lease_name, self.owner, now),
                )
                conn.execute(
                    "INSERT INTO lease_epochs (name, epoch) VALUES (?, 1) "
                    "ON CONFLICT(name) DO UPDATE SET epoch = epoch + 1",
                    (self.lease_name,),
                )
                epoch = int(
                    conn.execute("SELECT epoch FROM lease_epochs WHERE name = ?", (self.lease_name,)).fetchone()[0]
                )
            conn.execute(
                "INSERT INTO leases (name, owner, expires_ms, instance, epoch) VALUES (?, ?, ?, ?, ?) "
                "ON CONFLICT(name) DO UPDATE SET owner = excluded.owner, expires_ms = excluded.expires_ms, "
                "instance = excluded.instance, epoch = excluded.epoch",
                (self.lease_name, self.owner, now + self.lease_ms, self.instance, epoch),
            )
            self.epoch = epoch
            return True

    def renew(self) -> bool:
        """Only an unexpired lease can be renewed: once expired, another owner may already have acted on it."""
        now = clock.now_ms()
        with self._db.transaction() as conn:
            cursor = conn.execute(
                "UPDATE leases SET expires_ms = ? "
                "WHERE name = ? AND owner = ? AND instance = ? AND expires_ms > ?",
                (now + self.lease_ms, self.lease_name, self.owner, self.instance, now),
            )
            return cursor.rowcount == 1

    def release(self) -> None:
        now = clock.now_ms()
        with self._db.transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM leases WHERE name = ? AND owner = ? AND instance = ? AND expires_ms > ?",
                (self.lease_name, self.owner, self.instance, now),
            )
            if cursor.rowcount:
                _close_history(conn, self.lease_name, self.owner, now, "released")

    def held(self, epoch: int | None = None) -> bool:
        row = (
            self._db.connection()
            .execute("SELECT owner, expires_ms, instance, epoch FROM leases WHERE name = ?", (self.lease_name,))
            .fetchone()
        )
        return self._ours(row) and row[1] > clock.now_ms() and (epoch is None or int(row[3]) == epoch)

    def holder(self) -> str | None:
        row = (
            self._db.connection()
            .execute("SELECT owner, expires_ms FROM leases WHERE name = ?", (self.lease_name,))
            .fetchone()
        )
        return row[0] if row is not None and row[1] > clock.now_ms() else None

    def break_if_held_by(self, owner: str, instance: str) -> bool:
        now = clock.now_ms()
        with self._db.transaction() as conn:
            cursor = conn.execute(
                "DELETE FROM leases WHERE name = ? AND owner = ? AND instance = ? AND expires_ms > ?",
                (self.lease_name, owner, instance, now),
            )
            if cursor.rowcount:
                _close_history(conn, self.lease_name, owner, now, "broken")
            return cursor.rowcount == 1


def _upgrade_leases(db: Database) -> None:
    """A job database made before leases had holders' instances and epochs gets the two columns."""
    with db.transaction() as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(leases)")}
        if "instance" not in columns:
            conn.execute("ALTER TABLE leases ADD COLUMN instance TEXT NOT NULL DEFAULT ''")
        if "epoch" not in columns:
            conn.execute("ALTER TABLE leases ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0")


class SqliteLatch(Latch):
    def __init__(self, db: Database, name: str) -> None:
        self._db = db
        self.name = name

    def join(self, participant: str) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO latches (name, state) VALUES (?, ?)", (self.name, LatchState.OPEN.value)
            )
            conn.execute("INSERT OR IGNORE INTO latch_participants VALUES (?, ?)", (self.name, participant))

    def participants(self) -> set[str]:
        rows = (
            self._db.connection()
            .execute("SELECT participant FROM latch_participants WHERE name = ?", (self.name,))
            .fetchall()
        )
        return {r[0] for r in rows}

    def _finish(self, state: LatchState) -> None:
        with self._db.transaction() as conn:
            conn.execute(
                "INSERT OR IGNORE INTO latches (name, state) VALUES (?, ?)", (self.name, LatchState.OPEN.value)
            )
            conn.execute(
                "UPDATE latches SET state = ? WHERE name = ? AND state = ?",
                (state.value, self.name, LatchState.OPEN.value),
            )

    def complete(self) -> None:
        self._finish(LatchState.COMPLETE)

    def time_out(self) -> None:
        self._finish(LatchState.TIMED_OUT)

    def state(self) -> LatchState:
        row = self._db.connection().execute("SELECT state FROM latches WHERE name = ?", (self.name,)).fetchone()
        return LatchState(row[0]) if row else LatchState.OPEN


class SqliteProcessorRegistry(ProcessorRegistry):
    def __init__(self, db: Database) -> None:
        self._db = db

    def heartbeat(self, info: ProcessorInfo) -> None:
        self._db.connection().execute(
            "INSERT INTO processors (processor_id, info) VALUES (?, ?) "
            "ON CONFLICT(processor_id) DO UPDATE SET info = excluded.info",
            (info.processor_id, json.dumps(info.to_json())),
        )

    def processors(self) -> list[ProcessorInfo]:
        """Every readable row; a malformed one is reported once (`weirflow.base.malformed`) and left out."""
        rows = self._db.connection().execute("SELECT processor_id, info FROM processors ORDER BY processor_id")
        found = []
        for processor_id, info in rows.fetchall():
            try:
                found.append(ProcessorInfo.from_json(json.loads(info)))
            except (ValueError, TypeError) as exc:  # not JSON, or MalformedDocumentError
                malformed.report(f"processor/{processor_id}", exc, info, action="skipped (not a member)")
        return found

    def unregister(self, processor_id: str) -> None:
        self._db.connection().execute("DELETE FROM processors WHERE processor_id = ?", (processor_id,))


class SqliteCoordinationUtils(CoordinationUtils):
    """All primitives of one job in its SQLite database, for one owner."""

    def __init__(
        self, db_path: Path, owner: str, lease_ms: int, busy_timeout_ms: int = 10000, instance: str = ""
    ) -> None:
        self.owner = owner
        self.instance = instance
        self.lease_ms = lease_ms
        self._db = Database(db_path, SCHEMA, busy_timeout_ms)
        _upgrade_leases(self._db)

    def leader_elector(self) -> LeaderElector:
        return LeaseLeaderElector(_Lease(self._db, LEADER_LEASE, self.owner, self.lease_ms, self.instance))

    def lock(self, name: str) -> Lock:
        return LeaseLock(name, _Lease(self._db, f"lock/{name}", self.owner, self.lease_ms, self.instance))

    def latch(self, name: str) -> Latch:
        return SqliteLatch(self._db, name)

    def processor_registry(self) -> ProcessorRegistry:
        return SqliteProcessorRegistry(self._db)

    def lock_history(self) -> list[dict[str, Any]]:
        """Every tenure of every lease: ``name`` (``leader`` or the lock name), ``owner``, ``acquired_ms``,
        ``ended_ms`` (None while held), ``end_reason``."""
        rows = (
            self._db.connection()
            .execute(
                "SELECT name, owner, acquired_ms, ended_ms, end_reason FROM lease_history ORDER BY acquired_ms"
            )
            .fetchall()
        )
        return [
            {"name": n.removeprefix("lock/"), "owner": o, "acquired_ms": a, "ended_ms": e, "end_reason": r}
            for n, o, a, e, r in rows
        ]

    def close(self) -> None:
        self._db.close()
