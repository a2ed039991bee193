"""The pure parts of the Kinesis system (docs/kinesis.md): slices of the MD5 hash space, positions and their
order, which shards may be read (parents before children), the producer's rounds and calls, and its settings."""

from __future__ import annotations

import json

import pytest

from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config
from weirflow.coordination.assignment import assign
from weirflow.interfaces.system import OutgoingRecord, SystemStreamPartition
from weirflow.job.grouper import group_by_partition
from weirflow_kinesis import positions
from weirflow_kinesis.hashing import HASH_SPACE, key_hash, partition_key, pinning_key, slice_of, slice_range
from weirflow_kinesis.producer import MAX_BYTES_PER_CALL, MAX_RECORDS_PER_CALL, _calls, _rounds, _with_id
from weirflow_kinesis.settings import KinesisSettings
from weirflow_kinesis.shards import Shard, ShardMap


def _lineage(generations: int) -> ShardMap:
    """A shard split ``generations`` times, each time into a lower half (the one holding slice 0 of 2) and an
    upper half that is not split again: ``shardId-<n>`` for the chain, every shard created in order."""
    shards, low, high, parent = [], 0, HASH_SPACE - 1, ()
    for n in range(generations + 1):
        chain = f"shardId-{2 * n:012d}"
        closed = n < generations
        shards.append(Shard(chain, low, high, parent, str(10**9 + 2 * n), "9" if closed else None))
        if closed:
            middle = (low + high) // 2
            shards.append(
                Shard(f"shardId-{2 * n + 1:012d}", middle + 1, high, (chain,), str(10**9 + 2 * n + 1), None)
            )
            high, parent = middle, (chain,)
    return ShardMap(shards)


def test_a_position_prunes_the_shards_it_read_to_their_end_and_stays_within_every_store_s_limits() -> None:
    """A task reading a shard split 20,000 times keeps, pruned, one state per shard it may still read: unpruned,
    its position would outgrow an Azure Table string property (32K characters). A pruned
    shard is still done for every read (never read again), still lets its other children be read, and
    compares as the same as its unpruned form."""
    from weirflow_aws.checkpoints import MAX_BODY_BYTES, encode

    from weirflow_azure.checkpoint.table import CHUNK_CHARS

    generations, virtual = 20_000, 2
    shards = _lineage(generations)
    chain = [s for s in shards.ordered if s.low == 0]
    assert len(chain) == generations + 1
    whole = {s.id: positions.ENDED for s in chain[:-1]} | {chain[-1].id: positions.processed("77", 3)}
    pruned = shards.prune(whole, 0, virtual)
    assert pruned == {chain[-1].id: positions.processed("77", 3), positions.PRUNED: str(generations)}
    assert shards.pruned_shards(pruned, 0, virtual) == {s.id for s in chain[:-1]}, "every pruned shard is done"
    assert not shards.done(chain[-1], pruned, 0, virtual) and shards.done(chain[-2], pruned, 0, virtual)
    assert positions.compare(positions.encode(pruned), positions.encode(whole)) == 0
    earlier = {**whole, chain[-1].id: positions.processed("70", 1)}
    assert positions.compare(positions.encode(pruned), positions.encode(earlier)) == 1
    assert positions.compare(positions.encode({chain[0].id: "E"}), positions.EARLIEST) == 1, "ended, not pruned"

    ssp = SystemStreamPartition("kin", "views", 0)
    assert len(positions.encode(pruned)) < 100 and len(encode({ssp: positions.encode(pruned)}, None)) < 1000
    assert len(positions.encode(whole)) > CHUNK_CHARS, "unpruned, it outgrows an Azure Table string property"
    assert len(encode({ssp: positions.encode(whole)}, None)) < MAX_BODY_BYTES  # (DynamoDB's zlib holds out longer)

    # slice 1 lies in the upper halves: each read to its end before the next, none split again
    one = shards.feeding(1, virtual)
    assert [s.id for s in one][:2] == [chain[0].id, "shardId-000000000001"]
    at_first_child = shards.prune({chain[0].id: positions.ENDED, "shardId-000000000001": "88#1"}, 1, virtual)
    assert at_first_child == {"shardId-000000000001": "88#1", positions.PRUNED: "1"}
    assert shards.readable(shards.by_id["shardId-000000000001"], at_first_child, 1, virtual)
    expired = ShardMap([s for s in shards.ordered if s.id != chain[0].id])  # the parent left the listing
    assert expired.prune({chain[0].id: positions.ENDED, chain[1].id: "5#1"}, 0, virtual) == {
        chain[1].id: "5#1",
        positions.PRUNED: "1",
    }


