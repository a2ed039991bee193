"""The Spark source on an Event Hubs stream: Event Hubs' own columns, a start time, a per-trigger limit.

One bounded input stream on the emulator is copied to a local stream by a pipeline with no transform, so
every column the source yields (the decoded ``key``/``value``, the event time and the system columns)
arrives as JSON and is compared with what the unmodified SDK receives from the same partitions.
"""

from __future__ import annotations

import datetime as dt
import json
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from azure.eventhub import EventData, EventHubConsumerClient, EventHubProducerClient

from weirflow.config import load_config
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.context import JobContext
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

PIPELINE = """
def pipeline(app):
    app.input("views").send_to("out")
"""

CONFIG = """
job: {{name: ehsource}}
app: {{pipeline: "ehsource_pipeline:pipeline"}}
task.trigger.interval.ms: 200
task.stateless.merge: false   # one query per task, so each task's Spark offset log shows its batches
job.coordinator.lease.duration.ms: 600000   # nothing renews the test's task locks
systems:
  eh: {{factory: eventhub, connection.string: "{cs}"}}
streams:
  views:
    system: eh
    partitions: 2
    serde: string
    bounded: true
    start: "{start}"
    system-columns: all
    max-events-per-trigger: {limit}
  out: {{partitions: 1}}
spark: {{master: "local[1]"}}
"""

LIMIT = 7


def _send(cs: str, events: list[tuple[dict[str, Any], str | None, int | None, bytes]]) -> None:
    """Send (properties, partition key, partition id, body) events one batch per destination, in order."""
    client = EventHubProducerClient.from_connection_string(cs, eventhub_name="views")
    try:
        for props, key, pid, body in events:
            batch = client.create_batch(partition_key=key) if key else client.create_batch(partition_id=str(pid))
            event = EventData(body)
            event.properties = props
            batch.add(event)
            client.send_batch(batch)
    finally:
        client.close()


def _sdk_events(cs: str) -> dict[int, list[Any]]:
    """Every event of every partition, as the SDK receives them."""
    client = EventHubConsumerClient.from_connection_string(cs, "$Default", eventhub_name="views")
    counts = {int(p): client.get_partition_properties(p)["last_enqueued_sequence_number"] + 1 for p in ("0", "1")}
    got: dict[int, list[Any]] = {0: [], 1: []}
    thread = threading.Thread(
        target=lambda: client.receive_batch(
            lambda ctx, events: got[int(ctx.partition_id)].extend(events), starting_position="-1"
        ),
        daemon=True,
    )
    thread.start()
    try:
        wait_until(lambda: all(len(got[p]) >= counts[p] for p in counts), 60, "every event through the SDK")
    finally:
        client.close()
        thread.join(10)
    return got


def _batch_sizes(spark_checkpoint: Path, start: dict[str, int]) -> list[int]:
    """Records each micro-batch of a task's query read, from Spark's offset log (end offsets per batch)."""
    previous, sizes = dict(start), []
    for batch in sorted(int(p.name) for p in (spark_checkpoint / "offsets").glob("[0-9]*")):
        lines = (spark_checkpoint / "offsets" / str(batch)).read_text().splitlines()
        (source,) = [json.loads(line) for line in lines[2:] if line.startswith("{") and '"p"' in line]
        ends = {key: int(pos["o"]) for key, pos in source["p"].items()}
        sizes.append(sum(ends[k] - previous[k] for k in ends))
        previous = ends
    return sizes


def _millis(text: str) -> int:
    return int(dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def test_event_hubs_columns_a_start_time_and_the_trigger_limit(
    eventhubs_emulator, tmp_path: Path, measure
) -> None:
    emulator = eventhubs_emulator({"views": 2, "views.dlq": 2})
    cs = emulator.connection_string()
    _send(cs, [({"tag": "early", "n": i}, f"user-{i}", None, f"e{i}".encode()) for i in range(10)])
    probe = EventHubProducerClient.from_connection_string(cs, eventhub_name="views")
    cutoff_ms = 1 + max(
        int(probe.get_partition_properties(p)["last_enqueued_time_utc"].timestamp() * 1000) for p in ("0", "1")
    )
    probe.close()
    wait_until(lambda: time.time() * 1000 > cutoff_ms, 5, "the clock to pass the early events", 0.005)
    late = [
        ({"tag": "late", "n": i, "ok": True, "blob": b"\xff\xfe"}, f"user-{i}", None, f"l{i}".encode())
        for i in range(20)
    ]
    late += [({"tag": "pinned", "n": i}, None, i % 2, f"p{i}".encode()) for i in range(6)]
    _send(cs, late)

    start = dt.datetime.fromtimestamp(cutoff_ms / 1000, tz=dt.UTC).isoformat().replace("+00:00", "Z")
    (tmp_path / "ehsource_pipeline.py").write_text(textwrap.dedent(PIPELINE))
    (tmp_path / "job.yaml").write_text(CONFIG.format(cs=cs, start=start, limit=LIMIT))
    config = load_config(tmp_path / "job.yaml")
    ctx = JobContext.open(config, "test")
    from weirflow.spark.plane import SparkDataPlane

    plane = SparkDataPlane(ctx)
    try:
        tasks = plane.plan.plan_tasks()
        began = time.monotonic()
        for name, task in sorted(tasks.items()):
            lock = ctx.coordination.lock(f"task-{name}")
            assert lock.try_acquire()
            plane.runner.start_task(task, lock)

        def finished() -> bool:
            assert not plane.runner.failures(), plane.runner.failures()
            return set(plane.runner.finished()) == set(tasks)

        wait_until(finished, 180, "both tasks to finish", 0.2)
        took = time.monotonic() - began
        measure(f"2 Event Hubs tasks read {len(late)} events from a start time in {took:.1f} s")

        out = ctx.systems.consumer("local").read(SystemStreamPartition("local", "out", 0), "0", 1000)
        rows = {json.loads(r.value)["value"]: json.loads(r.value) for r in out}
        assert sorted(rows) == sorted(body.decode() for *_, body in late), "exactly the events after the start"

        sdk = _sdk_events(cs)
        by_body = {e.body_as_str(): e for events in sdk.values() for e in events}
        for value, row in rows.items():
            event = by_body[value]
            assert row["sequence_number"] == event.sequence_number
            assert row["offset"] == str(event.offset)
            assert _millis(row["enqueued_time"]) == int(event.enqueued_time.timestamp() * 1000)
            assert _millis(row["event_time"]) == int(event.enqueued_time.timestamp() * 1000)
            key = event.partition_key.decode() if event.partition_key else None
            assert row.get("partition_key") == key and row.get("key") == key  # to_json drops nulls
        assert rows["l3"]["properties"] == {"tag": "late", "n": "3", "ok": "true", "blob": "//4="}
        assert rows["p4"]["properties"] == {"tag": "pinned", "n": "4"} and "partition_key" not in rows["p4"]

        for name in tasks:  # every micro-batch read at most LIMIT events of the stream, from the start time on
            (ssp,) = tasks[name].ssps
            first_late = min(e.sequence_number for e in sdk[ssp.partition] if e.body_as_str()[0] != "e")
            sizes = _batch_sizes(plane.runner.spark_checkpoint_dir(name), {ssp.key(): first_late})
            assert sizes and max(sizes) <= LIMIT, sizes
            assert sum(sizes) == sum(1 for e in sdk[ssp.partition] if e.body_as_str()[0] != "e"), sizes
            assert len([s for s in sizes if s]) > 1, f"{name}: the limit split the reading ({sizes})"
    finally:
        plane.runner.close()
        ctx.close()
        plane.spark.stop()
