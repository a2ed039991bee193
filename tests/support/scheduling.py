"""How `make test`'s pytest-xdist workers (three on the 2-core machine) share the test files: each file goes to a
worker whole, as ``--dist loadfile`` does, but which file a worker takes next depends on what the others run.

A file marked ``spark`` keeps a core busy or a little more (Spark processors and sessions: measured with every
process's CPU sampled, 1.1 to 1.2 cores for the busiest files alone); the other files mostly wait (for a lease to
expire, a liveness timeout to pass, a receiver to attach) or are short unit files, about 0.3 to 0.5 of a core.
With two workers, one busy file beside one waiting file left a quarter of the two cores idle (0.74 of them
used over a full run, 16 to 18 minutes); three workers, at most two of them on busy files, used 0.86 of them and
the run took 13.5 minutes. Three busy files at once would ask for 3.5 cores, and two waiting files with the third
worker idle would leave the cores unused: so ``busy_at_most`` is one less than the workers (one for two
workers, as before).

`PairingScheduling` gives a worker the next busy file while fewer than ``busy_at_most`` other workers run one,
else the next waiting file (and waiting files while Spark's class archive is still being dumped, which keeps a
core and a half busy and which every busy file waits for: `tests/support/spark_jvm.py`), in the order of
`tests/conftest.py`; when one kind runs out it takes what is left. It decides at the last moment it can: a
worker asks for its next file when one test of its current file is left (the worker has to know the test that
follows before it runs the last one), not two as pytest-xdist's scheduler does.

The workers know the files' marks and the controlling process does not (it collects nothing): each worker writes
the kind of every file (`record_kinds`) to a file named in its ``workerinput`` before it reports its collection,
and the scheduler reads it when the collections are complete. Without it (another runner), every file is of
one kind and the files go out in order, as with ``--dist loadfile``.

It overrides two of pytest-xdist's scheduler methods (`_assign_work_unit`, `_reschedule`), which are not a
public interface: pyproject.toml keeps pytest-xdist below 4, and `tests/unit/test_scheduling.py` drives the
scheduler as pytest-xdist's controlling process does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from xdist.remote import Producer
from xdist.scheduler import LoadFileScheduling
from xdist.workermanage import WorkerController

from tests.support import spark_jvm

BUSY = "busy"
WAITING = "waiting"
# The key in a worker's ``workerinput`` (set by the controlling process) naming the file of the files' kinds.
KINDS_INPUT = "weirflow_file_kinds"
_kinds_key = pytest.StashKey[Path]()


def enable(config: pytest.Config) -> None:
    """In the controlling process: where the workers will write the files' kinds (removed by `disable`)."""
    config.stash[_kinds_key] = Path(tempfile.mkdtemp(prefix="weirflow-tests-kinds-")) / "kinds.json"


def disable(config: pytest.Config) -> None:
    where = config.stash.get(_kinds_key, None)
    if where is not None:
        shutil.rmtree(where.parent, ignore_errors=True)


def configure_worker(config: pytest.Config, workerinput: dict[str, object]) -> None:
    """In the controlling process, for each worker it starts: name the kinds file in the worker's input."""
    where = config.stash.get(_kinds_key, None)
    if where is not None:
        workerinput[KINDS_INPUT] = str(where)


def record_kinds(config: pytest.Config, kinds: dict[str, str]) -> None:
    """In a worker: write each test file's kind (`BUSY` or `WAITING`) for the scheduler. Every worker writes the
    same content, each in one rename, so the scheduler reads one whole copy."""
    where = getattr(config, "workerinput", {}).get(KINDS_INPUT)
    if not where:
        return
    partial = Path(f"{where}.{os.getpid()}")
    partial.write_text(json.dumps(kinds))
    partial.replace(where)


class PairingScheduling(LoadFileScheduling):
    """pytest-xdist's load-file scheduling with the next file chosen so that at most ``busy_at_most`` workers run
    busy files at once, and the others waiting ones."""

    def __init__(self, config: pytest.Config, log: Producer | None = None) -> None:
        super().__init__(config, log)
        self._kinds: dict[str, str] | None = None

    def _kind(self, scope: str) -> str:
        if self._kinds is None:
            where = self.config.stash.get(_kinds_key, None)
            try:
                self._kinds = json.loads(where.read_text()) if where is not None else {}
            except (OSError, ValueError):
                self._kinds = {}
        return self._kinds.get(scope, WAITING)

    def _running(self, node: WorkerController) -> str | None:
        """The kind of the file ``node`` runs now (its first with tests left), None when it runs nothing."""
        for scope, tests in self.assigned_work.get(node, {}).items():
            if not all(tests.values()):
                return self._kind(scope)
        return None

    def _next_scope(self, node: WorkerController) -> str:
        others = [self._running(other) for other in self.nodes if other is not node]
        busy_at_most = max(1, len(self.nodes) - 1)
        want = WAITING if others.count(BUSY) >= busy_at_most or spark_jvm.dump_running() else BUSY
        return next((scope for scope in self.workqueue if self._kind(scope) == want), next(iter(self.workqueue)))

    def _assign_work_unit(self, node: WorkerController) -> None:
        self.workqueue.move_to_end(self._next_scope(node), last=False)
        super()._assign_work_unit(node)

    def _reschedule(self, node: WorkerController) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        # A worker runs a test once it has the one after it; with one test left it waits for its next file.
        while self.workqueue and self._pending_of(self.assigned_work[node]) < 2:
            self._assign_work_unit(node)
