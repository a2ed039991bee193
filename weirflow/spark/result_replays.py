"""Results of a stateful stage that a replay would write again, recognised by the task that writes them
(docs/guarantees.md, "Stateful stages").

A stateful stage's rows are *results* (an aggregation's windows, a join's matches), not input rows: they have
no input position for the consumer's marks (`weirflow.spark.replay`), and two results may be equal (one page
viewed 5 times in each of three minutes, counted per minute without the window: three equal rows). But a
stateful stage runs one task per query, and that task can tell what it already wrote:

* **Tails.** When a micro-batch's write is committed (the sink's ``commit``, on the driver, before the next
  batch starts), the sink notes the next offset of each partition of every stream the task writes results to
  (intermediate and output streams) and keeps them, with the replays still to come, in a **ledger** of the
  batch inside the task's Spark checkpoint directory (`ResultsLedger`, ``results/<batch>.json``), which the
  state mirror carries with the batch. The task's checkpoint for that batch records them (``control.tails``,
  ``control.replays``). Every result the task writes after that checkpoint lies beyond its tails. A stream the
  batch wrote nothing to keeps the tails the same query attempt noted at its previous batch: nothing of the
  task lies past them (the attempt's first batch noted them past every earlier attempt's writes, and it wrote
  nothing there since), and most batches of a windowed task close no window, so the stream's system is not
  asked (an event hub's partition ends are a management call each).
* **Replays.** A task starting from a checkpoint with tails reads each partition from its tail to the end and
  keeps what an earlier attempt of the task wrote there: the rows of packed records naming it (`TASK_KEY` in
  their schema metadata) and the records whose result id names it (`weirflow.results.ids`). Each is counted
  under its **replay key**: the stream, the Spark partition that wrote it (`PART_KEY`, or the id's origin)
  and its digest. The sink's writer of Spark partition *p* leaves out each result equal to one counted under
  *p*, once per copy; the remainder is carried from batch to batch (the ledgers, the task's checkpoints), so
  that a second fault before the replay is over still knows the first attempt's rows, until it is matched or
  the replay is over: the task's batches have read every input partition past where it ended when the replay
  began (``until``: no earlier attempt can have read further, since each had stopped writing before the new
  holder started), and `KEEP_BATCHES` batches more have passed for the windows that input closes to come out.
  However far Spark had run ahead of the checkpoint, a replay is never given up before it could be produced.

Why a replay is recognised and an equal new result is not taken for one: the next holder restores the operator
state matching the checkpoint (the state mirror, docs/pipelines.md) and reads the same input from the same
offsets; an aggregation's result in append mode is a closed window's final value, which a replay produces
again, in the same Spark partition (the stateful operator's, chosen by a hash of the grouping key). What the
earlier attempts wrote past the checkpoint is therefore a sub-multiset of what the replay produces, partition
by partition: leaving out one produced copy per written copy leaves exactly what was not written yet,
whichever of several equal results is taken for the written one (equal rows are interchangeable). A result
counted under one partition is never matched by another's writers, so two writers of one batch never use up
one copy twice; were a result to land in another partition on replay (a transform that shuffles after the
aggregation), it would be written again: a duplicate, never a loss. Results of update mode are changes, which
a replay that cuts batches differently need not reproduce; those are left out only when equal, and the rest
are new (at least once in update mode).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.spark_checkpoint import planned_batch
from weirflow.interfaces.system import SystemStream, SystemStreamPartition
from weirflow.results.ids import ResultId, parse
from weirflow.runtime.control import MessageType
from weirflow.spark.packing import unpack
from weirflow.spark.replay import compare_offsets

log = logging.getLogger("weirflow.spark")

TASK_KEY = b"weirflow.task"  # a stateful stage's packed record: the schema metadata naming the task
PART_KEY = b"weirflow.part"  # ... and the Spark partition that wrote it
ROWS = bytes([MessageType.ROWS])
# The most bytes of replays a task's checkpoint holds itself; more are named by the ledger that holds them
# (`in_checkpoint`), so the checkpoint stays within its store's limits (a DynamoDB item: 400 KB, an Azure
# Table entity: 1 MiB) however many results a killed attempt wrote.
INLINE_REPLAYS_BYTES = 16_384
KEEP_BATCHES = 10  # micro-batches an unmatched replay is kept once the task has read past its ``until``


def row_digests(rows: pa.Table | pa.RecordBatch, columns: Iterable[str] | None = None) -> list[str]:
    """A digest per row of ``columns`` (all by default), the same in every process and on every machine."""
    names = list(columns) if columns is not None else list(rows.schema.names)
    values = [rows.column(name).to_pylist() for name in names]
    return [hashlib.blake2b(repr(row).encode(), digest_size=8).hexdigest() for row in zip(*values, strict=True)]


def replay_key(stream: str, partition: int, digest: str) -> str:
    """What a written result is counted under: the stream (``<system>.<physical>``), the Spark partition
    that wrote it and its digest."""
    return f"{partition}|{stream}|{digest}"


@dataclass
class Replays:
    """Results an earlier attempt of a task wrote that its replay will produce again: replay key (`replay_key`)
    -> [copies, the micro-batches left to keep them once the task has read its input to ``until``], and
    ``until``: input SSP key -> the offset no earlier attempt can have read past (the partition's end when the
    replay began). JSON:
    ``{"rows": {"0|local.mid|9c0e4d1b22aa0f3e": [1, 10]}, "until": {"local.in.0": "812"}}``."""

    rows: dict[str, list[int]] = field(default_factory=dict)
    until: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return sum(copies for copies, _ in self.rows.values())

    def add(self, keys: Iterable[str]) -> None:
        for key in keys:
            entry = self.rows.setdefault(key, [0, KEEP_BATCHES])
            entry[0] += 1
            entry[1] = KEEP_BATCHES

    def merge(self, other: Replays) -> None:
        for key, (copies, left) in other.rows.items():
            entry = self.rows.setdefault(key, [0, left])
            entry[0] += copies
            entry[1] = max(entry[1], left)
        self.until.update(other.until)

    def await_input(self, ends: Mapping[str, str]) -> None:
        """Keep every replay at least until the task's batches have read each input partition to ``ends``
        (SSP key -> offset), its end as the replay begins: no earlier attempt read further."""
        self.until.update(ends)

    def take(self, key: str) -> bool:
        """Whether ``key`` is a replay; if so one copy of it is used up."""
        if key not in self.rows:
            return False
        self.used({key: 1})
        return True

    def used(self, taken: Mapping[str, int]) -> None:
        """Use up the copies that writers took (``key -> copies``)."""
        for key, copies in taken.items():
            entry = self.rows.get(key)
            if entry is None:
                continue
            entry[0] -= copies
            if entry[0] <= 0:
                del self.rows[key]

    def aged(self, read_past: Callable[[Mapping[str, str]], bool]) -> Replays:
        """After one more micro-batch. While it has not read past ``until`` (``read_past(until)`` is False) the
        replays are all kept: the replay may not have produced them yet. From then on, entries kept
        `KEEP_BATCHES` batches more unmatched are dropped (a result of update mode, which a replay need not
        produce again)."""
        if self.until and not read_past(self.until):
            return Replays({d: list(entry) for d, entry in self.rows.items()}, dict(self.until))
        return Replays({d: [c, left - 1] for d, (c, left) in self.rows.items() if left > 1})

    def to_json(self) -> dict[str, Any]:
        """The replays as JSON; none left: ``{}``."""
        if not self.rows:
            return {}
        data: dict[str, Any] = {"rows": {d: list(entry) for d, entry in sorted(self.rows.items())}}
        if self.until:
            data["until"] = dict(sorted(self.until.items()))
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> Replays:
        """Replays of a checkpoint or ledger. Of the format before ``until`` (the entries alone), every entry
        counts its batches at once; entries of the format before that (a digest without the partition that
        wrote it) are left out: no writer could tell its copies apart from another partition's."""
        data = dict(data or {})
        rows = dict(data["rows"]) if "rows" in data else data
        until = {str(k): str(v) for k, v in dict(data.get("until") or {}).items()} if "rows" in data else {}
        return cls(
            {str(d): [int(e[0]), int(e[1])] for d, e in rows.items() if str(d).count("|") == 2},
            until,
        )

    @classmethod
    def load(cls, path: Path) -> Replays:
        try:
            return cls.from_json(json.loads(path.read_text()))
        except FileNotFoundError:
            return cls()

    def save(self, path: Path) -> None:
        """Write the replays to ``path``; none left removes the file (its readers then find nothing to do)."""
        if not self.rows:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json()))
        tmp.replace(path)


