"""The record runner: runs each task as a thread that reads its SSPs and calls `task.function` per record.

It is the data plane for jobs without Spark (coordination demos, simple relays) and the reference for what
any runner must do: start from the task's checkpoint, write outputs before advancing offsets (at-least-once),
checkpoint through the fence, and stop cleanly before the lock is released. It commits every `task.commit.ms`
even in the middle of a read, and a stop waits for the record in hand, not for the rest of the read
(docs/architecture.md, "Record tasks: commits and stops").

The task function (``task.function: module:callable``; the config file's directory is importable) gets one dict
per record::

    {"stream": "page-views", "partition": 3, "offset": "41", "key": "u7" | None,
     "value": "<text>" (bytes when not UTF-8), "timestamp_ms": 1700000000000}

and returns an iterable of outgoing dicts ``{"stream": <stream id>, "value": str | bytes | dict | list,
"key": str | bytes | None, "partition": int | None}`` (dicts and lists are sent as JSON), or
``{"table": <name in task.tables>, "key": str, "value": <row>}`` to serve the row as the key's latest in a
table (`weirflow.tasks.record_tables`, docs/endpoints.md).

Inside the function, `current_task()` tells which task calls it: its name, the processor running it
(``processor_id``, and ``instance``, this run of it) and the ``epoch`` of the task's lock (the fencing token of
this tenure: greater for every later holder), e.g. to tag outputs for auditing::

    from weirflow.tasks.record_task import current_task

    def relay(record):
        task = current_task()
        return [{"stream": "out", "value": {"v": record["value"], "by": task.processor_id, "epoch": task.epoch}}]

**Draining** (docs/drain.md): once the processor saw a drain notification of its run (`drain`), each task
stops at the record in hand as a stop does, which is its cut: it sends what it processed (outputs and
served-table changelog rows), checkpoints its offsets with ``drained: <run id>`` and ends. A task drained in
this run is not started again; in another run it reads on from its cut. A record job's outputs are the user's
streams, read by anything, so no control record is written into them: the end of the run is the
``job-finished`` document the leader writes (`weirflow.coordination.job_finished`).

**Abandoning.** When the processor can no longer prove it holds a task's lock (`TaskRunner.abandon_tasks`),
the task stops at once: no send and no checkpoint write begins after that call returns (a send already under
way is waited for, briefly; a checkpoint write under way is left to the store's fence), and no final
checkpoint is written; the task resumes from its last checkpoint wherever it runs next. Before every send
and checkpoint the task also asks the processor's own lease deadline (`TaskRunner.lease_valid`), so a process
waking from a pause past its lease abandons the task before it writes.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from weirflow.base.errors import ConfigError, LockLostError, WeirflowError
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.coordination import Lock
from weirflow.interfaces.system import IncomingRecord, OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.drain_notice import DEFAULT_RUN_ID, run_id_of
from weirflow.job.model import TaskModel
from weirflow.job.retention import check_retention
from weirflow.job.start_position import parse_start, resume_offset, start_offset
from weirflow.job.systems import Systems
from weirflow.job.user_code import load_callable
from weirflow.runtime.control import TaskControl
from weirflow.runtime.fencing import FencedCheckpointWriter
from weirflow.runtime.served_tables import MemoryTable
from weirflow.runtime.trim_points import TrimScope
from weirflow.tasks.record_tables import RecordTables
from weirflow.tasks.runner import TaskRunner

log = logging.getLogger("weirflow.tasks")

RecordFunction = Callable[[dict[str, Any]], Iterable[dict[str, Any]]]

_IDLE_WAIT_S = 0.05
# How long `abandon_tasks` waits for sends already under way (all of them together) before it returns anyway.
_ABANDON_WAIT_S = 1.0


@dataclass(frozen=True)
class TaskContext:
    """The task calling a record function (`current_task`)."""

    name: str
    processor_id: str
    instance: str
    epoch: int


_current = threading.local()


def current_task() -> TaskContext | None:
    """The task whose thread is calling (from inside `task.function`), or None outside a record task."""
    return getattr(_current, "task", None)


@dataclass
class _Pending:
    """Outputs of records processed since the task last sent: what the next send writes."""

    outgoing: dict[str, list[OutgoingRecord]] = field(default_factory=dict)  # by system
    rows: list[tuple[str, str, str]] = field(default_factory=list)  # served-table rows: table, key, row

    def clear(self) -> None:
        self.outgoing = {}
        self.rows = []


class _Progress:
    """Where a running task is: the next offset of each SSP, the systems' native positions of the last records
    (for their own checkpoint layouts), and whether anything moved since the last checkpoint."""

    def __init__(
        self, runner: RecordTaskRunner, handle: _TaskThread, offsets: dict[SystemStreamPartition, str]
    ) -> None:
        self.runner = runner
        self.handle = handle
        self.offsets = offsets
        self.positions: dict[SystemStreamPartition, Mapping[str, str]] = {}
        self.dirty = False
        self.last_commit = time.monotonic()

    def due(self) -> bool:
        """`task.commit.ms` has passed since the last checkpoint."""
        return (time.monotonic() - self.last_commit) * 1000 >= self.runner.commit_ms

    def advance(self, ssp: SystemStreamPartition, pending: _Pending, last: IncomingRecord) -> None:
        """Send ``pending``, then move the offset of ``ssp`` past ``last``: no checkpoint names an output
        that was not sent."""
        handle = self.handle
        handle.guarded(functools.partial(self.runner._send, pending.outgoing))
        for table, key, row in pending.rows:  # sent to the changelog: now the table may show them
            handle.tables[table].put(key, row)
        pending.clear()
        self.offsets[ssp] = last.next_offset
        position = self.runner.systems.admin(ssp.system).native_position(last)
        if position:
            self.positions[ssp] = position
        self.dirty = True

    def commit(self, control: dict[str, Any] | None = None) -> None:
        """Write the task's offsets (and ``control``: the drained mark of a drain's last checkpoint)."""
        checkpoint = Checkpoint(offsets=dict(self.offsets), control=control or {}, positions=dict(self.positions))
        self.handle.guarded(lambda: self.handle.writer.write(checkpoint), hold=False)
        self.dirty = False
        self.last_commit = time.monotonic()


class _Abandoned(WeirflowError):
    """The task was abandoned: leave its loop without writing anything more."""


def load_record_function(config: ConfigView) -> RecordFunction:
    """Import `task.function`, with the config file's directory importable; errors name the key and file."""
    return load_callable(config, "task.function")


