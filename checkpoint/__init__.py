"""Checkpoint managers of the Azure suite: `TableCheckpointManager` (``task.checkpoint.factory: azure-table``),
which also writes Event Hubs checkpoints in the Azure SDKs' table layout
(`weirflow_azure.eventhubs.checkpoint_layout`)."""
