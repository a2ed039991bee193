"""Keeping PySpark's per-task garbage collection cheap in the Python processes Spark starts.

PySpark's worker daemon runs a full ``gc.collect()`` after *every* task a reused Python worker runs (reads,
writes, and the data-source planning calls alike). A full collection walks every tracked object of the
process, and a worker holds all of PySpark, pyarrow and pandas: measured here at 35 to 180 ms per task,
which made garbage collection the largest Python cost of the example job.

`before_task` is called by the weirflow source and sink at the start of each task: it moves every object
alive at that point into the permanent generation (`gc.freeze`, constant time), so the collection after the
task only walks what the task itself created. Every `_FULL_EVERY`-th task unfreezes instead, so that the
collection after it walks everything once and cyclic garbage is never kept for good.
"""

from __future__ import annotations

import gc

_FULL_EVERY = 256
_tasks = 0


def before_task() -> None:
    global _tasks
    _tasks += 1
    if _tasks % _FULL_EVERY == 0:
        gc.unfreeze()
    else:
        gc.freeze()
