"""The streams a job reads back whole (table changelogs, intermediate streams) against their systems' retention
(`weirflow.job.retention`): refused at start with a config error naming `systems.<name>.retention.loss.allowed`,
started with a warning when that key is set. The systems are fakes of `weirflow.interfaces.system`, named by
``module:Class`` as a third-party system is."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path
from typing import Any

import pytest

from weirflow.base.errors import ConfigError
from weirflow.config import load_config
from weirflow.config.loader import Config
from weirflow.endpoints.http_system import HttpSystemAdmin
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import (
    PartitionMetadata,
    Retention,
    StreamSpec,
    SystemAdmin,
    SystemConsumer,
    SystemFactory,
    SystemProducer,
)
from weirflow.job.retention import check_retention
from weirflow.job.systems import Systems
from weirflow.pipeline.api import App
from weirflow.pipeline.plan import PipelinePlan
from weirflow.tasks.record_task import RecordTaskRunner

DAY_MS = 86_400_000

# What the fake systems' admins answer, and the streams they were asked to create (reset by every test).
RETENTION: dict[str, Retention | None] = {}
CREATED: list[str] = []


class UnsayingAdmin(SystemAdmin):
    """A third-party system's admin that does not override `SystemAdmin.retention`."""

    def partition_count(self, stream: str) -> int:
        return 2

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:
        return {p: PartitionMetadata("0", None, "0") for p in range(2)}

    def create_stream(self, spec: StreamSpec) -> bool:
        CREATED.append(spec.stream)
        return True

    def list_streams(self) -> dict[str, int]:
        return {}


class ExpiringAdmin(UnsayingAdmin):
    def retention(self, stream: str) -> Retention | None:
        return RETENTION.get(stream, Retention(DAY_MS, "the fake's setting"))


class _Factory(SystemFactory):
    admin: type[SystemAdmin] = ExpiringAdmin

    def get_admin(self, system_name: str, config: ConfigView) -> SystemAdmin:
        return self.admin()

    def get_consumer(self, system_name: str, config: ConfigView) -> SystemConsumer:
        raise NotImplementedError

    def get_producer(self, system_name: str, config: ConfigView) -> SystemProducer:
        raise NotImplementedError


class ExpiringSystem(_Factory):
    admin = ExpiringAdmin


class UnsayingSystem(_Factory):
    admin = UnsayingAdmin


RECORD_JOB = """
job: {name: lastview, default.system: exp}
task: {inputs: [views], tables: [last_view], function: "retention_job:serve"}
systems:
  exp: {factory: "tests.unit.test_retention:ExpiringSystem"}
streams:
  views: {system: local}
"""


@pytest.fixture(autouse=True)
def _fresh_fakes() -> None:
    RETENTION.clear()
    CREATED.clear()


def record_job(tmp_path: Path, *overrides: str) -> tuple[Config, Systems]:
    (tmp_path / "job.yaml").write_text(textwrap.dedent(RECORD_JOB))
    (tmp_path / "retention_job.py").write_text("def serve(record):\n    return []\n")
    config = load_config(tmp_path / "job.yaml", [f"job.state.dir={tmp_path / 'state'}", *overrides])
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("views", 2))
    return config, systems


def test_a_changelog_on_a_system_that_drops_records_stops_the_start_naming_the_key_the_file_and_what_to_do(
    tmp_path: Path,
) -> None:
    config, systems = record_job(tmp_path)
    try:
        with pytest.raises(ConfigError) as refused:
            RecordTaskRunner.from_config(config, systems, checkpoints=None)  # type: ignore[arg-type]
    finally:
        systems.close()
    error = refused.value
    assert (error.key, error.source) == ("systems.exp.retention.loss.allowed", str(tmp_path / "job.yaml"))
    message = str(error)
    assert "the changelog of table 'last_view' ('lastview-1-table-last_view', on 'exp' by job.default.system)" in (
        message
    )
    assert "drops records after 1 day (the fake's setting)" in message
    assert "the table then loses rows" in message
    # what to do: another system, more retention, or the key
    assert "a system that keeps every record (job.default.system)" in message
    assert "raise the stream's retention" in message
    assert "set systems.exp.retention.loss.allowed: true" in message
    assert CREATED == [], "a refused job creates nothing"


