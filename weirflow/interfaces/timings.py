"""The protocol's timings, read once from config (every one is a key with a default; see docs/configuration.md).

A value type of the interfaces because the core hands it to the coordinator factory
(`JobCoordinatorFactory.get_coordination_utils`): a backend sizes its leases and storage calls from the same
values the protocol runs on, without importing the protocol (docs/architecture.md, "The dependency rule").
"""

from __future__ import annotations

from dataclasses import dataclass

from weirflow.interfaces.config import ConfigView

MARGIN_KEY = "job.coordinator.lease.renew.margin.ms"


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
    # self-fencing: a lease whose renewal is not confirmed by ``deadline - renew_margin_ms`` is given up
    renew_margin_ms: int = 0
    task_stop_timeout_ms: int = 30000
    finished_check_interval_ms: int = 1000

    @classmethod
    def from_config(cls, config: ConfigView) -> CoordinationTimings:
        lease_ms = config.get("job.coordinator.lease.duration.ms")
        margin = config.get(MARGIN_KEY)
        timings = cls(
            lease_ms=lease_ms,
            renew_interval_ms=config.get("job.coordinator.lease.renew.interval.ms"),
            heartbeat_interval_ms=config.get("job.coordinator.heartbeat.interval.ms"),
            liveness_timeout_ms=config.get("job.coordinator.liveness.timeout.ms"),
            debounce_ms=config.get("job.debounce.time.ms"),
            latch_timeout_ms=config.get("job.coordinator.latch.timeout.ms"),
            poll_interval_ms=config.get("job.coordinator.poll.interval.ms"),
            lock_timeout_ms=config.get("job.coordinator.lock.timeout.ms"),
            renew_margin_ms=lease_ms // 3 if margin is None else margin,
            task_stop_timeout_ms=config.get("task.stop.timeout.ms"),
            finished_check_interval_ms=config.get("job.coordinator.finished.check.interval.ms"),
        )
        timings._validate(config, explicit_margin=margin is not None)
        return timings

    def _validate(self, config: ConfigView, *, explicit_margin: bool) -> None:
        if self.renew_interval_ms >= self.lease_ms:
            raise config.error(
                "job.coordinator.lease.renew.interval.ms",
                f"must be shorter than job.coordinator.lease.duration.ms ({self.lease_ms} ms), "
                "or leases expire between renewals; a third of it is a good value",
            )
        if self.heartbeat_interval_ms >= self.liveness_timeout_ms:
            raise config.error(
                "job.coordinator.heartbeat.interval.ms",
                f"must be shorter than job.coordinator.liveness.timeout.ms ({self.liveness_timeout_ms} ms), "
                "or live processors are declared dead",
            )
        # the margin key when it was set, else the renew interval (the default margin is derived from the lease)
        key = MARGIN_KEY if explicit_margin else "job.coordinator.lease.renew.interval.ms"
        if self.renew_margin_ms <= 0:
            raise config.error(
                key,
                f"must be positive (got {self.renew_margin_ms} ms): without a margin a processor that cannot "
                "renew stops its tasks only when another may already have taken them",
            )
        if self.renew_margin_ms >= self.lease_ms - self.renew_interval_ms:
            raise config.error(
                key,
                f"the renew margin ({self.renew_margin_ms} ms) must be shorter than "
                f"job.coordinator.lease.duration.ms - job.coordinator.lease.renew.interval.ms "
                f"({self.lease_ms} - {self.renew_interval_ms} = {self.lease_ms - self.renew_interval_ms} ms), "
                "or every task is fenced before its next renewal is due; shorten the renew interval or the "
                f"margin ({MARGIN_KEY})",
            )
        if self.heartbeat_interval_ms >= self.liveness_timeout_ms - self.liveness_margin_ms():
            raise config.error(
                "job.coordinator.heartbeat.interval.ms",
                f"must be shorter than job.coordinator.liveness.timeout.ms minus its self-fence margin "
                f"({self.liveness_timeout_ms} - {self.liveness_margin_ms()} ms): a processor gives up its "
                "leases when no heartbeat was confirmed for that long; a third of the liveness timeout is a good "
                "value",
            )
        if self.task_stop_timeout_ms <= 0:
            raise config.error("task.stop.timeout.ms", "must be positive")
        if self.finished_check_interval_ms <= 0:
            raise config.error("job.coordinator.finished.check.interval.ms", "must be positive")

    def check_call_deadline(self, config: ConfigView, key: str, deadline_s: float, timeout_key: str) -> None:
        """Refuse a backend's deadline of one storage call, retries included (``deadline_s``, set by ``key``), that
        is not shorter than the renew margin: a lease renewal still retrying when the self-fence must act would
        outlast the margin meant to stop the tasks before another processor may take them (docs/coordination.md,
        "The self-fence"). Each coordinator factory asks it with its own keys, ``timeout_key`` being its
        request timeout, which the deadline must leave room for."""
        deadline_ms = round(deadline_s * 1000)
        if deadline_ms >= self.renew_margin_ms:
            raise config.error(
                key,
                f"{deadline_ms} ms is not shorter than {MARGIN_KEY} ({self.renew_margin_ms} ms): a lease renewal "
                f"could still be retrying when the processor must fence itself; lower it (with {timeout_key}) or "
                "raise the margin",
            )

    def liveness_margin_ms(self) -> int:
        """The heartbeat's self-fence margin: a processor whose last confirmed heartbeat was *sent* longer than
        ``liveness_timeout_ms - liveness_margin_ms`` ago gives up every lease it holds, because from the liveness
        timeout on (by the store's clock) other processors may break them (`weirflow.coordination.keeper`).
        A fifth of the liveness timeout, never more than the lease renewal margin."""
        return min(self.renew_margin_ms, self.liveness_timeout_ms // 5)

    def renew_retry_ms(self) -> int:
        """How soon a renewal that failed (an error, not a refusal) is tried again: soon enough for another
        try before the fence, never busier than a poll."""
        return max(100, min(self.poll_interval_ms, self.renew_margin_ms // 4))