@dataclass
class ResultsLedger:
    """A stateful task's results as one micro-batch committed, kept in its Spark checkpoint directory
    (``results/<batch>.json``, `weirflow.interfaces.spark_checkpoint.RESULTS_DIR`) so that the state mirror
    carries it with the batch: ``tails`` (SSP key -> the next offset of each partition the task writes results
    to), the ``replays`` still to come after the batch and the query ``attempt`` that committed it. JSON:
    ``{"tails": {"local.mid.0": "17"}, "replays": {"0|local.mid|9c0e4d1b22aa0f3e": [1, 9]}, "attempt":
    "5f0c1e2a9b3d4c6e"}``.

    The processor's checkpoint of the batch records both (``control.tails``, ``control.replays``); a restart
    that catches up with a batch Spark committed after the last checkpoint reads them from the batch's ledger
    (`weirflow.spark.task_progress`), since the checkpoint's are older."""

    tails: dict[str, str] = field(default_factory=dict)
    replays: Replays = field(default_factory=Replays)
    attempt: str = ""  # the query attempt that committed the batch (`weirflow.results.ids`' token)

    def save(self, directory: Path, batch: int) -> None:
        """Write the ledger of ``batch`` (once: a file is never changed, as the state mirror expects). Ledgers
        are removed by the processor once a checkpoint names a later batch (`prune`), never here: however far
        Spark runs ahead of the checkpoints, the batch a checkpoint names finds its ledger."""
        directory.mkdir(parents=True, exist_ok=True)
        tmp = directory / f".{batch}.{os.getpid()}.tmp"
        data = {"tails": self.tails, "replays": self.replays.to_json(), "attempt": self.attempt}
        tmp.write_text(json.dumps(data))
        tmp.replace(directory / f"{batch}.json")

    @staticmethod
    def prune(directory: Path, checkpointed: int) -> None:
        """Remove the ledgers of batches before ``checkpointed``, the batch the task's checkpoint now names:
        a restart resumes from that checkpoint or catches up with a later batch (`weirflow.spark.task_progress`),
        and reads no earlier ledger."""
        for path in directory.glob("*.json"):
            if path.stem.isdigit() and int(path.stem) < checkpointed:
                path.unlink(missing_ok=True)

    @classmethod
    def load(cls, directory: Path, batch: int) -> ResultsLedger | None:
        """The ledger of ``batch``, or None when it has none (the task writes no results, or its directory was
        written before ledgers were kept)."""
        try:
            data = json.loads((directory / f"{batch}.json").read_text())
        except (FileNotFoundError, ValueError):
            return None
        tails = {str(k): str(v) for k, v in dict(data.get("tails", {})).items()}
        return cls(tails, Replays.from_json(data.get("replays")), str(data.get("attempt", "")))


