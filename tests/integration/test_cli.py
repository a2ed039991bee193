"""The `weirflow` command as a user runs it: real subprocesses, real files, exit codes and JSON output."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration


def weirflow(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "weirflow", *args], input=stdin, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(
        textwrap.dedent(
            """
            job:
              name: clitest
              coordinator.poll.interval.ms: 200
            task:
              inputs: [orders]
              function: passthrough:copy
            streams:
              orders: {partitions: 3}
              copies: {partitions: 1}
            systems:
              vault:
                factory: local
            azure.storage.connection.string: "DefaultEndpointsProtocol=https;AccountName=a;AccountKey=topsecret"
            """
        )
    )
    (tmp_path / "passthrough.py").write_text(
        "def copy(record):\n    return [{'stream': 'copies', 'value': record['value'], 'key': record['key']}]\n"
    )
    return path


def test_streams_produce_then_consume_as_json_round_trips_every_record(config: Path) -> None:
    assert weirflow("streams", "create", str(config), "orders").returncode == 0
    lines = "".join(json.dumps({"order": i, "customer": f"c{i % 4}"}) + "\n" for i in range(50))
    produced = weirflow("streams", "produce", str(config), "orders", "--key-field", "customer", stdin=lines)
    assert produced.returncode == 0, produced.stderr
    assert "sent 50 records" in produced.stderr

    consumed = weirflow("streams", "consume", str(config), "orders", "--json")
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert sorted(r["value"]["order"] for r in records) == list(range(50))
    by_key: dict[str, set[int]] = {}
    for r in records:
        by_key.setdefault(r["key"], set()).add(r["partition"])
    assert all(len(partitions) == 1 for partitions in by_key.values()), "one key, one partition"

    listing = json.loads(weirflow("streams", "list", str(config), "--json").stdout)
    assert {"system": "local", "stream": "orders", "partitions": 3, "records": 50} in listing


def test_produce_rejects_a_line_that_is_not_json_naming_the_line(config: Path) -> None:
    weirflow("streams", "create", str(config), "orders")
    result = weirflow("streams", "produce", str(config), "orders", stdin='{"a": 1}\nnot json\n')
    assert result.returncode == 1
    assert "stdin line 2 is not JSON" in result.stderr


def test_config_shows_effective_values_with_secrets_masked(config: Path) -> None:
    result = weirflow("config", str(config), "--json", "--set", "job.debounce.time.ms=5s")
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout)
    assert values["job.name"] == "clitest"
    assert values["job.debounce.time.ms"] == "5s"
    assert values["job.coordinator.lease.duration.ms"] == 15000
    assert "topsecret" not in result.stdout
    assert values["azure.storage.connection.string"] == "****"


def test_a_bad_config_value_exits_2_naming_the_key_and_the_file(config: Path) -> None:
    result = weirflow("status", str(config), "--set", "job.coordinator.lease.duration.ms=soon")
    assert result.returncode == 2
    assert "job.coordinator.lease.duration.ms" in result.stderr
    assert "--set" in result.stderr


def test_an_unknown_factory_alias_exits_2_listing_the_known_aliases(config: Path) -> None:
    result = weirflow("run", str(config), "--set", "job.coordinator.factory=zookeeper")
    assert result.returncode == 2
    assert "unknown alias 'zookeeper'" in result.stderr
    assert "local" in result.stderr


def test_a_system_plugin_s_key_on_another_system_exits_2_naming_the_key_the_source_and_the_plugin(
    config: Path,
) -> None:
    result = weirflow("config", str(config), "--set", "systems.vault.prefetch=50")
    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert "systems.vault.prefetch" in message and "--set" in message
    assert "key of the eventhub system plugin" in message and "'local'" in message


def test_the_reference_lists_every_installed_plugin_s_keys() -> None:
    result = weirflow("config-reference")
    assert result.returncode == 0
    for key in ("`systems.<name>.prefetch`", "`azure.storage.account`", "`local.db.busy.timeout.ms`"):
        assert key in result.stdout


def test_an_unknown_key_warns_with_the_closest_known_key(config: Path) -> None:
    result = weirflow("config", str(config), "--set", "job.debounce.time=1000")
    assert result.returncode == 0
    assert "did you mean 'job.debounce.time.ms'" in result.stderr


def test_status_json_shows_the_live_group_and_a_missing_input_stream_surfaces_as_an_error(config: Path) -> None:
    proc = start_processor(config, "solo", log_dir=config.parent / "logs")
    cfg = load_config(config)
    try:
        # `orders` does not exist yet: the leader cannot plan tasks, and says so in the processor's row
        wait_until(
            lambda: any("orders" in p["error"] for p in status_document(cfg)["processors"]),
            30,
            "the missing-stream error to show in status",
        )
        weirflow("streams", "create", str(config), "orders")
        wait_until(lambda: status_document(cfg)["task_count"] == 3, 30, "the job model to hold 3 tasks")
        wait_until(
            lambda: [p["tasks"] for p in status_document(cfg)["processors"]] == [["main-0", "main-1", "main-2"]],
            30,
            "all 3 tasks running",
        )
        wait_until(lambda: status_document(cfg)["processors"][0]["error"] == "", 30, "the error to clear")
        result = weirflow("status", str(config), "--json")
        doc = json.loads(result.stdout)
        assert doc["leader"] == "solo"
        assert doc["job_model_version"] >= 1
        (row,) = doc["processors"]
        assert row["state"] == "RUNNING" and row["live"] and row["heartbeat_age_s"] < 10
        table = weirflow("status", str(config))
        assert "solo" in table.stdout and "RUNNING" in table.stdout
    finally:
        assert proc.terminate() == 0
    assert status_document(cfg)["processors"][0]["state"] == "STOPPED"


def test_a_wrong_system_factory_fails_at_start_not_at_first_use(config: Path) -> None:
    result = weirflow("run", str(config), "--set", "systems.vault.factory=eventhubz")
    assert result.returncode == 2
    assert "systems.vault.factory" in result.stderr and "unknown alias 'eventhubz'" in result.stderr


def test_drain_asks_a_record_job_too_and_a_wait_that_times_out_says_what_is_left(
    config: Path, tmp_path: Path
) -> None:
    asked = weirflow("drain", str(config))  # a record-task job drains too (tests/integration/test_record_drain.py)
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "drain requested for run default" in asked.stdout
    assert "no processor of this job is running" in asked.stderr

    pipeline = Path(__file__).resolve().parents[2] / "examples" / "pageviews" / "job.yaml"
    state = f"job.state.dir={tmp_path / 'state'}"
    waited = weirflow("drain", str(pipeline), "--set", state, "--run-id", "v7", "--wait", "--timeout", "1")
    assert waited.returncode == 1, waited.stdout + waited.stderr
    assert "drain requested for run v7" in waited.stdout
    assert "no processor of this job is running" in waited.stderr  # said at once, not after the time-out
    assert "the drain of run v7 did not complete in 1 s" in waited.stderr
    assert "tasks drained" in waited.stderr
