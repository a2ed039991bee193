"""Which output ids the embedded log must keep: those a replay may still send again (docs/guarantees.md, "Output
ids").

The embedded log drops a send of an id it holds (``record_ids``), which is how a replay's rows are not written
twice. An id no replay can send again is dead weight, and one is written per output record, so the leader
forgets them (`SystemAdmin.forget_ids`) in the same round as its trim (`weirflow.coordination.trimming`). By the
three kinds of id (`weirflow.results.ids`):

* a **row** of a row-wise stage is sent again only by a replay of its input from the stage task's checkpoint: one
  whose input record (``__pos`` / 4,096) lies before the offset that task's checkpoint resumes from can never be;
* a **dead letter** of input record *o* likewise, once the checkpoint of the task reading its partition is past
  *o*;
* a **result** of a stateful task is never sent twice: its id names the query attempt that first wrote it, and a
  replay leaves out the results an earlier attempt wrote instead of sending them again
  (`weirflow.spark.result_replays`), so it is forgotten at once.

An id of another shape, of a task or stage that is not in the job model, of an input partition whose task has no
checkpoint yet, or of a system of positions (Kinesis lanes) is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.model import JobModel
from weirflow.results.ids import DeadLetterId, ResultId, RowId, parse

CODE_BITS = 16  # `weirflow.spark.replay`: ``__pss`` is (code << 16) | partition, a lane above bit 32
ROW_BITS = 12  # ``__pos`` is the record's offset times 4,096 plus the row's index in it
LANE_SHIFT = 32


def ids_to_keep(
    model: JobModel,
    checkpoints: Mapping[str, Checkpoint],
    stage_inputs: Mapping[str, Mapping[int, tuple[str, str]]],
) -> Callable[[str], bool]:
    """A predicate: whether an output id must be kept (module docstring)."""
    by_stage: dict[tuple[str, str], int] = {}  # (stage, ssp key) -> the offset its task resumes from
    by_ssp: dict[str, int] = {}  # ssp key -> the lowest offset a task reading it resumes from
    unknown: set[str] = set()  # ssp keys a task reads without a checkpointed offset
    for task in model.tasks.values():
        checkpoint = checkpoints.get(task.name)
        for ssp in task.ssps:
            offset = checkpoint.offsets.get(ssp) if checkpoint is not None else None
            if offset is None or not offset.isdigit():
                unknown.add(ssp.key())
                continue
            by_stage[(task.stage, ssp.key())] = int(offset)
            by_ssp[ssp.key()] = min(int(offset), by_ssp.get(ssp.key(), int(offset)))

    def keep(text: str) -> bool:
        found = parse(text)
        if isinstance(found, ResultId):
            return found.task not in model.tasks
        if isinstance(found, DeadLetterId):
            resumes = by_ssp.get(found.ssp)
            if resumes is None or found.ssp in unknown or not found.offset.isdigit():
                return True
            return int(found.offset) >= resumes
        if isinstance(found, RowId):
            if found.pss >> LANE_SHIFT:
                return True
            ref = stage_inputs.get(found.stage, {}).get(found.pss >> CODE_BITS)
            if ref is None:
                return True
            key = SystemStreamPartition(ref[0], ref[1], found.pss & ((1 << CODE_BITS) - 1)).key()
            resumes = by_stage.get((found.stage, key))
            return resumes is None or key in unknown or found.pos >> ROW_BITS >= resumes
        return True

    return keep
