"""Records/s read from Kinesis: weirflow's Spark source vs a raw boto3 `GetRecords` loop, same kinesalite stream.

One kinesalite (npm, started from this checkout's ``node_modules`` like the tests do) holds ``--events`` JSON
page views (default 100,000) in a stream of ``--shards`` shards (4), written with random partition keys.

* **raw boto3**: `GetRecords` (10,000 per call) on every shard in turn from ``TRIM_HORIZON``, counting records,
  from client creation until every record arrived.
* **weirflow source**: one Structured Streaming query over the `weirflow` source reading every virtual task
  of the stream (``--virtual-tasks``, 16: each its own SSP with its own per-trigger budget, as a job's tasks
  read them) through the processor's spool from an empty spool, JSON decoded to the page-view schema, into a
  `noop` sink; from query start until the query's progress has counted every record. The Spark session is
  started before the clock starts.

Prints one JSON line: ``{"figure", "unit": "records/s", "value", "baseline", "ratio", ...}`` (target: ratio ≥ 0.9).
Usage: ``python benchmarks/kinesis_source.py [--events N] [--shards N] [--virtual-tasks N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.support.kinesalite: the kinesalite launcher of the test tree

from tests.support.kinesalite import Kinesalite, use_dummy_credentials  # noqa: E402
from weirflow.base.waiting import wait_until  # noqa: E402
from weirflow.config.loader import Config  # noqa: E402

SCHEMA = "user string, page string, event_time timestamp"


def produce(client, stream: str, events: int) -> None:
    for start in range(0, events, 500):
        records = [
            {
                "Data": json.dumps(
                    {"user": f"u{i % 997}", "page": f"/p/{i % 50}", "event_time": "2026-11-23T10:00:00Z"}
                ).encode(),
                "PartitionKey": uuid.uuid4().hex,
            }
            for i in range(start, min(events, start + 500))
        ]
        response = client.put_records(StreamName=stream, Records=records)
        assert response["FailedRecordCount"] == 0


def raw_boto3(endpoint: str, stream: str, events: int) -> float:
    import boto3

    started = time.monotonic()
    client = boto3.client("kinesis", endpoint_url=endpoint)
    count = 0
    for shard in client.list_shards(StreamName=stream)["Shards"]:
        iterator = client.get_shard_iterator(
            StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
        )["ShardIterator"]
        while iterator:
            response = client.get_records(ShardIterator=iterator, Limit=10_000)
            count += len(response["Records"])
            if not response["Records"]:
                break
            iterator = response.get("NextShardIterator")
    elapsed = time.monotonic() - started
    if count != events:
        raise RuntimeError(f"raw boto3 read {count} of {events} records")
    return elapsed


def weirflow_source(config: Config, stream: str, virtual: int, events: int) -> float:
    from pyspark.sql import types as T

    from weirflow.spark.session import build_spark_session
    from weirflow.spark.source import SOURCE_NAME, WeirflowSource

    spark = build_spark_session(config)
    spark.dataSource.register(WeirflowSource)
    ssps = [f"kin.{stream}.{k}" for k in range(virtual)]
    options = {
        "config": config.snapshot(),
        "stream": "views",
        "tasks": json.dumps({key: f"views-v{key.rsplit('.', 1)[1]}" for key in ssps}),
        "system": "kin",
        "physical": stream,
        "ssps": json.dumps(ssps),
        "start": json.dumps({k: {"o": "{}", "e": False} for k in ssps}),
        "serde": "json",
        "user_schema": json.dumps(T._parse_datatype_string(SCHEMA).jsonValue()),
        "event_time_field": "event_time",
        "event_time_from_record": "false",
        "delay_ms": "0",
        "intermediate": "false",
        "bounded": "false",
        "dense": "false",
        "max_records": str(config.get("task.max.records.per.trigger")),
        "read_groups": str(spark.sparkContext.defaultParallelism),  # as a job's queries read it (warm: True)
    }
    frame = spark.readStream.format(SOURCE_NAME).options(**options).load()
    started = time.monotonic()
    query = frame.writeStream.format("noop").trigger(processingTime="100 milliseconds").start()
    seen: dict[int, int] = {}

    def read_all() -> bool:
        for progress in query.recentProgress:
            seen[progress["batchId"]] = int(progress["numInputRows"])
        return sum(seen.values()) >= events

    wait_until(read_all, 900, "the source to read every record", interval_s=0.05)
    elapsed = time.monotonic() - started
    if os.environ.get("BENCH_VERBOSE"):
        for progress in query.recentProgress:
            print(progress["batchId"], progress["numInputRows"], progress["durationMs"], file=sys.stderr)
    query.stop()
    spark.stop()
    # rows = records + the source's control rows (one ``seen`` row per SSP read: weirflow.spark.source)
    if sum(seen.values()) < events:
        raise RuntimeError(f"the source read {sum(seen.values())} rows for {events} records")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--virtual-tasks", type=int, default=16)
    args = parser.parse_args()
    use_dummy_credentials()
    import boto3

    server = Kinesalite().start()
    spool = Path(tempfile.mkdtemp(prefix="kinesis-bench-"))
    try:
        client = boto3.client("kinesis", endpoint_url=server.endpoint)
        stream = "views"
        client.create_stream(StreamName=stream, ShardCount=args.shards)
        client.get_waiter("stream_exists").wait(StreamName=stream, WaiterConfig={"Delay": 0.2})
        client.add_tags_to_stream(StreamName=stream, Tags={"weirflow.virtual.tasks": str(args.virtual_tasks)})
        print(f"writing {args.events} records to {args.shards} shards...", file=sys.stderr)
        produce(client, stream, args.events)
        config = Config.from_dict(
            {
                "job.name": "bench-kinesis-source",
                "job.state.dir": str(spool),
                "systems.kin.factory": "kinesis",
                "systems.kin.endpoint": server.endpoint,
                "systems.kin.region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                "streams.views.system": "kin",
                "streams.views.physical.name": stream,
                "spark.master": "local[2]",
            }
        )
        print("raw boto3 GetRecords loop...", file=sys.stderr)
        baseline_s = raw_boto3(server.endpoint, stream, args.events)
        print("weirflow Spark source...", file=sys.stderr)
        weirflow_s = weirflow_source(config, stream, args.virtual_tasks, args.events)
    finally:
        server.stop()
        shutil.rmtree(spool, ignore_errors=True)
    value, baseline = args.events / weirflow_s, args.events / baseline_s
    print(
        json.dumps(
            {
                "figure": (
                    f"Kinesis read throughput (kinesalite, {args.shards} shards, {args.virtual_tasks} tasks)"
                ),
                "unit": "records/s",
                "value": round(value),
                "baseline": round(baseline),
                "baseline_name": "raw boto3 GetRecords loop (10,000 per call)",
                "ratio": round(value / baseline, 3),
                "target_ratio": 0.9,
                "events": args.events,
                "weirflow_s": round(weirflow_s, 2),
                "baseline_s": round(baseline_s, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
