"""`CheckpointManager` on SQLite: one row per task and SSP, plus the task's control-state JSON."""

from __future__ import annotations

import json
from pathlib import Path

from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.local.database import Database

SCHEMA = """
CREATE TABLE IF NOT EXISTS checkpoints (task TEXT NOT NULL, ssp TEXT NOT NULL, next_offset TEXT NOT NULL,
    PRIMARY KEY (task, ssp));
CREATE TABLE IF NOT EXISTS checkpoint_control (task TEXT PRIMARY KEY, control TEXT NOT NULL);
"""


class SqliteCheckpointManager(CheckpointManager):
    def __init__(self, db_path: Path, busy_timeout_ms: int = 10000) -> None:
        self._db = Database(db_path, SCHEMA, busy_timeout_ms)

    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None:
        with self._db.transaction() as conn:
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

    def _read(self, task: str | None) -> dict[str, Checkpoint]:
        conn = self._db.connection()
        where, args = ("WHERE task = ?", (task,)) if task is not None else ("", ())
        offsets: dict[str, dict[SystemStreamPartition, str]] = {}
        for name, ssp, offset in conn.execute(f"SELECT task, ssp, next_offset FROM checkpoints {where}", args):
            offsets.setdefault(name, {})[SystemStreamPartition.parse(ssp)] = offset
        controls = {
            name: json.loads(control)
            for name, control in conn.execute(f"SELECT task, control FROM checkpoint_control {where}", args)
        }
        return {
            name: Checkpoint(offsets=offsets.get(name, {}), control=controls.get(name, {}))
            for name in sorted(offsets.keys() | controls.keys())
        }

    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None:
        return self._read(task_name).get(task_name)

    def read_all(self) -> dict[str, Checkpoint]:
        return self._read(None)

    def stop(self) -> None:
        self._db.close()
