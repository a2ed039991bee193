"""System contract (`weirflow.testing.contracts.system`) on each system: the embedded log, Event Hubs on the
emulator, and Kinesis on kinesalite. The module's ``weirflow_backend`` replaces the conftest's, whose backends
are stores."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.contract.backends import eventhub_backend, kinesis_backend, local_backend
from tests.contract.conftest import SYSTEMS
from weirflow.testing import Backend, SystemContract


@pytest.fixture(params=SYSTEMS)
def weirflow_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    if request.param == "eventhub":
        start_emulator: Callable[[dict[str, int]], object] = request.getfixturevalue("eventhubs_emulator")
        return eventhub_backend(start_emulator({}))
    if request.param == "kinesis":
        return kinesis_backend(request.getfixturevalue("own_kinesalite"), tmp_path)
    return local_backend(tmp_path)


class TestSystem(SystemContract):
    pass
