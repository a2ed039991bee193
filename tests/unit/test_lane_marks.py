"""Marks of lanes no row can come from again are forgotten (`weirflow.spark.lane_marks`, docs/guarantees.md,
"Checkpoints stay bounded"): a consumer of a stage reading a Kinesis stream resharded again and again keeps a
mark per lane only while the producer may still read the lane's shard, and then only until it has read every
row written before it learned so. The producer's checkpoint and the stream's shards are given here by fakes of
weirflow's own interfaces (`SystemAdmin.lanes_live`, a checkpoint reader); the Kinesis admin's answer is
checked against kinesalite in tests/integration/test_kinesis.py."""

from __future__ import annotations

import numpy as np

from weirflow.interfaces.checkpoint import Checkpoint
from weirflow.interfaces.system import SystemStreamPartition
from weirflow.runtime.control import TaskControl
from weirflow.spark import lane_marks
from weirflow.spark.lane_marks import CHECK_EVERY_MS, LaneCheck, LaneSource, decode_sources, encode_sources
from weirflow.spark.replay import Marks, lane_pss, pss

CODE = 300
LANES = 20_000


def _name(partition: int, lane: int) -> str:
    base = pss(CODE, partition)
    return f"views-1|{int(lane_pss(base, np.array([lane]))[0])}"


def _marks() -> Marks:
    """The marks of a consumer that read rows of 20,000 lanes (shards) of input partition 3, at offset 50."""
    return Marks("50", {_name(3, lane): (4096 * (lane + 1), 0) for lane in range(LANES)})


class _Admin:
    """The input system's `SystemAdmin.lanes_live`: only the last lane is still read, at the checkpoint's
    position; the calls are counted."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, str]] = []

    def lanes_live(self, stream: str, partition: int, offset: str) -> set[int]:
        self.calls.append((stream, partition, offset))
        return {LANES - 1}


def _check(admin: _Admin) -> LaneCheck:
    checkpoint = Checkpoint({SystemStreamPartition("kin", "views", 3): '{"shardId-000000019999":"9#1"}'})
    checkpoints = {"views-1-v3": checkpoint}
    return LaneCheck(
        decode_sources(encode_sources({("views-1", CODE): LaneSource("kin", "views", "v")})),
        checkpoints.get,
        lambda system: admin,
    )


def _sizes(marks: Marks) -> tuple[int, int]:
    from weirflow_aws.checkpoints import encode

    from weirflow_azure.checkpoint.table import _control_row

    control = TaskControl(marks={"local.mid.0": marks.to_json()}).to_json()
    row = _control_row("task", control)
    return len(encode({}, control)), sum(2 * len(v) for v in row.values() if isinstance(v, str))


def test_marks_of_lanes_read_to_their_end_go_once_every_row_written_before_is_read() -> None:
    from weirflow_aws.checkpoints import MAX_BODY_BYTES

    marks, admin = _marks(), _Admin()
    whole = _sizes(marks)
    assert whole[0] > MAX_BODY_BYTES or whole[1] > 1 << 20, "kept whole, they outgrow a store's limit"
    check = _check(admin)
    ends = iter(["100"])
    reached = lambda offset: int(marks.at) >= int(offset)  # noqa: E731

    assert lane_marks.prune(marks, CHECK_EVERY_MS, check.live_lanes, lambda: next(ends), reached) == 0
    assert admin.calls == [("views", 3, '{"shardId-000000019999":"9#1"}')], "one question per input partition"
    assert len(marks.pending) == LANES - 1 and set(marks.pending.values()) == {"100"}
    assert len(marks.marks) == LANES, "nothing goes before the rows written before the check are read"

    marks.at = "99"  # a replay of a done lane written before the check may still come: its mark stays
    assert lane_marks.prune(marks, CHECK_EVERY_MS + 1, check.live_lanes, lambda: "x", reached) == 0
    assert len(admin.calls) == 1, f"checked at most once per {CHECK_EVERY_MS} ms"

    marks.at = "100"
    assert lane_marks.prune(marks, CHECK_EVERY_MS + 2, check.live_lanes, lambda: "x", reached) == LANES - 1
    assert list(marks.marks) == [_name(3, LANES - 1)] and not marks.pending, "the live lane keeps its mark"
    again = Marks.from_json(marks.to_json())
    assert again == marks, "pending marks and the last check travel with the marks"
    dynamodb, azure_table = _sizes(marks)
    assert dynamodb < 1000 and azure_table < 1000


def test_nothing_is_forgotten_without_the_producer_s_checkpoint_or_for_partitions_of_one_lane() -> None:
    admin = _Admin()
    check = LaneCheck({}, {}.get, lambda system: admin)
    marks = _marks()
    assert lane_marks.prune(marks, CHECK_EVERY_MS, check.live_lanes, lambda: "100", lambda offset: True) == 0
    assert not marks.pending and not admin.calls, "an input without lanes' source: nothing asked"

    no_checkpoint = LaneCheck(_check(admin).sources, {}.get, lambda system: admin)
    assert no_checkpoint.live_lanes("views-1", pss(CODE, 3)) is None
    dense = Marks("5", {f"views-1|{pss(CODE, 3)}": (4096, 0)})  # a partition of one lane (dense offsets)
    assert lane_marks.prune(dense, CHECK_EVERY_MS, _check(admin).live_lanes, lambda: "9", lambda o: True) == 0
    assert not dense.pending and not admin.calls
    assert lane_marks.lane_of(f"views-1|{pss(CODE, 3)}") is None
    assert lane_marks.lane_of(_name(3, 7)) == ("views-1", pss(CODE, 3), 7)
