"""ProcessorRegistry contract: upserted rows, every field round trips, liveness by heartbeat age and state."""

from __future__ import annotations

from weirflow.coordination.state import is_live
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.testing.contracts._base import CoordinationContract


def info(pid: str, heartbeat_ms: int, state: str = "RUNNING", **extra) -> ProcessorInfo:
    return ProcessorInfo(pid, "host-1", 4242, state, heartbeat_ms=heartbeat_ms, started_ms=1000, **extra)


class ProcessorRegistryContract(CoordinationContract):
    """`weirflow.interfaces.coordination.ProcessorRegistry`, through ``Backend.coordination``."""

    def test_a_heartbeat_upserts_the_row_and_every_field_round_trips(self, coordination) -> None:
        registry = coordination("p1").processor_registry()
        registry.heartbeat(info("p1", 5000, state="IN_REBALANCE"))
        full = info(
            "p1", 6000, job_model_version=3, tasks=["main-0", "main-2"], endpoint="http://h:8080", error="x",
            instance="0f3a9c2e71d4",
        )
        registry.heartbeat(full)
        assert coordination("status").processor_registry().processors() == [full]

    def test_processors_are_sorted_by_id(self, coordination) -> None:
        for pid in ("p3", "p1", "p2"):
            coordination(pid).processor_registry().heartbeat(info(pid, 1000))
        assert [p.processor_id for p in coordination("x").processor_registry().processors()] == ["p1", "p2", "p3"]

    def test_unregister_removes_the_row_and_is_idempotent(self, coordination) -> None:
        registry = coordination("p1").processor_registry()
        registry.heartbeat(info("p1", 1000))
        registry.unregister("p1")
        registry.unregister("p1")
        assert registry.processors() == []

    def test_live_excludes_silent_and_stopped_processors(self, coordination) -> None:
        registry = coordination("p1").processor_registry()
        registry.heartbeat(info("fresh", 10_000))
        registry.heartbeat(info("silent", 1_000))
        registry.heartbeat(info("stopped", 10_000, state="STOPPED"))
        registry.heartbeat(info("failed", 10_000, state="FAILED"))
        rows = registry.processors()
        assert [p.processor_id for p in rows if is_live(p, now_ms=12_000, liveness_timeout_ms=5_000)] == ["fresh"]
