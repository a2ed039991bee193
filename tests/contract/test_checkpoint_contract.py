"""CheckpointManager contract (`weirflow.testing.contracts.checkpoint`) on each backend."""

from weirflow.testing import CheckpointManagerContract


class TestCheckpointManager(CheckpointManagerContract):
    pass