def _encode(value: Any) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, separators=(",", ":")).encode()


class _TaskThread:
    def __init__(self, runner: RecordTaskRunner, task: TaskModel, lock: Lock) -> None:
        self.task = task
        self.lock = lock
        self.stop_event = threading.Event()
        self.error: str | None = None
        self.writer = FencedCheckpointWriter(task.name, runner.checkpoints, lock)
        self.thread = threading.Thread(target=self._run, args=(runner,), name=f"task-{task.name}", daemon=True)
        self._abandoned = False
        self.drained = False  # checkpointed drained in this run: done, not failed
        self.tables: dict[str, MemoryTable] = {}  # served tables, once rebuilt from their changelogs
        self._gate = threading.Lock()  # held by each send; every send and checkpoint checks the flags under it
        self._lease_valid = runner.lease_valid

    def guarded(self, action: Callable[[], Any], *, hold: bool = True) -> None:
        """Run ``action`` unless the task was abandoned (then `_Abandoned`). A send holds the gate while it
        runs (``hold``), so `abandon` waits for it; a checkpoint write only checks it before it begins (the
        store fences a late one by the lock's epoch, and a write stuck on an unreachable store must not
        delay the fence)."""
        with self._gate:
            if not self._abandoned and self._lease_valid is not None and not self._lease_valid(self.task.name):
                log.error("task %s: its lock is not confirmed any more; abandoning it", self.task.name)
                self._abandoned = True
                self.stop_event.set()
            if self._abandoned:
                raise _Abandoned
            if hold:
                action()
                return
        action()

    def abandon(self) -> None:
        """Forbid any further send or checkpoint write; `wait_for_send` then waits for a send under way."""
        self._abandoned = True
        self.stop_event.set()

    def wait_for_send(self, timeout_s: float) -> None:
        if self._gate.acquire(timeout=max(0.0, timeout_s)):
            self._gate.release()
        else:
            log.warning(
                "task %s: a send under way did not finish within %.1f s of abandoning the task",
                self.task.name,
                _ABANDON_WAIT_S,
            )

    def _run(self, runner: RecordTaskRunner) -> None:
        _current.task = TaskContext(
            self.task.name,
            self.lock.owner,
            getattr(self.lock, "instance", ""),
            getattr(self.lock, "epoch", 0),
        )
        try:
            runner.run_task(self)
        except _Abandoned:
            log.warning("task %s abandoned: stopped without writing anything more", self.task.name)
        except LockLostError as exc:
            if self._abandoned:  # a checkpoint write begun before the task was abandoned, refused: as it should
                log.warning("task %s abandoned; its last checkpoint write was refused: %s", self.task.name, exc)
                return
            self.error = str(exc)
            log.error("task %s stopped: %s", self.task.name, exc)
        except Exception as exc:  # surfaced through failures(); the processor reports it
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("task %s failed", self.task.name)


