"""`ProcessorRegistry` on Table Storage: table ``<prefix>processors``, PartitionKey ``processors``, RowKey the
processor id; one column per `ProcessorInfo` field (``tasks`` as a JSON list). A heartbeat replaces the whole
row, so a stale field never survives. Liveness is decided by readers (`weirflow.coordination.state.is_live`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import UpdateMode

from weirflow.interfaces.coordination import ProcessorInfo, ProcessorRegistry
from weirflow_azure.coordinator.storage import Storage, escape_key

T = TypeVar("T")

PARTITION = "processors"


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
    return ProcessorInfo(
        processor_id=entity["processor_id"],
        host=entity.get("host", ""),
        pid=int(entity.get("pid", 0)),
        state=entity.get("state", ""),
        job_model_version=int(entity.get("job_model_version", -1)),
        tasks=json.loads(entity.get("tasks") or "[]"),
        endpoint=entity.get("endpoint", ""),
        heartbeat_ms=int(entity.get("heartbeat_ms", 0)),
        started_ms=int(entity.get("started_ms", 0)),
        error=entity.get("error", ""),
        instance=entity.get("instance", ""),
    )


class TableProcessorRegistry(ProcessorRegistry):
    def __init__(self, storage: Storage) -> None:
        self._storage = storage

    def _call(self, operation: str, fn: Callable[[], T]) -> T:
        table = self._storage.settings.table_name("processors")
        return self._storage.call(operation, table, self._storage.table_endpoint, fn)

    def heartbeat(self, info: ProcessorInfo) -> None:
        entity = _to_entity(info)
        self._call(
            "write heartbeat to",
            lambda: self._storage.table("processors").upsert_entity(entity, mode=UpdateMode.REPLACE),
        )

    def processors(self) -> list[ProcessorInfo]:
        def query() -> list[ProcessorInfo]:
            rows = self._storage.table("processors").query_entities(
                "PartitionKey eq @pk", parameters={"pk": PARTITION}
            )
            return sorted((_from_entity(r) for r in rows), key=lambda p: p.processor_id)

        return self._call("read processors from", query)

    def unregister(self, processor_id: str) -> None:
        def delete() -> None:
            try:
                self._storage.table("processors").delete_entity(PARTITION, escape_key(processor_id))
            except ResourceNotFoundError:
                pass

        self._call("unregister processor in", delete)