def in_checkpoint(replays: Replays, batch: int) -> dict[str, Any]:
    """What a task's checkpoint of ``batch`` records of the replays still to come after it
    (``control.replays``): the replays themselves up to `INLINE_REPLAYS_BYTES`, else ``{"ledger": batch,
    "copies": n}``: they are in the batch's ledger, which the Spark checkpoint directory keeps (and the state
    mirror carries) as long as a checkpoint names the batch (`ResultsLedger.prune`)."""
    data = replays.to_json()
    if len(json.dumps(data)) <= INLINE_REPLAYS_BYTES:
        return data
    return {"ledger": batch, "copies": len(replays)}


def from_checkpoint(task: str, data: Mapping[str, Any] | None, directory: Path) -> Replays:
    """The replays a task's checkpoint records (`in_checkpoint`), read from the ledger it names when they are
    not in the checkpoint itself; ``directory`` is the task's ledgers (its Spark checkpoint's ``results``).
    A named ledger that is missing fails the start: starting without it would write those results again."""
    if not data or "ledger" not in data:
        return Replays.from_json(data)
    ledger = ResultsLedger.load(directory, int(data["ledger"]))
    if ledger is None:
        raise MalformedDocumentError(
            f"task {task}: its checkpoint keeps {data.get('copies', 'its')} replayed results in the ledger of "
            f"batch {data['ledger']} ({directory / (str(data['ledger']) + '.json')}), which is missing: restore "
            "the task's Spark checkpoint directory (the state mirror holds it), or reset the task"
        )
    return ledger.replays