def test_a_shard_never_read_is_not_pruned_and_a_child_waits_for_it() -> None:
    shards = _lineage(2)
    parent, child = shards.by_id["shardId-000000000000"], shards.by_id["shardId-000000000002"]
    assert shards.prune({}, 0, 2) == {}
    assert not shards.done(parent, {}, 0, 2) and not shards.readable(child, {}, 0, 2)
    pinned = {child.id: positions.pinned("5")}
    assert not shards.done(parent, pinned, 0, 2), "a pinned child has not started"
    assert shards.prune({parent.id: positions.ENDED}, 0, 2) == {parent.id: positions.ENDED}, "no child started"


def test_slices_tile_the_hash_space_and_agree_with_slice_of() -> None:
    for virtual in (1, 3, 16, 1024):
        ranges = [slice_range(k, virtual) for k in range(virtual)]
        assert ranges[0][0] == 0 and ranges[-1][1] == HASH_SPACE - 1
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
        for k, (low, high) in enumerate(ranges):
            assert slice_of(low, virtual) == k and slice_of(high, virtual) == k


def test_a_key_s_hash_is_the_md5_kinesis_uses_and_pinning_keys_land_in_their_slice() -> None:
    assert key_hash("a") == 0x0CC175B9C0F1B6A831C399E269772661  # md5("a")
    assert partition_key(b"user-1") == "user-1"
    assert partition_key(b"\xff\xfe") != partition_key(b"\xff\xfd")  # not UTF-8: a hex digest, still distinct
    assert len(partition_key(b"x" * 300)) == 32
    for k in range(16):
        assert slice_of(key_hash(pinning_key(k, 16)), 16) == k


def test_positions_compare_shard_by_shard_and_encode_canonically() -> None:
    a = positions.encode({"s1": "100", "s0": "E"})
    assert a == '{"s0":"E","s1":"100"}'
    assert positions.compare(a, positions.encode({"s0": "E", "s1": "99"})) == 1
    assert positions.compare(positions.EARLIEST, a) == -1
    assert positions.compare(a, a) == 0
    ahead_and_behind = positions.encode({"s0": "5", "s1": "9"}), positions.encode({"s0": "6", "s1": "8"})
    assert positions.compare(*ahead_and_behind) is None
    assert positions.compare(positions.encode({"s0": "@10"}), positions.encode({"s0": "@20"})) is None
    assert positions.sequence_key("9") < positions.sequence_key("10")


def test_a_processed_state_carries_its_ordinal_and_compares_by_its_sequence_number() -> None:
    state = positions.processed("100", 7)
    assert (positions.sequence_of(state), positions.ordinal_of(state)) == ("100", 7)
    assert positions.ordinal_of("100") == 0 and positions.ordinal_of(None) == 0 and positions.ordinal_of("@5") == 0
    # a state written before ordinals is the same place in the shard
    assert positions.compare(positions.encode({"s0": state}), positions.encode({"s0": "100"})) == 0
    assert (
        positions.compare(positions.encode({"s0": positions.processed("99", 9)}), positions.encode({"s0": state}))
        == -1
    )
    assert positions.lane("shardId-000000000012") == 12
    assert 0 <= positions.lane("not-a-shard-id") <= positions.MAX_LANE


def _shard(shard_id: str, low: int, high: int, parents: tuple[str, ...] = (), closed: bool = False) -> Shard:
    return Shard(shard_id, low, high, parents, "1" + shard_id[-1] * 3, "9" if closed else None)


