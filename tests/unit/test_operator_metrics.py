"""What the operator of the coordinator watches on ``GET /metrics`` (docs/endpoints.md, "Status page and
metrics"), counted where it happens (`weirflow.base.telemetry`): storage retries and errors, latch time-outs,
checkpoint write and lease renewal latencies, the Kinesis spool's size. Each is driven through the code that
counts it, and read as a change of the process's registry (other tests of the process count there too)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.unit.test_azure_storage import unreachable
from tests.unit.test_kinesis_spool import FakeShards, _fill, _spool
from tests.unit.test_leader_duties import TIMINGS, World
from tests.unit.test_lease_keeper import FakeClock, FakeLock
from weirflow.base import telemetry
from weirflow.base.errors import ServiceUnavailableError
from weirflow.base.sqlite import Database
from weirflow.base.telemetry import Histogram, HistogramData, Telemetry
from weirflow.coordination.keeper import LeaseKeeper
from weirflow.endpoints.metrics import ProcessorSnapshot, metrics_exposition
from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.coordination import LatchState, latch_name
from weirflow.local.checkpoint import SqliteCheckpointManager
from weirflow.runtime.fencing import FencedCheckpointWriter
from weirflow.testing import wait_until
from weirflow_kinesis.spool import SPOOL_BYTES


def counted(metric: telemetry.Metric, **labels: str) -> float:
    values = tuple(labels[name] for name in metric.labels)
    return sum(v for m, found, v in telemetry.TELEMETRY.counters() if m == metric and found == values)


def observed(metric: telemetry.Metric) -> int:
    return sum(data.count for m, _, data in telemetry.TELEMETRY.histograms() if m == metric)


def test_retries_and_a_failed_call_of_the_azure_store_are_counted_by_operation() -> None:
    storage = unreachable()  # 3 attempts against a closed port
    labels = {"store": "azure", "operation": "renew lease on"}
    retries, errors = counted(telemetry.STORAGE_RETRIES, **labels), counted(telemetry.STORAGE_ERRORS, **labels)
    with pytest.raises(ServiceUnavailableError):
        storage.call(
            "renew lease on",
            "c0c/leases/x",
            storage.blob_endpoint,
            lambda: storage.blob_service.get_container_client("c0c").get_container_properties(),
        )
    assert counted(telemetry.STORAGE_RETRIES, **labels) - retries == 2
    assert counted(telemetry.STORAGE_ERRORS, **labels) - errors == 1


def test_a_sqlite_transaction_failing_in_the_database_is_a_storage_error(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", "CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY);")
    labels = {"store": "sqlite", "operation": "transaction"}
    before = counted(telemetry.STORAGE_ERRORS, **labels)
    with pytest.raises(sqlite3.IntegrityError), db.transaction() as conn:
        conn.execute("INSERT INTO t VALUES ('a')")
        conn.execute("INSERT INTO t VALUES ('a')")
    with pytest.raises(KeyError), db.transaction():
        raise KeyError("the caller's own error")
    db.close()
    assert counted(telemetry.STORAGE_ERRORS, **labels) - before == 1, "the database's error only"


def test_a_latch_the_leader_times_out_is_counted(tmp_path: Path) -> None:
    world = World(tmp_path)
    duties = world.duties()
    world.beat("p1")
    world.beat("p2")
    world.clock.now += 2000
    duties.tick()
    world.join_latch(1, "p1")
    before = counted(telemetry.LATCH_TIMEOUTS)
    world.clock.now += TIMINGS.latch_timeout_ms
    world.beat("p1")
    world.beat("p2")
    duties.tick()
    assert world.coordination.latch(latch_name(1)).state() is LatchState.TIMED_OUT
    assert counted(telemetry.LATCH_TIMEOUTS) - before == 1


def test_checkpoint_writes_and_lease_renewals_are_timed(tmp_path: Path) -> None:
    writes = observed(telemetry.CHECKPOINT_WRITE_SECONDS)
    manager = SqliteCheckpointManager(tmp_path / "checkpoints.db")
    writer = FencedCheckpointWriter("main-0", manager, FakeLock("task-main-0"))
    writer.write(Checkpoint(offsets={}))
    writer.write(Checkpoint(offsets={}))
    assert observed(telemetry.CHECKPOINT_WRITE_SECONDS) - writes == 2

    renewals = observed(telemetry.LEASE_RENEWAL_SECONDS)
    clock = FakeClock()
    keeper = LeaseKeeper(TIMINGS, clock)
    gate = threading.Event()
    lock = FakeLock("a", gate=gate)
    keeper.add("a", lock, sent_at=clock.t)
    clock.t += 5  # a renewal is due
    keeper.tick()
    wait_until(lambda: lock.renewals == 1, 5, "the renewal sent")
    assert observed(telemetry.LEASE_RENEWAL_SECONDS) == renewals, "not before the store answered"
    gate.set()
    wait_until(lambda: observed(telemetry.LEASE_RENEWAL_SECONDS) - renewals == 1, 5, "the renewal timed")
    keeper.close()


def test_the_kinesis_spool_s_size_is_a_gauge_while_it_is_open(tmp_path: Path) -> None:
    def size() -> float | None:
        found = [v for m, labels, v in telemetry.TELEMETRY.gauges() if m == SPOOL_BYTES]
        return found[0] if found else None

    spool = _spool(tmp_path, FakeShards(size=10))
    try:
        assert size() == 0
        _fill(spool)
        assert size() == spool.size() == 200
    finally:
        spool.close()
    assert size() is None, "a closed spool has no size"


def test_the_registry_is_exposed_per_processor_with_units_and_types(tmp_path: Path) -> None:
    registry = Telemetry()
    registry.count(telemetry.STORAGE_RETRIES, 3, store="azure", operation="renew lease on")
    registry.observe(telemetry.CHECKPOINT_WRITE_SECONDS, 0.02)
    registry.observe(telemetry.CHECKPOINT_WRITE_SECONDS, 0.3)
    registry.gauge(SPOOL_BYTES, lambda: 4096, stream="views")
    registry.gauge(SPOOL_BYTES, lambda: 1 / 0, stream="broken")
    with pytest.raises(ValueError, match="metric weirflow_storage_retries is a counter with labels"):
        registry.count(telemetry.STORAGE_RETRIES, store="azure")
    snapshot = ProcessorSnapshot("p1", "RUNNING", 1, 0, True)
    text = metrics_exposition(lambda: snapshot, registry)().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    kinds = {name: families[name].type for name in families if name.startswith("weirflow_") and "task" not in name}
    assert kinds["weirflow_storage_retries"] == kinds["weirflow_latch_timeouts"] == "counter"
    assert kinds["weirflow_checkpoint_write_seconds"] == kinds["weirflow_lease_renewal_seconds"] == "histogram"
    assert kinds["weirflow_kinesis_spool_bytes"] == "gauge"
    assert 'weirflow_storage_retries_total{operation="renew lease on",processor="p1",store="azure"} 3.0' in text
    assert 'weirflow_latch_timeouts_total{processor="p1"} 0.0' in text, "a counter without labels from the start"
    assert 'weirflow_checkpoint_write_seconds_count{processor="p1"} 2.0' in text
    assert 'weirflow_checkpoint_write_seconds_bucket{le="0.025",processor="p1"} 1.0' in text
    assert 'weirflow_lease_renewal_seconds_count{processor="p1"} 0.0' in text
    assert 'weirflow_kinesis_spool_bytes{processor="p1",stream="views"} 4096.0' in text
    assert 'stream="broken"' not in text, "a gauge that cannot be read is left out, the scrape goes on"


def test_a_histogram_keeps_fixed_buckets_and_round_trips_through_json() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 2.0, 2.0):
        histogram.observe(value)
    data = HistogramData.of(histogram.to_json())
    assert data.buckets == ((0.1, 2), (1.0, 3), (float("inf"), 5)) and data.count == 5
    assert data.sum == pytest.approx(4.65)
