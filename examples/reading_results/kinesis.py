"""Read a weirflow job's output Kinesis stream with boto3, each result once.

A job's outputs on Kinesis are at least once: a processor killed after a micro-batch's records were sent and
before its checkpoint leaves the batch to the next holder of the task, which sends the records again with the
same id, the last field of each record's JSON object (``weirflow_id``, `systems.<name>.record.id.field`;
docs/guarantees.md, "Reading results once"). Kinesis does not keep the order of one send's records within a
shard, so `ReplayFilter` keeps, per lane of each shard, a window of the places one send can hold: the job's
``spark.sql.execution.arrow.maxRecordsPerBatch`` (10,000 unless the job sets another):

    python examples/reading_results/kinesis.py --stream page-counts [--window 10000] [--endpoint URL]

Reads every shard from its oldest record to its end now, parents before children, and prints each result once,
then how many replays it left out. Needs ``pip install weirflow boto3`` (AWS credentials as boto3 finds them).
A long-running reader (the Kinesis Client Library, a Lambda) feeds the filter the same way, record by record and
shard by shard, and saves ``replays.state()`` with its checkpoints.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import boto3

from weirflow.results import ReplayFilter
from weirflow.results.replay_filter import KINESIS_ID_FIELD, SPARK_BATCH_ROWS

Handler = Callable[[str, dict[str, Any]], None]


def shards_in_order(client: Any, stream: str) -> list[str]:
    """The stream's shards, every parent before its children (a reshard's new shards after the old)."""
    shards: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"StreamName": stream}
    while True:
        page = client.list_shards(**kwargs)
        shards += page["Shards"]
        if not page.get("NextToken"):
            break
        kwargs = {"NextToken": page["NextToken"]}
    ordered: list[str] = []
    pending = {
        s["ShardId"]: [p for p in (s.get("ParentShardId"), s.get("AdjacentParentShardId")) if p] for s in shards
    }
    while pending:
        ready = [s for s, parents in pending.items() if not any(p in pending for p in parents if p)]
        ordered += sorted(ready)
        for shard in ready:
            del pending[shard]
    return ordered


def records_of(client: Any, stream: str, shard: str) -> Iterator[dict[str, Any]]:
    """A shard's records from its oldest to its end now (a closed shard: to its last record)."""
    iterator = client.get_shard_iterator(StreamName=stream, ShardId=shard, ShardIteratorType="TRIM_HORIZON")[
        "ShardIterator"
    ]
    while iterator:
        page = client.get_records(ShardIterator=iterator, Limit=1000)
        yield from page["Records"]
        iterator = page.get("NextShardIterator")
        if not page["Records"] and page.get("MillisBehindLatest", 0) == 0:
            return  # an open shard, read to its end


def read_results(
    client: Any,
    stream: str,
    handle: Handler,
    *,
    window: int | None = SPARK_BATCH_ROWS,
    id_field: str = KINESIS_ID_FIELD,
) -> ReplayFilter:
    """Call ``handle(shard_id, record)`` once per result of ``stream``; return the filter (its ``replays``: how
    many records it left out). ``window``: the job's ``spark.sql.execution.arrow.maxRecordsPerBatch``."""
    replays = ReplayFilter(window)
    for shard in shards_in_order(client, stream):
        for record in records_of(client, stream, shard):
            if replays.is_new_kinesis_record(shard, record, id_field):
                handle(shard, record)
    return replays


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stream", required=True, help="the job's output stream")
    parser.add_argument("--window", type=int, default=SPARK_BATCH_ROWS, help="the job's Arrow batch rows")
    parser.add_argument("--id-field", default=KINESIS_ID_FIELD, help="systems.<name>.record.id.field")
    parser.add_argument("--endpoint", default=None, help="a Kinesis endpoint other than AWS's (kinesalite)")
    args = parser.parse_args()
    client = boto3.client("kinesis", endpoint_url=args.endpoint)

    def show(shard: str, record: dict[str, Any]) -> None:
        print(json.dumps({"shard": shard, "value": record["Data"].decode("utf-8", "replace")}), flush=True)

    replays = read_results(client, args.stream, show, window=args.window, id_field=args.id_field)
    if replays.replays:
        print(f"left out {replays.replays} replayed records", file=sys.stderr)


if __name__ == "__main__":
    main()
