"""Which of the Event Hubs SDKs' checkpoint layouts the checkpoint manager writes beside its own rows
(``task.checkpoint.azure.eventhubs.layout``: ``table``, ``blob``, ``both`` (the default) or ``none``).

The layouts themselves, and which systems are Event Hubs, belong to the Event Hubs plugin
(`weirflow_azure.eventhubs.checkpoint_layout`, `weirflow_azure.eventhubs.checkpoint_blobs`).
"""

from __future__ import annotations

from weirflow.interfaces.config import ConfigView

LAYOUTS = ("table", "blob")
LAYOUT_KEY = "task.checkpoint.azure.eventhubs.layout"


def layouts_of(config: ConfigView) -> frozenset[str]:
    """``task.checkpoint.azure.eventhubs.layout`` as the set of layouts to write: ``table``, ``blob``, ``both``
    or ``none`` (``true`` / ``false``, its values when it was a switch, mean ``both`` / ``none``)."""
    value = str(config.get(LAYOUT_KEY)).strip().lower()
    chosen = {"both": LAYOUTS, "true": LAYOUTS, "none": (), "false": (), "table": ("table",), "blob": ("blob",)}
    if value not in chosen:
        raise config.error(LAYOUT_KEY, f"'{value}' is not one of table, blob, both, none")
    return frozenset(chosen[value])
