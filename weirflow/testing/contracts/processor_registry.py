"""ProcessorRegistry contract: upserted rows, every field round trips, liveness by heartbeat age and state.

Heartbeat and registration times are compared with tolerance: a backend whose store stamps its writes returns
them measured on that clock and expressed on the reader's (`weirflow.interfaces.coordination.ProcessorInfo`),
which is the time of the write give or take the store's resolution, not the value the writer sent.
"""

from __future__ import annotations

import dataclasses
import time

from weirflow.base import clock
from weirflow.coordination.state import is_live
from weirflow.interfaces.coordination import ProcessorInfo
from weirflow.testing.contracts._base import CoordinationContract

# how far a time read back may be from the time it was written (a store's clock has a resolution of a second)
TOLERANCE_MS = 1500


def info(pid: str, heartbeat_ms: int | None = None, state: str = "RUNNING", **extra) -> ProcessorInfo:
    now = clock.now_ms()
    beat = heartbeat_ms if heartbeat_ms is not None else now
    return ProcessorInfo(pid, "host-1", 4242, state, heartbeat_ms=beat, started_ms=now, **extra)


def _without_times(row: ProcessorInfo) -> ProcessorInfo:
    return dataclasses.replace(row, heartbeat_ms=0, started_ms=0)


class ProcessorRegistryContract(CoordinationContract):
    """`weirflow.interfaces.coordination.ProcessorRegistry`, through ``Backend.coordination``."""

    def test_a_heartbeat_upserts_the_row_and_every_field_round_trips(self, coordination) -> None:
        """The times read back are those of the writes (or, where the reader stamps them, of the read that first
        saw them), so they lie between the first write's start and the read's end, give or take the store's
        resolution (on a loaded machine a call can take seconds: comparing with the value sent measured that)."""
        registry = coordination("p1").processor_registry()
        before = clock.now_ms()
        registry.heartbeat(info("p1", state="IN_REBALANCE", beat=1))
        full = info(
            "p1",
            job_model_version=3,
            tasks=["main-0", "main-2"],
            endpoint="http://h:8080",
            error="x",
            instance="0f3a9c2e71d4",
            beat=2,
        )
        registry.heartbeat(full)
        [row] = coordination("status").processor_registry().processors()
        after = clock.now_ms()
        assert _without_times(row) == _without_times(full)
        for name, value in (("heartbeat", row.heartbeat_ms), ("started", row.started_ms)):
            assert before - TOLERANCE_MS <= value <= after + TOLERANCE_MS, (name, before, value, after)

    def test_processors_are_sorted_by_id(self, coordination) -> None:
        for pid in ("p3", "p1", "p2"):
            coordination(pid).processor_registry().heartbeat(info(pid))
        assert [p.processor_id for p in coordination("x").processor_registry().processors()] == ["p1", "p2", "p3"]

    def test_unregister_removes_the_row_and_is_idempotent(self, coordination) -> None:
        registry = coordination("p1").processor_registry()
        registry.heartbeat(info("p1"))
        registry.unregister("p1")
        registry.unregister("p1")
        assert registry.processors() == []

    def test_live_excludes_silent_and_stopped_processors(self, coordination) -> None:
        registry = coordination("p1").processor_registry()
        registry.heartbeat(info("silent"))
        time.sleep(2.0)  # the silence under test: the row ages by the time that passes, on whatever clock
        registry.heartbeat(info("fresh"))
        registry.heartbeat(info("stopped", state="STOPPED"))
        registry.heartbeat(info("failed", state="FAILED"))
        rows = registry.processors()
        assert [p.processor_id for p in rows if is_live(p, clock.now_ms(), liveness_timeout_ms=1_000)] == ["fresh"]
