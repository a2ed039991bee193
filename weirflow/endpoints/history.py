"""Throughput and lag over the last minutes: each processor's bounded sample history, ``GET /status/history``,
and the job-wide sum the status page charts (docs/endpoints.md, "Status page and metrics").

A task report (`weirflow.endpoints.task_report.TaskReport`) is a picture of now: counters since each task
started here and the lag of this moment. A chart needs the same picture over time, so a background thread
of every processor takes one every ``endpoints.history.interval.ms`` and keeps the last
``endpoints.history.window.ms`` of them in memory (nothing is stored: a restarted processor starts a new
history, and a dead one's history dies with it). Rates are computed per task between two samples, so a task
that moves away or arrives between them, or restarts its counters, changes neither the rate nor the sum by
its whole count.

One sample, as ``GET /status/history`` serves it::

    {"at_ms": 1763820221000,            # epoch ms of the sample
     "records_in_per_s": 812.4,         # over the tasks running here in this and the previous sample; null first
     "records_out_per_s": 790.0,        # records_out summed over streams, likewise
     "lag": 1530,                       # records behind the partitions' ends, over the tasks whose lag is known
     "tasks": 6}                        # tasks reported
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from weirflow.base import clock

log = logging.getLogger("weirflow.endpoints")

# How long the status page waits for a peer's history (as for its task report): one that does not answer in time
# is named on the page, and the chart sums the others.
PEER_TIMEOUT_S = 2.0


@dataclass(frozen=True)
class Sample:
    at_ms: int
    records_in_per_s: float | None
    records_out_per_s: float | None
    lag: int | None
    tasks: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _counts(report: dict[str, Any]) -> tuple[int, int]:
    """A task's records in and out (summed over its output streams) so far."""
    out = report.get("records_out") or 0
    total_out = sum(int(n) for n in out.values()) if isinstance(out, dict) else int(out)
    return int(report.get("records_in") or 0), total_out


class ThroughputHistory:
    """The last ``window_ms`` of samples of ``report`` (task -> its report, as ``GET /tasks`` answers), one per
    ``interval_ms`` while `start`-ed (`sample` takes one now). Thread-safe."""

    def __init__(
        self,
        report: Callable[[], dict[str, dict[str, Any]]],
        interval_ms: int,
        window_ms: int,
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self._report = report
        self.interval_ms = interval_ms
        self.window_ms = window_ms
        self._now = now_ms if now_ms is not None else lambda: clock.now_ms()
        self._samples: collections.deque[Sample] = collections.deque(maxlen=window_ms // interval_ms + 1)
        self._previous: tuple[int, dict[str, tuple[int, int]]] | None = None  # at_ms, task -> (in, out)
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Sample:
        """Take a sample of the report now and keep it; samples older than the window are dropped."""
        report = self._report()
        at = self._now()
        counts = {task: _counts(r) for task, r in report.items()}
        lags = [r["lag_total"] for r in report.values() if isinstance(r.get("lag_total"), int)]
        with self._guard:
            rate_in = rate_out = None
            if self._previous is not None and at > self._previous[0]:
                then, before = self._previous
                seconds = (at - then) / 1000
                grown = [
                    (now_in - was_in, now_out - was_out)
                    for task, (now_in, now_out) in counts.items()
                    if task in before
                    for was_in, was_out in [before[task]]
                ]
                # a counter that went down restarted (the task stopped and started again here): no rate for it
                rate_in = sum(d for d, _ in grown if d >= 0) / seconds
                rate_out = sum(d for _, d in grown if d >= 0) / seconds
            self._previous = (at, counts)
            taken = Sample(
                at,
                None if rate_in is None else round(rate_in, 2),
                None if rate_out is None else round(rate_out, 2),
                sum(lags) if lags else None,
                len(report),
            )
            self._samples.append(taken)
            while self._samples and self._samples[0].at_ms < at - self.window_ms:
                self._samples.popleft()
        return taken

    def to_json(self) -> dict[str, Any]:
        """What ``GET /status/history`` answers: the sampling and the samples, oldest first."""
        with self._guard:
            samples = [s.to_json() for s in self._samples]
        return {"interval_ms": self.interval_ms, "window_ms": self.window_ms, "samples": samples}

    def start(self) -> None:
        """Sample every ``interval_ms`` on a daemon thread until `stop`; a failed sample is logged and skipped."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="status-history", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self.sample()
            except Exception as exc:  # a report that failed now may not next time: a gap, not a dead thread
                log.warning("status history: no sample taken (%s)", exc)
            if self._stop.wait(self.interval_ms / 1000):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def job_series(histories: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The job-wide sum of several processors' histories (processor -> ``GET /status/history``): their samples
    put in time slots of the largest interval among them, and summed per slot, oldest first. A processor with
    no sample in a slot adds nothing to it; a slot where none knew a value has null. The newest slot is left out
    while fewer processors sampled in it than in the one before (they sample at their own moments)."""
    interval = max((int(h.get("interval_ms") or 0) for h in histories.values()), default=0) or 1
    slots: dict[int, dict[str, Any]] = {}
    contributors: collections.Counter[int] = collections.Counter()
    for history in histories.values():
        seen: set[int] = set()
        for sample in history.get("samples") or []:
            slot = int(sample["at_ms"]) // interval * interval
            if slot in seen:  # two samples of one processor in one slot (a shorter interval): the first counts
                continue
            seen.add(slot)
            contributors[slot] += 1
            total = slots.setdefault(
                slot, {"at_ms": slot, "records_in_per_s": None, "records_out_per_s": None, "lag": None}
            )
            for key in ("records_in_per_s", "records_out_per_s", "lag"):
                value = sample.get(key)
                if value is not None:
                    total[key] = (total[key] or 0) + value
    order = sorted(slots)
    if len(order) > 1 and contributors[order[-1]] < contributors[order[-2]]:
        order.pop()  # the newest slot, where not every processor has sampled yet: not a drop in throughput
    return [slots[t] for t in order]
