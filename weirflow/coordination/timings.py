"""The protocol's timings, read once from config (every one is a key with a default; see docs/configuration.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CoordinationTimings:
    lease_ms: int
    renew_interval_ms: int
    heartbeat_interval_ms: int
    liveness_timeout_ms: int
    debounce_ms: int
    latch_timeout_ms: int
    poll_interval_ms: int
    lock_timeout_ms: int

    @classmethod
    def from_config(cls, config: Any) -> CoordinationTimings:
        timings = cls(
            lease_ms=config.get("job.coordinator.lease.duration.ms"),
            renew_interval_ms=config.get("job.coordinator.lease.renew.interval.ms"),
            heartbeat_interval_ms=config.get("job.coordinator.heartbeat.interval.ms"),
            liveness_timeout_ms=config.get("job.coordinator.liveness.timeout.ms"),
            debounce_ms=config.get("job.debounce.time.ms"),
            latch_timeout_ms=config.get("job.coordinator.latch.timeout.ms"),
            poll_interval_ms=config.get("job.coordinator.poll.interval.ms"),
            lock_timeout_ms=config.get("job.coordinator.lock.timeout.ms"),
        )
        if timings.renew_interval_ms >= timings.lease_ms:
            raise config.error(
                "job.coordinator.lease.renew.interval.ms",
                f"must be shorter than job.coordinator.lease.duration.ms ({timings.lease_ms} ms), "
                "or leases expire between renewals; a third of it is a good value",
            )
        if timings.heartbeat_interval_ms >= timings.liveness_timeout_ms:
            raise config.error(
                "job.coordinator.heartbeat.interval.ms",
                f"must be shorter than job.coordinator.liveness.timeout.ms ({timings.liveness_timeout_ms} ms), "
                "or live processors are declared dead",
            )
        return timings
