"""The Spark runner's monitor never dies and never leaves a query it cannot check holding its tasks: a query
whose health check keeps raising (as a Py4J error asking Spark about it would) fails its tasks with the error
(weirflow.spark.runner.SparkTaskRunner._monitor_loop). The runner is built without a SparkSession: only the
monitor's own state is set, and the query is a stand-in of our own StageQuery."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from weirflow.spark.runner import SparkTaskRunner
from weirflow.testing import wait_until


class BrokenQuery:
    id = "q-1"
    name = "counts-0"
    merged = False
    stage = SimpleNamespace(name="counts")

    def __init__(self, tasks: list) -> None:
        self.tasks = tasks
        self.checks = 0
        self.stopped = False

    def failure(self) -> str | None:
        self.checks += 1
        raise RuntimeError("py4j.protocol.Py4JNetworkError: Answer from Java side is empty")

    def stop(self) -> None:
        self.stopped = True


def test_a_query_whose_health_check_keeps_failing_fails_its_tasks_and_the_monitor_goes_on() -> None:
    runner = SparkTaskRunner.__new__(SparkTaskRunner)
    task = SimpleNamespace(name="counts-0", done=False, error=None)
    query = BrokenQuery([task])
    runner._guard = threading.RLock()
    runner._closing = threading.Event()
    runner._wake = threading.Event()
    runner._tasks = {"counts-0": task}
    runner._failed = {}
    runner._by_id = {query.id: query}
    runner._query_of = {"counts-0": query}
    runner._merged = {}
    runner._pending = set()
    monitor = threading.Thread(target=runner._monitor_loop, daemon=True)
    monitor.start()
    try:
        wait_until(
            lambda: "counts-0" in runner._failed or not monitor.is_alive(),
            30,
            "the task failing",
            interval_s=0.05,
        )
        assert "counts-0" in runner._failed, "the monitor died"
    finally:
        runner._closing.set()
        monitor.join(5)
    assert "health check kept failing" in runner._failed["counts-0"]
    assert "Py4JNetworkError" in runner._failed["counts-0"]
    assert "counts-0" not in runner._tasks and query.stopped
    assert query.checks > 1, "it gave up on the first error instead of retrying"


class RecordingPool:
    def __init__(self) -> None:
        self.submitted: list[list[str]] = []

    def submit(self, _fn, states):  # type: ignore[no-untyped-def]
        self.submitted.append([s.name for s in states])
        done = SimpleNamespace(done=lambda: True)
        return done


def test_the_launcher_waits_for_the_data_plane_s_preparation_without_holding_the_runner_s_lock() -> None:
    """Grouping pending tasks into start units asks whether stages merge, which waits for the preparation (a
    slow first `readStream.load` in a fresh JVM). Waiting for it under the runner's lock blocked the lease keeper,
    which takes that lock to publish renewals before it heartbeats: a new processor missed its heartbeats and
    fenced itself. The launcher must wait outside the lock, then start the pending tasks once prepared."""
    runner = SparkTaskRunner.__new__(SparkTaskRunner)
    stage = SimpleNamespace(name="counts", serves=False)
    task = SimpleNamespace(name="counts-0", stage=stage)
    runner._guard = threading.RLock()
    runner._closing = threading.Event()
    runner._wake = threading.Event()
    runner._ready = threading.Event()  # the preparation is still running
    runner._prepare_error = None
    runner.merge_stateless = True
    runner.builder = SimpleNamespace(stateless=lambda _stage: True)
    runner._tasks = {"counts-0": task}
    runner._pending = {"counts-0"}
    runner._changed = 0.0
    runner._rounds = 0
    runner._busy = {}
    runner._pool = RecordingPool()
    launcher = threading.Thread(target=runner._launch_loop, daemon=True)
    launcher.start()
    runner._wake.set()
    try:
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:  # the keeper's view: the lock stays free while the launcher waits
            assert runner._guard.acquire(timeout=1.0), (
                "the launcher held the runner's lock through the preparation"
            )
            runner._guard.release()
            time.sleep(0.05)  # not synchronisation: the launcher must hold off for the whole window, sampled
        assert runner._pool.submitted == [], "a task started before the data plane was prepared"
        runner._ready.set()
        runner._wake.set()
        wait_until(
            lambda: runner._pool.submitted, 10, "the pending task to start after the preparation", interval_s=0.05
        )
    finally:
        runner._closing.set()
        runner._wake.set()
        launcher.join(5)
    assert runner._pool.submitted == [["counts-0"]]
