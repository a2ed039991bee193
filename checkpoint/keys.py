"""The ``azure-table`` checkpoint manager's keys; registered under ``weirflow.config_keys`` as ``azure-table``
(pyproject.toml). The storage account keys it shares with the coordinator are in
`weirflow_azure.coordinator.keys`."""

from __future__ import annotations

from weirflow.interfaces.config import ConfigKey
from weirflow_azure.coordinator.keys import SECTION

KEYS: tuple[ConfigKey, ...] = (
    ConfigKey(
        "task.checkpoint.azure.eventhubs.layout",
        "str",
        "both",
        "Where `azure-table` checkpoints also write Event Hubs positions in the Azure SDKs' layouts, so SDK "
        "consumers (any language) and KEDA's scaler resume or measure lag there: `blob` (one blob per partition, "
        "`<namespace>/<hub>/<consumer group>/checkpoint/<partition>`, what every released SDK reads), `table` "
        "(rows `<namespace> <hub> <consumer group> Checkpoint`), `both` or `none`.",
        SECTION,
    ),
    ConfigKey(
        "task.checkpoint.azure.eventhubs.container",
        "str",
        None,
        "Blob container of the Event Hubs SDK-layout checkpoint blobs, in the job's storage account; also where "
        "`streams.<id>.start: sdk-checkpoint` reads an SDK consumer app's checkpoints. Default: the job's "
        "container (`azure.storage.container`).",
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
