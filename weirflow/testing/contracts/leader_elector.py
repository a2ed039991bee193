"""LeaderElector contract: one leader at a time, renewal, expiry takeover, resignation."""

from __future__ import annotations

import time

import pytest

from weirflow.base.waiting import wait_until
from weirflow.testing.contracts._base import CoordinationContract


class LeaderElectorContract(CoordinationContract):
    """`weirflow.interfaces.coordination.LeaderElector`, through ``Backend.coordination``. Takes about three
    leases (``Backend.lease_ms``) of waiting."""

    def test_exactly_one_of_several_owners_becomes_leader(self, coordination) -> None:
        electors = {o: coordination(o).leader_elector() for o in ("a", "b", "c")}
        winners = [o for o, e in electors.items() if e.try_become_leader()]
        assert len(winners) == 1
        assert all(e.is_leader == (o in winners) for o, e in electors.items())
        assert electors["a"].current_leader() == winners[0]

    def test_the_leader_keeps_the_lease_by_renewing(self, coordination, lease_ms) -> None:
        leader, other = coordination("a").leader_elector(), coordination("b").leader_elector()
        assert leader.try_become_leader()
        deadline = time.monotonic() + 1.5 * lease_ms / 1000  # more than a lease's worth of time passes
        while time.monotonic() < deadline:
            time.sleep(lease_ms / 4000)  # the passage of time is the point here, not synchronisation
            assert leader.renew()
            assert not other.try_become_leader()
        assert other.current_leader() == "a"

    def test_another_owner_takes_over_when_the_leader_stops_renewing(self, coordination, lease_ms) -> None:
        old, new = coordination("a").leader_elector(), coordination("b").leader_elector()
        assert old.try_become_leader()
        wait_until(
            new.try_become_leader, lease_ms / 1000 + 10, "b to win after a's lease expired", interval_s=0.05
        )
        assert new.is_leader
        assert not old.renew()
        assert not old.is_leader
        assert old.current_leader() == "b"

    def test_resigning_lets_another_owner_win_at_once(self, coordination) -> None:
        old, new = coordination("a").leader_elector(), coordination("b").leader_elector()
        assert old.try_become_leader()
        old.resign()
        assert not old.is_leader
        assert new.try_become_leader()
        old.resign()  # idempotent, and does not touch b's lease
        assert new.current_leader() == "b"

    def test_no_leader_before_anyone_tried(self, coordination) -> None:
        assert coordination("a").leader_elector().current_leader() is None

    def test_a_silent_leaders_lease_is_broken_and_another_wins_at_once(self, coordination) -> None:
        """What a follower does when the leader is silent past the liveness timeout: break its lease and win
        without waiting for it to expire. A break naming another holder changes nothing; a backend that cannot
        break leases returns False."""
        old, new = coordination("a", "run-1").leader_elector(), coordination("b", "run-1").leader_elector()
        assert old.try_become_leader()
        assert not new.break_if_held_by("a", "run-2")
        assert not new.try_become_leader()
        if not new.break_if_held_by("a", "run-1"):
            pytest.skip("this backend does not break leases")
        assert new.try_become_leader()
        assert not old.renew()
        assert new.current_leader() == "b"
