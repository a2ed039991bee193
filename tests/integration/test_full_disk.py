"""A full disk loses nothing: the processor stops naming the path and its free space, and a restart after space
is freed counts every window exactly once (docs/operations.md, "Running for months"; `weirflow.base.disk`).

The example job's state directory (the embedded log, the job database, Spark's checkpoints) is on a tmpfs of
its own, mounted by the test (it needs root: the test is skipped, saying why, where mounting is not allowed).
The input is written, then a ballast file takes all but a little of the space left, so the job's own writes
(intermediate records, Spark's checkpoint and state files, checkpoints, outputs) run out of space part way
through, wherever that happens. The processor must exit 1 with the error; with the ballast removed, the next
processor must finish the job with every window equal to pandas' count, once.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.drain_job import window_counts_once
from tests.integration.example_job import EXAMPLE, generate, results
from weirflow.config import load_config
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EVENTS = 100_000
DISK_MB = 96
LEFT_MB = 2  # what the ballast leaves: enough for the processor to start, not for the job to finish


@pytest.fixture
def small_disk(tmp_path: Path):
    """A tmpfs of `DISK_MB`, mounted for the test and unmounted after it."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("a size-limited filesystem for the state directory needs root to mount a tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs for the state directory here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(path: Path, leave_mb: int) -> None:
    """Write a ballast file taking all but ``leave_mb`` of ``path``'s filesystem."""
    free = os.statvfs(path).f_bavail * os.statvfs(path).f_frsize
    size = max(0, free - leave_mb * 1_000_000)
    with open(path / "ballast", "wb") as out:
        chunk = b"\0" * 1_000_000
        for _ in range(size // len(chunk)):
            out.write(chunk)


def test_a_full_disk_stops_the_processor_naming_the_path_and_a_restart_counts_every_window_once(
    small_disk: Path, tmp_path: Path, measure
) -> None:
    state = small_disk / "state"
    overrides = [f"job.state.dir={state}", "task.max.records.per.trigger=2000"]
    config = load_config(EXAMPLE / "job.yaml", overrides)
    events = generate.write(config, EVENTS)
    _fill(small_disk, LEFT_MB)

    first = start_processor(EXAMPLE / "job.yaml", "p1", overrides, log_dir=tmp_path / "logs")
    try:
        wait_until(lambda: not first.alive(), 300, "the processor to stop on the full disk", 0.5)
    finally:
        first.kill()
    text = first.log_text()
    assert first.popen.returncode == 1, text[-4000:]
    said = [line for line in text.splitlines() if "the disk is full" in line]
    assert said, text[-4000:]
    line = said[0]
    assert str(state) in line and "MB free of" in line, line

    (small_disk / "ballast").unlink()
    second = start_processor(EXAMPLE / "job.yaml", "p2", overrides, log_dir=tmp_path / "logs")
    try:
        wait_until(lambda: not second.alive(), 300, "the job to finish once space was freed", 0.5)
    finally:
        second.kill()
    assert second.popen.returncode == 0, second.log_text()[-4000:]
    counts, twice = window_counts_once(config)
    assert not twice, f"windows written more than once: {twice[:5]}"
    expected = results.expected_counts(events)
    assert counts == expected, {k: (counts.get(k), v) for k, v in expected.items() if counts.get(k) != v}
    said_by = line.split("weirflow.processor: ", 1)[-1]
    measure(f"stopped: {said_by[:240]}; restarted: {len(expected)} windows once, equal to pandas")