def test_children_are_read_only_after_every_parent_holding_the_slice_ends() -> None:
    half = HASH_SPACE // 2
    parent = _shard("p0", 0, half - 1, closed=True)
    other = _shard("p1", half, HASH_SPACE - 1, closed=True)
    left = _shard("c2", 0, half // 2 - 1, ("p0",))
    merged = _shard("c3", half // 2, HASH_SPACE - 1, ("p0", "p1"))  # a merge of p0's upper part and p1
    shards = ShardMap([merged, left, other, parent])
    assert [s.id for s in shards.ordered][:2] == ["p0", "p1"], "parents first"
    assert [s.id for s in shards.feeding(0, 4)] == ["p0", "c2"]
    assert not shards.readable(left, {}, 0, 4)
    assert shards.readable(left, {"p0": "E"}, 0, 4)
    # slice 3 lies in p1 and c3 only: p0 holds none of its keys, so p1 alone must end first
    assert not shards.readable(merged, {}, 3, 4)
    assert shards.readable(merged, {"p1": "E"}, 3, 4)
    assert not shards.readable(merged, {"p1": "E"}, 1, 4), "slice 1 lies in p0 too"
    assert shards.readable(_shard("c4", 0, 1, ("expired",)), {}, 0, 4), "an expired parent does not block"
    pinned = {"c2": positions.pinned("200")}  # a start pinned before the parents end says nothing of them
    assert not shards.readable(left, pinned, 0, 4)
    assert shards.readable(left, {**pinned, "p0": "E"}, 0, 4)


def test_a_key_appears_once_per_round_and_calls_keep_the_service_limits() -> None:
    items = [(OutgoingRecord("s", b"v"), k) for k in ["a", "b", "a", "c", "a", "b"]]
    rounds = list(_rounds(items))
    assert [[k for _, k in r] for r in rounds] == [["a", "b", "c"], ["a", "b"], ["a"]]
    many = [(OutgoingRecord("s", b"x" * 20_000), str(i)) for i in range(1200)]
    calls = list(_calls(many))
    assert all(len(c) <= MAX_RECORDS_PER_CALL for c in calls)
    assert all(sum(len(r.value) + len(k) for r, k in c) <= MAX_BYTES_PER_CALL for c in calls)
    assert [item for call in calls for item in call] == many


def test_a_shard_s_neighbouring_virtual_tasks_are_assigned_together() -> None:
    ssps = [SystemStreamPartition("kin", "views", k) for k in range(16)]
    tasks = group_by_partition("views", ssps, "v")
    assert sorted(tasks) == sorted(f"views-v{k}" for k in range(16))
    model = assign(tasks, ["p0", "p1"])
    assert set(model["p0"]) == {f"views-v{k}" for k in range(8)}
    assert set(model["p1"]) == {f"views-v{k}" for k in range(8, 16)}


def test_an_output_record_s_id_becomes_the_last_field_of_its_json_object() -> None:
    """Kinesis records carry no properties: a consumer finds the id (docs/guarantees.md) in the JSON itself."""
    row = OutgoingRecord("out", b'{"page": "/a", "views": 3}', key=b"/a", id="views/1/2000/0")
    with_id = _with_id(row, "weirflow_id")
    assert json.loads(with_id.value) == {"page": "/a", "views": 3, "weirflow_id": "views/1/2000/0"}
    assert (with_id.stream, with_id.key) == (row.stream, row.key)
    assert json.loads(_with_id(OutgoingRecord("out", b"{}", id="t/ab"), "id").value) == {"id": "t/ab"}
    packed = OutgoingRecord("mid", b"\x04arrow", partition=1)  # intermediate rows: no id, untouched
    assert _with_id(packed, "weirflow_id") is packed
    no_id = OutgoingRecord("out", b'{"a": 1}')
    assert _with_id(no_id, "weirflow_id") is no_id


def test_streams_are_created_with_a_retention_kinesis_accepts() -> None:
    def retention(hours: int) -> int:
        config = Config.from_dict(
            {"job.name": "j", "systems.kin.factory": "kinesis", "systems.kin.retention.hours": hours}
        )
        return KinesisSettings.from_config("kin", config).retention_hours

    assert (retention(24), retention(8760)) == (24, 8760)
    for hours in (23, 8761):
        with pytest.raises(ConfigError, match="systems.kin.retention.hours"):
            retention(hours)
