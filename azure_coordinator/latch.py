"""`Latch` on Table Storage: table ``<prefix>latches``, one partition per latch.

* a participant's row: PartitionKey = latch name, RowKey = participant id (upserted, so joining twice is a
  no-op);
* the outcome row: RowKey ``!state`` with column ``state`` (``complete`` or ``timed_out``). It is *inserted*,
  never updated, so the first of ``complete`` / ``time_out`` wins and later calls change nothing; no row
  means the latch is open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from azure.core.exceptions import ResourceExistsError, ResourceNotFoundError

from weirflow.interfaces.coordination import Latch, LatchState
from weirflow_azure.coordinator.storage import Storage, escape_key, unescape_key

T = TypeVar("T")

STATE_ROW = "!state"  # '!' cannot start an escaped participant id of a sane processor, and sorts first


class TableLatch(Latch):
    def __init__(self, storage: Storage, name: str) -> None:
        self._storage = storage
        self.name = name
        self._pk = escape_key(name)

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        table = self._storage.settings.table_name("latches")
        return self._storage.call(operation, f"{table}/{self.name}", self._storage.table_endpoint, fn)

    @property
    def _table(self) -> Any:
        return self._storage.table("latches")

    def join(self, participant: str) -> None:
        entity = {"PartitionKey": self._pk, "RowKey": escape_key(participant)}
        self._call("join latch", lambda: self._table.upsert_entity(entity))

    def participants(self) -> set[str]:
        def query() -> set[str]:
            rows = self._table.query_entities(
                "PartitionKey eq @pk", parameters={"pk": self._pk}, select=["RowKey"]
            )
            return {unescape_key(r["RowKey"]) for r in rows if r["RowKey"] != STATE_ROW}

        return self._call("read latch", query)

    def _finish(self, state: LatchState) -> None:
        def insert() -> None:
            try:
                self._table.create_entity({"PartitionKey": self._pk, "RowKey": STATE_ROW, "state": state.value})
            except ResourceExistsError:
                pass  # already complete or timed out: the first outcome stands

        self._call(f"mark latch {state.value}", insert)

    def complete(self) -> None:
        self._finish(LatchState.COMPLETE)

    def time_out(self) -> None:
        self._finish(LatchState.TIMED_OUT)

    def state(self) -> LatchState:
        def read() -> LatchState:
            try:
                row = self._table.get_entity(self._pk, STATE_ROW)
            except ResourceNotFoundError:
                return LatchState.OPEN
            return LatchState(row["state"])

        return self._call("read latch state", read)
