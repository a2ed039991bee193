"""A processor of a record job that reports its tasks' counts, for the status page's failover test: run as
``python -m tests.integration.status_job CONFIG PROCESSOR_ID`` (so that SIGKILL is a crash), it is `weirflow
run` with the record runner plus the per-task counts that runner does not keep (records in and out, next offset
per SSP), which the status page's task table and charts read through ``GET /tasks`` and ``GET /status/history``.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from weirflow.config import load_config
from weirflow.endpoints.processor_server import serving_processor
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.tasks.record_task import RecordTaskRunner, current_task
from weirflow.tasks.runner import TaskRunner


class CountingRunner(RecordTaskRunner):
    """The record runner, counting each task's records in and out and its next offset per SSP."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counts: dict[str, dict[str, Any]] = {}
        self._counts_guard = threading.Lock()
        function = self.fn

        def counted(message: dict[str, Any]) -> list[dict[str, Any]]:
            out = list(function(message) or ())
            task = current_task()
            ref = self.systems.resolve(message["stream"])
            ssp = SystemStreamPartition(ref.system, ref.physical, message["partition"]).key()
            if task is not None:
                with self._counts_guard:
                    counts = self._counts.setdefault(task.name, {"records_in": 0, "out": 0, "offsets": {}})
                    counts["records_in"] += 1
                    counts["out"] += len(out)
                    counts["offsets"][ssp] = str(int(message["offset"]) + 1)
            return out

        self.fn = counted

    def task_stats(self) -> dict[str, dict[str, Any]]:
        running = self.running()
        with self._counts_guard:
            return {
                task: {
                    "records_in": c["records_in"],
                    "records_out": {"relayed": c["out"]},
                    "offsets": dict(c["offsets"]),
                }
                for task, c in self._counts.items()
                if task in running
            }


def runner(ctx: JobContext) -> TaskRunner:
    return CountingRunner.from_config(ctx.config, ctx.systems, ctx.checkpoints)


def main(config_path: str, processor_id: str) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {processor_id} %(name)s %(message)s")
    processor = serving_processor(load_config(Path(config_path)), processor_id=processor_id, runner_factory=runner)
    signal.signal(signal.SIGTERM, lambda *_: processor.stop())
    return processor.run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
