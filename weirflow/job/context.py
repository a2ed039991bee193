"""Everything a processor (or `weirflow status`) opens for one job, built from the configured factories."""

from __future__ import annotations

from dataclasses import dataclass

from weirflow.config.loader import Config
from weirflow.interfaces.checkpoint import CheckpointManager
from weirflow.interfaces.coordination import CoordinationUtils
from weirflow.interfaces.metadata import MetadataStore
from weirflow.interfaces.plugins import (
    checkpoint_factory,
    coordinator_factory,
    metadata_store_factory,
    validate_factories,
)
from weirflow.interfaces.timings import CoordinationTimings
from weirflow.job.mode import JobMode
from weirflow.job.systems import Systems


@dataclass
class JobContext:
    config: Config
    owner: str
    coordination: CoordinationUtils
    metadata: MetadataStore
    checkpoints: CheckpointManager
    systems: Systems
    mode: JobMode  # a pipeline or a record job, decided once from the config (`weirflow.job.mode`)

    @classmethod
    def open(
        cls, config: Config, owner: str, instance: str = "", timings: CoordinationTimings | None = None
    ) -> JobContext:
        """Resolve every factory first (a wrong value fails here, before anything is created), then open.
        ``timings`` (the processor's, read once from ``config``) go to the coordinator factory."""
        validate_factories(config)
        coordinator = coordinator_factory(config)
        metadata_factory = metadata_store_factory(config)
        checkpoints_factory = checkpoint_factory(config)
        metadata = metadata_factory.get_metadata_store(config)
        metadata.start()
        checkpoints = checkpoints_factory.get_checkpoint_manager(config)
        checkpoints.start()
        return cls(
            config=config,
            owner=owner,
            coordination=coordinator.get_coordination_utils(config, owner, instance=instance, timings=timings),
            metadata=metadata,
            checkpoints=checkpoints,
            systems=Systems(config),
            mode=JobMode.of(config),
        )

    def close(self) -> None:
        self.systems.close()
        self.checkpoints.stop()
        self.metadata.stop()
        self.coordination.close()
