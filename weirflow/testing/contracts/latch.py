"""Latch contract: participants, and completion / timeout that are final."""

from __future__ import annotations

from weirflow.interfaces.coordination import LatchState
from weirflow.testing.contracts._base import CoordinationContract


class LatchContract(CoordinationContract):
    """`weirflow.interfaces.coordination.Latch`, through ``Backend.coordination``."""

    def test_a_new_latch_is_open_and_empty(self, coordination) -> None:
        latch = coordination("leader").latch("jobmodel-1")
        assert latch.state() is LatchState.OPEN
        assert latch.participants() == set()

    def test_participants_join_once_each(self, coordination) -> None:
        for owner in ("a", "b", "a"):
            coordination(owner).latch("jobmodel-1").join(owner)
        assert coordination("leader").latch("jobmodel-1").participants() == {"a", "b"}

    def test_complete_is_final(self, coordination) -> None:
        latch = coordination("leader").latch("jobmodel-1")
        latch.join("a")
        latch.complete()
        latch.time_out()
        assert coordination("a").latch("jobmodel-1").state() is LatchState.COMPLETE

    def test_time_out_is_final(self, coordination) -> None:
        latch = coordination("leader").latch("jobmodel-1")
        latch.time_out()
        latch.complete()
        latch.join("late")
        assert latch.state() is LatchState.TIMED_OUT

    def test_latches_of_different_versions_are_independent(self, coordination) -> None:
        leader = coordination("leader")
        leader.latch("jobmodel-1").join("a")
        leader.latch("jobmodel-1").complete()
        assert leader.latch("jobmodel-2").state() is LatchState.OPEN
        assert leader.latch("jobmodel-2").participants() == set()
