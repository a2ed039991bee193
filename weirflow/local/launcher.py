"""Start and stop `weirflow run` processes on this machine (the demo, tests and benchmarks use it).

Each processor is a real OS process running the CLI, so killing one with SIGKILL is exactly what a crash is.
Its output goes to a log file beside the job's state, named after the processor id.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO


@dataclass
class ProcessorProcess:
    """One running `weirflow run`."""

    processor_id: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes] = field(repr=False)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, like a crashed machine."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()
        self._log.close()

    def request_stop(self) -> None:
        """SIGTERM without waiting: several processors stopping at once each hand their tasks over in parallel."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout_s: float = 60) -> int:
        """Wait for the stop `request_stop` asked for; SIGKILL if it does not come in time. Returns the exit
        code."""
        try:
            self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()
        self._log.close()
        return self.popen.returncode

    def terminate(self, timeout_s: float = 60) -> int:
        """SIGTERM and wait for a clean stop; SIGKILL if it does not stop in time. Returns the exit code."""
        self.request_stop()
        return self.wait_stopped(timeout_s)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def start_processor(
    config: Path,
    processor_id: str,
    overrides: Sequence[str] = (),
    log_dir: Path | None = None,
    env: Mapping[str, str] | None = None,
) -> ProcessorProcess:
    """Start `weirflow run CONFIG --processor-id ID [--set ...]` with this interpreter; ``env`` adds to (or
    overrides) the inherited environment."""
    log_dir = log_dir or config.parent
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{processor_id}.log"
    log = open(log_path, "ab")
    args = [sys.executable, "-m", "weirflow", "run", str(config), "--processor-id", processor_id]
    for item in overrides:
        args += ["--set", item]
    popen = subprocess.Popen(
        args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    )
    return ProcessorProcess(processor_id, popen, log_path, log)
