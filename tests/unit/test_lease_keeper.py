"""`LeaseKeeper`: local monotonic deadlines per held lease, independent renewals, and the self-fence."""

from __future__ import annotations

import threading

import pytest

from weirflow.coordination.keeper import LeaseKeeper
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import Lock
from weirflow.testing import wait_until

TIMINGS = CoordinationTimings(
    lease_ms=15000,
    renew_interval_ms=5000,
    heartbeat_interval_ms=3000,
    liveness_timeout_ms=10000,
    debounce_ms=2000,
    latch_timeout_ms=15000,
    poll_interval_ms=500,
    lock_timeout_ms=60000,
    renew_margin_ms=5000,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class FakeLock(Lock):
    """A lock whose renewals answer ``answer`` (True, False, or an exception), optionally after ``gate``."""

    def __init__(self, name: str, answer: object = True, gate: threading.Event | None = None) -> None:
        self.name = name
        self.owner = "p1"
        self.answer = answer
        self.gate = gate
        self.renewals = 0

    def try_acquire(self) -> bool:
        return True

    def renew(self) -> bool:
        self.renewals += 1
        if self.gate is not None:
            self.gate.wait(10)
        if isinstance(self.answer, BaseException):
            raise self.answer
        return bool(self.answer)

    def release(self) -> None:
        pass

    def is_held(self) -> bool:
        return True


def answered(keeper: LeaseKeeper, locks: list[FakeLock]) -> bool:
    """The renewal of each of ``locks`` sent by the keeper has finished on its pool: the next `tick` collects
    its answer."""
    with keeper._guard:
        in_flight = [held.in_flight for lock in locks if (held := keeper._held.get(lock.name)) is not None]
    return all(future is None or future.done() for future in in_flight)


def idle(keeper: LeaseKeeper) -> bool:
    """No call the keeper handed its pool is under way (those of leases it gave up included)."""
    with keeper._calls_guard:
        return not keeper._calls


def settle(keeper: LeaseKeeper, locks: list[FakeLock], renewals: int) -> None:
    """Wait until the pool ran ``renewals`` renewals of ``locks`` in all and each has answered (the fake clock
    does not move meanwhile)."""
    wait_until(lambda: sum(lock.renewals for lock in locks) >= renewals, 5, f"{renewals} renewals")
    wait_until(lambda: answered(keeper, locks), 5, "the renewals' answers")


def test_a_confirmed_renewal_moves_the_deadline_to_its_send_time_plus_the_lease() -> None:
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    lock = FakeLock("a")
    keeper.add("a", lock, sent_at=clock.t)
    assert keeper.deadline("a") == clock.t + 15
    clock.t += 5  # renewal due
    assert keeper.tick().expiring == []
    settle(keeper, [lock], 1)
    assert keeper.tick().expiring == []
    assert keeper.deadline("a") == 1005 + 15
    keeper.close()


def test_a_lease_whose_renewal_is_not_confirmed_by_deadline_minus_margin_is_given_up() -> None:
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    hang = threading.Event()
    lock = FakeLock("a", gate=hang)  # the store does not answer
    keeper.add("a", lock, sent_at=clock.t)
    clock.t += 5
    keeper.tick()  # sends the renewal, which hangs
    clock.t += 4.9  # deadline - margin = +10 s
    assert keeper.tick().expiring == []
    clock.t += 0.1
    result = keeper.tick()
    assert result.expiring == ["a"]
    assert keeper.names() == set()
    hang.set()  # the late answer is ignored: the lease stays given up
    wait_until(lambda: idle(keeper), 5, "the late answer")
    assert keeper.tick().expiring == [] and keeper.names() == set()
    keeper.close()


def test_one_hanging_or_failing_renewal_does_not_delay_the_others() -> None:
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    hang = threading.Event()
    hanging = FakeLock("hangs", gate=hang)
    failing = FakeLock("fails", answer=OSError("storage away"))
    healthy = FakeLock("ok")
    for lock in (hanging, failing, healthy):
        keeper.add(lock.name, lock, sent_at=clock.t)
    clock.t += 5
    keeper.tick()
    settle(keeper, [failing, healthy], 2)
    result = keeper.tick()
    assert [name for name, _ in result.errors] == ["fails"]
    assert keeper.deadline("ok") == 1005 + 15
    # the failing one is retried soon (not a renew interval later); the healthy one keeps its schedule
    clock.t += TIMINGS.renew_retry_ms() / 1000
    keeper.tick()
    wait_until(lambda: failing.renewals >= 2, 5, "the failed renewal retried")
    assert healthy.renewals == 1 and hanging.renewals == 1
    # past deadline - margin: the two unconfirmed ones are given up, the healthy one is not
    clock.t = 1010.0
    result = keeper.tick()
    assert sorted(result.expiring) == ["fails", "hangs"]
    assert keeper.names() == {"ok"}
    hang.set()
    keeper.close()


def test_a_renewal_refused_by_the_store_reports_the_lease_lost() -> None:
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    lock = FakeLock("a", answer=False)
    keeper.add("a", lock, sent_at=clock.t)
    clock.t += 5
    keeper.tick()
    settle(keeper, [lock], 1)
    assert keeper.tick().lost == ["a"]
    assert keeper.names() == set()
    keeper.close()


@pytest.mark.parametrize(
    ("values", "key", "message"),
    [
        ({"job.coordinator.lease.renew.margin.ms": 0}, "job.coordinator.lease.renew.margin.ms", "positive"),
        ({"job.coordinator.lease.renew.margin.ms": 10000}, "job.coordinator.lease.renew.margin.ms", "shorter"),
        (
            {"job.coordinator.lease.duration.ms": 6000, "job.coordinator.lease.renew.interval.ms": 5000},
            "job.coordinator.lease.renew.interval.ms",
            "margin",
        ),
        (
            {"job.coordinator.heartbeat.interval.ms": 8500, "job.coordinator.liveness.timeout.ms": 10000},
            "job.coordinator.heartbeat.interval.ms",
            "self-fence margin",
        ),
    ],
)
def test_a_margin_that_cannot_work_is_a_config_error_naming_the_key(
    tmp_path, values: dict, key: str, message: str
) -> None:
    from weirflow.base.errors import ConfigError
    from weirflow.config import load_config

    path = tmp_path / "job.yaml"
    path.write_text("job.name: t\n" + "".join(f"{k}: {v}\n" for k, v in values.items()))
    with pytest.raises(ConfigError, match=key) as info:
        CoordinationTimings.from_config(load_config(path))
    assert message in str(info.value)


def test_the_default_margin_is_a_third_of_the_lease(tmp_path) -> None:
    from weirflow.config import load_config

    path = tmp_path / "job.yaml"
    path.write_text("job.name: t\n")
    assert CoordinationTimings.from_config(load_config(path)).renew_margin_ms == 5000


def test_a_leader_past_its_deadline_minus_margin_writes_nothing_as_leader(tmp_path) -> None:
    from weirflow.base.errors import LockLostError
    from weirflow.coordination.leader_fence import FencedCoordination, FencedMetadataStore, LeaderFence
    from weirflow.local.coordination import SqliteCoordinationUtils
    from weirflow.local.metadata import SqliteMetadataStore

    clock = FakeClock()
    fence = LeaderFence("p1", valid_until=lambda: 1010.0, clock=clock)
    metadata = FencedMetadataStore(SqliteMetadataStore(tmp_path / "job.db"), fence)
    coordination = FencedCoordination(SqliteCoordinationUtils(tmp_path / "job.db", "p1", lease_ms=3000), fence)
    assert coordination.leader_elector().try_become_leader()
    metadata.put("job-model", {"version": 1})
    coordination.latch("jobmodel-1").complete()
    clock.t = 1010.0
    with pytest.raises(LockLostError, match="leader"):
        metadata.put("job-model", {"version": 2})
    with pytest.raises(LockLostError):
        coordination.latch("jobmodel-2").time_out()
    with pytest.raises(LockLostError):
        coordination.processor_registry().unregister("p2")
    assert metadata.get("job-model").value == {"version": 1}  # reads pass


def test_a_deposed_leader_cannot_publish_even_when_its_own_deadline_says_it_may(tmp_path) -> None:
    """The embedded store checks the leader lease inside the model write's transaction: a leader whose lease
    expired and was taken is refused even if its self-fence is blind (a clock running slow, say)."""
    from weirflow.base.errors import LockLostError
    from weirflow.coordination.job_model_store import publish_job_model, read_job_model
    from weirflow.coordination.leader_fence import FencedMetadataStore, LeaderFence
    from weirflow.job.model import JobModel
    from weirflow.local.coordination import SqliteCoordinationUtils
    from weirflow.local.metadata import SqliteMetadataStore

    db = tmp_path / "job.db"
    deposed = SqliteCoordinationUtils(db, "p1", lease_ms=200, instance="run-a")
    current = SqliteCoordinationUtils(db, "p2", lease_ms=5000, instance="run-b")
    store = SqliteMetadataStore(db)
    try:
        assert deposed.leader_elector().try_become_leader()
        _, etag = read_job_model(store)
        elector = current.leader_elector()
        # p1's lease runs out; p2 is elected
        wait_until(elector.try_become_leader, 10, "p2 elected once p1's lease ran out", interval_s=0.05)

        blind = FencedMetadataStore(store, LeaderFence("p1", lambda: float("inf"), instance="run-a"))
        with pytest.raises(LockLostError, match="leader"):
            publish_job_model(blind, JobModel(version=1, leader="p1"), etag)
        assert read_job_model(store)[0].version == 0, "the deposed leader's model was stored"
        # the same owner in another run is another holder
        other_run = FencedMetadataStore(store, LeaderFence("p2", lambda: float("inf"), instance="run-z"))
        with pytest.raises(LockLostError):
            publish_job_model(other_run, JobModel(version=1, leader="p2"), etag)

        leading = FencedMetadataStore(store, LeaderFence("p2", lambda: float("inf"), instance="run-b"))
        publish_job_model(leading, JobModel(version=1, leader="p2"), etag)
        assert read_job_model(store)[0].leader == "p2"
    finally:
        deposed.close()
        current.close()
        store.stop()


# --- the heartbeat's self-fence -----------------------------------------------------------------------------
ALIVE_S = (TIMINGS.liveness_timeout_ms - TIMINGS.liveness_margin_ms()) / 1000  # 8 s with these timings


def test_leases_are_given_up_when_no_heartbeat_was_confirmed_within_liveness_minus_margin() -> None:
    """Another processor may break the leases of one silent past the liveness timeout: its keeper gives them up
    before that, counted from the send time of its last confirmed heartbeat, whatever the leases' own deadlines."""
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    keeper.heartbeat_confirmed(sent_at=clock.t)
    lock = FakeLock("a")
    keeper.add("a", lock, sent_at=clock.t)
    clock.t += 5
    keeper.tick()
    settle(keeper, [lock], 1)  # the lease is renewed: its own deadline is 1020 s
    assert keeper.tick().unheard == []
    clock.t = 1000 + ALIVE_S - 0.1
    assert keeper.valid("a") and keeper.tick().unheard == []
    assert keeper.valid_until("a") == pytest.approx(1000 + ALIVE_S)
    clock.t = 1000 + ALIVE_S
    assert not keeper.valid("a"), "a task may write after the processor's silence let its lock be broken"
    result = keeper.tick()
    assert result.unheard == ["a"] and result.expiring == []
    assert keeper.names() == set()
    keeper.close()


def test_a_heartbeat_confirmed_in_time_keeps_the_leases() -> None:
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    keeper.heartbeat_confirmed(sent_at=clock.t)
    keeper.add("a", FakeLock("a"), sent_at=clock.t)
    clock.t += 3
    keeper.heartbeat_confirmed(sent_at=clock.t)
    clock.t = 1000 + ALIVE_S + 1
    assert keeper.valid("a") and keeper.tick().unheard == []
    assert keeper.lapses == 0
    keeper.close()


def test_a_heartbeat_confirmed_after_a_gap_revives_no_lease_held_across_it() -> None:
    """A process paused past its alive deadline (SIGSTOP) wakes with a heartbeat that may succeed before the
    keeper ticks: the leases it held across the gap are given up all the same, since a reader may have seen
    the silence and broken them; a lease taken afterwards is kept."""
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    keeper.heartbeat_confirmed(sent_at=clock.t)
    keeper.add("a", FakeLock("a"), sent_at=clock.t)
    clock.t += ALIVE_S + 2  # paused
    keeper.heartbeat_confirmed(sent_at=clock.t)  # the first thing done on waking
    assert keeper.lapses == 1
    assert not keeper.valid("a")
    keeper.add("b", FakeLock("b"), sent_at=clock.t)
    result = keeper.tick()
    assert result.unheard == ["a"]
    assert keeper.names() == {"b"} and keeper.valid("b")
    keeper.close()


def test_before_the_first_heartbeat_only_the_leases_own_deadlines_count() -> None:
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    keeper.add("a", FakeLock("a"), sent_at=clock.t)
    clock.t += ALIVE_S + 0.5
    assert keeper.valid("a") and keeper.alive_until() == float("inf")
    keeper.close()
