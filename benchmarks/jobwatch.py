"""Watching a job from outside, as the benchmarks measure it: when every task runs, when the first output
record appears, how many events the job had processed by then, and when every task finished.

An event counts as *processed* once the job's last stage has consumed it: the rows of the intermediate stream
that the last stage's tasks checkpointed (a one-stage job: its input events checkpointed).

Everything is read from the job's own stores (processor registry, checkpoints, the output stream's offsets)
every ``interval_s``, so the processor runs unmodified; each figure is accurate to one interval.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pyarrow.compute as pc

from weirflow.base.waiting import wait_until
from weirflow.job.context import JobContext


def two_stage_tasks(config: Any, input_partitions: int) -> int:
    """The tasks of a two-stage job: one per input partition, one per intermediate partition
    (`job.intermediate.partitions`, by default the inputs' most)."""
    return input_partitions + (config.get("job.intermediate.partitions") or input_partitions)


def wait_all_running(config: Any, tasks: int, owner: str, interval_s: float = 0.2) -> None:
    """Wait (up to 300 s) until the job's processors run ``tasks`` tasks between them, as their registry says."""
    ctx = JobContext.open(config, owner=owner)
    try:
        wait_until(
            lambda: sum(len(p.tasks) for p in ctx.coordination.processor_registry().processors()) >= tasks,
            300,
            "every task to run",
            interval_s=interval_s,
        )
    finally:
        ctx.close()


@dataclass
class JobTimeline:
    """Wall-clock times (``time.time()``) of a job's milestones; None until seen."""

    started: float
    all_running: float | None = None
    processed_at_all_running: int = 0
    first_output: float | None = None
    processed_at_first_output: int = 0
    finished: float | None = None

    def startup_s(self) -> float | None:
        return None if self.all_running is None else self.all_running - self.started

    def steady_rate(self, events: int) -> float | None:
        """Events per second from the first output to the end: the events not yet processed when the first
        output record appeared, over the time the job took to finish them."""
        if self.first_output is None or self.finished is None or self.finished <= self.first_output:
            return None
        return (events - self.processed_at_first_output) / (self.finished - self.first_output)

    def running_rate(self, events: int) -> float | None:
        """Events per second once every task had started: the events not yet processed then, over the time
        the job took to finish them (defined even when all output comes at the end)."""
        if self.all_running is None or self.finished is None or self.finished <= self.all_running:
            return None
        return (events - self.processed_at_all_running) / (self.finished - self.all_running)


def _events_in(rows: Any) -> int:
    """The input events a packed record stands for: its rows, or the counts its partials carry
    (`weirflow.spark.partials`)."""
    if "__rows" in rows.column_names:
        return int(pc.sum(rows.column("__rows")).as_py() or 0)
    return int(rows.num_rows)


class JobWatch:
    """Polls one job's stores. ``input_stream`` and ``output_stream`` are stream ids of the job config."""

    def __init__(
        self, config: Any, input_stream: str, output_stream: str, task_count: int, last_stage_input: str | None
    ) -> None:
        """``last_stage_input``: the intermediate stream (physical name) the last stage reads; None: one stage."""
        self.config = config
        self.ctx = JobContext.open(config, owner="benchmark-watch")
        self.task_count = task_count
        self.input = self.ctx.systems.resolve(input_stream)
        self.output = self.ctx.systems.resolve(output_stream)
        self.last_stage_input = last_stage_input
        self._started: set[str] = set()

    def close(self) -> None:
        self.ctx.close()

    def consumed(self, checkpoints: dict[str, Any] | None = None) -> int:
        """Input events the job has checkpointed as processed (the sum of the input's next offsets)."""
        checkpoints = self.ctx.checkpoints.read_all() if checkpoints is None else checkpoints
        return sum(
            int(offset)
            for checkpoint in checkpoints.values()
            for ssp, offset in checkpoint.offsets.items()
            if ssp.stream == self.input.physical
        )

    def processed(self, checkpoints: dict[str, Any]) -> int:
        """Events the last stage has consumed: rows of the intermediate stream below its tasks' checkpoints."""
        if self.last_stage_input is None:
            return self.consumed(checkpoints)
        from weirflow.spark.packing import unpack

        rows = 0
        consumer = self.ctx.systems.consumer(self.input.system)
        for checkpoint in checkpoints.values():
            for ssp, offset in checkpoint.offsets.items():
                if ssp.stream != self.last_stage_input:
                    continue
                position = "0"
                while int(position) < int(offset):
                    chunk = consumer.read_columns(ssp, position, 1000, offset)
                    for value in chunk.values:
                        rows += _events_in(unpack(value)) if value[:1] == b"\x04" else int(value[:1] == b"\x00")
                    position = chunk.next_offset
        return rows

    def all_running(self, checkpoints: dict[str, Any]) -> bool:
        """Every task has started: running now (processor registry), or seen running or finished before
        (with many tasks, the first ones may finish before the last ones start)."""
        for row in self.ctx.coordination.processor_registry().processors():
            self._started.update(row.tasks)
        self._started.update(name for name, c in checkpoints.items() if c.control.get("finished"))
        return len(self._started) >= self.task_count

    def output_records(self) -> int:
        admin = self.ctx.systems.admin(self.output.system)
        try:
            return sum(int(m.upcoming) for m in admin.partition_metadata(self.output.physical).values())
        except Exception:  # the output stream is created by the job when it starts
            return 0

    def finished(self, checkpoints: dict[str, Any]) -> bool:
        return len(checkpoints) >= self.task_count and all(c.control.get("finished") for c in checkpoints.values())

    def watch(self, alive: Any, started: float, timeout_s: float, interval_s: float = 0.1) -> JobTimeline:
        """Poll until the job finished (every task checkpointed ``finished``) or ``alive()`` turns false."""
        timeline = JobTimeline(started=started)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            now = time.time()
            checkpoints = self.ctx.checkpoints.read_all()
            if timeline.all_running is None and self.all_running(checkpoints):
                timeline.all_running = now
                timeline.processed_at_all_running = self.processed(checkpoints)
            if timeline.first_output is None and self.output_records() > 0:
                timeline.first_output = now
                timeline.processed_at_first_output = self.processed(checkpoints)
            if self.finished(checkpoints):
                timeline.finished = now
                return timeline
            if not alive():
                return timeline
            time.sleep(interval_s)
        raise TimeoutError(f"the job did not finish within {timeout_s:.0f} s")
