"""The layout of a Spark checkpoint directory and the weirflow source's offsets in it
(`weirflow.interfaces.spark_checkpoint`): the codec writes exactly the JSON the source always wrote, and the
last committed batch is read in one place."""

from __future__ import annotations

import json
from pathlib import Path

from weirflow.interfaces.spark_checkpoint import (
    PartitionOffset,
    SourceOffset,
    last_committed,
    last_committed_batch,
)

WIRE = {
    "s": "page-views",
    "p": {
        "local.views.0": {"o": "40", "e": False},
        "local.views.1": {"o": "7", "e": True, "d": True},
        "eventhub.hub.2": {"o": "12", "e": False, "x": {"offset": "880", "sequence_number": "11"}},
    },
    "w": 1_700_000_000_000,
}


def test_a_source_offset_round_trips_to_the_same_json_keys_and_order() -> None:
    offset = SourceOffset.from_json(json.loads(json.dumps(WIRE)))
    assert offset.stream_id == "page-views" and offset.watermark == 1_700_000_000_000
    assert offset.partitions["local.views.1"] == PartitionOffset("7", ended=True, drained=True)
    assert offset.partitions["eventhub.hub.2"].position == {"offset": "880", "sequence_number": "11"}
    # Spark compares offsets as JSON text: an unchanged offset must encode to the very same text
    assert json.dumps(offset.to_json()) == json.dumps(WIRE)
    assert SourceOffset.from_json(offset.to_json()) == offset


def test_missing_optional_keys_take_their_defaults() -> None:
    offset = SourceOffset.from_json({"p": {"local.views.0": {"o": "3"}}})
    assert offset.watermark == -1 and offset.stream_id == ""
    assert offset.partitions["local.views.0"] == PartitionOffset("3", ended=False, drained=False, position=None)
    assert offset.partitions["local.views.0"].to_json() == {"o": "3", "e": False}


def _write_batch(root: Path, batch: int, sources: list[dict[str, object]], committed: bool = True) -> None:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    (root / "commits").mkdir(exist_ok=True)
    lines = ["v1", json.dumps({"batchWatermarkMs": 5}), *(json.dumps(s) for s in sources)]
    (root / "offsets" / str(batch)).write_text("\n".join(lines) + "\n")
    if committed:
        (root / "commits" / str(batch)).write_text("v1\n{}\n")
        (root / "commits" / f".{batch}.crc").write_text("")  # Spark's hidden checksums are not batches


def test_the_last_committed_batch_is_none_without_a_directory_or_a_commit(tmp_path: Path) -> None:
    assert last_committed_batch(tmp_path / "absent") is None and last_committed(tmp_path / "absent") is None
    _write_batch(tmp_path, 0, [WIRE], committed=False)
    assert last_committed_batch(tmp_path) is None and last_committed(tmp_path) is None


def test_the_last_committed_batch_reads_only_the_weirflow_sources_of_its_offset_log(tmp_path: Path) -> None:
    _write_batch(tmp_path, 3, [WIRE])
    _write_batch(tmp_path, 4, [WIRE, {"other-source": 1}])
    _write_batch(tmp_path, 5, [WIRE], committed=False)  # planned, not committed
    committed = last_committed(tmp_path)
    assert last_committed_batch(tmp_path) == 4
    assert committed is not None and committed.batch == 4 and committed.watermark_ms == 5
    assert committed.sources == [SourceOffset.from_json(WIRE)]
