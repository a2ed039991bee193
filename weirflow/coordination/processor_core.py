"""What the three loops of a `StreamProcessor` share (`weirflow.coordination.processor`): the processor's
identity, timings, lease keeper and events, its state, and how a loop reports an error, recovers, pauses and
halts. Each loop's own work is a role of its own (`weirflow.coordination.leader_role`,
`weirflow.coordination.keeper_role`; the follower stays in the processor), each reading only what is declared
here; `StreamProcessor` sets all of it in its constructor."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from weirflow.base import clock
from weirflow.base.disk import disk_full_message, is_disk_full
from weirflow.config.loader import Config
from weirflow.coordination.keeper import LeaseKeeper
from weirflow.coordination.loops import Leadership, LoopErrors
from weirflow.coordination.silence import SilentHolders
from weirflow.coordination.state import ProcessorState, check_transition
from weirflow.coordination.timings import CoordinationTimings
from weirflow.job.context import JobContext
from weirflow.job.model import JobModel
from weirflow.tasks.runner import TaskRunner

if TYPE_CHECKING:
    from weirflow.coordination.drain_monitor import DrainMonitor

log = logging.getLogger("weirflow.processor")

_FATAL_AFTER_LEASES = 4


# How often the leader and follower loops go round while a drain is under way (`ProcessorCore._round_ms`).
DRAIN_POLL_MS = 100


class ProcessorCore:
    """The state and helpers every loop of a processor uses."""

    config: Config
    processor_id: str
    instance_id: str
    timings: CoordinationTimings
    ctx: JobContext | None
    runner: TaskRunner | None
    error: str
    _fatal: bool
    _state: ProcessorState
    _state_lock: threading.Lock
    _stop: threading.Event
    _wake_follower: threading.Event
    _wake_leader: threading.Event
    _keeper_stop: threading.Event
    _keeper: LeaseKeeper
    _model: JobModel
    _working_version: int
    _tenure: Leadership | None
    _lost: set[str]
    _lost_guard: threading.Lock
    _heartbeat_now: threading.Event
    _heartbeat_future: Future[None] | None
    _heartbeat_again: bool
    _last_heartbeat: float
    _next_finished_read: float
    _finished_known: bool
    _drain: DrainMonitor | None

    def _round_ms(self) -> int:
        """The pause between two rounds of the leader and follower loops: the poll interval, or `DRAIN_POLL_MS`
        while a drain is under way, when every pause between a task drained and the processors' exit is time the
        drain takes (docs/drain.md); a drain lasts seconds, so the extra reads are few."""
        if self._drain is not None and self._drain.notice is not None:
            return min(DRAIN_POLL_MS, self.timings.poll_interval_ms)
        return self.timings.poll_interval_ms

    def _write_heartbeat(self) -> None:
        raise NotImplementedError

    def _set_state(self, new: ProcessorState) -> None:
        with self._state_lock:
            if self._state is new:
                return
            check_transition(self._state, new)
            log.info("state %s -> %s", self._state.value, new.value)
            self._state = new
        self._heartbeat_now.set()

    def _silent_holders(self) -> SilentHolders:
        assert self.ctx is not None
        return SilentHolders(
            self.ctx.coordination.processor_registry(), self.timings.liveness_timeout_ms, self.processor_id
        )

    def _loop_error(self, loop: str, errors: LoopErrors, exc: BaseException) -> None:
        if is_disk_full(exc):
            self._stop_on_full_disk(f"the {loop} loop", exc)
            return
        elapsed = errors.failed(clock.now_ms())
        self.error = f"{loop}: {type(exc).__name__}: {exc}"
        log.error("%s loop error (failing for %d ms): %s", loop, elapsed, exc, exc_info=exc)
        if elapsed > self.timings.lease_ms * _FATAL_AFTER_LEASES:
            log.critical("%s loop has failed for %d s; the processor gives up", loop, elapsed // 1000)
            self._fatal = True
            self._set_state(ProcessorState.FAILED)
            self._halt()

    def _stop_on_full_disk(self, what: str, error: BaseException | str) -> None:
        """Stop now, failed, naming the path and its free space: retrying cannot help until space is freed
        (`weirflow.base.disk`). Said once: the other loops find the disk full too as the processor stops."""
        if self._fatal:
            return
        self.error = disk_full_message(self.config.state_dir(), what, error)
        log.critical("%s", self.error)
        self._fatal = True
        self._set_state(ProcessorState.FAILED)
        self._halt()

    def _recovered(self, errors: LoopErrors, loop: str) -> None:
        if errors.ok() and self.error.startswith(f"{loop}:"):
            log.info("%s loop recovered", loop)
            self.error = ""

    def _halt(self) -> None:
        """End the follower and leader loops, waking them from their pauses."""
        self._stop.set()
        self._wake_follower.set()
        self._wake_leader.set()

    def _wait(self, ms: int, wake: threading.Event) -> bool:
        """Pause up to ``ms``, less when ``wake`` is set (news from the other loop, or stop); True when stop was
        requested. A wake set while the loop was busy ends the next pause at once: the loop may have read the
        news already, and one round more costs a read."""
        wake.wait(ms / 1000)
        wake.clear()
        return self._stop.is_set()
