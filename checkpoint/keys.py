"""The ``azure-table`` checkpoint manager's keys; registered under ``weirflow.config_keys`` as ``azure-table``
(pyproject.toml). The storage account keys it shares with the coordinator are in
`weirflow_azure.coordinator.keys`."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey
from weirflow_azure.coordinator.keys import SECTION

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "task.checkpoint.azure.eventhubs.layout",
        "bool",
        True,
        "`azure-table` checkpoints also write Event Hubs positions in the Azure SDKs' table layout "
        "(PartitionKey `<namespace> <hub> <consumer group> Checkpoint`), so SDK processors can resume there.",
        SECTION,
    ),
    ConfigKey(
        "task.checkpoint.azure.eventhubs.table",
        "str",
        None,
        "Table of the Event Hubs SDK-layout rows; default the job's checkpoint table `<prefix>checkpoints`.",
        SECTION,
    ),
)
