"""Suite-wide fixtures. `measure` records a figure that is printed in the summary of every run, so CI logs
show the measured failover and rebalance times without `-s`."""

from __future__ import annotations

from collections.abc import Callable

import pytest

_MEASUREMENTS: list[str] = []


@pytest.fixture
def measure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    def record(line: str) -> None:
        _MEASUREMENTS.append(f"{request.node.name}: {line}")
        print(line)

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if _MEASUREMENTS:
        terminalreporter.section("measured")
        for line in _MEASUREMENTS:
            terminalreporter.write_line(line)
