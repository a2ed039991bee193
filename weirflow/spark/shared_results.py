"""The results bookkeeping of a shared aggregation query, task by task (`weirflow.spark.shared_aggregation`).

A stateful task's query keeps, for the results it writes, the replays an earlier attempt wrote past its
checkpoint and a ledger per batch (`weirflow.spark.result_replays`). A query shared by several tasks keeps the
same for each of them: its result rows name their partition (``__part``), hence their task, and the sink
writes each task's rows with that task's replays and ids, then commits each task's ledger. The tails are the
same for every task of the query (they are where the streams end as the batch commits), so they are read once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc

from weirflow.spark.result_replays import Replays, ResultsLedger, read_past
from weirflow.spark.source import systems_for
from weirflow.spark.source_spec import PART_COLUMN

_SEPARATOR = "\t"  # between a task and a replay key in a shared query's replayed counts (`task_key`)


def task_key(task: str, key: str) -> str:
    """A replay key counted for ``task`` in a shared query's commit message (the writers' counts of replays they
    left out travel in one dict: `weirflow.spark.sink.WrittenCount`)."""
    return f"{task}{_SEPARATOR}{key}"


@dataclass
class SharedResults:
    """A shared query's tasks (``task_of``: intermediate partition, a result's ``__part``, -> its task), the
    replays file of each that has one, where each keeps its ledgers (``<ledgers>/<task>``) and the query's Spark
    checkpoint directory (whose offset log says how far a batch read)."""

    task_of: dict[int, str]
    replays_files: dict[str, str]
    ledgers_dir: str
    spark_dir: str
    _loaded: dict[str, Replays | None] = field(default_factory=dict, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_of": {str(p): t for p, t in self.task_of.items()},
            "replays": self.replays_files,
            "ledgers": self.ledgers_dir,
            "spark_dir": self.spark_dir,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SharedResults:
        return cls(
            {int(p): str(t) for p, t in dict(data["task_of"]).items()},
            {str(k): str(v) for k, v in dict(data.get("replays") or {}).items()},
            str(data["ledgers"]),
            str(data["spark_dir"]),
        )

    def ledgers(self, task: str) -> str:
        return str(Path(self.ledgers_dir) / quote(task, safe=""))

    def split(
        self, rows: pa.RecordBatch, sink: Mapping[str, Any], by_task: dict[str, dict[str, int]]
    ) -> list[tuple[str | None, pa.RecordBatch]]:
        """``rows`` of one output task by task, without ``__part``, each counted in ``by_task``; rows of an
        output that does not name tasks are returned whole."""
        if not sink.get("task_column") or PART_COLUMN not in rows.schema.names:
            return [(None, rows)]
        column = rows.column(PART_COLUMN)
        rest = rows.drop_columns([PART_COLUMN])
        parts: list[tuple[str | None, pa.RecordBatch]] = []
        for index in pc.unique(column).to_pylist():
            part = rest.filter(pc.equal(column, index))
            task = self.task_of[int(index)]
            written = by_task.setdefault(task, {})
            written[str(sink["stream"])] = written.get(str(sink["stream"]), 0) + part.num_rows
            parts.append((task, part))
        return parts

    def fresh(self) -> None:
        """Forget the replays read: a writer's partition of a batch reads them as the last commit left them."""
        self._loaded.clear()

    def replays(self, task: str) -> Replays | None:
        """The results ``task``'s earlier attempts wrote that its writers must leave out (read once per write)."""
        if task not in self._loaded:
            path = self.replays_files.get(task)
            self._loaded[task] = Replays.load(Path(path)) if path else None
        return self._loaded[task]

    def commit(
        self, snapshot: str, replayed: Mapping[str, int], batch: int, attempt: str, tails: dict[str, str]
    ) -> None:
        """After the writers of ``batch`` returned: each task's replays used up and aged (the next batch's writers
        read what is left), and its ledger of the batch (the tails and the replays still to come)."""
        used: dict[str, dict[str, int]] = {}
        for counted, n in replayed.items():
            task, _, key = counted.partition(_SEPARATOR)
            used.setdefault(task, {})[key] = n
        for task in sorted(set(self.task_of.values())):
            left = Replays()
            path = self.replays_files.get(task)
            if path:
                left = Replays.load(Path(path))
                left.used(used.get(task, {}))
                left = left.aged(
                    lambda until: read_past(systems_for(snapshot), Path(self.spark_dir), batch, until)
                )
                left.save(Path(path))
            if tails:
                ResultsLedger(tails, left, attempt).save(Path(self.ledgers(task)), batch)
        self._loaded.clear()
