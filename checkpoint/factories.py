"""The ``azure-table`` alias: `task.checkpoint.factory: azure-table`."""

from __future__ import annotations

import re

from weirflow.interfaces.checkpoint import CheckpointManager, CheckpointManagerFactory
from weirflow.interfaces.config import ConfigView
from weirflow_azure.checkpoint.eventhubs_layout import layouts_of
from weirflow_azure.checkpoint.table import TABLE_SUFFIX, TableCheckpointManager
from weirflow_azure.coordinator.storage import Storage
from weirflow_azure.eventhubs.checkpoint_blobs import open_blob_checkpoints
from weirflow_azure.eventhubs.configured import eventhubs_systems


class TableCheckpointManagerFactory(CheckpointManagerFactory):
    def get_checkpoint_manager(self, config: ConfigView) -> CheckpointManager:
        storage = Storage.from_config(config)
        layouts = layouts_of(config)
        eventhubs = eventhubs_systems(config) if layouts else {}
        table = config.get("task.checkpoint.azure.eventhubs.table") or storage.settings.table_name(TABLE_SUFFIX)
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9]{2,62}", table):
            raise config.error(
                "task.checkpoint.azure.eventhubs.table",
                f"'{table}' is not a valid table name: 3-63 letters and digits, starting with a letter",
            )
        blobs = open_blob_checkpoints(config, storage) if eventhubs and "blob" in layouts else None
        return TableCheckpointManager(
            storage,
            eventhubs=eventhubs,
            eventhubs_table=table,
            table_layout="table" in layouts,
            eventhubs_blobs=blobs,
        )