class RecordTaskRunner(TaskRunner):
    """Runs tasks as threads of this process. ``fn`` is the record function; ``commit_ms`` the checkpoint
    interval; ``max_records`` the read size per SSP per poll."""

    def __init__(
        self,
        systems: Systems,
        checkpoints: CheckpointManager,
        fn: RecordFunction,
        *,
        commit_ms: int = 1000,
        max_records: int = 500,
        tables: RecordTables | None = None,
        run_id: str = DEFAULT_RUN_ID,
    ) -> None:
        self.systems = systems
        self.run_id = run_id
        self._draining = threading.Event()  # the processor saw this run's drain notification
        self.tables = tables
        self.checkpoints = checkpoints
        self.fn = fn
        self.commit_ms = commit_ms
        self.max_records = max_records
        self._tasks: dict[str, _TaskThread] = {}
        self._done: set[str] = set()  # drained in this run: never started again here
        self._failed: dict[str, str] = {}
        self._stopping: dict[str, _TaskThread] = {}  # popped from _tasks, stop under way
        self._guard = threading.Lock()

    @classmethod
    def from_config(cls, config: ConfigView, systems: Systems, checkpoints: CheckpointManager) -> RecordTaskRunner:
        for stream_id in config.get("task.inputs") or []:
            parse_start(config, stream_id)  # a bad start fails the processor now, naming the key
        tables = RecordTables(config, systems)
        tables.check()
        check_retention(config, systems, tables.read_back())
        for name in tables.tables:
            ref = tables.changelog(name)
            systems.admin(ref.system).create_stream(StreamSpec(ref.physical, tables.partitions()))
        return cls(
            systems,
            checkpoints,
            load_record_function(config),
            commit_ms=config.get("task.commit.ms"),
            max_records=config.get("task.poll.max.records"),
            tables=tables if tables.tables else None,
            run_id=run_id_of(config),
        )

    # --- TaskRunner -----------------------------------------------------------------------------------
    def start_task(self, task: TaskModel, lock: Lock) -> None:
        with self._guard:
            if task.name in self._done or (task.name in self._tasks and self._tasks[task.name].thread.is_alive()):
                return
            handle = _TaskThread(self, task, lock)
            self._tasks[task.name] = handle
            self._failed.pop(task.name, None)
        handle.thread.start()

    def stop_task(self, task_name: str) -> None:
        self.stop_tasks([task_name])

    def stop_tasks(self, task_names: Iterable[str]) -> None:
        """Signal every task first, then wait for each: they stop (and checkpoint) in parallel. While they
        stop they can still be abandoned (`abandon_tasks`, a stop that outlasts `task.stop.timeout.ms`)."""
        with self._guard:
            handles = [h for h in (self._tasks.pop(n, None) for n in task_names) if h is not None]
            for handle in handles:
                self._stopping[handle.task.name] = handle
        try:
            for handle in handles:
                handle.stop_event.set()
            for handle in handles:
                handle.thread.join()
        finally:
            with self._guard:
                for handle in handles:
                    if self._stopping.get(handle.task.name) is handle:
                        del self._stopping[handle.task.name]

    def abandon_tasks(self, task_names: Iterable[str]) -> None:
        """Stop at once, writing nothing more: running tasks and tasks whose stop is still under way."""
        with self._guard:
            handles = []
            for name in task_names:
                handle = self._tasks.pop(name, None) or self._stopping.get(name)
                if handle is not None:
                    handles.append(handle)
        for handle in handles:
            handle.abandon()
        deadline = time.monotonic() + _ABANDON_WAIT_S  # one short wait for all of them, not one each
        for handle in handles:
            handle.wait_for_send(deadline - time.monotonic())

    def drain(self, run_id: str) -> None:
        if run_id == self.run_id and not self._draining.is_set():
            log.info("draining: every task stops at the record in hand, flushes and checkpoints drained")
            self._draining.set()

    def running(self) -> set[str]:
        with self._guard:
            return {n for n, h in self._tasks.items() if h.thread.is_alive() and h.error is None and not h.drained}

    def failures(self) -> dict[str, str]:
        with self._guard:
            for name, handle in list(self._tasks.items()):
                if handle.error is not None and not handle.thread.is_alive():
                    self._failed[name] = handle.error
                    del self._tasks[name]
            return dict(self._failed)

    def forget(self, task_name: str) -> None:
        with self._guard:
            self._failed.pop(task_name, None)

    def trim_scope(self) -> TrimScope | None:
        """The tables' changelogs, compacted: a task rebuilds its table from the latest row per key."""
        if self.tables is None or not self.tables.tables:
            return None
        changelogs = (self.tables.changelog(name) for name in self.tables.tables)
        return TrimScope(
            frozenset(), lambda stage: False, compacted=frozenset((c.system, c.physical) for c in changelogs)
        )

    @property
    def table_routes(self) -> RecordTables | None:
        """The job's ``task.tables`` (`weirflow.tasks.record_tables`): a key's table row is in the task holding
        the key's partition of the first input."""
        return self.tables

    def table(self, task_name: str, table: str) -> MemoryTable | None:
        with self._guard:
            handle = self._tasks.get(task_name)
        if handle is None or not handle.thread.is_alive() or handle.error is not None:
            return None
        return handle.tables.get(table)

    # --- the task loop --------------------------------------------------------------------------------
    def _start_offsets(self, handle: _TaskThread) -> dict[SystemStreamPartition, str]:
        """Where the task resumes; the checkpoint it read is claimed with this holder's epoch first, so that
        no former holder's write can land after it (`FencedCheckpointWriter.claim`). A checkpoint drained in this
        run marks the handle ``drained``: the task has nothing more to do."""
        task = handle.task
        checkpoint = self.checkpoints.read_last_checkpoint(task.name)
        handle.guarded(lambda: handle.writer.claim(checkpoint), hold=False)
        if checkpoint is not None and TaskControl.from_json(checkpoint.control).drained == self.run_id:
            handle.drained = True  # nothing more to do in this run (a restart or a rebalance during the drain)
        stored = dict(checkpoint.offsets) if checkpoint else {}
        offsets: dict[SystemStreamPartition, str] = {}
        for ssp in task.ssps:
            stream_id = self.systems.stream_id_of(ssp.system, ssp.stream)
            admin = self.systems.admin(ssp.system)
            if ssp in stored:
                offsets[ssp] = resume_offset(self.systems.config, stream_id, admin, ssp, stored[ssp])
            else:
                offsets[ssp] = start_offset(self.systems.config, stream_id, admin, ssp)
        return offsets

    def _restore_tables(self, handle: _TaskThread) -> None:
        """Rebuild the task's served tables from their changelog partitions (the task's partition)."""
        if self.tables is None or not handle.task.ssps:
            return
        partition = handle.task.ssps[0].partition
        for name in self.tables.tables:
            ref = self.tables.changelog(name)
            ssp = SystemStreamPartition(ref.system, ref.physical, partition)
            consumer = self.systems.consumer(ref.system)
            admin = self.systems.admin(ref.system)
            held = admin.partition_metadata_of(ref.physical, [partition])[partition]
            end = held.upcoming
            table = MemoryTable()
            position = held.oldest  # the system's own first offset ("0" is none on Kinesis, whose are positions)
            while records := consumer.read(ssp, position, 5000, end):
                for record in records:
                    key = (record.key or b"").decode("utf-8", "replace")
                    table.put(key, record.value.decode("utf-8", "replace"))
                position = records[-1].next_offset
            handle.tables[name] = table
            log.info("task %s: table %s rebuilt from its changelog (%d keys)", handle.task.name, name, len(table))

    def run_task(self, handle: _TaskThread) -> None:
        """Read, process, send, checkpoint, until stopped. Time, not the size of a read, decides when progress
        is committed (`_read_through`), so a stop waits for one record, never for the rest of a read."""
        task = handle.task
        progress = _Progress(self, handle, self._start_offsets(handle))
        if handle.drained:
            with self._guard:
                self._done.add(task.name)
            log.info("task %s already drained in run %s", task.name, self.run_id)
            return
        self._restore_tables(handle)
        log.info("task %s started at %s", task.name, {str(k): v for k, v in progress.offsets.items()})
        while not self._halted(handle):
            progressed = False
            for ssp in task.ssps:
                if self._halted(handle):
                    break
                records = self.systems.consumer(ssp.system).read(ssp, progress.offsets[ssp], self.max_records)
                if records:
                    self._read_through(handle, progress, ssp, records)
                    progressed = True
            if progress.dirty and progress.due():
                progress.commit()
            if not progressed:
                handle.stop_event.wait(_IDLE_WAIT_S)
        at = {str(k): v for k, v in progress.offsets.items()}
        if self._draining.is_set() and not handle.stop_event.is_set():
            progress.commit(TaskControl(drained=self.run_id).to_json())
            handle.drained = True
            with self._guard:
                self._done.add(task.name)
            log.info("task %s drained in run %s at its cut %s", task.name, self.run_id, at)
            return
        if progress.dirty:
            progress.commit()
        log.info("task %s stopped at %s", task.name, at)

    def _halted(self, handle: _TaskThread) -> bool:
        """The task must leave its loop at the next record boundary: stopped, or draining."""
        return handle.stop_event.is_set() or self._draining.is_set()

    def _read_through(
        self, handle: _TaskThread, progress: _Progress, ssp: SystemStreamPartition, records: list[IncomingRecord]
    ) -> None:
        """Process one read's records. After each record the task checks its stop flag and whether `commit_ms`
        has passed; if either, it sends what it has processed, moves its offset past those records only, and
        (the interval passed) writes the checkpoint. A stop leaves the rest of the read after the checkpoint,
        for the next holder to read again (docs/architecture.md, "Record tasks: commits and stops")."""
        stream_id = self.systems.stream_id_of(ssp.system, ssp.stream)
        pending = _Pending()
        for index, record in enumerate(records):
            self._process(stream_id, ssp, record, pending)
            stopping = self._halted(handle)
            due = progress.due()
            if stopping or due or index == len(records) - 1:
                progress.advance(ssp, pending, record)
            if stopping:
                return
            if due:
                progress.commit()

    def _process(
        self, stream_id: str, ssp: SystemStreamPartition, record: IncomingRecord, pending: _Pending
    ) -> None:
        """Call the record function on one record; its outputs (by system) and served-table rows (table, key,
        row as JSON) join ``pending``."""
        try:
            value: str | bytes = record.value.decode()
        except UnicodeDecodeError:
            value = record.value
        message = {
            "stream": stream_id,
            "partition": ssp.partition,
            "offset": record.offset,
            "key": record.key.decode(errors="replace") if record.key is not None else None,
            "value": value,
            "timestamp_ms": record.timestamp_ms,
        }
        for out in self.fn(message) or ():
            if "table" in out:
                pending.rows.append(self._table_row(out, ssp.partition, pending.outgoing))
                continue
            if "stream" not in out or "value" not in out:
                raise ConfigError(f"task.function returned {out!r}; each outgoing dict needs 'stream' and 'value'")
            ref = self.systems.resolve(out["stream"])
            key = out.get("key")
            pending.outgoing.setdefault(ref.system, []).append(
                OutgoingRecord(
                    stream=ref.physical,
                    value=_encode(out["value"]),
                    key=_encode(key) if key is not None else None,
                    partition=out.get("partition"),
                )
            )

    def _table_row(
        self, out: dict[str, Any], partition: int, by_system: dict[str, list[OutgoingRecord]]
    ) -> tuple[str, str, str]:
        """A served-table row: to the table's changelog, in the task's partition."""
        name, key = out.get("table"), out.get("key")
        if self.tables is None or name not in self.tables.tables:
            known = ", ".join(self.tables.tables) if self.tables else "none"
            raise ConfigError(f"task.function wrote table {name!r}, which task.tables does not list ({known})")
        if key is None or "value" not in out:
            raise ConfigError(f"task.function returned {out!r}; a table row needs 'key' and 'value'")
        row = _encode(out["value"])
        ref = self.tables.changelog(str(name))
        by_system.setdefault(ref.system, []).append(
            OutgoingRecord(ref.physical, row, key=_encode(key), partition=partition)
        )
        return str(name), key.decode() if isinstance(key, bytes) else str(key), row.decode("utf-8", "replace")

    def _send(self, outgoing: dict[str, list[OutgoingRecord]]) -> None:
        for system, records in outgoing.items():
            self.systems.producer(system).send(records)
