"""A short chaos run (benchmarks/chaos.py, the 3-minute run's checks in about two minutes): the pageviews job on
Azurite and the Event Hubs emulator, 2 processors, one SIGKILLed and replaced every 10 s while events arrive
at a steady rate (a processor silent for 6 s is dead, instead of the shipped 10 s); then the output is counted
against pandas. Every window must be written with exactly pandas' count (nothing lost, nothing counted twice:
docs/guarantees.md), no result may be written twice, and no two processors (lock epochs) may ever have written
for one task at the same time."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_a_short_chaos_run_counts_every_window_exactly_and_never_overlaps_writers(measure) -> None:
    args = [
        "--duration",
        "24",
        "--kill-every",
        "10",
        "--processors",
        "2",
        "--rate",
        "100",
        "--settle",
        "8",
        "--drain-timeout",
        "240",
        # a killed processor is noticed in seconds (the blob lease itself cannot be shorter than 15 s)
        *("--set", "job.coordinator.heartbeat.interval.ms=1500"),
        *("--set", "job.coordinator.liveness.timeout.ms=6000"),
        *("--set", "job.debounce.time.ms=1000"),
    ]
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chaos.py"), *args],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["kills"] == 2
    assert result["lost"] == 0, result
    assert result["missing_windows"] == 0, result
    assert result["overcounted_windows"] == 0 and result["undercounted_windows"] == 0, result
    assert result["exact_windows"] == result["windows"], result
    assert result["duplicate_outputs"] == 0, result
    assert result["batches_logged"] > 0, "no processor logged its committed batches: overlap not measured"
    assert result["overlap_ms"] == 0, result
    measure(
        f"chaos (24 s, 2 kills): {result['exact_windows']}/{result['windows']} windows exact, "
        f"{result['duplicate_outputs']} duplicate outputs ({result['replayed_outputs']} replays dropped by id), "
        f"{result['intermediate_replays_dropped']} replayed intermediate rows dropped, "
        f"overlap {result['overlap_ms']} ms"
    )
