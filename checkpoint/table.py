"""`TableCheckpointManager` (``task.checkpoint.factory: azure-table``): checkpoints in Azure Table Storage.

Table ``<prefix>checkpoints`` (see `weirflow_azure.coordinator.storage` for the prefix), one partition per task:

* one row per SSP — RowKey ``ssp:<system.stream.partition>``, columns ``system``, ``stream``,
  ``partition`` (int) and ``offset`` (the next offset to read, as the system's string);
* the fence row — RowKey ``~fence``, column ``epoch``: the greatest lock epoch written (the fencing token);
  every write is conditional on it, in its first transaction (`TableCheckpointManager._fence_operation`);
* the control row — RowKey ``~control``, column ``control`` (JSON), split over ``control_1`` ... when it
  outgrows one string property (32K characters), with ``chunks`` counting the parts.

A write upserts its rows in entity-group transactions of at most 100 rows (Table Storage's limit; all rows
of a task share its PartitionKey, which transactions require). A checkpoint of up to 98 SSPs plus control
(plus the fence row) is therefore atomic. A wider one is written in several transactions, the fence row
and the first SSP rows first, the control row last: a reader racing the write sees, for some SSPs, the
previous offsets — an older, equally valid checkpoint (inputs are replayed, never skipped) — and never
control state ahead of the offsets it belongs to.

Keys are escaped (`escape_key`) because Table keys may not contain ``/ \\ # ?``.

Event Hubs SSPs are also written in the Azure SDKs' layouts, table rows and/or blobs, after the checkpoint's own
rows (see `weirflow_azure.eventhubs.checkpoint_layout`).
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from azure.core import MatchConditions
from azure.core.exceptions import ResourceNotFoundError
from azure.data.tables import EntityProperty, TableTransactionError, UpdateMode

from weirflow.base.errors import FencedOffError, MalformedDocumentError
from weirflow.interfaces.checkpoint import Checkpoint, CheckpointManager
from weirflow.interfaces.system import SystemStreamPartition
from weirflow_azure.coordinator.storage import Storage, escape_key, unescape_key
from weirflow_azure.eventhubs.checkpoint_blobs import BlobCheckpoints
from weirflow_azure.eventhubs.checkpoint_layout import EventHubsSystem, sdk_checkpoints

T = TypeVar("T")

log = logging.getLogger("weirflow.checkpoint")

TABLE_SUFFIX = "checkpoints"
SSP_PREFIX = "ssp:"
CONTROL_ROW = "~control"
FENCE_ROW = "~fence"
_IF_MATCH = MatchConditions.IfNotModified
MAX_BATCH = 100
CHUNK_CHARS = 30_000  # a string property holds 64 KiB of UTF-16: 32K characters


def batches(entities: Iterable[dict[str, Any]], size: int = MAX_BATCH) -> Iterator[list[dict[str, Any]]]:
    """Group rows into transactions: consecutive rows of one PartitionKey, at most ``size`` per group."""
    batch: list[dict[str, Any]] = []
    for entity in entities:
        if batch and (len(batch) == size or batch[0]["PartitionKey"] != entity["PartitionKey"]):
            yield batch
            batch = []
        batch.append(entity)
    if batch:
        yield batch


def _control_row(partition_key: str, control: Any) -> dict[str, Any]:
    text = json.dumps(control)
    parts = [text[i : i + CHUNK_CHARS] for i in range(0, len(text), CHUNK_CHARS)] or [""]
    row: dict[str, Any] = {"PartitionKey": partition_key, "RowKey": CONTROL_ROW, "control": parts[0]}
    if len(parts) > 1:
        row["chunks"] = len(parts)
        row.update({f"control_{i}": part for i, part in enumerate(parts[1:], start=1)})
    return row


def _control_of(row: Any) -> Any:
    chunks = _integer(row.get("chunks") or 1)
    return json.loads(_text(row["control"]) + "".join(_text(row[f"control_{i}"]) for i in range(1, chunks)))


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise MalformedDocumentError(f"a string was expected, not {value!r:.100}")
    return value


def _integer(value: Any) -> int:
    """An integer property: the SDK returns an Int32 as an int and an Int64 as an `EntityProperty`."""
    if isinstance(value, EntityProperty):
        value = value.value
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise MalformedDocumentError(f"an integer was expected, not {value!r:.100}")
    return int(value)


def _transact(table: Any, operations: list[Any], fence: tuple[str, dict[str, Any], dict[str, Any]] | None) -> None:
    """Submit one transaction; a failed fence condition (another holder wrote since it was read) refuses it."""
    try:
        table.submit_transaction(operations)
    except TableTransactionError as exc:
        if fence is not None and exc.status_code in (409, 412):
            entity = fence[1]
            raise FencedOffError(unescape_key(entity["PartitionKey"]), int(entity["epoch"]), -1) from exc
        raise


def checkpoint_rows(task_name: str, checkpoint: Checkpoint) -> list[dict[str, Any]]:
    """The entities a checkpoint of ``task_name`` is stored as, without the fence row: one per input position
    (ordered by SSP) and the control row when there is one."""
    pk = escape_key(task_name)
    rows: list[dict[str, Any]] = [
        {
            "PartitionKey": pk,
            "RowKey": SSP_PREFIX + escape_key(ssp.key()),
            "system": ssp.system,
            "stream": ssp.stream,
            "partition": ssp.partition,
            "offset": str(offset),
        }
        for ssp, offset in sorted(checkpoint.offsets.items(), key=lambda item: item[0].key())
    ]
    if checkpoint.control:
        rows.append(_control_row(pk, checkpoint.control))
    return rows


class TableCheckpointManager(CheckpointManager):
    """Checkpoints of one job in Table Storage.

    ``eventhubs`` maps system names to their Event Hubs coordinates; their SSPs are also written in the SDKs'
    layouts: rows in the table ``eventhubs_table`` (default: the checkpoint table itself) unless
    ``table_layout`` is False, and blobs through ``eventhubs_blobs`` when given. Empty ``eventhubs`` disables
    both.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        eventhubs: dict[str, EventHubsSystem] | None = None,
        eventhubs_table: str | None = None,
        table_layout: bool = True,
        eventhubs_blobs: BlobCheckpoints | None = None,
    ) -> None:
        self._storage = storage
        self._eventhubs = eventhubs or {}
        self._eventhubs_table = eventhubs_table or storage.settings.table_name(TABLE_SUFFIX)
        self._table_layout = table_layout
        self._blobs = eventhubs_blobs

    @property
    def table_name(self) -> str:
        return self._storage.settings.table_name(TABLE_SUFFIX)

    @property
    def eventhubs_table_name(self) -> str:
        return self._eventhubs_table

    def _call(self, operation: str, resource: str, fn: Callable[[], T]) -> T:
        return self._storage.call(operation, resource, self._storage.table_endpoint, fn)

    def start(self) -> None:
        self._storage.table(TABLE_SUFFIX)
        if self._eventhubs and self._table_layout:
            self._storage.table_named(self._eventhubs_table)

    def write_checkpoint(self, task_name: str, checkpoint: Checkpoint) -> None:
        """The fence row first (conditional on what was read), then the rows: one transaction when they fit."""
        pk = escape_key(task_name)
        rows = checkpoint_rows(task_name, checkpoint)
        fence = self._fence_operation(task_name, pk, checkpoint.epoch)
        self._submit(self.table_name, rows, f"{self.table_name}/{task_name}", first=fence)
        if not self._eventhubs:
            return
        sdk = sdk_checkpoints(checkpoint, self._eventhubs)
        if self._table_layout:
            sdk_rows = sorted((cp.table_row() for cp in sdk), key=lambda r: r["PartitionKey"])
            self._submit(self._eventhubs_table, sdk_rows, f"{self.eventhubs_table_name} (Event Hubs layout)")
        if self._blobs is not None:
            self._blobs.write(sdk)

    def _fence_operation(self, task_name: str, pk: str, epoch: int) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """The transaction operation that makes a write conditional on the task's fencing token: the fence row
        (``~fence``, column ``epoch``) is read; a greater stored epoch refuses the write at once; otherwise the
        row is written back with this epoch *if it is unchanged since the read* (If-Match on its ETag, or create
        when absent), in the same transaction as the first rows — so a later holder's write in between makes
        this one fail as a whole (`FencedOffError`)."""
        table = self._storage.table(TABLE_SUFFIX)

        def read() -> Any:
            try:
                return table.get_entity(pk, FENCE_ROW)
            except ResourceNotFoundError:
                return None

        row = self._call("read checkpoint fence from", f"{self.table_name}/{task_name}", read)
        stored = int(row["epoch"]) if row is not None else 0
        if epoch < stored:
            raise FencedOffError(task_name, epoch, stored)
        entity = {"PartitionKey": pk, "RowKey": FENCE_ROW, "epoch": str(max(epoch, stored))}
        if row is None:
            return ("create", entity, {})
        etag = row.metadata["etag"]
        return ("update", entity, {"mode": UpdateMode.REPLACE, "etag": etag, "match_condition": _IF_MATCH})

    def _submit(
        self,
        table_name: str,
        rows: list[dict[str, Any]],
        resource: str,
        first: tuple[str, dict[str, Any], dict[str, Any]] | None = None,
    ) -> None:
        table = self._storage.table_named(table_name)
        groups = list(batches(rows, MAX_BATCH - 1)) if first is not None else list(batches(rows))
        for index, batch in enumerate(groups or [[]]):
            operations: list[Any] = [("upsert", row, {"mode": UpdateMode.REPLACE}) for row in batch]
            if index == 0 and first is not None:
                operations.insert(0, first)
            if not operations:
                continue
            fenced = first if index == 0 else None
            self._call("write checkpoint to", resource, functools.partial(_transact, table, operations, fenced))

    def _rows(self, task_name: str | None) -> list[Any]:
        table = self._storage.table(TABLE_SUFFIX)

        def query() -> list[Any]:
            if task_name is None:
                return list(table.list_entities())
            return list(table.query_entities("PartitionKey eq @pk", parameters={"pk": escape_key(task_name)}))

        return self._call("read checkpoints from", f"{self.table_name}/{task_name or '*'}", query)

    @staticmethod
    def _assemble(rows: Iterable[Any]) -> dict[str, Checkpoint]:
        offsets: dict[str, dict[SystemStreamPartition, str]] = {}
        controls: dict[str, Any] = {}
        epochs: dict[str, int] = {}
        for row in rows:
            task = unescape_key(str(row.get("PartitionKey", "")))
            key = row.get("RowKey")
            try:
                if not isinstance(key, str):
                    continue  # not a row of ours (nor of the SDK layout)
                if key.startswith(SSP_PREFIX):
                    ssp = SystemStreamPartition(
                        _text(row["system"]), _text(row["stream"]), _integer(row["partition"])
                    )
                    offsets.setdefault(task, {})[ssp] = _text(row["offset"])
                elif key == CONTROL_ROW:
                    controls[task] = _control_of(row)
                elif key == FENCE_ROW:
                    epochs[task] = _integer(row["epoch"])
                # anything else (the SDK layout sharing this table) is not ours
            except (KeyError, TypeError, ValueError, OverflowError) as exc:
                # a reader must not take an unreadable checkpoint for none: the task would replay from the start
                raise MalformedDocumentError(
                    f"checkpoint of task {task}: row {key!r:.100} is malformed ({type(exc).__name__}: {exc})"
                ) from exc
        return {
            task: Checkpoint(
                offsets=offsets.get(task, {}), control=controls.get(task, {}), epoch=epochs.get(task, 0)
            )
            for task in sorted(offsets.keys() | controls.keys() | epochs.keys())
        }

    def read_last_checkpoint(self, task_name: str) -> Checkpoint | None:
        return self._assemble(self._rows(task_name)).get(task_name)

    def read_all(self) -> dict[str, Checkpoint]:
        return self._assemble(self._rows(None))

    def read_sdk_rows(self) -> list[dict[str, Any]]:
        """Every row in the Event Hubs SDK layout, as the SDKs' checkpoint stores would read them. Nothing in
        the runtime calls it (weirflow resumes from its own rows); it is for tools and tests that check what an
        SDK processor taking over would see."""
        table = self._storage.table_named(self._eventhubs_table)

        def query() -> list[dict[str, Any]]:
            return [dict(row) for row in table.list_entities() if str(row["PartitionKey"]).endswith(" Checkpoint")]

        return self._call("read Event Hubs checkpoints from", self.eventhubs_table_name, query)

    def stop(self) -> None:
        self._storage.close()
