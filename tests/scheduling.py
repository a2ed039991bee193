"""How `make test` spreads test files over pytest-xdist's workers: never more Spark jobs at once than cores.

Most of the suite waits (leases expiring, SDKs attaching, emulators answering) while a few files keep a core
busy for minutes: each of their tests starts several processors, and every processor its own Spark driver and
Python workers. With pytest-xdist's ``--dist loadfile`` on as many workers as cores, a worker running a
waiting file leaves its core idle; with more workers, three Spark files at once share two cores and each
runs slower, long enough to miss heartbeats.

`CoreAwareScheduling` is ``loadfile`` (each file runs whole on one worker) with two changes:

- at most ``max_heavy`` workers hold `HEAVY` files at once, heaviest first; the other workers take the
  waiting files meanwhile;
- a worker gets its next file when it is on the last test of the current one (``loadfile`` queues a file
  ahead from two tests before the end), so a file seldom waits behind a long test while another worker is free.

`make test` runs ``-n 3 --heavy-at-once 2``. Without ``--heavy-at-once`` pytest-xdist schedules as it always
does. The scheduler reads pytest-xdist's scheduling state (``workqueue``, ``assigned_work``), which is why
pyproject.toml pins pytest-xdist to one minor version.
"""

from __future__ import annotations

import pytest
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

# Files whose tests run Spark processors (several drivers and their Python workers each), heaviest first by
# the CPU time one run measured: a file missing here only loses its priority.
HEAVY = (
    "tests/integration/test_served_tables.py",
    "tests/integration/test_drain.py",
    "tests/integration/test_kinesis.py",
    "tests/integration/test_chaos.py",
    "tests/integration/test_pageviews_on_azure.py",
    "tests/integration/test_spark_cluster.py",
    "tests/integration/test_spark_state_moves.py",
    "tests/integration/test_spark_fencing.py",
)
_RANK = {path: rank for rank, path in enumerate(HEAVY)}


class CoreAwareScheduling(LoadFileScheduling):
    """``loadfile`` where at most ``max_heavy`` workers hold `HEAVY` files at any time."""

    def __init__(self, config: pytest.Config, log: object = None, *, max_heavy: int) -> None:
        super().__init__(config, log)
        self.max_heavy = max_heavy

    def _holds_heavy(self, node: WorkerController) -> bool:
        return any(scope in _RANK and not all(unit.values()) for scope, unit in self.assigned_work[node].items())

    def _next_scope(self, node: WorkerController) -> str | None:
        """The heaviest waiting `HEAVY` file if fewer than ``max_heavy`` *other* workers hold one (a worker runs
        its files one after another, so more of them on one worker never adds to how many run at once), else
        the first other file."""
        heavy = sorted((scope for scope in self.workqueue if scope in _RANK), key=_RANK.__getitem__)
        others = sum(1 for other in self.assigned_work if other is not node and self._holds_heavy(other))
        if heavy and others < self.max_heavy:
            return heavy[0]
        return next((scope for scope in self.workqueue if scope not in _RANK), None)

    def _assign_work_unit(self, node: WorkerController) -> bool:  # type: ignore[override]
        scope = self._next_scope(node)
        if scope is None:  # only heavy files are left and enough workers hold one: this one waits
            return False
        work_unit = self.workqueue.pop(scope)
        self.assigned_work.setdefault(node, {})[scope] = work_unit
        collection = self.registered_collections[node]
        node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])
        return True

    def _reschedule(self, node: WorkerController) -> None:
        """A worker gets its next file once it holds at most one test: pytest-xdist's worker keeps its last
        test until it knows what follows (or is told to stop), so one must always be queued behind it."""
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        while self.workqueue and self._pending_of(self.assigned_work[node]) <= 1:
            if not self._assign_work_unit(node):
                return

    def mark_test_complete(self, node: WorkerController, item_index: int, duration: float = 0) -> None:
        super().mark_test_complete(node, item_index, duration)
        for other in self.nodes:  # a heavy file that just ended lets a waiting worker take the next one
            if other is not node:
                self._reschedule(other)


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(
        "--heavy-at-once",
        type=int,
        default=0,
        metavar="N",
        help="with -n and --dist loadfile: run at most N Spark-heavy test files at once (tests/scheduling.py)",
    )


def make_scheduler(config: pytest.Config, log: object) -> CoreAwareScheduling | None:
    """The scheduler for ``--heavy-at-once N`` with ``--dist loadfile``; None leaves pytest-xdist's own."""
    max_heavy = config.getoption("heavy_at_once")
    if not max_heavy or config.getoption("dist") != "loadfile":
        return None
    return CoreAwareScheduling(config, log, max_heavy=max_heavy)
