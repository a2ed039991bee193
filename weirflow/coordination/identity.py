"""One processor id, one live process: a new run checks that no other run of its id is alive before it joins.

Each run of a processor has an **instance** id (`StreamProcessor.instance_id`). Leases are held by the pair
(processor id, instance), so two runs of one id can never both hold a lease; this module makes the second run
refuse to start at all, with an error that says what to do, instead of running beside the first.

The registry row of the id decides, judged without comparing clocks: when it belongs to another instance
and has not departed, the new run watches it for up to the liveness timeout. A live process keeps writing
its heartbeat, so a row that changes (its ``beat``, a count of writes, not a time) means a live duplicate
(`DuplicateProcessorError`); a row that stays unchanged for the liveness timeout is a predecessor that died
(SIGKILL, a lost machine), and the new run takes over the id. A fixed ``processor.id`` restarted after a
crash thus waits at most the liveness timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from weirflow.base import clock
from weirflow.base.errors import DuplicateProcessorError
from weirflow.coordination.state import ProcessorState, has_departed
from weirflow.coordination.timings import CoordinationTimings
from weirflow.interfaces.coordination import ProcessorInfo, ProcessorRegistry

log = logging.getLogger("weirflow.processor")


def default_processor_id() -> str:
    """A processor id unique to this process: host, pid and a random suffix (``processor.id`` unset)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


def _row(registry: ProcessorRegistry, processor_id: str) -> ProcessorInfo | None:
    return next((p for p in registry.processors() if p.processor_id == processor_id), None)


def _other_run(row: ProcessorInfo | None, instance: str) -> bool:
    return row is not None and row.instance != instance and not has_departed(row.state)


def ensure_sole_instance(
    registry: ProcessorRegistry, processor_id: str, instance: str, timings: CoordinationTimings
) -> None:
    """Return when no other live run of ``processor_id`` exists; raise `DuplicateProcessorError` when one does."""
    first = _row(registry, processor_id)
    if not _other_run(first, instance):
        return
    assert first is not None
    log.warning(
        "processor id %s is registered by another run (pid %s on %s, instance %s); watching its heartbeat for "
        "up to %d s to tell a running process from a dead one",
        processor_id,
        first.pid,
        first.host,
        first.instance or "?",
        timings.liveness_timeout_ms // 1000,
    )
    deadline = time.monotonic() + timings.liveness_timeout_ms / 1000
    poll_s = max(0.05, min(timings.heartbeat_interval_ms, timings.poll_interval_ms) / 1000)
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        row = _row(registry, processor_id)
        if not _other_run(row, instance) or (row is not None and row.instance != first.instance):
            return  # it stopped, or was replaced by yet another run that will meet the same check
        assert row is not None
        if (row.beat, row.state, row.job_model_version) != (first.beat, first.state, first.job_model_version):
            raise DuplicateProcessorError(
                f"processor id '{processor_id}' is already running (pid {row.pid} on {row.host}, state "
                f"{row.state}, instance {row.instance}); stop that process or start this one with another "
                "--processor-id (processor.id)"
            )
    log.info(
        "processor id %s: the earlier run's row did not change for %d s; it is gone, taking the id over",
        processor_id,
        timings.liveness_timeout_ms // 1000,
    )


class Announcement:
    """The row of a run that has not started its tasks yet (state NEW), written at once and every heartbeat
    interval until `stop` (the processor's own heartbeats take over then), so that a second run of the same id
    started meanwhile — while this one starts Spark, say — sees a live row and refuses."""

    def __init__(self, registry: ProcessorRegistry, info: ProcessorInfo, timings: CoordinationTimings) -> None:
        self._registry = registry
        self._info = info
        self._interval_s = timings.heartbeat_interval_ms / 1000
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="announce", daemon=True)

    def start(self) -> Announcement:
        self._write()
        self._thread.start()
        return self

    def _write(self) -> None:
        self._info.heartbeat_ms = clock.now_ms()
        self._info.beat += 1
        self._registry.heartbeat(self._info)

    def _loop(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._write()
            except Exception as exc:  # the next round retries; the processor's own heartbeats report errors
                log.warning("could not write the starting processor's row: %s", exc)

    def stop(self, failed: bool = False) -> None:
        """Stop writing the row. ``failed``: the run could not start; its row says so (state FAILED) at once,
        so the leader counts it as gone now (a processor that left) instead of waiting out the liveness
        timeout and then recording a failover."""
        self._stop.set()
        self._thread.join()
        if failed:
            self._info.state = ProcessorState.FAILED.value
            try:
                self._write()
            except Exception as exc:  # the row then ages out as a silent processor's would
                log.warning("could not mark the processor that failed to start as failed: %s", exc)
