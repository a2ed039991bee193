"""Records a row-wise stage writes to an output stream (weirflow.spark.sink): named by their position, and, sent
without a key, placed in the partition of their input partition, so that a replay lands where the first copy
did and a reader recognises it (weirflow.results.ReplayFilter)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from weirflow.config.loader import Config
from weirflow.interfaces.system import StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.results import ReplayFilter
from weirflow.results.ids import RowId, parse
from weirflow.spark.replay import POS, PSS, pss
from weirflow.spark.sink import WeirflowStreamWriter
from weirflow.spark.source_spec import release

OUT = {"stream": "out", "system": "local", "physical": "out", "positions": True, "stage": "copy"}


def _rows(places: list[tuple[int, int]], keyed: bool) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "__key": pa.array([f"k{x}".encode() if keyed else None for _, x in places], pa.binary()),
            "__value": pa.array([f'{{"p": {p}, "x": {x}}}'.encode() for p, x in places], pa.binary()),
            PSS: pa.array([pss(0, p) for p, _ in places], pa.int64()),
            POS: pa.array([x * 4096 for _, x in places], pa.int64()),
        }
    )


def _read(systems: Systems) -> dict[int, list[str | None]]:
    found = {}
    for partition in range(3):
        records = systems.consumer("local").read(SystemStreamPartition("local", "out", partition), "0", 1000)
        found[partition] = [r.id for r in records]
    return found


def test_keyless_rows_go_to_their_input_partition_s_partition_and_a_replay_follows_them(tmp_path: Path) -> None:
    config = Config.from_dict({"job.name": "rows", "job.state.dir": str(tmp_path)})
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("out", 3))
        places = [(p, x) for x in range(4) for p in range(5)]
        writer = WeirflowStreamWriter(config.snapshot(), [OUT])
        writer.write(iter([_rows(places, keyed=False)]))
        by_partition = _read(systems)
        for partition, ids in by_partition.items():
            lanes = {parse(i).pss for i in ids}  # type: ignore[union-attr]
            assert lanes and all(p % 3 == partition for p in lanes), (partition, lanes)
            rows = [parse(i) for i in ids]
            assert all(isinstance(r, RowId) for r in rows)
        # the keyed rows go where their keys hash, as any keyed record
        systems.admin("local").create_stream(StreamSpec("keyed", 3))
        keyed = dict(OUT, physical="keyed")
        WeirflowStreamWriter(config.snapshot(), [keyed]).write(iter([_rows(places, keyed=True)]))
        consumer = systems.consumer("local")
        placed = {
            p: {r.key for r in consumer.read(SystemStreamPartition("local", "keyed", p), "0", 1000)}
            for p in range(3)
        }
        assert all(
            systems.admin("local").partition_for_key("keyed", k) == p for p, ks in placed.items() for k in ks
        )
        # a reader of the keyless output recognises every row once, by the marks of their lanes
        reader = ReplayFilter()
        seen = [i for partition, ids in by_partition.items() for i in ids if reader.is_new(partition, i)]
        assert len(seen) == len(places) and reader.replays == 0
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)
