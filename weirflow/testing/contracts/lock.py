"""Lock contract: mutual exclusion, re-entrancy, release, expiry takeover and the fence, across processes."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from weirflow.base.waiting import wait_until
from weirflow.testing.backend import Backend
from weirflow.testing.contracts._base import (
    PROCESS_LEASE_MS,
    CoordinationContract,
    new_job_name,
    require_processes,
)

# Each spawned process takes the lock this many times at least while the others try too; the test gives up
# (saying so) after the deadline, which only a machine stalled for a minute reaches.
CONTENDED_ACQUISITIONS = 10
CONTENTION_DEADLINE_S = 60.0


def _contend(backend: Backend, job: str, owner: str, processes: int, start_together, done, refused, queue) -> None:
    """In a spawned process: take and release the lock ``contended`` until every process has taken it
    `CONTENDED_ACQUISITIONS` times and some try was refused (another held it); report when it held it.

    The processes wait for each other before the first try (``start_together``), and none stops before all
    are done, so every acquisition is contended by construction, however slowly the processes started."""
    lock = backend.coordination(job, owner, max(PROCESS_LEASE_MS, backend.lease_ms)).lock("contended")
    intervals: list[tuple[float, float]] = []
    try:
        start_together.wait(CONTENTION_DEADLINE_S)
    except threading.BrokenBarrierError:  # the others never started: the test reports no acquisitions
        queue.put((owner, intervals))
        return
    deadline = time.monotonic() + CONTENTION_DEADLINE_S
    counted = False
    while time.monotonic() < deadline and not (done.value >= processes and refused.value > 0):
        if lock.try_acquire():
            start = time.time()
            assert lock.is_held()
            time.sleep(0.005)
            stop = time.time()
            lock.release()
            intervals.append((start, stop))
            if len(intervals) >= CONTENDED_ACQUISITIONS and not counted:
                counted = True
                with done.get_lock():
                    done.value += 1
            time.sleep(0.001)  # let another process try before this one tries again
        else:
            with refused.get_lock():
                refused.value += 1
    queue.put((owner, intervals))


class LockContract(CoordinationContract):
    """`weirflow.interfaces.coordination.Lock`, through ``Backend.coordination``; the last test spawns four
    processes that build their primitives from the (pickled) backend."""

    def test_only_one_owner_holds_a_lock(self, coordination) -> None:
        a, b = coordination("a").lock("task-1"), coordination("b").lock("task-1")
        assert a.try_acquire()
        assert not b.try_acquire()
        assert a.is_held() and not b.is_held()

    def test_acquiring_again_as_the_same_owner_succeeds(self, coordination) -> None:
        lock = coordination("a").lock("task-1")
        assert lock.try_acquire()
        assert lock.try_acquire()
        assert lock.is_held()

    def test_locks_with_different_names_are_independent(self, coordination) -> None:
        assert coordination("a").lock("task-1").try_acquire()
        assert coordination("b").lock("task-2").try_acquire()

    def test_locks_of_different_jobs_are_independent(
        self, weirflow_backend: Backend, coordination, lease_ms
    ) -> None:
        assert coordination("a").lock("task-1").try_acquire()
        other_job = weirflow_backend.coordination(new_job_name(), "b", lease_ms)
        try:
            assert other_job.lock("task-1").try_acquire()
        finally:
            other_job.close()

    def test_release_frees_the_lock_and_only_the_owner_can_release(self, coordination) -> None:
        a, b = coordination("a").lock("task-1"), coordination("b").lock("task-1")
        assert a.try_acquire()
        b.release()  # not b's: nothing happens
        assert a.is_held()
        a.release()
        a.release()  # idempotent
        assert not a.is_held()
        assert b.try_acquire()

    def test_an_expired_lock_is_taken_over_and_the_old_owner_is_fenced(self, coordination, lease_ms) -> None:
        old, new = coordination("a").lock("task-1"), coordination("b").lock("task-1")
        assert old.try_acquire()
        wait_until(new.try_acquire, lease_ms / 1000 + 10, "b to take the expired lock", interval_s=0.05)
        assert not old.is_held()
        assert not old.renew()
        assert new.is_held()
        assert new.renew()

    def test_epochs_grow_with_every_tenure_and_an_acquire_by_the_holder_keeps_its_epoch(
        self, coordination, lease_ms
    ) -> None:
        a, b = coordination("a", "run-1").lock("task-1"), coordination("b", "run-1").lock("task-1")
        assert a.epoch == 0
        assert a.try_acquire()
        first = a.epoch
        assert first > 0
        assert a.try_acquire() and a.epoch == first, "an acquire by the holder goes on with its tenure"
        again = coordination("a", "run-1").lock("task-1")
        assert again.try_acquire() and again.epoch == first, "another object of the same holder, same tenure"
        a.release()
        assert b.try_acquire()
        assert b.epoch > first
        b.release()
        assert a.try_acquire()
        assert a.epoch > b.epoch, "a released lock taken back starts a new, greater tenure"

    def test_a_writer_of_an_ended_tenure_is_refused_even_when_its_holder_took_the_lock_back(
        self, coordination
    ) -> None:
        a = coordination("a", "run-1").lock("task-1")
        assert a.try_acquire()
        first = a.epoch
        assert a.is_held_in(first)
        a.release()
        again = coordination("a", "run-1").lock("task-1")
        assert again.try_acquire() and again.epoch > first, "taken back after a release: a new tenure"
        assert again.is_held_in(again.epoch)
        assert not again.is_held_in(first), "a writer of the ended tenure (an abandoned query) passes the fence"
        assert not coordination("b", "run-1").lock("task-1").is_held_in(again.epoch), "another holder passes"

    def test_the_same_owner_in_another_instance_is_another_holder(self, coordination) -> None:
        first, second = coordination("p1", "run-1").lock("task-1"), coordination("p1", "run-2").lock("task-1")
        assert first.try_acquire()
        assert not second.try_acquire(), "a second process with the same processor id took a held lock"
        assert not second.renew()
        assert not second.is_held()
        second.release()  # not its lease: nothing happens
        assert first.is_held()
        assert first.instance == "run-1" and second.instance == "run-2"

    def test_a_break_names_its_holder_and_ends_only_that_tenure(self, coordination) -> None:
        """What a processor does to the lock of a processor silent past the liveness timeout: the break frees
        the lock at once for another holder, who starts a greater tenure, and the broken holder learns it on its
        next renew or fence check. A break naming anyone else (another owner, or another run of the same
        processor id) changes nothing. A backend that cannot break leases returns False: the lock then
        expires as usual."""
        a, b = coordination("a", "run-1").lock("task-1"), coordination("b", "run-1").lock("task-1")
        assert a.try_acquire()
        first = a.epoch
        holder = b.current_holder()  # asked of another holder's object, as a processor refused the lock does
        assert not b.break_if_held_by("a", "run-2"), "broke the lease of another run of a"
        assert not b.break_if_held_by("c", "run-1"), "broke the lease of a holder that does not hold it"
        assert a.is_held()
        if not b.break_if_held_by("a", "run-1"):
            pytest.skip("this backend does not break leases")
        assert holder == "a", "a backend that breaks leases must name their holder (current_holder)"
        assert a.current_holder() is None
        assert not a.is_held() and not a.is_held_in(first)
        assert b.try_acquire() and b.epoch > first, "the next tenure after a break is greater"
        assert not a.renew(), "the broken holder renewed a lease that is no longer its own"
        assert not b.break_if_held_by("a", "run-1"), "a break of a holder that no longer holds it ended b's tenure"
        assert b.is_held()

    def test_a_free_lock_is_not_broken(self, coordination) -> None:
        lock = coordination("a", "run-1").lock("task-1")
        assert not lock.break_if_held_by("a", "run-1")
        assert lock.try_acquire()
        lock.release()
        assert not coordination("b").lock("task-1").break_if_held_by("a", "run-1")

    def test_no_two_processes_hold_a_lock_at_once(self, weirflow_backend: Backend, job_name: str) -> None:
        require_processes(weirflow_backend)
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        processes = 4
        start_together, done, refused = ctx.Barrier(processes), ctx.Value("i", 0), ctx.Value("i", 0)
        procs = [
            ctx.Process(
                target=_contend,
                args=(weirflow_backend, job_name, f"p{i}", processes, start_together, done, refused, queue),
            )
            for i in range(processes)
        ]
        for proc in procs:
            proc.start()
        wait_s = 2 * CONTENTION_DEADLINE_S + 60  # the barrier, the loop, and spawning on a busy machine
        results = [queue.get(timeout=wait_s) for _ in procs]
        for proc in procs:
            proc.join(timeout=60)
            assert proc.exitcode == 0
        taken = {owner: len(intervals) for owner, intervals in results}
        assert all(n >= CONTENDED_ACQUISITIONS for n in taken.values()) and refused.value > 0, (
            f"waited {CONTENTION_DEADLINE_S:.0f} s for each process to take the lock {CONTENDED_ACQUISITIONS}"
            f" times while the others tried; acquisitions {taken}, refused tries {refused.value}"
        )
        held = sorted((start, stop, owner) for owner, intervals in results for start, stop in intervals)
        for (_, end_a, owner_a), (start_b, _, owner_b) in zip(held, held[1:], strict=False):
            assert end_a <= start_b, f"{owner_a} and {owner_b} held the lock at once"
