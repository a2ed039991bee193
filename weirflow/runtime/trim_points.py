"""How far each partition of an intermediate stream may be deleted: below the first offset anything may still read.

An intermediate stream (`partition_by`) is written by the job for itself. Once every task that reads a
partition has checkpointed past a record, and nothing that recovers from a fault can read it again, the record
is dead weight: Kafka Streams purges a repartition topic's records once its consumer committed past them, and
the embedded log deletes them the same way (`SystemAdmin.trim`; docs/guarantees.md, "Trimming").

What may still read a partition of an intermediate stream, each bounded by a durable checkpoint that only ever
moves forward (fenced writes: a late writer cannot move it back):

* a **consuming task** resumes from its checkpoint's offset (``offsets``);
* its **marks** (``control.marks``) are rebuilt, when their cache is gone, by reading from the offset they hold
  at (``at``), and a drain's cut brings them forward from there (`weirflow.spark.drain_cut`);
* a task of a **shared aggregation query** rebuilds its open windows from its rebuild marks (``control.rebuild``),
  about a window and the lateness before its offset; one that has closed windows but no rebuild mark (its
  checkpoint was written by a query of its own) rebuilds from the partition's oldest record, so nothing of that
  partition is deleted until it has marks;
* a **stateful producer** that restarts reads what an earlier attempt of it wrote past its checkpoint from its
  tails (``control.tails``) on, to leave those results out of its replay (`weirflow.spark.result_replays`).

A consuming task with no checkpoint of the partition yet (a job's first minutes, a task added by an upgrade)
starts from the stream's oldest record: nothing of the partition is deleted while one exists. Spark's own
checkpoint of a consumer is at or ahead of the store's offsets (the store is written after Spark's commit, and
a Spark checkpoint behind the store is discarded), so it never needs a record below them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.model import TaskModel
from weirflow.job.systems import StreamRef
from weirflow.runtime.control import TaskControl

Compare = Callable[[SystemStreamPartition, str, str], int | None]


@dataclass(frozen=True)
class TrimScope:
    """What a job may trim, as its task runner knows it: its intermediate streams as ``(system, physical
    name)`` pairs, ``rebuilds(stage)``, whether a stage's tasks rebuild open windows from rebuild marks, and the
    streams it may compact."""

    streams: frozenset[tuple[str, str]]
    rebuilds: Callable[[str], bool]
    # per stage, the code of each input in its rows' ``__pss`` -> (system, physical): what names the input
    # partition of a row's output id (`weirflow.results.ids`), for forgetting the ids no replay sends again
    stage_inputs: Mapping[str, Mapping[int, tuple[str, str]]] = field(default_factory=dict)
    # streams read back whole of which only the latest record per key counts (a record task's table changelogs)
    compacted: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def of(
        cls,
        refs: Iterable[StreamRef],
        shared_known: Callable[[str], bool | None],
        stage_inputs: Mapping[str, Mapping[int, tuple[str, str]]],
    ) -> TrimScope:
        """A pipeline's: ``refs`` its intermediate streams; ``shared_known(stage)`` whether the stage's tasks run
        one shared aggregation query, as far as the processor has worked it out (None: not yet). A stage not
        worked out yet is taken to rebuild from marks, which keeps more of its input, never less."""

        def rebuilds(stage: str) -> bool:
            known = shared_known(stage)
            return True if known is None else known

        return cls(frozenset((ref.system, ref.physical) for ref in refs), rebuilds, stage_inputs)


@dataclass(frozen=True)
class TrimPoint:
    """The first offset of ``ssp`` something may still read (``offset``), and what holds it there
    (``held_by``: a task and why), for the log line and for tests; ``offset`` None: keep everything."""

    ssp: SystemStreamPartition
    offset: str | None
    held_by: str


def trim_points(
    tasks: Mapping[str, TaskModel],
    checkpoints: Mapping[str, Checkpoint],
    intermediate: Iterable[SystemStreamPartition],
    *,
    rebuilds: Callable[[str], bool],
    compare: Compare,
) -> dict[SystemStreamPartition, TrimPoint]:
    """Per partition of ``intermediate``, the first offset anything may still read (module docstring).

    ``tasks`` are the job model's tasks (who reads what), ``checkpoints`` every task's last checkpoint (a task
    that is no longer in the model may still hold tails). ``rebuilds(stage)`` says whether a stage's tasks
    rebuild open windows from rebuild marks (a shared aggregation query). ``compare(ssp, a, b)`` orders two
    offsets of ``ssp`` (`SystemAdmin.compare_offsets`); offsets it cannot order keep everything."""
    points: dict[SystemStreamPartition, TrimPoint] = {}
    wanted = set(intermediate)
    readers: dict[SystemStreamPartition, list[TaskModel]] = {ssp: [] for ssp in wanted}
    for task in tasks.values():
        for ssp in task.ssps:
            if ssp in readers:
                readers[ssp].append(task)
    controls = {name: TaskControl.from_json(cp.control) for name, cp in checkpoints.items()}
    for ssp in sorted(wanted, key=SystemStreamPartition.key):
        point = _lowest(ssp, readers[ssp], checkpoints, controls, rebuilds, compare)
        points[ssp] = point
    return points


def _lowest(
    ssp: SystemStreamPartition,
    readers: list[TaskModel],
    checkpoints: Mapping[str, Checkpoint],
    controls: Mapping[str, TaskControl],
    rebuilds: Callable[[str], bool],
    compare: Compare,
) -> TrimPoint:
    key = ssp.key()
    if not readers:
        return TrimPoint(ssp, None, "no task of the job model reads it")
    held: list[tuple[str, str]] = []  # (offset, why)
    for task in readers:
        checkpoint = checkpoints.get(task.name)
        offset = checkpoint.offsets.get(ssp) if checkpoint is not None else None
        if offset is None:
            return TrimPoint(ssp, None, f"task {task.name} has no checkpoint of it yet")
        control = controls[task.name]
        held.append((offset, f"task {task.name}'s checkpoint"))
        if key in control.marks and "at" in control.marks[key]:
            held.append((str(control.marks[key]["at"]), f"task {task.name}'s marks"))
        if control.rebuild.get(key):
            held += [(str(mark[0]), f"task {task.name}'s rebuild marks") for mark in control.rebuild[key]]
        elif rebuilds(task.stage) and control.closed is not None and control.closed >= 0:
            return TrimPoint(ssp, None, f"task {task.name} would rebuild its windows from the oldest record")
    for name, control in controls.items():
        if key in control.tails:
            held.append((control.tails[key], f"task {name}'s tails"))
    lowest = held[0]
    for candidate in held[1:]:
        order = compare(ssp, candidate[0], lowest[0])
        if order is None:
            return TrimPoint(ssp, None, f"{candidate[1]} and {lowest[1]} cannot be ordered")
        if order < 0:
            lowest = candidate
    return TrimPoint(ssp, lowest[0], lowest[1])
