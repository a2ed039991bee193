"""The line a processor logs for each task of each committed batch, and what a set of such lines shows.

After a batch's checkpoint is written, the processor logs who wrote for the task and when (logger
``weirflow.spark``; docs/pipelines.md, "How a task runs")::

    wrote task=views-by-page-1 batch=12 epoch=3 processor=p0 start_ms=1764025200123 end_ms=1764025200871

A writer is a (processor, lock epoch) pair; its tenure of a task spans its first batch's start to its last
batch's end. Fencing (docs/coordination.md, "The fence") means two writers' tenures of one task never overlap:
`overlap_ms` measures it from the logs of every processor of a run, for the chaos benchmark and the tests that
kill processors.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable

# The format `weirflow.spark.task_progress` logs with (%-style, as logging takes it) and the pattern that reads it.
WROTE_FORMAT = "wrote task=%s batch=%d epoch=%d processor=%s start_ms=%d end_ms=%d"
WROTE = re.compile(
    r"wrote task=(?P<task>\S+) batch=(?P<batch>\d+) epoch=(?P<epoch>\d+) processor=(?P<processor>\S+) "
    r"start_ms=(?P<start>\d+) end_ms=(?P<end>\d+)"
)


def overlap_ms(logs: Iterable[str]) -> tuple[int | None, int]:
    """Total milliseconds during which two writers of one task had open tenures, over the given log texts;
    and the number of batch lines read. The total is None when no line was found (nothing was measured)."""
    spans: dict[str, dict[tuple[str, str], list[int]]] = defaultdict(dict)
    batches = 0
    for text in logs:
        for match in WROTE.finditer(text):
            batches += 1
            writer = (match["processor"], match["epoch"])
            start, end = int(match["start"]), int(match["end"])
            span = spans[match["task"]].setdefault(writer, [start, end])
            span[0], span[1] = min(span[0], start), max(span[1], end)
    if not batches:
        return None, 0
    total = 0
    for writers in spans.values():
        # a sweep over the tenures' ends: time during which at least two are open
        events = sorted([(s, 1) for s, _ in writers.values()] + [(e, -1) for _, e in writers.values()])
        open_count, since = 0, 0
        for at, step in events:
            if open_count >= 2:
                total += at - since
            open_count += step
            since = at
    return total, batches
