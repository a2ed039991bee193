"""A record job whose served table's changelog is on Kinesis, against kinesalite (docs/guarantees.md, "Streams
read back whole"): Kinesis deletes records after the stream's retention, read or not, so the processor refuses
to start, naming `systems.<name>.retention.loss.allowed` and the config file, and creates nothing; with the key
set it starts, creates the changelog with `systems.<name>.retention.hours` and warns. Each processor runs in
this process and is stopped once its tasks run: no Spark, no subprocess."""

from __future__ import annotations

import logging
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_processor_faults import Running
from weirflow.base.errors import ConfigError
from weirflow.config import load_config
from weirflow.coordination.processor import StreamProcessor
from weirflow.interfaces.system import StreamSpec
from weirflow.job.systems import Systems
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

JOB = """
job.name: {name}
job.default.system: kin
job.debounce.time.ms: 200
job.coordinator.poll.interval.ms: 100
task.inputs: [views]
task.tables: [last_view]
task.function: kinesis_retention_job:serve
systems.kin.factory: kinesis
systems.kin.endpoint: {endpoint}
systems.kin.region: us-east-1
systems.kin.virtual.tasks: 2
systems.kin.shards: 1
systems.kin.read.interval.ms: 50
systems.kin.retention.hours: 48
streams.views.physical.name: {views}
"""


def serving(processor: StreamProcessor) -> bool:
    """Whether both virtual tasks run, their tables rebuilt from their changelog partitions."""
    runner = processor.runner
    return runner is not None and all(runner.table(f"main-v{k}", "last_view") is not None for k in range(2))


def test_a_record_job_with_its_changelog_on_kinesis_starts_only_with_the_loss_allowed(
    kinesalite: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import boto3

    name = f"kept-{uuid.uuid4().hex[:8]}"
    (tmp_path / "job.yaml").write_text(
        textwrap.dedent(JOB.format(name=name, endpoint=kinesalite.endpoint, views=f"{name}-views"))
    )
    (tmp_path / "kinesis_retention_job.py").write_text("def serve(record):\n    return []\n")
    changelog = f"{name}-1-table-last_view"
    client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint)
    state = f"job.state.dir={tmp_path / 'state'}"
    config = load_config(tmp_path / "job.yaml", [state])
    systems = Systems(config)
    try:
        systems.admin("kin").create_stream(StreamSpec(f"{name}-views", 2))
    finally:
        systems.close()

    refused = StreamProcessor(config, processor_id="p1")
    try:
        with pytest.raises(ConfigError) as error:
            refused.run()
    finally:
        if refused.ctx is not None:
            refused.ctx.close()
    assert (error.value.key, error.value.source) == (
        "systems.kin.retention.loss.allowed",
        str(tmp_path / "job.yaml"),
    )
    assert f"the changelog of table 'last_view' ('{changelog}', on 'kin' by job.default.system)" in str(
        error.value
    )
    assert "drops records after 2 days (systems.kin.retention.hours" in str(error.value)
    assert changelog not in client.list_streams()["StreamNames"], "a refused job creates nothing"

    # a state dir of its own: the refused processor's starting row is in the first one (its coordination)
    allowed = load_config(
        tmp_path / "job.yaml", [f"job.state.dir={tmp_path / 'state2'}", "systems.kin.retention.loss.allowed=true"]
    )
    with caplog.at_level(logging.WARNING, logger="weirflow.job.retention"):
        running = Running(StreamProcessor(allowed, processor_id="p2"))
        try:
            wait_until(
                lambda: serving(running.processor), 60, "both tasks serving their tables, read from Kinesis"
            )
        finally:
            assert running.stop() == 0
    summary = client.describe_stream_summary(StreamName=changelog)["StreamDescriptionSummary"]
    assert summary["RetentionPeriodHours"] == 48
    [warning] = [r.getMessage() for r in caplog.records if r.name == "weirflow.job.retention"]
    assert f"the changelog of table 'last_view' ('{changelog}') is on system 'kin'" in warning
    assert "drops records after 2 days" in warning and "allowed by systems.kin.retention.loss.allowed" in warning
