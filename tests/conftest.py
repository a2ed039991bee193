"""Suite-wide fixtures. `measure` records a figure that is printed in the summary of every run, so CI logs
show the measured failover and rebalance times without `-s`.

`azure_storage` is the connection string of the storage account the Azure suite runs against: Azurite
started for the session on free ports (see `tests/support/azurite.py`), or a real account when the
environment variable ``WEIRFLOW_TEST_AZURE_STORAGE`` holds its connection string. Every test names its own
job, so jobs' containers and tables never collide and nothing needs cleaning between tests.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REAL_ACCOUNT_ENV = "WEIRFLOW_TEST_AZURE_STORAGE"


@pytest.fixture(scope="session")
def azure_storage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    real = os.environ.get(REAL_ACCOUNT_ENV)
    if real:
        yield real
        return
    from tests.support.azurite import Azurite

    azurite = Azurite(tmp_path_factory.mktemp("azurite")).start()
    try:
        yield azurite.connection_string
    finally:
        azurite.stop()


@pytest.fixture
def own_azurite(tmp_path: Path) -> Iterator[object]:
    """An Azurite of this test alone (it may be stopped and restarted); skipped on a real account."""
    if os.environ.get(REAL_ACCOUNT_ENV):
        pytest.skip("stops and restarts storage: needs Azurite, not a real account")
    from tests.support.azurite import Azurite

    azurite = Azurite(tmp_path / "azurite").start()
    try:
        yield azurite
    finally:
        azurite.stop()


@pytest.fixture
def eventhubs_emulator(tmp_path: Path) -> Iterator[Callable[..., object]]:
    """``eventhubs_emulator({"hub": partitions}, data_dir=None)`` starts an Event Hubs emulator on a free port;
    all are stopped after the test."""
    from weirflow_azure.eventhubs.emulator.server import EventHubsEmulator

    started: list[EventHubsEmulator] = []

    def start(hubs: dict[str, int], data_dir: Path | None = None) -> EventHubsEmulator:
        emulator = EventHubsEmulator(hubs, data_dir=data_dir).start()
        started.append(emulator)
        return emulator

    yield start
    for emulator in started:
        emulator.stop()


def _start_kinesalite() -> Any:
    """A started kinesalite (`tests/support/kinesalite.py`), with the dummy AWS credentials it needs in the
    environment."""
    from tests.support.kinesalite import Kinesalite, use_dummy_credentials

    use_dummy_credentials()
    return Kinesalite().start()


@pytest.fixture(scope="session")
def _session_kinesalite() -> Iterator[list[Any]]:
    """The session's kinesalite, in a box a test's fixture can replace it in (see `kinesalite`)."""
    box = [_start_kinesalite()]
    try:
        yield box
    finally:
        box[0].stop()


@pytest.fixture
def kinesalite(_session_kinesalite: list[Any]) -> Iterator[object]:
    """A kinesalite shared by the session (`tests/support/kinesalite.py`); tests name their own streams. Its
    dummy AWS credentials are put in the environment, where boto3's chain (and spawned processors) find them.

    A kinesalite that died during a test fails that test's teardown with its stderr, and the next test gets a
    new one: one crash is reported once instead of failing every later Kinesis test with "connection refused"."""
    if not _session_kinesalite[0].alive():
        _session_kinesalite[0] = _start_kinesalite()
    server = _session_kinesalite[0]
    yield server
    if not server.alive():
        pytest.fail(f"kinesalite ({server.endpoint}) died during the test; its stderr: {server.stderr_tail()}")


@pytest.fixture
def own_kinesalite() -> Iterator[object]:
    """A kinesalite of this test alone (holding no streams)."""
    server = _start_kinesalite()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def _session_moto() -> Iterator[list[Any]]:
    from tests.support.moto_server import MotoServer

    box = [MotoServer().start()]
    try:
        yield box
    finally:
        box[0].stop()


@pytest.fixture
def moto(_session_moto: list[Any]) -> Iterator[Any]:
    """The session's moto server (`tests/support/moto_server.py`): DynamoDB and S3 for the AWS suite. Its dummy
    AWS credentials are in the environment, where boto3's chain (and spawned processors) find them. A server
    that died is started again for the next test, and the test during which it died fails with its log."""
    if not _session_moto[0].alive():
        from tests.support.moto_server import MotoServer

        _session_moto[0] = MotoServer().start()
    server = _session_moto[0]
    yield server
    if not server.alive():
        pytest.fail(f"moto's server ({server.endpoint}) died during the test; its log: {server.log_tail()}")


# How often a thread holding the GIL is made to hand it over (Python's default: 5 ms). The Event Hubs SDK's
# synchronous receive (`EventProcessor.start`) loops without sleeping until its receiver exists, about a second
# per receiver a test opens. At 5 ms, every other thread of the test process waits up to 5 ms for each handover
# meanwhile: the in-process Event Hubs emulator serving every processor of the test, and the SDK's own handshake
# thread that ends the loop. Measured on the system contract's Event Hubs tests: 113 s of wall time and 48 s of
# user CPU at the default, 88 s and 21 s at 0.5 ms. It changes no result, only how soon a waiting thread runs.
GIL_SWITCH_INTERVAL_S = 0.0005


def pytest_configure(config: pytest.Config) -> None:
    """Cheaper Spark driver JVMs for every process of the run (`tests/support/spark_jvm.py`); the controlling
    process starts dumping their class archive, when there is none yet, before pytest-xdist starts its workers,
    and makes room for the workers to tell its scheduler the test files' kinds (`tests/support/scheduling.py`).
    Threads of the test process hand the GIL over sooner (`GIL_SWITCH_INTERVAL_S`)."""
    from tests.support import spark_jvm

    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)

    spark_jvm.prepare(build=not hasattr(config, "workerinput"))
    if not hasattr(config, "workerinput") and config.getoption("dist", None) == "loadfile":
        from tests.support import scheduling

        scheduling.enable(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Remove what `pytest_configure` made for the scheduler."""
    from tests.support import scheduling

    scheduling.disable(config)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Before any fixture of the test starts a JVM: a test marked ``spark`` waits for the class archive's
    background dump, and every test picks the archive up once it exists (`spark_jvm.await_archive`)."""
    from tests.support import spark_jvm

    spark_jvm.await_archive(wait=item.get_closest_marker("spark") is not None)


# The files that take more than a minute and a half with three workers on the 2-core machine, longest first: each
# kind starts with them, so that the run does not end with one worker still on one of them while the others
# are done (measured in a full run: 219, 194, 130, 121, 110 and 100 s).
LONGEST_FIRST = (
    "tests/integration/test_pageviews_on_azure.py",
    "tests/integration/test_kinesis.py",
    "tests/integration/test_azure_coordination.py",
    "tests/integration/test_drain_scenarios.py",
    "tests/contract/test_system_contract.py",
    "tests/integration/test_served_tables.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Order the test files for `make test`'s pytest-xdist workers: the files marked ``spark`` (they keep a core
    busy), then the other integration and contract files (they mostly wait), then the unit files (short); within
    each kind the files of `LONGEST_FIRST` first. The scheduler (`tests/support/scheduling.py`) mixes busy and
    waiting files, taking each kind in this order; each worker tells it which file is of which kind. The order of
    the tests within a file is kept, and nothing a test checks depends on it."""
    from tests.support import scheduling

    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::", 1)[0], []).append(item)
    first = {name: rank for rank, name in enumerate(LONGEST_FIRST)}
    by_file = {name: by_file[name] for name in sorted(by_file, key=lambda name: first.get(name, len(first)))}
    busy = [name for name, found in by_file.items() if any(i.get_closest_marker("spark") for i in found)]
    unit = [name for name in by_file if name.startswith("tests/unit/") and name not in busy]
    waiting = [name for name in by_file if name not in busy and name not in unit]
    items[:] = [item for name in busy + waiting + unit for item in by_file[name]]
    kinds = {name: scheduling.BUSY if name in busy else scheduling.WAITING for name in by_file}
    scheduling.record_kinds(config, kinds)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadfile`` (`make test`) mixes busy files with waiting ones (`tests/support/scheduling.py`)."""
    if config.getoption("dist", None) != "loadfile":
        return None
    from tests.support import scheduling

    return scheduling.PairingScheduling(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Tell each pytest-xdist worker where to write the test files' kinds for the scheduler."""
    from tests.support import scheduling

    scheduling.configure_worker(node.config, node.workerinput)


def unique_job_name(prefix: str = "t") -> str:
    """A job name no other test (or earlier run on a real account) uses."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def measure(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record a measured figure; the run's summary lists them under "measured". They travel in the test's
    report (``user_properties``), so they reach the summary from pytest-xdist's worker processes too."""

    def record(line: str) -> None:
        request.node.user_properties.append(("measured", f"{request.node.name}: {line}"))
        print(line)

    return record


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    lines = [
        value
        for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", [])
        if report.when == "call"
        for name, value in report.user_properties
        if name == "measured"
    ]
    if lines:
        terminalreporter.section("measured")
        for line in lines:
            terminalreporter.write_line(line)
