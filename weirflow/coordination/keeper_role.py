"""The keeper loop of a `StreamProcessor` (`weirflow.coordination.processor`): it writes the heartbeat row and
renews the task locks, each on its own (`LeaseKeeper`); a lock that is lost, or whose renewal is not confirmed by
``deadline - margin``, has its task abandoned at once (`TaskRunner.abandon_tasks`: no further output or
checkpoint), before another processor can take it. It runs until the very end of a shutdown, so the locks of
tasks being stopped stay renewed."""

from __future__ import annotations

import logging
import time

from weirflow.coordination.loops import LoopErrors
from weirflow.coordination.processor_core import ProcessorCore

log = logging.getLogger("weirflow.processor")


class KeeperRole(ProcessorCore):
    """The keeper loop: task locks and the heartbeat row."""

    def _keeper_loop(self) -> None:
        errors = LoopErrors()
        tick_ms = min(
            self.timings.poll_interval_ms, self.timings.heartbeat_interval_ms, self.timings.renew_margin_ms // 4
        )
        tick_s = max(0.05, tick_ms / 1000)
        while not self._keeper_stop.is_set():
            self._heartbeat_now.wait(tick_s)
            if self._keeper_stop.is_set():
                break
            try:
                problem = self._keep_leases()
                problem = self._keep_heartbeat() or problem
                if problem is None:
                    self._recovered(errors, "keeper")
                else:
                    self._loop_error("keeper", errors, problem)
            except Exception as exc:
                self._loop_error("keeper", errors, exc)

    def _keep_leases(self) -> BaseException | None:
        """One keeper round over the task locks; returns a renewal error of this round, if any."""
        result = self._keeper.tick()
        assert self.runner is not None
        self.runner.leases_renewed()  # before fencing: a lock given up below is then left out too
        for task, exc in result.errors:
            log.warning("renewing the lock of task %s failed (retrying): %s", task, exc)
        if result.lost:
            self._fence(result.lost, "its lock is no longer ours")
        if result.expiring:
            self._fence(
                result.expiring,
                f"its lock's renewal was not confirmed within lease - margin "
                f"({self.timings.lease_ms - self.timings.renew_margin_ms} ms)",
            )
        if result.unheard:
            self._fence(
                result.unheard,
                f"no heartbeat of this processor was confirmed within liveness - margin "
                f"({self.timings.liveness_timeout_ms - self.timings.liveness_margin_ms()} ms), so another "
                "processor may break its lock",
            )
        return result.errors[0][1] if result.errors else None

    def _fence(self, tasks: list[str], why: str) -> None:
        """Abandon ``tasks`` at once: they write nothing more here; the follower tries to take them again."""
        assert self.runner is not None
        self.runner.abandon_tasks(tasks)
        for task in tasks:
            log.error("lost the lock of task %s: %s; abandoned it, writing nothing more", task, why)
        self.error = f"lost the lock of {', '.join(sorted(tasks))}: {why}"
        with self._lost_guard:
            self._lost.update(tasks)
        self._heartbeat_now.set()

    def _keep_heartbeat(self) -> BaseException | None:
        """Write the registry row on the keeper's pool (never blocking the fence); returns the error of the
        previous write, if it failed."""
        error: BaseException | None = None
        future = self._heartbeat_future
        if future is not None and future.done():
            self._heartbeat_future = None
            error = future.exception()
        now = time.monotonic()
        due = (
            self._heartbeat_now.is_set()
            or self._heartbeat_again
            or (now - self._last_heartbeat) * 1000 >= self.timings.heartbeat_interval_ms
        )
        self._heartbeat_now.clear()
        if error is not None:
            due = True  # a failed heartbeat is written again on the next tick, not an interval later
        if due and self._heartbeat_future is None:
            self._heartbeat_again = False
            self._last_heartbeat = now
            self._heartbeat_future = self._keeper.submit(self._write_heartbeat)
        elif due:
            self._heartbeat_again = True  # one is under way: write again once it is done
        return error
