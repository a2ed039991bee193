"""Sticky balanced assignment of tasks to processors.

Balance: with T tasks and P processors every processor gets ⌊T/P⌋ or ⌈T/P⌉ tasks, and exactly T mod P of
them get the larger share. Stickiness: the number of tasks that stay where they were is the largest any
balanced assignment allows. That maximum is reached by giving the ⌈T/P⌉ slots to the processors that
previously held the most still-valid tasks (an exchange argument: swapping a larger slot to a processor with
fewer previous tasks can only lower ``sum(min(previous_i, slot_i))``), letting each keep
``min(previous_i, slot_i)`` of its tasks, and filling the remaining room with the freed and new tasks. Ties
and choices are broken by sorted ids, so the result does not depend on input order.

Tasks are taken in natural order (``s-2`` before ``s-10``), so a fresh assignment gives each processor a run of
neighbouring tasks: Kinesis's virtual tasks ``s-v<k>`` fed by one shard are neighbours, and land together
(docs/kinesis.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_NUMBER = re.compile(r"(\d+)")


def natural(task: str) -> tuple[tuple[int, str | int], ...]:
    """Sort key of a task id: digit runs compare as numbers."""
    return tuple((1, int(part)) if part.isdigit() else (0, part) for part in _NUMBER.split(task) if part)


def assign(
    tasks: Iterable[str], processors: Iterable[str], previous: Mapping[str, Iterable[str]] | None = None
) -> dict[str, tuple[str, ...]]:
    all_tasks = sorted(set(tasks), key=natural)
    procs = sorted(set(processors))
    if not procs:
        return {}
    task_set = set(all_tasks)
    prev: dict[str, list[str]] = {p: [] for p in procs}
    claimed: set[str] = set()
    for p in procs:
        for t in sorted(set((previous or {}).get(p, ())), key=natural):
            if t in task_set and t not in claimed:
                prev[p].append(t)
                claimed.add(t)
    base, extra = divmod(len(all_tasks), len(procs))
    order = sorted(procs, key=lambda p: (-len(prev[p]), p))
    slots = {p: base + (1 if i < extra else 0) for i, p in enumerate(order)}
    result: dict[str, list[str]] = {p: prev[p][: slots[p]] for p in procs}
    kept = {t for ts in result.values() for t in ts}
    free = [t for t in all_tasks if t not in kept]
    for p in order:
        room = slots[p] - len(result[p])
        result[p].extend(free[:room])
        free = free[room:]
    return {p: tuple(sorted(result[p])) for p in procs}
