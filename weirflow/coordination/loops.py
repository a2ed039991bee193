"""What the processor's loops (`weirflow.coordination.processor`) keep between rounds: a loop's run of
failures, the leader loop's tenure, and a call bounded in time."""

from __future__ import annotations

import threading
from collections.abc import Callable

from weirflow.coordination.job_finished import FinishedWatch
from weirflow.coordination.leader import LeaderDuties
from weirflow.coordination.trimming import Trimmer


class LoopErrors:
    """Consecutive-failure bookkeeping of one loop: the first error time, to decide when to give up."""

    def __init__(self) -> None:
        self.since_ms: int | None = None

    def ok(self) -> bool:
        """Record a good round; True when it ends a run of failures."""
        recovered = self.since_ms is not None
        self.since_ms = None
        return recovered

    def failed(self, now: int) -> int:
        if self.since_ms is None:
            self.since_ms = now
        return now - self.since_ms


class Leadership:
    """The leader loop's tenure: duties while leading, and the monotonic deadline of the leadership lease."""

    def __init__(self) -> None:
        self.duties: LeaderDuties | None = None
        self.finished: FinishedWatch | None = None
        self.trimmer: Trimmer | None = None
        self.deadline = 0.0  # monotonic s: sent time of the last confirming request + lease
        self.last_sent = 0.0
        self.lapses = 0  # the keeper's heartbeat lapses when leadership was won (`LeaseKeeper.lapses`)

    def confirm(self, sent_at: float, lease_s: float) -> None:
        self.deadline = sent_at + lease_s
        self.last_sent = sent_at

    def step_down(self) -> None:
        self.duties = None
        self.finished = None
        self.trimmer = None


def run_bounded(fn: Callable[[], None], timeout_s: float, name: str) -> bool:
    """Run ``fn`` in a thread; True when it returned within ``timeout_s`` (its exception is re-raised)."""
    done = threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # re-raised in the caller's thread
            failure.append(exc)
        finally:
            done.set()

    threading.Thread(target=target, name=name, daemon=True).start()
    finished = done.wait(timeout_s)
    if failure:
        raise failure[0]
    return finished