def tails_of(systems: Any, streams: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The next offset of every partition of ``streams`` (system, physical name) now: SSP key -> offset."""
    tails = {}
    for system, physical in streams:
        table = systems.table_writer(system)
        if table is not None:  # a table is one partition; its offset is its version
            tails[SystemStreamPartition(system, physical, 0).key()] = str(table.snapshot(physical, ()).version)
            continue
        for partition, meta in systems.admin(system).partition_metadata(physical).items():
            tails[SystemStreamPartition(system, physical, partition).key()] = meta.upcoming
    return tails


def batch_tails(systems: Any, streams: Iterable[tuple[str, str, bool]], kept: Mapping[str, str]) -> dict[str, str]:
    """The tails of a batch's commit for ``streams`` (system, physical name, whether the batch wrote to it):
    a stream it wrote nothing to keeps its tails in ``kept`` (those the same query attempt noted at its previous
    batch: nothing of the task lies past them), without asking its system; the others are asked (`tails_of`)."""
    tails: dict[str, str] = {}
    ask = []
    for system, physical, wrote in streams:
        stream = SystemStream(system, physical)
        same = {k: v for k, v in kept.items() if SystemStreamPartition.parse(k).system_stream == stream}
        if same and not wrote:
            tails.update(same)
        else:
            ask.append((system, physical))
    if ask:
        tails.update(tails_of(systems, ask))
    return tails


def read_past(systems: Any, spark_dir: Path | None, batch: int, until: Mapping[str, str]) -> bool:
    """Whether ``batch`` of the Spark checkpoint at ``spark_dir`` read every input partition of ``until`` (SSP
    key -> offset) to that offset or further, by the end offsets Spark planned it with (its offset log)."""
    planned = planned_batch(spark_dir, batch) if spark_dir is not None else None
    if planned is None:
        return False
    ends = {key: p for source in planned.sources for key, p in source.partitions.items()}
    for key, offset in until.items():
        end = ends.get(key)
        if end is None:
            return False
        if end.ended:
            continue
        order = compare_offsets(systems.admin(SystemStreamPartition.parse(key).system), end.offset, offset)
        if order is None or order < 0:
            return False
    return True


def written_since(systems: Any, task: str, tails: Mapping[str, str]) -> Replays:
    """What ``task`` wrote to each partition from its tail offset (``ssp key -> offset``) on, read to the
    partition's end: the rows of packed records naming the task, and the records whose result id names it,
    each counted under its replay key (`replay_key`)."""
    found = Replays()
    for key, start in tails.items():
        ssp = SystemStreamPartition.parse(key)
        stream = f"{ssp.system}.{ssp.stream}"
        table = systems.table_writer(ssp.system)
        if table is not None:  # what commits after the version added
            for rows in table.rows_since(ssp.stream, int(start)):
                found.add(_results_of(task, stream, rows.column(table.id_column).to_pylist()))
            continue
        consumer = systems.consumer(ssp.system)
        offset = start
        while batch := consumer.read(ssp, offset, 10_000):
            for record in batch:
                found.add(_written_by(task, stream, record))
            offset = batch[-1].next_offset
    return found


def _results_of(task: str, stream: str, ids: Iterable[str | None]) -> list[str]:
    """The replay keys of the result ids among ``ids`` that ``task`` wrote."""
    keys = []
    for text in ids:
        result = parse(text)
        if isinstance(result, ResultId) and result.task == task:
            keys.append(replay_key(stream, int(result.origin.split(".")[2], 16), result.digest))
    return keys


def _written_by(task: str, stream: str, record: Any) -> list[str]:
    """The replay keys of what ``record`` holds of ``task``'s results (none when another task wrote it)."""
    if isinstance(parse(record.id), ResultId):
        return _results_of(task, stream, [record.id])
    value = record.value
    if value[:1] != ROWS:  # control messages and single JSON rows
        return []
    try:
        rows = unpack(value)
    except (pa.ArrowInvalid, OSError):
        return []
    metadata = rows.schema.metadata or {}
    if metadata.get(TASK_KEY) != task.encode():
        return []
    partition = int(metadata.get(PART_KEY, b"-1"))  # -1: written before records named their partition
    return [replay_key(stream, partition, digest) for digest in row_digests(rows)]
