"""The leader's decisions, tick by tick, with a controlled clock over the embedded backend's primitives."""

from __future__ import annotations

from pathlib import Path

import pytest

from weirflow.coordination.job_model_store import read_job_model
from weirflow.coordination.leader import LeaderDuties
from weirflow.coordination.model_history import read_history_or_report
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import LatchState, ProcessorInfo, latch_name
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.grouper import group_by_partition
from weirflow.local.coordination import SqliteCoordinationUtils
from weirflow.local.metadata import SqliteMetadataStore

TIMINGS = CoordinationTimings(
    lease_ms=15000,
    renew_interval_ms=5000,
    heartbeat_interval_ms=3000,
    liveness_timeout_ms=10000,
    debounce_ms=2000,
    latch_timeout_ms=15000,
    poll_interval_ms=500,
    lock_timeout_ms=60000,
)
TASKS = group_by_partition("main", [SystemStreamPartition("local", "events", p) for p in range(6)])


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


class World:
    def __init__(self, root: Path) -> None:
        self.db = root / "job.db"
        self.clock = Clock()
        self.coordination = SqliteCoordinationUtils(self.db, owner="leader", lease_ms=TIMINGS.lease_ms)
        self.metadata = SqliteMetadataStore(self.db)
        self.metadata.start()
        self.registry = self.coordination.processor_registry()

    def duties(self) -> LeaderDuties:
        return LeaderDuties("leader", self.coordination, self.metadata, lambda: TASKS, TIMINGS, clock=self.clock)

    def beat(self, pid: str, started_ms: int | None = None, state: str = "RUNNING", at: int | None = None) -> None:
        rows = {p.processor_id: p for p in self.registry.processors()}
        started = started_ms if started_ms is not None else rows[pid].started_ms if pid in rows else self.clock.now
        self.registry.heartbeat(
            ProcessorInfo(
                pid, "host", 1, state, heartbeat_ms=at if at is not None else self.clock.now, started_ms=started
            )
        )

    def model(self):
        return read_job_model(self.metadata)[0]

    def join_latch(self, version: int, *pids: str) -> None:
        latch = self.coordination.latch(latch_name(version))
        for pid in pids:
            latch.join(pid)


def settle(world: World, duties: LeaderDuties, *pids: str) -> None:
    """Register ``pids``, let the debounce pass, publish v1 and complete its latch."""
    for pid in pids:
        world.beat(pid)
    world.clock.now += TIMINGS.debounce_ms
    assert duties.tick().version == 1
    world.join_latch(1, *pids)
    duties.tick()


@pytest.fixture
def world(tmp_path: Path) -> World:
    return World(tmp_path)


def test_first_model_waits_for_membership_to_be_stable_for_the_debounce_time(world: World) -> None:
    duties = world.duties()
    world.beat("p1")
    world.beat("p2")
    world.clock.now += 1000
    assert duties.tick() is None
    world.clock.now += 1000
    model = duties.tick()
    assert model is not None and model.version == 1
    assert model.processors == ("p1", "p2")
    assert sorted(t for p in model.processors for t in model.tasks_of(p)) == sorted(TASKS)


def test_a_burst_of_joins_causes_one_rebalance_after_the_last_join(world: World) -> None:
    duties = world.duties()
    settle(world, duties, "p1")
    world.clock.now += 500
    world.beat("p1")
    world.beat("p2")
    world.clock.now += 1500
    world.beat("p3")  # joins 1.5 s after p2: the debounce restarts
    world.clock.now += 1000
    assert duties.tick() is None
    world.clock.now += 1000
    model = duties.tick()
    assert model.version == 2 and model.processors == ("p1", "p2", "p3")
    assert world.model().version == 2


def test_a_silent_processor_is_removed_as_soon_as_it_is_past_the_liveness_timeout(world: World) -> None:
    """No debounce after the liveness timeout: the silence itself waited longer than any debounce, and deaths
    come with silences spread over a heartbeat interval, which a debounce of joins would not batch anyway."""
    duties = world.duties()
    settle(world, duties, "p1", "p2")
    last_p2 = world.clock.now - TIMINGS.debounce_ms  # p2's only heartbeat
    world.clock.now = last_p2 + TIMINGS.liveness_timeout_ms
    world.beat("p1")
    assert duties.tick() is None  # not yet past the timeout
    world.clock.now = last_p2 + TIMINGS.liveness_timeout_ms + 1
    world.beat("p1")
    model = duties.tick()
    assert model.version == 2 and model.processors == ("p1",)
    assert set(model.tasks_of("p1")) == set(TASKS)


def test_a_death_right_after_a_join_waits_for_the_joins_debounce(world: World) -> None:
    duties = world.duties()
    settle(world, duties, "p1", "p2")
    last_p2 = world.clock.now - TIMINGS.debounce_ms  # p2's only heartbeat
    world.clock.now = last_p2 + TIMINGS.liveness_timeout_ms + 1
    world.beat("p1")
    world.beat("p3")  # joins as p2 is found silent
    assert duties.tick() is None
    world.clock.now += TIMINGS.debounce_ms
    world.beat("p1")
    world.beat("p3")
    model = duties.tick()
    assert model.version == 2 and model.processors == ("p1", "p3")


def test_a_leader_elected_after_a_death_publishes_without_waiting_again(world: World) -> None:
    settle(world, world.duties(), "p1", "p2")
    # p2 (the old leader) dies; a new leader is elected 15 s later and sees p2 silent for 15 s
    world.clock.now += 15000
    world.beat("p1")
    model = world.duties().tick()
    assert model is not None and model.processors == ("p1",)


