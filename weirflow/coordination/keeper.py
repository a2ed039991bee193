"""`LeaseKeeper`: renews the leases a processor holds, each on its own, and says when one must be given up.

**The self-fence.** Every held lease has a local deadline on the monotonic clock (`time.monotonic`, never the
wall clock): the moment the request that last *confirmed* it (the acquisition, or a renewal that returned
True) was sent, plus the lease duration. The store extended the lease no earlier than it received that
request, so the lease cannot expire before this deadline (clock *rates* agree; no clocks are compared). When
``deadline - margin`` (`job.coordinator.lease.renew.margin.ms`) passes without a newer confirmation, `tick`
reports the lease as *expiring*: the processor abandons the task at once (`TaskRunner.abandon_tasks`: no
further output or checkpoint), so it has stopped before anyone else can take the lease. A renewal answered
False (the lease is someone else's) reports it as *lost*, to the same effect.

**The heartbeat's self-fence.** A processor silent past the liveness timeout by the store's clock may have its
leases *broken* by others (`weirflow.coordination.silence`), which moves its tasks without waiting for the
leases to expire. So the heartbeat is a lease too: the keeper keeps an *alive* deadline, the moment the last
confirmed heartbeat was sent plus ``liveness - liveness margin`` (`CoordinationTimings.liveness_margin_ms`);
the store stamped that heartbeat no earlier than it was sent, so the deadline passes before any reader can see
the row silent. When it passes, every held lease is reported *unheard* and given up, like an expiring one. A
heartbeat confirmed after the deadline passed (a process paused past it: SIGSTOP, a stalled host) revives
nothing: the leases held across the gap are given up all the same (a reader may have judged the silence in
it), and only leases taken afterwards are kept.

**Independence.** Renewals run on a small thread pool, at most one in flight per lease, each with its own
error handling: a renewal that hangs or fails delays neither the other leases nor the heartbeat (which the
processor also runs on this pool through `submit`). A failed renewal is retried after
`CoordinationTimings.renew_retry_ms`; a result that arrives after its lease was given up is ignored.

The keeper never calls the store from `tick` itself, so the fence is checked on time however slow the store is.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from weirflow.base import telemetry
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import Lock

_WORKERS = 16


@dataclass
class _Held:
    lock: Lock
    deadline: float  # monotonic s: when the lease may expire at the earliest, as far as we know
    next_at: float  # monotonic s: when to send the next renewal
    in_flight: Future[tuple[float, bool]] | None = None


@dataclass
class KeeperRound:
    """What one `LeaseKeeper.tick` found. Names in ``lost`` and ``expiring`` are no longer kept."""

    lost: list[str] = field(default_factory=list)  # a renewal said the lease is not ours
    expiring: list[str] = field(default_factory=list)  # not confirmed by deadline - margin
    unheard: list[str] = field(default_factory=list)  # no heartbeat confirmed by liveness - liveness margin
    errors: list[tuple[str, BaseException]] = field(default_factory=list)  # renewals that raised (retried)


class LeaseKeeper:
    """Keeps the deadlines of held leases and renews them on a pool. Thread-safe."""

    def __init__(self, timings: CoordinationTimings, clock: Callable[[], float] = time.monotonic) -> None:
        self._lease_s = timings.lease_ms / 1000
        self._margin_s = timings.renew_margin_ms / 1000
        self._renew_s = timings.renew_interval_ms / 1000
        self._retry_s = timings.renew_retry_ms() / 1000
        self._clock = clock
        self._held: dict[str, _Held] = {}
        self._alive_s = (timings.liveness_timeout_ms - timings.liveness_margin_ms()) / 1000
        self._alive_until: float | None = None  # monotonic s; None until the first heartbeat is confirmed
        self._gap: set[str] = set()  # leases held while the alive deadline passed: given up on the next tick
        self.lapses = 0  # times the alive deadline passed (a leader steps down on a change)
        self.renewals = 0  # lock renewals confirmed by the store (GET /metrics)
        self._guard = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="lease-keeper")
        self._calls: set[Future[Any]] = set()  # submitted and not done: waited for by `close`
        self._calls_guard = threading.Lock()  # `submit` runs under `_guard` from `tick`

    def now(self) -> float:
        return self._clock()

    # --- the heartbeat -------------------------------------------------------------------------------
    def heartbeat_confirmed(self, sent_at: float) -> None:
        """A heartbeat sent at monotonic ``sent_at`` (read *before* the call) was written: the processor is
        heard until ``sent_at + liveness - liveness margin``. When that deadline had already passed, the leases
        held across the gap are given up on the next tick however fresh the heartbeat is."""
        with self._guard:
            if self._alive_until is not None and self._clock() >= self._alive_until:
                self._gap.update(self._held)
                self.lapses += 1
            until = sent_at + self._alive_s
            self._alive_until = until if self._alive_until is None else max(self._alive_until, until)

    def alive_until(self) -> float:
        """The monotonic time until which this processor is heard (``inf`` before its first heartbeat)."""
        with self._guard:
            return float("inf") if self._alive_until is None else self._alive_until

    def _limit(self, held: _Held) -> float:
        """Until when ``held`` may be used: its own deadline - margin, and never past the alive deadline."""
        own = held.deadline - self._margin_s
        return own if self._alive_until is None else min(own, self._alive_until)

    # --- what is held ---------------------------------------------------------------------------------
    def add(self, name: str, lock: Lock, sent_at: float) -> None:
        """Keep ``lock``, acquired by a request sent at monotonic time ``sent_at`` (read *before* the call)."""
        with self._guard:
            self._held[name] = _Held(lock, deadline=sent_at + self._lease_s, next_at=sent_at + self._renew_s)
            self._gap.discard(name)

    def remove(self, name: str) -> Lock | None:
        """Stop keeping ``name``; returns its lock (to release), or None when it was not kept."""
        with self._guard:
            held = self._held.pop(name, None)
            self._gap.discard(name)
        return held.lock if held is not None else None

    def names(self) -> set[str]:
        with self._guard:
            return set(self._held)

    def remove_all(self) -> list[Lock]:
        with self._guard:
            held, self._held = self._held, {}
            self._gap.clear()
        return [h.lock for h in held.values()]

    def valid(self, name: str) -> bool:
        """Whether ``name`` is kept and its deadline - margin has not passed (no store call: the fence a task
        checks before each write)."""
        with self._guard:
            held = self._held.get(name)
            return held is not None and name not in self._gap and self._clock() < self._limit(held)

    def valid_until(self, name: str) -> float | None:
        """The monotonic time until which ``name`` is confirmed (deadline - margin), or None when not kept."""
        with self._guard:
            held = self._held.get(name)
            if held is None:
                return None
            return float("-inf") if name in self._gap else self._limit(held)

    def deadline(self, name: str) -> float | None:
        with self._guard:
            held = self._held.get(name)
            return held.deadline if held is not None else None

    # --- one round ------------------------------------------------------------------------------------
    def tick(self) -> KeeperRound:
        """Collect finished renewals, report leases lost, past ``deadline - margin`` or unheard (and stop keeping
        them), and send the renewals that are due. Never waits for the store."""
        result = KeeperRound()
        now = self._clock()
        with self._guard:
            for name, held in list(self._held.items()):
                if held.in_flight is not None and held.in_flight.done():
                    if not self._collect(name, held, now, result):
                        del self._held[name]
                        continue
                if name in self._gap or (self._alive_until is not None and now >= self._alive_until):
                    result.unheard.append(name)
                    del self._held[name]
                    self._gap.discard(name)
                elif now >= held.deadline - self._margin_s:
                    result.expiring.append(name)
                    del self._held[name]
                elif held.in_flight is None and now >= held.next_at:
                    held.in_flight = self.submit(functools.partial(self._renew, held.lock))
        return result

    def _collect(self, name: str, held: _Held, now: float, result: KeeperRound) -> bool:
        """Apply a finished renewal; False when the lease turned out lost."""
        future, held.in_flight = held.in_flight, None
        assert future is not None
        try:
            sent_at, ok = future.result()
        except Exception as exc:
            result.errors.append((name, exc))
            held.next_at = now + self._retry_s
            return True
        if not ok:
            result.lost.append(name)
            return False
        held.deadline = max(held.deadline, sent_at + self._lease_s)
        held.next_at = sent_at + self._renew_s
        self.renewals += 1
        return True

    def _renew(self, lock: Lock) -> tuple[float, bool]:
        """One renewal; its duration, when the store answered, goes to ``GET /metrics``
        (`weirflow.base.telemetry.LEASE_RENEWAL_SECONDS`, by the monotonic clock whatever clock drives
        deadlines)."""
        sent_at = self._clock()
        began = time.monotonic()
        renewed = bool(lock.renew())
        telemetry.observe(telemetry.LEASE_RENEWAL_SECONDS, time.monotonic() - began)
        return sent_at, renewed

    # --- the pool, shared with the heartbeat ----------------------------------------------------------
    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future = self._pool.submit(fn)
        with self._calls_guard:
            self._calls.add(future)
        future.add_done_callback(self._done)
        return future

    def _done(self, future: Future[Any]) -> None:
        with self._calls_guard:
            self._calls.discard(future)

    def close(self, timeout_s: float = 0.0) -> None:
        """Drop queued calls and wait up to ``timeout_s`` for those under way (the caller closes the store's
        connections next), but no longer: a call hung on an unreachable store must not hold shutdown."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._calls_guard:
            calls = set(self._calls)
        wait(calls, timeout=timeout_s)
