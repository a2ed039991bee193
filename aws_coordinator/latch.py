"""`Latch` in the coordination table, one partition per latch (``pk = latch/<name>``):

* a participant's item: ``sk`` = participant id (put, so joining twice is a no-op);
* the outcome item: ``sk = !state`` with ``state`` (``complete`` or ``timed_out``), put only if absent, so
  the first of ``complete`` / ``time_out`` wins and later calls change nothing; no item means open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from weirflow_aws.clients import COORDINATION, Aws
from weirflow_aws.errors import is_condition_failure

from weirflow.interfaces.coordination import Latch, LatchState

T = TypeVar("T")

STATE = "!state"  # '!' sorts before the ids of sane processors


class DynamoLatch(Latch):
    def __init__(self, aws: Aws, name: str) -> None:
        self._aws = aws
        self.name = name
        self._pk = f"latch/{name}"

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        return self._aws.call(operation, f"{self._table}/{self._pk}", self._aws.dynamodb_endpoint, fn)

    @property
    def _table(self) -> str:
        return self._aws.table(COORDINATION)

    def join(self, participant: str) -> None:
        item = {"pk": {"S": self._pk}, "sk": {"S": participant}}
        self._call("join latch", lambda: self._aws.dynamodb.put_item(TableName=self._table, Item=item))

    def participants(self) -> set[str]:
        def query() -> set[str]:
            pages = self._aws.dynamodb.get_paginator("query").paginate(
                TableName=self._table,
                KeyConditionExpression="pk = :pk",
                ExpressionAttributeValues={":pk": {"S": self._pk}},
                ProjectionExpression="sk",
                ConsistentRead=True,
            )
            return {i["sk"]["S"] for page in pages for i in page.get("Items", []) if i["sk"]["S"] != STATE}

        return self._call("read latch", query)

    def _finish(self, state: LatchState) -> None:
        item = {"pk": {"S": self._pk}, "sk": {"S": STATE}, "state": {"S": state.value}}

        def put() -> None:
            try:
                self._aws.dynamodb.put_item(
                    TableName=self._table, Item=item, ConditionExpression="attribute_not_exists(pk)"
                )
            except Exception as exc:
                if not is_condition_failure(exc):
                    raise  # otherwise already complete or timed out: the first outcome stands

        self._call(f"mark latch {state.value}", put)

    def complete(self) -> None:
        self._finish(LatchState.COMPLETE)

    def time_out(self) -> None:
        self._finish(LatchState.TIMED_OUT)

    def state(self) -> LatchState:
        def read() -> LatchState:
            item = self._aws.dynamodb.get_item(
                TableName=self._table, Key={"pk": {"S": self._pk}, "sk": {"S": STATE}}, ConsistentRead=True
            ).get("Item")
            return LatchState.OPEN if item is None else LatchState(item["state"]["S"])

        return self._call("read latch state", read)