def test_a_stopped_processor_is_gone_after_the_debounce_without_waiting_for_liveness(world: World) -> None:
    duties = world.duties()
    settle(world, duties, "p1", "p2")
    world.clock.now += 2000
    world.beat("p2", state="STOPPED")
    world.beat("p1")
    assert duties.tick() is None
    world.clock.now += TIMINGS.debounce_ms
    world.beat("p1")
    assert duties.tick().processors == ("p1",)


def test_the_latch_completes_when_every_processor_of_the_model_joined(world: World) -> None:
    duties = world.duties()
    world.beat("p1")
    world.beat("p2")
    world.clock.now += 2000
    duties.tick()
    latch = world.coordination.latch(latch_name(1))
    world.join_latch(1, "p1")
    duties.tick()
    assert latch.state() is LatchState.OPEN
    world.join_latch(1, "p2")
    duties.tick()
    assert latch.state() is LatchState.COMPLETE


def test_a_timed_out_latch_makes_the_leader_publish_a_new_version(world: World) -> None:
    duties = world.duties()
    world.beat("p1")
    world.beat("p2")
    world.clock.now += 2000
    duties.tick()
    world.join_latch(1, "p1")
    world.clock.now += TIMINGS.latch_timeout_ms
    world.beat("p1")
    world.beat("p2")
    model = duties.tick()
    assert world.coordination.latch(latch_name(1)).state() is LatchState.TIMED_OUT
    assert model is not None and model.version == 2


def test_a_new_leader_adopts_the_open_latch_of_the_current_model(world: World) -> None:
    world.beat("p1")
    world.beat("p2")
    world.clock.now += 2000
    world.duties().tick()
    world.join_latch(1, "p1", "p2")
    successor = world.duties()
    successor.tick()
    assert world.coordination.latch(latch_name(1)).state() is LatchState.COMPLETE


def test_a_stale_leader_cannot_overwrite_a_newer_model(world: World) -> None:
    old, new = world.duties(), world.duties()
    world.beat("p1")
    world.clock.now += 2000
    assert new.tick().version == 1
    world.join_latch(1, "p1")
    new.tick()
    world.beat("p2")
    world.clock.now += 2000
    world.beat("p1")
    assert new.tick().version == 2
    # the old leader's view is stale only in memory; it re-reads and sees membership unchanged
    assert old.tick() is None
    assert world.model().version == 2


class LostResponseStore:
    """Our own MetadataStore, wrapped: the first job-model write is stored, then raises as if its response was
    lost on the way back (the write's outcome is unknown to the leader)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.dropped = False

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def put(self, key, value, **conditions):
        etag = self._inner.put(key, value, **conditions)
        if not self.dropped:
            self.dropped = True
            raise ConnectionError("the connection was reset before the response arrived")
        return etag


def test_a_publish_whose_response_was_lost_still_gets_its_latch_completed(world: World) -> None:
    world.metadata = LostResponseStore(world.metadata)
    duties = world.duties()
    world.beat("p1")
    world.clock.now += TIMINGS.debounce_ms
    with pytest.raises(ConnectionError):
        duties.tick()
    assert world.model().version == 1, "the write was stored although its response was lost"
    world.join_latch(1, "p1")
    world.clock.now += TIMINGS.poll_interval_ms
    assert duties.tick() is None  # the stored model is the current one: nothing to publish again
    assert world.coordination.latch(latch_name(1)).state() is LatchState.COMPLETE


def test_a_model_published_by_a_deposed_leader_is_watched_by_the_current_one(world: World) -> None:
    duties = world.duties()
    settle(world, duties, "p1")
    deposed = LeaderDuties("old", world.coordination, world.metadata, lambda: TASKS, TIMINGS, clock=world.clock)
    world.beat("p2")
    world.clock.now += TIMINGS.debounce_ms
    assert deposed.tick().version == 2  # it raced the current leader and won the write
    assert duties.tick() is None  # the current leader sees v2: same membership, nothing to publish
    world.join_latch(2, "p1", "p2")
    duties.tick()
    assert world.coordination.latch(latch_name(2)).state() is LatchState.COMPLETE


def test_a_leader_killed_between_a_latch_time_out_and_the_next_publish_is_followed_by_one_that_publishes(
    world: World,
) -> None:
    first = world.duties()
    settle(world, first, "p1")
    world.beat("p2")
    world.clock.now += TIMINGS.debounce_ms
    assert first.tick().version == 2
    world.join_latch(2, "p1")  # p2 never joins
    world.clock.now += TIMINGS.latch_timeout_ms
    world.beat("p1")
    world.beat("p2")
    world.coordination.latch(latch_name(2)).time_out()  # what `first` would do, then it is killed
    successor = world.duties()
    published = successor.tick()
    assert published is not None and published.version == 3, "the timed-out v2 was left as the last word"
    world.join_latch(3, "p1", "p2")
    successor.tick()
    assert world.coordination.latch(latch_name(3)).state() is LatchState.COMPLETE


def test_a_failover_is_recorded_with_the_silent_processor_and_the_tasks_it_lost(world: World) -> None:
    """The leader records why it published and which tasks moved where (`weirflow.coordination.model_history`)."""
    duties = world.duties()
    settle(world, duties, "p1", "p2")
    lost = set(world.model().tasks_of("p2"))
    world.clock.now += TIMINGS.liveness_timeout_ms + 1
    world.beat("p1")
    assert duties.tick().version == 2
    history, _ = read_history_or_report(world.metadata)
    first, failover = history.changes
    assert first.version == 1 and first.joined == ("p1", "p2") and not first.failover
    assert failover.version == 2 and failover.silent == ("p2",) and failover.left == ()
    assert failover.moved == {task: ("p2", "p1") for task in lost} and lost
    assert history.failovers == 1