def test_with_the_key_set_the_job_starts_and_warns_naming_the_stream_its_system_and_its_retention(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, systems = record_job(tmp_path, "systems.exp.retention.loss.allowed=true")
    RETENTION["lastview-1-table-last_view"] = Retention(7 * DAY_MS, "its setting")
    try:
        with caplog.at_level(logging.WARNING, logger="weirflow.job.retention"):
            runner = RecordTaskRunner.from_config(config, systems, checkpoints=None)  # type: ignore[arg-type]
    finally:
        systems.close()
    assert runner.tables is not None and CREATED == ["lastview-1-table-last_view"]
    [warning] = [r for r in caplog.records if r.name == "weirflow.job.retention"]
    assert warning.levelno == logging.WARNING
    text = warning.getMessage()
    assert "the changelog of table 'last_view' ('lastview-1-table-last_view') is on system 'exp'" in text
    assert "drops records after 7 days (its setting)" in text
    assert "allowed by systems.exp.retention.loss.allowed" in text


def test_a_system_that_never_drops_records_needs_nothing_and_logs_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config, systems = record_job(tmp_path)
    RETENTION["lastview-1-table-last_view"] = None
    try:
        with caplog.at_level(logging.WARNING, logger="weirflow.job.retention"):
            RecordTaskRunner.from_config(config, systems, checkpoints=None)  # type: ignore[arg-type]
        assert systems.admin("local").retention("views") is None, "the embedded log keeps every record"
    finally:
        systems.close()
    assert CREATED == ["lastview-1-table-last_view"]
    assert not [r for r in caplog.records if r.name == "weirflow.job.retention"]


def test_a_system_that_does_not_say_is_taken_to_drop_records(tmp_path: Path) -> None:
    config, systems = record_job(tmp_path, "systems.exp.factory=tests.unit.test_retention:UnsayingSystem")
    try:
        with pytest.raises(ConfigError, match="systems.exp.retention.loss.allowed") as refused:
            RecordTaskRunner.from_config(config, systems, checkpoints=None)  # type: ignore[arg-type]
    finally:
        systems.close()
    assert "may drop records (UnsayingAdmin does not say how long it keeps records)" in str(refused.value)


def _pipeline(tmp_path: Path, values: dict[str, Any]) -> tuple[Config, Systems, PipelinePlan]:
    config = Config.from_dict(
        {
            "job.name": "counts",
            "job.state.dir": str(tmp_path),
            "systems.exp.factory": "tests.unit.test_retention:ExpiringSystem",
            **values,
        },
        source=str(tmp_path / "job.yaml"),
        base_dir=tmp_path,
    )
    systems = Systems(config)
    app = App(config)
    app.input("views").partition_by("page", name="by-page").send_to("out")
    return config, systems, PipelinePlan(app, config, systems)


def test_an_intermediate_stream_is_checked_on_the_system_job_intermediate_system_puts_it_on(
    tmp_path: Path,
) -> None:
    config, systems, plan = _pipeline(tmp_path, {"job.intermediate.system": "exp"})
    try:
        [stream] = plan.read_back()
        assert (stream.ref.system, stream.ref.physical, stream.placed_by) == (
            "exp",
            "counts-1-by-page",
            "job.intermediate.system",
        )
        with pytest.raises(ConfigError, match="systems.exp.retention.loss.allowed") as refused:
            check_retention(config, systems, plan.read_back())
        assert "intermediate stream 'by-page' ('counts-1-by-page', on 'exp' by job.intermediate.system)" in str(
            refused.value
        )
        assert "the next stage then computes without those rows" in str(refused.value)
    finally:
        systems.close()

    config, systems, plan = _pipeline(tmp_path, {})  # on job.default.system, the embedded log
    try:
        assert [s.placed_by for s in plan.read_back()] == ["job.default.system"]
        check_retention(config, systems, plan.read_back())
    finally:
        systems.close()


def test_the_http_system_answers_with_its_backing_system_s_retention(tmp_path: Path) -> None:
    config = Config.from_dict(
        {
            "job.name": "rpc",
            "job.state.dir": str(tmp_path),
            "systems.web.factory": "http",
            "systems.web.backing": "exp",
            "systems.exp.factory": "tests.unit.test_retention:ExpiringSystem",
        }
    )
    admin = HttpSystemAdmin("web", config)
    assert admin.retention("calls") == Retention(DAY_MS, "the fake's setting")


@pytest.mark.parametrize(
    ("ms", "said"),
    [
        (86_400_000, "drops records after 1 day"),
        (7 * 86_400_000, "drops records after 7 days"),
        (36 * 3_600_000, "drops records after 36 hours"),
        (90 * 60_000, "drops records after 90 minutes"),
        (1500, "drops records after 1500 ms"),
        (None, "may drop records"),
    ],
)
def test_a_retention_reads_in_the_largest_whole_unit(ms: int | None, said: str) -> None:
    assert str(Retention(ms)) == said
    assert str(Retention(ms, "why")) == f"{said} (why)"
