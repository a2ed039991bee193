"""Named moments in the data plane where a test can kill its processor, so that a fault lands exactly where a
guarantee is hardest to keep (docs/guarantees.md, "How it is tested").

``WEIRFLOW_FAULT_POINT=<point>:<task prefix>:<n>`` in a processor's environment SIGKILLs the processor the
``n``-th time a task whose name starts with the prefix reaches ``point``. Points:

* ``before-checkpoint`` — a micro-batch's rows and control messages are durable in the task's outputs, and
  the checkpoint naming the batch's input offsets is not written yet: the next holder replays the batch.
* ``before-checkpoint-of-rows`` — the same moment, counting only micro-batches that wrote rows (a batch that
  only moved its offsets, say past a closed Kinesis shard, replays nothing).
* ``before-drained-checkpoint`` — a draining task sent its last batch's rows and its DRAIN message
  downstream, and its ``drained`` checkpoint is not written yet: the next holder replays the batch and
  drains again, after the first DRAIN (docs/drain.md).
* ``before-spark-commit`` — a task's micro-batch wrote results to an intermediate stream and Spark has not
  committed the batch (the sink's ``commit``, in a Python worker of Spark): the processor and the worker are
  killed, so Spark's own checkpoint names the batch as planned, not done, and the next run of the task runs
  it again (`weirflow.spark.result_replays`). Counted per worker process: use ``n`` = 1.
* ``between-partial-sends`` — a row-wise stage that sends partials (`weirflow.spark.partials`) sent one
  micro-batch's partials to some of the intermediate partitions and not yet to the others (the prefix names
  the stage). Counted per worker process.

A point reached in a Spark worker kills the processor too (`PROCESSOR_PID`, set when the processor starts
Spark, which its workers inherit).

``WEIRFLOW_FAULT_ARMED_BY=<path>`` as well counts a point's hits only once that file exists: a test arms the
fault at the moment it chooses (after a reshard, say) and the kill still lands on the named point.

Unset (the default), a point costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import threading

from weirflow.base.errors import InvalidArgumentError

ENV = "WEIRFLOW_FAULT_POINT"
ARMED_BY = "WEIRFLOW_FAULT_ARMED_BY"
POINTS = (
    "before-checkpoint",
    "before-checkpoint-of-rows",
    "before-drained-checkpoint",
    "before-spark-commit",
    "between-partial-sends",
)
PROCESSOR_PID = "WEIRFLOW_PROCESSOR_PID"

_lock = threading.Lock()
_hits = 0


def _parse(text: str) -> tuple[str, str, int]:
    point, prefix, n = text.rsplit(":", 2)
    if point not in POINTS:
        raise InvalidArgumentError(f"{ENV}={text!r}: unknown point {point!r}; the points are {', '.join(POINTS)}")
    return point, prefix, int(n)


_ARMED = _parse(os.environ[ENV]) if os.environ.get(ENV) else None
_ARMED_BY = os.environ.get(ARMED_BY) or None


def reached(point: str, task: str) -> None:
    """Task ``task`` is at ``point``: SIGKILL this process if that is the armed fault's moment."""
    global _hits
    if _ARMED is None or _ARMED[0] != point or not task.startswith(_ARMED[1]):
        return
    if _ARMED_BY is not None and not os.path.exists(_ARMED_BY):
        return
    with _lock:
        _hits += 1
        if _hits == _ARMED[2]:
            processor = int(os.environ.get(PROCESSOR_PID) or os.getpid())
            if processor != os.getpid():
                os.kill(processor, signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)
