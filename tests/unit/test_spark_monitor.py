"""The Spark runner's monitor never dies and never leaves a query it cannot check holding its tasks: a query
whose health check keeps raising (as a Py4J error asking Spark about it would) fails its tasks with the error
(weirflow.spark.runner.SparkTaskRunner._monitor_loop). The runner is built without a SparkSession: only the
monitor's own state is set, and the query is a stand-in of our own StageQuery."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from weirflow.spark.runner import SparkTaskRunner


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
        deadline = time.monotonic() + 30
        while "counts-0" not in runner._failed:
            assert time.monotonic() < deadline, "the task never failed"
            assert monitor.is_alive(), "the monitor died"
            time.sleep(0.05)
    finally:
        runner._closing.set()
        monitor.join(5)
    assert "health check kept failing" in runner._failed["counts-0"]
    assert "Py4JNetworkError" in runner._failed["counts-0"]
    assert "counts-0" not in runner._tasks and query.stopped
    assert query.checks > 1, "it gave up on the first error instead of retrying"
