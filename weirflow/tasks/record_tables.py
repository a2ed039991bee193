"""Served tables of a record-task job (``task.tables``; docs/endpoints.md "Record tasks").

A record function serves a table by returning ``{"table": <name>, "key": <key>, "value": <row>}`` among its
outgoing dicts. The row goes to the table's **changelog stream** (Samza's changelog: the table's history as a
log), ``<job.name>-<job.id>-table-<name>`` on `job.default.system`, in the partition of the task that wrote it;
the task keeps the table in memory (`weirflow.runtime.served_tables.MemoryTable`) and, wherever it starts,
rebuilds it
from its changelog partition before it reads any input. The changelog is written with the task's other
outputs, before its offsets advance, so the table is never behind the checkpoint. A changelog is the table's only
copy: a processor refuses to start with one on a system that may drop records (`weirflow.job.retention`).

Lookups are routed like a pipeline's: the key's partition in the job's first input stream (its system's
`SystemAdmin.partition_for_key`) is the task holding it, so a table's keys must be the keys the input records
are sent with.
"""

from __future__ import annotations

from weirflow.interfaces.config import ConfigView
from weirflow.job.grouper import partition_task
from weirflow.job.retention import ReadBackStream
from weirflow.job.systems import StreamRef, Systems
from weirflow.tasks.planning import RECORD_STAGE


class RecordTables:
    """The tables of a record-task job: their changelog streams and which task holds a key."""

    def __init__(self, config: ConfigView, systems: Systems) -> None:
        self.config = config
        self.systems = systems
        self.tables: dict[str, None] = dict.fromkeys(config.get("task.tables") or [])
        inputs = config.get("task.inputs") or []
        if self.tables and not inputs:
            raise config.error("task.tables", "serves tables, but task.inputs names no input stream")
        self.input = systems.resolve(inputs[0]) if inputs else None
        self._partitions: int | None = None

    def partitions(self) -> int:
        if self._partitions is None:
            assert self.input is not None
            self._partitions = self.systems.admin(self.input.system).partition_count(self.input.physical)
        return self._partitions

    def check(self) -> None:
        """Fail now when the input's system cannot say where a key goes (no routing without it)."""
        if not self.tables or self.input is None:
            return
        if self.systems.admin(self.input.system).partition_for_key(self.input.physical, b"k") is None:
            raise self.config.error(
                "task.tables",
                f"the input stream '{self.input.stream_id}' is on system '{self.input.system}', which cannot "
                "say which partition a key is in, so lookups cannot be routed; serve tables from a job whose "
                "first input is on the embedded log or on Event Hubs (partition.method: hash)",
            )

    def changelog(self, table: str) -> StreamRef:
        system = str(self.config.get("job.default.system"))
        physical = f"{self.config.get('job.name')}-{self.config.get('job.id')}-table-{table}"
        return StreamRef(f"{table}.changelog", system, physical)

    def read_back(self) -> list[ReadBackStream]:
        """The changelogs, which the job must read back whole (`weirflow.job.retention`): they are the tables."""
        return [
            ReadBackStream(
                self.changelog(name),
                f"the changelog of table '{name}'",
                "job.default.system",
                "the table then loses rows",
            )
            for name in self.tables
        ]

    def table_task(self, table: str, key: str) -> str:
        assert self.input is not None
        partition = self.systems.admin(self.input.system).partition_for_key(self.input.physical, key.encode())
        return partition_task(RECORD_STAGE, int(partition or 0), self._prefix())

    def table_tasks(self, table: str) -> list[str]:
        return [partition_task(RECORD_STAGE, n, self._prefix()) for n in range(self.partitions())]

    def _prefix(self) -> str:
        return self.systems.admin(self.input.system).task_prefix if self.input is not None else ""
