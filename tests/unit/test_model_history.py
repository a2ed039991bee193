"""Why and when tasks last moved (`weirflow.coordination.model_history`): what a publication changed, the bounded
record with its failover count, and the document in a real (embedded) metadata store."""

from __future__ import annotations

from pathlib import Path

from weirflow.base import malformed
from weirflow.coordination.model_history import (
    HISTORY_KEY,
    KEEP,
    ModelChange,
    ModelHistory,
    describe_change,
    read_history_or_report,
    record_change,
)
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.job.model import JobModel, TaskModel
from weirflow.local.metadata import SqliteMetadataStore

TIMEOUT_MS = 2000
NOW = 1_000_000
TASKS = {f"main-{n}": TaskModel(f"main-{n}", "main", ()) for n in range(4)}


def model(version: int, assignment: dict[str, tuple[str, ...]], tasks: dict[str, TaskModel] = TASKS) -> JobModel:
    return JobModel(version, tasks, assignment, created_ms=NOW, leader="p1")


def row(pid: str, state: str = "RUNNING", heard_ms_ago: int = 0) -> ProcessorInfo:
    return ProcessorInfo(pid, "host", 1, state, heartbeat_ms=NOW - heard_ms_ago)


def test_a_processor_past_the_liveness_timeout_went_silent_and_its_tasks_moved_to_the_survivor() -> None:
    old = model(3, {"p0": ("main-0", "main-1"), "p1": ("main-2", "main-3")})
    new = model(4, {"p1": ("main-0", "main-1", "main-2", "main-3")})
    change = describe_change(old, new, [row("p0", heard_ms_ago=TIMEOUT_MS + 1), row("p1")], TIMEOUT_MS)
    assert (change.silent, change.left, change.joined) == (("p0",), (), ())
    assert change.moved == {"main-0": ("p0", "p1"), "main-1": ("p0", "p1")}
    assert change.failover and (change.version, change.at_ms, change.leader) == (4, NOW, "p1")


def test_a_processor_that_said_it_stopped_left_and_a_new_one_joined() -> None:
    old = model(3, {"p0": ("main-0", "main-1"), "p1": ("main-2", "main-3")})
    new = model(4, {"p1": ("main-2", "main-3"), "p2": ("main-0", "main-1")})
    rows = [row("p0", "STOPPED", heard_ms_ago=10 * TIMEOUT_MS), row("p1"), row("p2")]
    change = describe_change(old, new, rows, TIMEOUT_MS)
    assert (change.silent, change.left, change.joined) == ((), ("p0",), ("p2",))
    assert not change.failover
    assert change.moved == {"main-0": ("p0", "p2"), "main-1": ("p0", "p2")}


def test_a_first_model_assigns_every_task_and_a_removed_task_is_unassigned() -> None:
    first = describe_change(JobModel.empty(), model(1, {"p0": tuple(TASKS)}), [row("p0")], TIMEOUT_MS)
    assert first.joined == ("p0",) and first.moved == {t: (None, "p0") for t in TASKS}
    fewer = {t: TASKS[t] for t in ("main-0", "main-1")}
    shrunk = describe_change(
        model(1, {"p0": tuple(TASKS)}),
        model(2, {"p0": ("main-0", "main-1")}, fewer),
        [row("p0")],
        TIMEOUT_MS,
        True,
    )
    assert shrunk.moved == {"main-2": ("p0", None), "main-3": ("p0", None)} and shrunk.latch_timed_out


def test_the_history_keeps_the_last_changes_and_counts_every_failover_once() -> None:
    history = ModelHistory()
    for version in range(1, KEEP + 6):
        silent = ("p0",) if version % 5 == 0 else ()
        history = history.with_change(ModelChange(version, NOW + version, "p1", silent=silent))
    assert [c.version for c in history.changes] == list(range(6, KEEP + 6))
    assert history.failovers == 5  # versions 5, 10, 15, 20, 25: the first of them is no longer kept
    again = history.with_change(ModelChange(KEEP + 5, NOW, "p1", silent=("p0",)))  # a publication retried
    assert again.failovers == 5 and len(again.changes) == KEEP
    assert ModelHistory.from_json(again.to_json()) == again


def test_the_leader_records_changes_in_the_store_and_a_malformed_document_is_replaced(tmp_path: Path) -> None:
    store = SqliteMetadataStore(tmp_path / "job.db")
    store.start()
    assert read_history_or_report(store) == (ModelHistory(), None)
    moved = ModelChange(2, NOW, "p1", silent=("p0",), moved={"main-0": ("p0", "p1")})
    record_change(store, ModelChange(1, NOW, "p0", joined=("p0", "p1")))
    record_change(store, moved)
    history, _ = read_history_or_report(store)
    assert [c.version for c in history.changes] == [1, 2] and history.failovers == 1
    assert history.changes[-1] == moved
    store.put(HISTORY_KEY, {"format": 1, "changes": "not a list"})
    with malformed.collect() as found:
        assert read_history_or_report(store)[0] == ModelHistory()
    assert [entry.document for entry in found] == [HISTORY_KEY]
    record_change(store, ModelChange(3, NOW, "p1"))
    assert [c.version for c in read_history_or_report(store)[0].changes] == [3]
    store.stop()
