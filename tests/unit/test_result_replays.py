"""A stateful task's results written past its checkpoint are recognised when a replay produces them again
(weirflow.spark.result_replays): the tails the sink's commit notes, the rows read back from them, and the sink
leaving each replayed result out once. Driven as Spark would drive the writer, over a real embedded log."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from weirflow.config.loader import Config
from weirflow.control import ControlMessage, MessageType
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.spark.packing import unpack
from weirflow.spark.result_replays import KEEP_BATCHES, TASK_KEY, Replays, row_digests, written_since
from weirflow.spark.sink import WeirflowStreamWriter, WrittenCount
from weirflow.systems import Systems

SINK = {
    "stream": "mid",
    "system": "local",
    "physical": "mid",
    "rows": [["__r0_0", "page"], ["__r0_1", "views"]],
    "results": True,
    "stage": "counts",
}


def _config(tmp_path: Path) -> Config:
    return Config.from_dict({"job.name": "replays", "job.state.dir": str(tmp_path)})


def _results(pages: list[str], views: list[int]) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "__partition": pa.array([len(p) % 2 for p in pages], pa.int32()),
            "__r0_0": pa.array(pages),
            "__r0_1": pa.array(views, pa.int64()),
        }
    )


def _written(systems: Systems) -> list[tuple[str, str, int]]:
    """(task named by the record, page, views) of every packed row in `mid`, both partitions."""
    found = []
    for partition in (0, 1):
        for record in systems.consumer("local").read(SystemStreamPartition("local", "mid", partition), "0", 1000):
            if record.value[:1] == b"\x04":
                rows = unpack(record.value)
                task = (rows.schema.metadata or {}).get(TASK_KEY, b"").decode()
                found += [(task, r["page"], r["views"]) for r in rows.to_pylist()]
    return sorted(found)


def test_replays_are_a_multiset_used_up_copy_by_copy_and_dropped_after_their_checkpoints() -> None:
    replays = Replays()
    replays.add(["a", "a", "b"])
    assert len(replays) == 3
    assert replays.take("a") and replays.take("a") and not replays.take("a"), "two copies, two takes"
    replays.used({"b": 1})
    assert len(replays) == 0
    replays.add(["c"])
    for _ in range(KEEP_BATCHES - 1):
        replays = replays.aged()
    assert len(replays) == 1 and Replays.from_json(json.loads(json.dumps(replays.to_json()))) == replays
    assert len(replays.aged()) == 0, "unmatched after its checkpoints: dropped"


def test_a_replay_writes_only_the_results_its_earlier_attempt_did_not(tmp_path: Path) -> None:
    config = _config(tmp_path)
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("mid", 2))
    counts_dir = tmp_path / "counts"
    try:
        # attempt 1: batch 0 committed and checkpointed (its tails noted), batch 1 written, then a kill
        first = WeirflowStreamWriter(config.snapshot(), [SINK], counts_dir=str(counts_dir), tasks=["counts-0"])
        first.commit([first.write(iter([_results(["/a", "/bb"], [1, 2])]))], 0)
        tails = json.loads((counts_dir / "0.json").read_text())["tails"]
        assert set(tails) == {"local.mid.0", "local.mid.1"}
        first.write(iter([_results(["/c", "/dd", "/c"], [3, 4, 3])]))
        # another stateful task writes to the same stream meanwhile, and a control message passes
        other = WeirflowStreamWriter(config.snapshot(), [SINK], tasks=["counts-1"])
        other.write(iter([_results(["/c"], [3])]))
        control = ControlMessage(
            type=MessageType.WATERMARK, task_name="counts-0", task_count=1, timestamp=5
        ).encode()
        systems.producer("local").send([OutgoingRecord("mid", control, partition=0)])

        since = written_since(systems, "counts-0", tails)
        assert len(since) == 3, "batch 1's three results of counts-0, not counts-1's, not batch 0's"
        expected = row_digests(pa.table({"page": ["/c", "/dd", "/c"], "views": [3, 4, 3]}))
        assert sorted(since.rows) == sorted(set(expected)) and since.rows[expected[0]][0] == 2

        # attempt 2 replays batch 1 (and produces one more result): only the new one is written
        path = tmp_path / "replays.json"
        since.save(path)
        second = WeirflowStreamWriter(
            config.snapshot(), [SINK], counts_dir=str(counts_dir), tasks=["counts-0"], replays_file=str(path)
        )
        message = second.write(iter([_results(["/c", "/dd", "/e", "/c"], [3, 4, 5, 3])]))
        assert isinstance(message, WrittenCount) and sum(message.replayed.values()) == 3
        second.commit([message], 1)
        assert len(Replays.load(path)) == 0 and not path.exists(), "every replayed copy used up"
        assert json.loads((counts_dir / "1.json").read_text())["replayed"] == 3
        assert _written(systems) == sorted(
            [
                ("counts-0", "/a", 1),
                ("counts-0", "/bb", 2),
                ("counts-0", "/c", 3),
                ("counts-0", "/c", 3),
                ("counts-0", "/dd", 4),
                ("counts-0", "/e", 5),
                ("counts-1", "/c", 3),
            ]
        ), "each result of counts-0 once"
    finally:
        systems.close()
