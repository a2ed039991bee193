"""`ProcessorRegistry` in the coordination table: ``pk = processor``, ``sk`` the processor id, the row as JSON
(``row``). A heartbeat replaces the whole item, so a stale field never survives. Liveness is decided by readers
(`weirflow.coordination.state.is_live`).

**Times by the reader's own clock.** DynamoDB stamps nothing a reader could measure an age with, and processors'
clocks may disagree by more than the liveness timeout, so a row's age is never the reader's clock minus the
writer's. As the Kinesis Client Library judges leases, a reader remembers when *it* first saw each row's current
heartbeat (its run, ``beat`` and the writer's own stamp: any write changes one of them) and returns that
moment as ``heartbeat_ms``, on its own clock; a row it writes itself counts as seen when the write returned.
A row whose heartbeat stops changing therefore ages on the reader's clock from the first read that showed it,
which is never before the write: a reader errs on the side of waiting (`weirflow.coordination.silence`). A
reader that has just started sees every row as fresh and judges it after one liveness timeout of watching,
as a new KCL worker does. ``started_ms`` is when the reader first saw the row's run (or, for its own rows,
the writer's value: the same clock).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from weirflow_aws.clients import COORDINATION, Aws

from weirflow.base import clock, malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.coordination import ProcessorInfo, ProcessorRegistry

T = TypeVar("T")

PARTITION = "processor"


def _version(row: ProcessorInfo) -> tuple[str, int, int]:
    """What changes with every heartbeat of a run: compared for equality only, never as times."""
    return row.instance, row.beat, row.heartbeat_ms


class DynamoProcessorRegistry(ProcessorRegistry):
    def __init__(self, aws: Aws) -> None:
        self._aws = aws
        # processor id -> (its heartbeat's version, local ms first seen, local ms its run was first seen)
        self._seen: dict[str, tuple[tuple[str, int, int], int, int]] = {}
        self._lock = threading.Lock()

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        table = self._aws.table(COORDINATION)
        return self._aws.call(operation, f"{table}/{PARTITION}", self._aws.dynamodb_endpoint, fn)

    def heartbeat(self, info: ProcessorInfo) -> None:
        item = {
            "pk": {"S": PARTITION},
            "sk": {"S": info.processor_id},
            "row": {"S": json.dumps(info.to_json())},
        }
        table = self._aws.table(COORDINATION)
        self._call("write heartbeat to", lambda: self._aws.dynamodb.put_item(TableName=table, Item=item))
        now = clock.now_ms()
        with self._lock:
            self._seen[info.processor_id] = (_version(info), now, info.started_ms)

    def _items(self) -> list[dict[str, Any]]:
        table = self._aws.table(COORDINATION)
        paginator = self._aws.dynamodb.get_paginator("query")
        pages = paginator.paginate(
            TableName=table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues={":pk": {"S": PARTITION}},
            ConsistentRead=True,
        )
        return [item for page in pages for item in page.get("Items", [])]

    def processors(self) -> list[ProcessorInfo]:
        items = self._call("read processors from", self._items)
        now = clock.now_ms()  # after the read: a row is never seen before it was written
        rows: list[ProcessorInfo] = []
        with self._lock:
            present = set()
            for item in items:
                name = item.get("sk", {}).get("S", "?")
                try:
                    row = ProcessorInfo.from_json(json.loads(item["row"]["S"]))
                except (KeyError, TypeError, ValueError, MalformedDocumentError) as exc:
                    malformed.report(f"processor/{name}", exc, dict(item), action="skipped (not a member)")
                    continue
                present.add(row.processor_id)
                version = _version(row)
                seen = self._seen.get(row.processor_id)
                if seen is None or seen[0] != version:
                    started = seen[2] if seen is not None and seen[0][0] == row.instance else now
                    seen = (version, now, started)
                    self._seen[row.processor_id] = seen
                row.heartbeat_ms, row.started_ms = seen[1], seen[2]
                rows.append(row)
            for gone in set(self._seen) - present:
                del self._seen[gone]
        return sorted(rows, key=lambda p: p.processor_id)

    def unregister(self, processor_id: str) -> None:
        table = self._aws.table(COORDINATION)
        key = {"pk": {"S": PARTITION}, "sk": {"S": processor_id}}
        self._call("unregister processor in", lambda: self._aws.dynamodb.delete_item(TableName=table, Key=key))
        with self._lock:
            self._seen.pop(processor_id, None)
