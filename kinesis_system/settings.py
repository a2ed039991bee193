"""How a ``kinesis`` system reaches its service and reads it, read once from ``systems.<name>.*``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from weirflow.interfaces.config import ConfigView
from weirflow_kinesis.keys import MAX_RETENTION_HOURS, MAX_VIRTUAL_TASKS, MIN_RETENTION_HOURS


@dataclass(frozen=True)
class KinesisSettings:
    system: str
    virtual_tasks: int
    region: str | None
    endpoint: str | None
    shards: int
    read_interval_ms: int
    shard_refresh_ms: int
    spool_dir: Path
    spool_retention_ms: int
    send_attempts: int
    record_id_field: str = "weirflow_id"
    spool_max_bytes: int = 256 * 1024 * 1024
    read_failures: int = 5
    retention_hours: int = MIN_RETENTION_HOURS

    @classmethod
    def from_config(cls, system: str, config: ConfigView) -> KinesisSettings:
        prefix = f"systems.{system}."
        virtual = int(config.get(prefix + "virtual.tasks"))
        if not 1 <= virtual <= MAX_VIRTUAL_TASKS:
            raise config.error(prefix + "virtual.tasks", f"{virtual} is not between 1 and {MAX_VIRTUAL_TASKS}")
        shards = int(config.get(prefix + "shards"))
        if shards < 1:
            raise config.error(prefix + "shards", f"{shards} shards: a stream needs at least one")
        for key in ("read.interval.ms", "shard.refresh.ms", "spool.retention.ms"):
            if int(config.get(prefix + key)) < 0:
                raise config.error(prefix + key, "must not be negative")
        retention = int(config.get(prefix + "retention.hours"))
        if not MIN_RETENTION_HOURS <= retention <= MAX_RETENTION_HOURS:
            raise config.error(
                prefix + "retention.hours",
                f"{retention} hours: Kinesis keeps records {MIN_RETENTION_HOURS} to {MAX_RETENTION_HOURS} hours",
            )
        attempts = int(config.get(prefix + "send.attempts"))
        if attempts < 1:
            raise config.error(prefix + "send.attempts", "must be at least 1")
        for key in ("spool.max.bytes", "read.failures"):
            if int(config.get(prefix + key)) < 1:
                raise config.error(prefix + key, f"{config.get(prefix + key)} is not a positive count")
        spool = (
            config.path(prefix + "spool.dir")
            if config.get(prefix + "spool.dir")
            else (config.state_dir() / "kinesis-spool")
        )
        return cls(
            system=system,
            virtual_tasks=virtual,
            region=config.get(prefix + "region") or None,
            endpoint=config.get(prefix + "endpoint") or None,
            shards=shards,
            read_interval_ms=int(config.get(prefix + "read.interval.ms")),
            shard_refresh_ms=int(config.get(prefix + "shard.refresh.ms")),
            spool_dir=spool,
            spool_retention_ms=int(config.get(prefix + "spool.retention.ms")),
            send_attempts=attempts,
            record_id_field=str(config.get(prefix + "record.id.field") or ""),
            spool_max_bytes=int(config.get(prefix + "spool.max.bytes")),
            read_failures=int(config.get(prefix + "read.failures")),
            retention_hours=retention,
        )

    @property
    def where(self) -> str:
        """The service this system reaches, for error messages."""
        return self.endpoint or f"AWS Kinesis ({self.region or 'region from the boto3 chain'})"
