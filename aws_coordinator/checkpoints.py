"""`DynamoCheckpointManager` (``task.checkpoint.factory: dynamodb``): checkpoints in DynamoDB.

Table ``<prefix>-checkpoints``, one item per task (``pk`` = task name, ``sk = checkpoint``):

* ``body`` — the checkpoint as zlib-compressed JSON (binary): offsets by SSP, control state;
* ``epoch`` — the greatest lock epoch written (the fencing token);
* ``version`` — a counter every write increments.

**The fence is in the write.** A write reads the item, refuses at once (`FencedOffError`) when the stored epoch is
greater than its own, merges its offsets into the stored ones (an SSP it does not name keeps its offset), and
puts the item back *conditional on the version it read*: a later holder's write in between makes the put fail,
and the write is read and decided again, so a late write of a former holder can neither move offsets backwards
nor revert ``finished``. One item is one atomic write: a reader sees all of a checkpoint or none of it.

DynamoDB items hold at most 400 KB: a checkpoint whose compressed body is larger is refused with
`CheckpointTooLargeError` naming the task (thousands of SSPs with large control state; see docs/aws.md).
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable
from typing import Any, TypeVar

from weirflow_aws.clients import CHECKPOINTS, Aws
from weirflow_aws.errors import CheckpointTooLargeError, is_condition_failure

from weirflow.base.errors import FencedOffError, MalformedDocumentError
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.system import SystemStreamPartition

T = TypeVar("T")

log = logging.getLogger("weirflow.checkpoint")

SORT_KEY = "checkpoint"
MAX_BODY_BYTES = 380_000  # DynamoDB's item limit is 400 KB, key and other attributes included
_RACES = 20  # writes of one task decided again after another write won the race, before giving up


def encode(offsets: dict[SystemStreamPartition, str], control: Any) -> bytes:
    data = {
        "offsets": [[ssp.system, ssp.stream, ssp.partition, offset] for ssp, offset in sorted(offsets.items())]
    }
    if control:
        data["control"] = control
    return zlib.compress(json.dumps(data, separators=(",", ":")).encode(), 6)


def decode(task: str, body: bytes) -> tuple[dict[SystemStreamPartition, str], dict[str, Any]]:
    """(offsets, control) of a stored body; `MalformedDocumentError` naming the task when it is not one (a
    reader must not take an unreadable checkpoint for none: the task would replay from the start)."""
    try:
        data = json.loads(zlib.decompress(body))
        offsets = {
            SystemStreamPartition(str(system), str(stream), int(partition)): str(offset)
            for system, stream, partition, offset in data["offsets"]
        }
        control = data.get("control") or {}
    except (zlib.error, KeyError, TypeError, ValueError) as exc:
        raise MalformedDocumentError(
            f"checkpoint of task {task} is malformed ({type(exc).__name__}: {exc})"
        ) from exc
    if not isinstance(control, dict):
        raise MalformedDocumentError(
            f"checkpoint of task {task}: control is {type(control).__name__}, not an object"
        )
    return offsets, control


class DynamoCheckpointManager(CheckpointManager):
    def __init__(self, aws: Aws) -> None:
        self._aws = aws

    @property
    def table_name(self) -> str:
        return self._aws.table(CHECKPOINTS)

    def _call(self, operation: str, task: str, fn: Callable[[], T]) -> T:
        return self._aws.call(operation, f"{self.table_name}/{task}", self._aws.dynamodb_endpoint, fn)

    def start(self) -> None:
        self._aws.table(CHECKPOINTS)

    def _get(self, task: str) -> dict[str, Any] | None:
        key = {"pk": {"S": task}, "sk": {"S": SORT_KEY}}
        item = self._aws.dynamodb.get_item(TableName=self.table_name, Key=key, ConsistentRead=True).get("Item")
        return dict(item) if item is not None else None

    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None:
        def attempt() -> bool:
            item = self._get(task_name)
            stored_epoch = int(item["epoch"]["N"]) if item else 0
            if checkpoint.epoch < stored_epoch:
                raise FencedOffError(task_name, checkpoint.epoch, stored_epoch)
            offsets: dict[SystemStreamPartition, str] = {}
            control: Any = {}
            if item is not None:
                offsets, control = decode(task_name, bytes(item["body"]["B"]))
            offsets.update({ssp: str(offset) for ssp, offset in checkpoint.offsets.items()})
            if checkpoint.control:
                control = dict(checkpoint.control)
            body = encode(offsets, control)
            if len(body) > MAX_BODY_BYTES:
                raise CheckpointTooLargeError(
                    f"the checkpoint of task {task_name} is {len(body)} bytes compressed, over the "
                    f"{MAX_BODY_BYTES} a DynamoDB item holds ({len(offsets)} SSPs); give the job more tasks"
                )
            version = int(item["version"]["N"]) if item else 0
            new = {
                "pk": {"S": task_name},
                "sk": {"S": SORT_KEY},
                "body": {"B": body},
                "epoch": {"N": str(max(checkpoint.epoch, stored_epoch))},
                "version": {"N": str(version + 1)},
            }
            condition: dict[str, Any] = (
                {"ConditionExpression": "attribute_not_exists(pk)"}
                if item is None
                else {
                    "ConditionExpression": "#v = :v",
                    "ExpressionAttributeNames": {"#v": "version"},
                    "ExpressionAttributeValues": {":v": {"N": str(version)}},
                }
            )
            try:
                self._aws.dynamodb.put_item(TableName=self.table_name, Item=new, **condition)
            except Exception as exc:
                if is_condition_failure(exc):
                    return False  # another write landed since the read: decide again on what it left
                raise
            return True

        for _ in range(_RACES):
            if self._call("write checkpoint to", task_name, attempt):
                return
        raise FencedOffError(task_name, checkpoint.epoch, -1, f"{_RACES} other writes kept landing first")

    def _checkpoint(self, task: str, item: dict[str, Any]) -> Checkpoint:
        try:
            offsets, control = decode(task, bytes(item["body"]["B"]))
            epoch = int(item["epoch"]["N"])
        except (KeyError, TypeError, ValueError) as exc:
            raise MalformedDocumentError(f"checkpoint of task {task} is malformed ({exc!r:.200})") from exc
        return Checkpoint(offsets=offsets, control=control, epoch=epoch)

    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None:
        item = self._call("read checkpoint from", task_name, lambda: self._get(task_name))
        return None if item is None else self._checkpoint(task_name, item)

    def read_all(self) -> dict[str, Checkpoint]:
        def scan() -> list[dict[str, Any]]:
            pages = self._aws.dynamodb.get_paginator("scan").paginate(
                TableName=self.table_name, ConsistentRead=True
            )
            return [item for page in pages for item in page.get("Items", [])]

        items = self._call("read checkpoints from", "*", scan)
        found = {}
        for item in items:
            if item.get("sk", {}).get("S") != SORT_KEY:
                continue
            task = item["pk"]["S"]
            found[task] = self._checkpoint(task, item)
        return dict(sorted(found.items()))

    def stop(self) -> None:
        self._aws.close()
