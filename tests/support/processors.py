"""One `weirflow run` processor run until it exits: started, its exit code checked, and nothing left running."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from weirflow.local.launcher import ProcessorProcess, start_processor

FINISHED = 0  # every task of a bounded job reached end-of-stream
KILLED = -9  # a fault point (`weirflow.runtime.fault_points`) SIGKILLed it


def run_to_exit(
    config: Path,
    name: str,
    overrides: Sequence[str],
    log_dir: Path,
    timeout_s: float,
    expected: int = FINISHED,
    env: Mapping[str, str] | None = None,
) -> ProcessorProcess:
    """Start processor ``name`` of the job in ``config`` and wait up to ``timeout_s`` for it to exit with
    ``expected``; the assertion shows the end of its log. Killed if still running; returned for its log."""
    process = start_processor(config, name, list(overrides), log_dir=log_dir, env=dict(env) if env else None)
    try:
        assert process.popen.wait(timeout_s) == expected, process.log_text()[-4000:]
    finally:
        process.kill()
    return process
