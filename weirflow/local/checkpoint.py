"""`CheckpointManager` on SQLite: one row per task and SSP, the task's control-state JSON, and its fencing token
(``checkpoint_epochs``: the greatest lock epoch written; a write with a smaller one is refused in the same
transaction, see `weirflow.interfaces.checkpoint.CheckpointManager`).

The embedded coordinator keeps its leases in the same database, so a fenced write (epoch > 0) also checks the
task's lock inside its transaction: while the lock's row exists, it must be unexpired and of the write's
epoch. That refuses a former holder's write as soon as its lease ran out, before the next holder has even
claimed the task (the epoch token alone refuses it only from that claim on).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from weirflow.base import clock
from weirflow.base.errors import FencedOffError, MalformedDocumentError
from weirflow.base.sqlite import Database
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.coordination import task_lock_name
from weirflow.interfaces.system import SystemStreamPartition

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (task TEXT NOT NULL, ssp TEXT NOT NULL, next_offset TEXT NOT NULL,
    PRIMARY KEY (task, ssp));
CREATE TABLE IF NOT EXISTS checkpoint_control (task TEXT PRIMARY KEY, control TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoint_epochs (task TEXT PRIMARY KEY, epoch INTEGER NOT NULL);
"""


class SqliteCheckpointManager(CheckpointManager):
    def __init__(self, db_path: Path, busy_timeout_ms: int = 10000) -> None:
        self._db = Database(db_path, SCHEMA, busy_timeout_ms)

    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None:
        """One ``BEGIN IMMEDIATE`` transaction: the fencing-token check, then the rows."""
        with self._db.transaction() as conn:
            row = conn.execute("SELECT epoch FROM checkpoint_epochs WHERE task = ?", (task_name,)).fetchone()
            stored = int(row[0]) if row else 0
            if checkpoint.epoch < stored:
                raise FencedOffError(task_name, checkpoint.epoch, stored)
            if checkpoint.epoch > 0:
                self._check_lock(conn, task_name, checkpoint.epoch)
            if checkpoint.epoch > stored:
                conn.execute(
                    "INSERT INTO checkpoint_epochs (task, epoch) VALUES (?, ?) "
                    "ON CONFLICT(task) DO UPDATE SET epoch = excluded.epoch",
                    (task_name, checkpoint.epoch),
                )
            conn.executemany(
                "INSERT INTO checkpoints (task, ssp, next_offset) VALUES (?, ?, ?) "
                "ON CONFLICT(task, ssp) DO UPDATE SET next_offset = excluded.next_offset",
                [(task_name, ssp.key(), offset) for ssp, offset in checkpoint.offsets.items()],
            )
            if checkpoint.control:
                conn.execute(
                    "INSERT INTO checkpoint_control (task, control) VALUES (?, ?) "
                    "ON CONFLICT(task) DO UPDATE SET control = excluded.control",
                    (task_name, json.dumps(checkpoint.control)),
                )

    @staticmethod
    def _check_lock(conn: Any, task_name: str, epoch: int) -> None:
        """The task's lock, read in the write's transaction (see the module docstring)."""
        if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'leases'").fetchone() is None:
            return  # another coordinator keeps the leases: the epoch token is the guard
        row = conn.execute(
            "SELECT epoch, expires_ms FROM leases WHERE name = ?", (f"lock/{task_lock_name(task_name)}",)
        ).fetchone()
        if row is None:
            return  # released (or never taken): the epoch token is the guard
        if int(row[0]) != epoch:
            raise FencedOffError(task_name, epoch, int(row[0]), f"the task's lock is held with epoch {row[0]}")
        if int(row[1]) <= clock.now_ms():
            raise FencedOffError(task_name, epoch, -1, "the task's lock expired")

    def _read(self, task: str | None) -> dict[str, Checkpoint]:
        conn = self._db.connection()
        where, args = ("WHERE task = ?", (task,)) if task is not None else ("", ())
        offsets: dict[str, dict[SystemStreamPartition, str]] = {}
        for name, ssp, offset in conn.execute(f"SELECT task, ssp, next_offset FROM checkpoints {where}", args):
            offsets.setdefault(name, {})[_ssp(name, ssp)] = offset
        controls = {
            name: _control(name, control)
            for name, control in conn.execute(f"SELECT task, control FROM checkpoint_control {where}", args)
        }
        epochs = {
            name: int(epoch)
            for name, epoch in conn.execute(f"SELECT task, epoch FROM checkpoint_epochs {where}", args)
        }
        return {
            name: Checkpoint(
                offsets=offsets.get(name, {}), control=controls.get(name, {}), epoch=epochs.get(name, 0)
            )
            for name in sorted(offsets.keys() | controls.keys() | epochs.keys())
        }

    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None:
        return self._read(task_name).get(task_name)

    def read_all(self) -> dict[str, Checkpoint]:
        return self._read(None)

    def stop(self) -> None:
        self._db.close()


def _ssp(task: str, key: Any) -> SystemStreamPartition:
    """An offset row's SSP; `MalformedDocumentError` naming the task when the row's key is not one."""
    try:
        return SystemStreamPartition.parse(key)
    except (ValueError, TypeError, AttributeError) as exc:
        raise MalformedDocumentError(f"checkpoint of task {task}: offset row key {key!r:.60} is no SSP") from exc


def _control(task: str, text: Any) -> Any:
    """A control row's JSON; `MalformedDocumentError` naming the task when it is not JSON (a reader must not
    take an unreadable checkpoint for none: the task would replay its inputs from the start)."""
    try:
        return json.loads(text)
    except (ValueError, TypeError) as exc:
        raise MalformedDocumentError(f"checkpoint of task {task}: its control state is not JSON ({exc})") from exc
