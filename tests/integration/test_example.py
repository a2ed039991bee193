"""`make run`'s demo must keep working: it is the first thing a new user runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.spark]

DEMO = Path(__file__).resolve().parents[2] / "examples" / "coordination" / "demo.py"


def test_the_coordination_demo_routes_every_view_and_prints_the_status() -> None:
    result = subprocess.run([sys.executable, str(DEMO)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all 20000 views routed" in result.stdout
    assert "job model v1" in result.stdout
    for n in range(3):
        assert f"demo-{n}" in result.stdout
    assert "busiest pages:" in result.stdout
    assert "processors stopped cleanly" in result.stdout
