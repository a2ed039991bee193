"""Events/s read from Event Hubs: weirflow's Spark source vs the raw SDK receive loop, same emulator, same data.

One in-process Event Hubs emulator holds ``--events`` JSON page views (default 100,000) in 4 partitions.

* **weirflow source**: one Structured Streaming query over the `weirflow` source (the `eventhub` system's
  consumer in Spark's Python workers, one task per partition with ``task.max.records.per.trigger`` events
  per batch, the partitions spread over Spark's cores as a job's queries spread them, JSON decoded to the
  page-view schema) into a `noop` sink, from query start until every event is read, with the shipped
  ``systems.<name>.prefetch`` and ``catch-up.prefetch``. The Spark session is started before the clock
  starts.
* **raw SDK**: `EventHubConsumerClient.receive_batch` on all partitions from the start, counting events in
  the callback, from client creation until every event arrived.

Prints one JSON line: ``{"figure": ..., "unit": "events/s", "value": ..., "baseline": ..., "ratio": ...}``.
Usage: ``python benchmarks/eventhub_source.py [--events N] [--prefetch N]``.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

from azure.eventhub import EventHubConsumerClient

from weirflow.base.waiting import wait_until
from weirflow.config.loader import Config
from weirflow.interfaces.system import OutgoingRecord
from weirflow.job.systems import Systems
from weirflow_azure.eventhubs.emulator.server import EventHubsEmulator

PARTITIONS = 4
SCHEMA = "user string, page string, event_time timestamp"


def produce(config: Config, events: int) -> None:
    systems = Systems(config)
    try:
        producer = systems.producer("eh")
        for start in range(0, events, 10_000):
            producer.send(
                [
                    OutgoingRecord(
                        "views",
                        json.dumps(
                            {"user": f"u{i % 997}", "page": f"/p/{i % 50}", "event_time": "2026-11-23T10:00:00Z"}
                        ).encode(),
                        partition=i % PARTITIONS,
                    )
                    for i in range(start, min(events, start + 10_000))
                ]
            )
    finally:
        systems.close()


def raw_sdk(connection_string: str, events: int) -> float:
    count = 0
    done = threading.Event()
    guard = threading.Lock()

    def on_batch(_ctx, batch) -> None:
        nonlocal count
        with guard:
            count += len(batch)
            if count >= events:
                done.set()

    started = time.monotonic()
    client = EventHubConsumerClient.from_connection_string(connection_string, consumer_group="$Default")
    thread = threading.Thread(
        target=client.receive_batch,
        kwargs={"on_event_batch": on_batch, "starting_position": "-1", "max_batch_size": 300},
        daemon=True,
    )
    thread.start()
    if not done.wait(600):
        raise TimeoutError(f"raw SDK received {count} of {events}")
    elapsed = time.monotonic() - started
    client.close()
    return elapsed


def weirflow_source(config: Config, events: int) -> float:
    from weirflow.spark.query import read_groups
    from weirflow.spark.session import build_spark_session
    from weirflow.spark.source import SOURCE_NAME, WeirflowSource

    spark = build_spark_session(config)
    spark.dataSource.register(WeirflowSource)
    from pyspark.sql import types as T

    systems = Systems(config)
    try:
        groups = read_groups(spark, systems.consumer("eh"))
    finally:
        systems.close()
    user_schema = T._parse_datatype_string(SCHEMA)
    ssps = [f"eh.views.{p}" for p in range(PARTITIONS)]
    options = {
        "config": config.snapshot(),
        "stream": "views",
        # one task per partition, as a job's tasks read them: each partition has its own per-trigger budget
        "tasks": json.dumps({key: f"views-{key.rsplit('.', 1)[1]}" for key in ssps}),
        "system": "eh",
        "physical": "views",
        "ssps": json.dumps(ssps),
        "start": json.dumps({k: {"o": "0", "e": False} for k in ssps}),
        "serde": "json",
        "user_schema": json.dumps(user_schema.jsonValue()),
        "event_time_field": "event_time",
        "event_time_from_record": "false",
        "delay_ms": "0",
        "intermediate": "false",
        "bounded": "false",
        "max_records": str(config.get("task.max.records.per.trigger")),
        "read_groups": str(groups),  # as the job's queries read it
    }
    frame = spark.readStream.format(SOURCE_NAME).options(**options).load()
    started = time.monotonic()
    query = frame.writeStream.format("noop").trigger(processingTime="100 milliseconds").start()

    def read_all() -> bool:
        progress = query.lastProgress
        if not progress or not progress["sources"]:
            return False
        end = json.loads(progress["sources"][0]["endOffset"] or "{}")
        return sum(int(v["o"]) for v in end.get("p", {}).values()) >= events

    wait_until(read_all, 900, "the source to read every event", interval_s=0.05)
    elapsed = time.monotonic() - started
    query.stop()
    spark.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--prefetch", type=int, default=None, help="systems.eh.prefetch (default: shipped)")
    args = parser.parse_args()
    with EventHubsEmulator({"views": PARTITIONS}) as emulator:
        config = Config.from_dict(
            {
                "job.name": "bench-eventhub-source",
                "systems.eh.factory": "eventhub",
                "systems.eh.connection.string": emulator.connection_string(),
                "streams.views.system": "eh",
                "spark.master": "local[2]",
                **({"systems.eh.prefetch": args.prefetch} if args.prefetch else {}),
            }
        )
        produce(config, args.events)
        baseline_s = raw_sdk(emulator.connection_string("views"), args.events)
        weirflow_s = weirflow_source(config, args.events)
    value, baseline = args.events / weirflow_s, args.events / baseline_s
    print(
        json.dumps(
            {
                "figure": "Event Hubs read throughput (emulator, 4 partitions)",
                "unit": "events/s",
                "value": round(value),
                "baseline": round(baseline),
                "baseline_name": "raw azure-eventhub receive_batch loop",
                "ratio": round(value / baseline, 3),
                "events": args.events,
                "prefetch": config.get("systems.eh.prefetch"),
                "catch_up_prefetch": config.get("systems.eh.catch-up.prefetch"),
            }
        )
    )


if __name__ == "__main__":
    main()
