"""Processes of the examples/pageviews job for end-to-end tests: start them, wait for the job to finish (every
process exits 0 once every task reached end-of-stream), kill what is left. Shared by the embedded and the
Azure variants, which differ only in the config file and overrides."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.testing import wait_until

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pageviews"
sys.path.insert(0, str(EXAMPLE))

import generate  # noqa: E402 - the example's own helpers, re-exported for the tests
import results  # noqa: E402

__all__ = ["DROPPED", "EXAMPLE", "ExampleJob", "generate", "replayed_rows_dropped", "results"]

# What a counting stage logs for the replayed intermediate rows it dropped (`weirflow.spark.task_progress`):
# the task, then how many.
DROPPED = re.compile(r"task (\S+): (\d+) replayed rows of \S+ dropped")


def replayed_rows_dropped(log: str) -> int:
    """Replayed intermediate rows the processor whose ``log`` this is dropped, summed over its tasks."""
    return sum(int(match[2]) for match in DROPPED.finditer(log))


class ExampleJob:
    def __init__(self, config_file: str, overrides: list[str], logs: Path, finish_s: float) -> None:
        self.config_path = EXAMPLE / config_file
        self.overrides = overrides
        self.logs = logs
        self.finish_s = finish_s
        self.processors: list[ProcessorProcess] = []

    def start(self, name: str, env: dict[str, str] | None = None) -> ProcessorProcess:
        proc = start_processor(self.config_path, name, self.overrides, log_dir=self.logs, env=env)
        self.processors.append(proc)
        return proc

    def wait_finished(self, procs: list[ProcessorProcess]) -> None:
        try:
            wait_until(lambda: not any(p.alive() for p in procs), self.finish_s, "the job to finish", 0.5)
        except TimeoutError:
            for p in procs:
                print(p.log_text()[-4000:])
            raise
        for p in procs:
            assert p.popen.wait() == 0, p.log_text()[-4000:]

    def stop_all(self) -> None:
        for p in self.processors:
            if p.alive():
                p.kill()
