"""`ProcessorRegistry` on Table Storage: table ``<prefix>processors``, PartitionKey ``processors``, RowKey the
processor id; one column per `ProcessorInfo` field (``tasks`` as a JSON list). A heartbeat replaces the whole
row, so a stale field never survives. Liveness is decided by readers (`weirflow.coordination.state.is_live`).

**Times by the store's clock.** Processors run on different hosts whose clocks may disagree by more than the
liveness timeout, so a row's age is never the reader's clock minus the writer's. The service stamps every
entity it writes (``Timestamp``) and every response (``Date``); `processors` measures each row's age on that
one clock (the response's time minus the row's stamp) and returns ``heartbeat_ms`` as the reader's "now"
minus that age. The registration time is carried the same way: a writer converts its ``started_ms`` to the
store's clock with the offset it learned from its previous write's ``Date`` (``started_store_ms``); the very
first row, written before any offset is known, is its own registration, so its ``Timestamp`` is used.
``Date`` has a resolution of one second: ages are good to about a second (see docs/coordination.md).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from datetime import datetime
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from weirflow.base import clock, malformed
from weirflow.base.errors import MalformedDocumentError
from weirflow.interfaces.coordination import ProcessorInfo, ProcessorRegistry
from weirflow_azure.coordinator.storage import Storage, escape_key

T = TypeVar("T")

PARTITION = "processors"
STARTED_STORE_COLUMN = "started_store_ms"

log = logging.getLogger("weirflow.azure")


def _epoch_ms(moment: datetime) -> int:
    return int(moment.timestamp() * 1000)


def _response_ms(date: Any) -> int | None:
    """A response's ``Date`` (an HTTP date string, or the datetime the SDK parsed from it) in epoch ms."""
    if isinstance(date, datetime):
        return _epoch_ms(date)
    if isinstance(date, str) and date:
        try:
            return _epoch_ms(parsedate_to_datetime(date))
        except (TypeError, ValueError):
            return None
    return None


def _to_entity(info: ProcessorInfo) -> dict[str, Any]:
    data = info.to_json()
    entity: dict[str, Any] = {"PartitionKey": PARTITION, "RowKey": escape_key(info.processor_id)}
    for name, value in data.items():
        if name == "tasks":
            entity[name] = json.dumps(value)
        elif isinstance(value, int) and not isinstance(value, bool):
            entity[name] = str(value)  # epoch ms exceed Edm.Int32; strings keep every int exact
        else:
            entity[name] = value
    return entity


def _from_entity(entity: Any) -> ProcessorInfo:
    """The row of an entity; `MalformedDocumentError` (via `ProcessorInfo.from_json`) when it is not one."""
    try:
        row = {
            "processor_id": entity["processor_id"],
            "host": entity.get("host", ""),
            "pid": int(entity.get("pid", 0)),
            "state": entity.get("state", ""),
            "job_model_version": int(entity.get("job_model_version", -1)),
            "tasks": json.loads(entity.get("tasks") or "[]"),
            "endpoint": entity.get("endpoint", ""),
            "heartbeat_ms": int(entity.get("heartbeat_ms", 0)),
            "started_ms": int(entity.get("started_ms", 0)),
            "error": entity.get("error", ""),
            "instance": entity.get("instance", ""),
            "beat": int(entity.get("beat", 0)),
        }
    except (KeyError, TypeError, ValueError, OverflowError) as exc:
        raise MalformedDocumentError(f"processor row is malformed ({type(exc).__name__}: {exc})") from exc
    return ProcessorInfo.from_json(row)


def _readable(entities: list[Any]) -> list[tuple[Any, ProcessorInfo]]:
    """(entity, row) of every entity that is a processor row; a malformed one is reported once
    (`weirflow.base.malformed`) and left out, so one bad row neither stops the leader nor fails ``/status``."""
    found = []
    for entity in entities:
        try:
            found.append((entity, _from_entity(entity)))
        except MalformedDocumentError as exc:
            name = f"processor/{entity.get('RowKey', '?')}"
            malformed.report(name, exc, dict(entity), action="skipped (not a member)")
    return found


def _on_store_clock(entity: Any, row: ProcessorInfo, store_now_ms: int, local_now_ms: int) -> ProcessorInfo:
    """``row`` with its heartbeat and registration times measured on the store's clock, expressed on the
    reader's: a row written ``age`` ago by the store gets ``heartbeat_ms = local_now - age``."""
    stamp = _epoch_ms(entity.metadata["timestamp"])
    started = int(entity.get(STARTED_STORE_COLUMN) or stamp)
    row.heartbeat_ms = local_now_ms - max(0, store_now_ms - stamp)
    row.started_ms = local_now_ms - max(0, store_now_ms - started)
    return row


class TableProcessorRegistry(ProcessorRegistry):
    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        # the store's clock minus this process's, learned from each write's response; None before the first
        self._offset_ms: int | None = None
        self._warned = False

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        table = self._storage.settings.table_name("processors")
        return self._storage.call(operation, table, self._storage.table_endpoint, fn)

    def heartbeat(self, info: ProcessorInfo) -> None:
        entity = _to_entity(info)
        if self._offset_ms is not None:
            entity[STARTED_STORE_COLUMN] = str(info.started_ms + self._offset_ms)
        sent_ms = clock.now_ms()
        result = self._call(
            "write heartbeat to",
            lambda: self._storage.table("processors").upsert_entity(entity, mode=UpdateMode.REPLACE),
        )
        received_ms = clock.now_ms()
        store_ms = _response_ms(result.get("date") if isinstance(result, dict) else None)
        if store_ms is not None:
            # ``Date`` is truncated to the second: its middle is the best guess, the request's middle ours
            self._offset_ms = store_ms + 500 - (sent_ms + received_ms) // 2

    def processors(self) -> list[ProcessorInfo]:
        def query() -> tuple[list[Any], int | None]:
            dates: list[Any] = []
            entities = list(
                self._storage.table("processors").query_entities(
                    "PartitionKey eq @pk",
                    parameters={"pk": PARTITION},
                    raw_response_hook=lambda response: dates.append(response.http_response.headers.get("Date")),
                )
            )
            return entities, _response_ms(dates[-1]) if dates else None

        read, store_ms = self._call("read processors from", query)
        local_now = clock.now_ms()
        pairs = _readable(read)
        entities, rows = [e for e, _ in pairs], [r for _, r in pairs]
        if store_ms is None:
            if not self._warned:
                self._warned = True
                log.warning("the table service sent no Date header: judging heartbeats by the writers' clocks")
        else:
            # the freshest stamp is a lower bound of the store's "now" finer than Date's second
            store_now = max([store_ms, *(_epoch_ms(e.metadata["timestamp"]) for e in entities)])
            rows = [_on_store_clock(e, r, store_now, local_now) for e, r in zip(entities, rows, strict=True)]
        return sorted(rows, key=lambda p: p.processor_id)

    def unregister(self, processor_id: str) -> None:
        def delete() -> None:
            try:
                self._storage.table("processors").delete_entity(PARTITION, escape_key(processor_id))
            except ResourceNotFoundError:
                pass

        self._call("unregister processor in", delete)
