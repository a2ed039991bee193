"""A task's ``records_in`` is counted by its systems' admins (`SystemAdmin.records_between`), never by
subtracting offsets itself: a system of positions (`SystemAdmin.dense_offsets` False) counts its own way."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from weirflow.interfaces.system import PartitionMetadata, StreamSpec, SystemAdmin, SystemStreamPartition
from weirflow.spark.task_progress import records_between


class PositionsAdmin(SystemAdmin):
    """Offsets are JSON of shard -> records consumed (not numbers): only this admin can count between them."""

    dense_offsets = False

    def __init__(self) -> None:
        self.asked: list[tuple[str, int, str, str]] = []

    def records_between(self, stream: str, partition: int, start: str, end: str) -> int | None:
        self.asked.append((stream, partition, start, end))
        a, b = json.loads(start), json.loads(end)
        return sum(b[shard] - a.get(shard, 0) for shard in b)

    def partition_count(self, stream: str) -> int:  # pragma: no cover - not used here
        raise NotImplementedError

    def partition_metadata(self, stream: str) -> dict[int, PartitionMetadata]:  # pragma: no cover
        raise NotImplementedError

    def create_stream(self, spec: StreamSpec) -> None:  # pragma: no cover
        raise NotImplementedError

    def list_streams(self) -> Any:  # pragma: no cover
        raise NotImplementedError


class DenseAdmin(PositionsAdmin):
    dense_offsets = True

    def records_between(self, stream: str, partition: int, start: str, end: str) -> int | None:
        return SystemAdmin.records_between(self, stream, partition, start, end)


def test_records_in_is_counted_by_the_admin_of_each_ssp_s_system() -> None:
    positions, dense = PositionsAdmin(), DenseAdmin()
    systems: Any = SimpleNamespace(admin=lambda system: {"kin": positions, "local": dense}[system])
    shards, log = SystemStreamPartition("kin", "views", 1), SystemStreamPartition("local", "clicks", 0)
    before = {shards: json.dumps({"s-0": 10, "s-1": 4}), log: "100"}
    after = {shards: json.dumps({"s-0": 15, "s-1": 9, "s-2": 3}), log: "130"}
    assert records_between(systems, before, after) == 13 + 30
    assert positions.asked == [("views", 1, before[shards], after[shards])]


def test_an_unmoved_or_uncountable_ssp_adds_nothing() -> None:
    class Uncountable(PositionsAdmin):
        def records_between(self, stream: str, partition: int, start: str, end: str) -> int | None:
            self.asked.append((stream, partition, start, end))
            return None  # cannot count without reading

    admin = Uncountable()
    systems: Any = SimpleNamespace(admin=lambda system: admin)
    ssp, other = SystemStreamPartition("kin", "views", 1), SystemStreamPartition("kin", "views", 2)
    assert records_between(systems, {ssp: '{"s-0": 1}'}, {ssp: '{"s-0": 1}', other: '{"s-0": 9}'}) == 0
    assert admin.asked == []  # unmoved, and an SSP first seen counts from where it is: nothing to ask
    assert records_between(systems, {ssp: '{"s-0": 1}'}, {ssp: '{"s-0": 2}'}) == 0
    assert len(admin.asked) == 1


def test_control_rows_of_a_progress_polled_from_the_query_are_read_like_the_feed_s() -> None:
    """``query.recentProgress`` (polled when a query stops) holds observed metrics as PySpark Rows, the feed's
    JSON as dicts: both read the same."""
    from pyspark.sql import Row

    from weirflow.spark.progress import ProgressView

    seen = {"kind": "seen", "ssp": "local.events.1", "producer": None, "task_count": None, "ctl_ms": 7}
    polled = ProgressView({"batchId": 3, "observedMetrics": {"obs_0": Row(control=[Row(**seen)])}})
    fed = ProgressView({"batchId": 3, "observedMetrics": {"obs_0": {"control": [seen]}}})
    assert polled.observedMetrics == fed.observedMetrics == {"obs_0": {"control": [seen]}}
