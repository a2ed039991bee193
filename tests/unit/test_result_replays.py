"""A stateful task's results are delivered exactly once (weirflow.spark.result_replays, docs/guarantees.md):
what an attempt wrote past its checkpoint is recognised when a replay produces it again, and a result equal to
another is never taken for a replay of it. Driven as Spark drives the sink's writer (each Spark partition's
``write``, then the batch's ``commit``), over a real embedded log, with random batch cuts, kills and many equal
results."""

from __future__ import annotations

import json
import random
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.unit import table_fakes
from weirflow.base.errors import MalformedDocumentError
from weirflow.config.loader import Config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems
from weirflow.results.ids import ResultId, parse
from weirflow.runtime.control import ControlMessage, MessageType
from weirflow.spark import sink as sink_module
from weirflow.spark.packing import unpack
from weirflow.spark.result_replays import (
    KEEP_BATCHES,
    PART_KEY,
    TASK_KEY,
    Replays,
    ResultsLedger,
    from_checkpoint,
    in_checkpoint,
    replay_key,
    tails_of,
    written_since,
)
from weirflow.spark.sink import WeirflowStreamWriter
from weirflow.spark.source_spec import release

TASK = "counts-0"
PARTITIONS = 2  # of each stream, and Spark partitions of the task's query
MID = {
    "stream": "mid",
    "system": "local",
    "physical": "mid",
    "rows": [["__r0_0", "page"], ["__r0_1", "views"]],
    "results": True,
    "stage": "counts",
}
OUT = {"stream": "out", "system": "local", "physical": "out", "results": True, "stage": "counts"}
LAKE = {
    "stream": "lake",
    "system": "lake",
    "physical": "counts",
    "rows": [["__r2_0", "page"], ["__r2_1", "views"]],
    "results": True,
    "stage": "counts",
    "table": True,
}
SINKS = [MID, OUT, LAKE]


def _systems(root: Path) -> tuple[Config, Systems]:
    config = Config.from_dict(
        {
            "job.name": "replays",
            "job.state.dir": str(root),
            "systems.lake.factory": "tests.unit.table_fakes:MemoryTableFactory",
        }
    )
    systems = Systems(config)
    for stream in ("mid", "out"):
        systems.admin("local").create_stream(StreamSpec(stream, PARTITIONS))
    return config, systems


def _frame(results: list[tuple[str, int]]) -> pa.RecordBatch:
    """The sink's frame of ``results`` (page, views), each written to the three outputs, as
    `StageBuilder.sink_frame` unions them: the intermediate stream ``mid`` (``__sink`` 0, packed rows), the
    output stream ``out`` (``__sink`` 1, a JSON record keyed by page) and the table ``counts`` (``__sink`` 2)."""
    pages = [p for p, _ in results]
    views = [v for _, v in results]
    n = len(results)
    none = [None] * n
    return pa.record_batch(
        {
            "__sink": pa.array([0] * n + [1] * n + [2] * n, pa.int8()),
            "__partition": pa.array([len(p) % PARTITIONS for p in pages] + none * 2, pa.int32()),
            "__r0_0": pa.array(pages + none * 2, pa.string()),
            "__r0_1": pa.array(views + none * 2, pa.int64()),
            "__key": pa.array(none + [p.encode() for p in pages] + none, pa.binary()),
            "__value": pa.array(
                none + [json.dumps({"page": p, "views": v}).encode() for p, v in results] + none, pa.binary()
            ),
            "__r2_0": pa.array(none * 2 + pages, pa.string()),
            "__r2_1": pa.array(none * 2 + views, pa.int64()),
        }
    )


def _table(root: Path) -> list[tuple[str, str, int]]:
    """(id, page, views) of every row committed to the table ``counts``."""
    rows = table_fakes.tables(str(root)).get("counts")
    committed = rows.rows() if rows is not None else None
    return [(r["weirflow_id"], r["page"], r["views"]) for r in committed.to_pylist()] if committed else []


def _intermediate(systems: Systems) -> list[tuple[str, str, int, str]]:
    """(task, writer partition, page, views) of every packed row in ``mid``."""
    found = []
    for partition in range(PARTITIONS):
        ssp = SystemStreamPartition("local", "mid", partition)
        for record in systems.consumer("local").read(ssp, "0", 100_000):
            if record.value[:1] == b"\x04":
                rows = unpack(record.value)
                metadata = rows.schema.metadata or {}
                writer = (metadata.get(TASK_KEY, b"").decode(), metadata.get(PART_KEY, b"").decode())
                found += [(*writer, r["page"], r["views"]) for r in rows.to_pylist()]
    return found


def _outputs(systems: Systems) -> list[tuple[str | None, str, int]]:
    """(id, page, views) of every record in ``out``."""
    found = []
    for partition in range(PARTITIONS):
        ssp = SystemStreamPartition("local", "out", partition)
        for record in systems.consumer("local").read(ssp, "0", 100_000):
            value = json.loads(record.value)
            found.append((record.id, value["page"], value["views"]))
    return found


def _write(writer: WeirflowStreamWriter, batch: int, partition: int, pieces: list[list[tuple[str, int]]]) -> Any:
    """One Spark partition's ``write`` of batch ``batch``, its rows arriving in ``pieces``."""
    with mock.patch.object(sink_module, "spark_task", lambda: (batch, partition, 0)):
        return writer.write(iter([_frame(piece) for piece in pieces]))


def test_replays_are_a_multiset_used_up_copy_by_copy_and_dropped_after_their_checkpoints() -> None:
    replays = Replays()
    replays.add(["0|a", "0|a", "0|b"])
    assert len(replays) == 3
    assert replays.take("0|a") and replays.take("0|a") and not replays.take("0|a"), "two copies, two takes"
    replays.used({"0|b": 1})
    assert len(replays) == 0
    key = replay_key("local.mid", 1, "c")
    replays.add([key])
    replays.await_input({"local.in.0": "40"})
    for _ in range(3 * KEEP_BATCHES):  # however many batches the replay takes to read its input again
        replays = replays.aged(lambda until: False)
    assert len(replays) == 1 and Replays.from_json(json.loads(json.dumps(replays.to_json()))) == replays
    replays = replays.aged(lambda until: until == {"local.in.0": "40"})
    for _ in range(KEEP_BATCHES - 2):
        replays = replays.aged(lambda until: False)
    assert len(replays) == 1 and not replays.until, "read past: counted down without asking again"
    assert len(replays.aged(lambda until: False)) == 0, "unmatched after its input was read and more batches"
    assert Replays.from_json({"9c0e4d1b22aa0f3e": [1, 5]}) == Replays(), "a digest naming no writer is left out"
    legacy = Replays.from_json({key: [1, 5]})  # a checkpoint written before replays had ``until``
    assert legacy.rows == {key: [1, 5]} and not legacy.until


def test_equal_results_of_one_task_are_all_written_and_each_gets_an_id_of_its_own(tmp_path: Path) -> None:
    """One page viewed 5 times in each of three minutes, counted per minute without the window: three equal
    results, in one batch and in two more, are all written, with three ids."""
    config, systems = _systems(tmp_path)
    try:
        writer = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=[TASK], results_dir=str(tmp_path / "r"))
        writer.commit([_write(writer, 0, 0, [[("/a", 5)]])], 0)
        writer.commit([_write(writer, 1, 0, [[("/a", 5), ("/a", 5)]])], 1)
        outputs = _outputs(systems)
        assert [(page, views) for _, page, views in outputs] == [("/a", 5)] * 3
        assert len({i for i, _, _ in outputs}) == 3
        assert all(isinstance(parse(i), ResultId) and parse(i).task == TASK for i, _, _ in outputs)  # type: ignore[union-attr]
        assert [(p, v) for _, _, p, v in _intermediate(systems)] == [("/a", 5)] * 3
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)


def test_a_replay_writes_only_the_results_its_earlier_attempt_did_not(tmp_path: Path) -> None:
    config, systems = _systems(tmp_path)
    results_dir = tmp_path / "results"
    try:
        # attempt 1: batch 0 committed and checkpointed (its ledger has the tails), batch 1 written, then a kill
        first = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=[TASK], results_dir=str(results_dir))
        first.commit([_write(first, 0, 0, [[("/a", 1), ("/bb", 2)]])], 0)
        ledger = ResultsLedger.load(results_dir, 0)
        assert ledger is not None
        assert set(ledger.tails) == {f"local.{s}.{p}" for s in ("mid", "out") for p in (0, 1)} | {"lake.counts.0"}
        _write(first, 1, 0, [[("/c", 3), ("/dd", 4), ("/c", 3)]])
        _write(first, 1, 1, [[("/c", 3)]])
        # another stateful task writes to the same streams meanwhile, and a control message passes
        other = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=["counts-1"])
        _write(other, 7, 0, [[("/c", 3)]])
        control = ControlMessage(type=MessageType.WATERMARK, task_name=TASK, task_count=1, timestamp=5).encode()
        systems.producer("local").send([OutgoingRecord("mid", control, partition=0)])

        since = written_since(systems, TASK, ledger.tails)
        assert len(since) == 8, "batch 1's four results of counts-0 in each stream, not counts-1's, not batch 0's"
        # (a table is committed by the batch's commit, which the kill came before: nothing of batch 1 in it)
        keys = Counter({k: c for k, (c, _) in since.rows.items()})
        assert sorted(keys.values()) == [1, 1, 1, 1, 2, 2], keys  # per stream: /c twice and /dd by 0, /c by 1
        assert {k.split("|")[0] for k in keys} == {"0", "1"}, "counted under the Spark partition that wrote them"

        # attempt 2 replays batch 1 (and produces one more result): only the new one is written
        path = tmp_path / "replays.json"
        since.save(path)
        second = WeirflowStreamWriter(
            config.snapshot(), SINKS, tasks=[TASK], replays_file=str(path), results_dir=str(results_dir)
        )
        messages = [
            _write(second, 1, 0, [[("/c", 3), ("/dd", 4)], [("/e", 5), ("/c", 3)]]),
            _write(second, 1, 1, [[("/c", 3)]]),
        ]
        assert sum(sum(m.replayed.values()) for m in messages) == 8
        second.commit(messages, 1)
        assert not path.exists(), "every replayed copy used up"
        ledger = ResultsLedger.load(results_dir, 1)
        assert ledger is not None and ledger.attempt == second.attempt and not ledger.replays
        assert ledger.tails == {**{key: str(n) for key, n in _ends(systems).items()}, "lake.counts.0": "1"}
        mine = Counter((page, views) for task, _, page, views in _intermediate(systems) if task == TASK)
        assert mine == Counter({("/a", 1): 1, ("/bb", 2): 1, ("/c", 3): 3, ("/dd", 4): 1, ("/e", 5): 1})
        outputs = Counter((page, views) for i, page, views in _outputs(systems) if (i or "").startswith(TASK))
        assert outputs == mine, "each result of counts-0 once in the output stream too"
        assert Counter((page, views) for _, page, views in _table(tmp_path)) == mine, "and in the table"
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)


def test_a_replay_that_takes_more_batches_than_are_kept_writes_nothing_twice(tmp_path: Path) -> None:
    """Spark ran far ahead of the checkpoints (a slow checkpoint store): an attempt wrote a result in each of
    `KEEP_BATCHES` + 5 batches past its checkpoint and was killed. Its replay reads the input again in as many
    batches: each result is left out however late it comes, since the replay is kept until the task has read
    its input to where it ended when the replay began."""
    config, systems = _systems(tmp_path)
    results_dir, path = tmp_path / "results", tmp_path / "replays.json"
    count = KEEP_BATCHES + 5
    try:
        tails = tails_of(systems, [("local", "mid"), ("local", "out"), ("lake", "counts")])

        def attempt(replays_file: Path | None) -> None:
            writer = WeirflowStreamWriter(
                config.snapshot(),
                SINKS,
                tasks=[TASK],
                replays_file=str(replays_file or ""),
                results_dir=str(results_dir),
            )
            for batch in range(count):
                _plan(tmp_path, batch, batch + 1)
                writer.commit([_write(writer, batch, 0, [[("/a", batch)]])], batch)

        attempt(None)  # killed after its last batch, before any checkpoint: the next holder starts over
        since = written_since(systems, TASK, tails)
        assert len(since) == 3 * count
        since.await_input({IN: str(count)})
        since.save(path)
        attempt(path)
        expected = Counter(("/a", batch) for batch in range(count))
        assert Counter((p, v) for _, _, p, v in _intermediate(systems)) == expected
        assert Counter((p, v) for _, p, v in _outputs(systems)) == expected
        assert Counter((p, v) for _, p, v in _table(tmp_path)) == expected
        assert not path.exists(), "every copy used up"
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)


def test_a_checkpoint_of_many_replays_stays_within_every_store_s_limits(tmp_path: Path) -> None:
    """A killed attempt of a task that writes many results leaves many replays (40,000 here: one DynamoDB item
    or one Azure Table entity could not hold them). The checkpoint records them by the ledger that holds them,
    and stays small; a restart reads them from that ledger, and fails naming it when it is missing."""
    from weirflow_aws.checkpoints import MAX_BODY_BYTES, encode

    from weirflow.runtime.control import TaskControl
    from weirflow_azure.checkpoint.table import _control_row

    replays = Replays()
    replays.add(replay_key("local.out", n % PARTITIONS, f"{n:016x}") for n in range(40_000))
    directory = tmp_path / "results"
    ResultsLedger({"local.out.0": "7"}, replays, "a").save(directory, 12)

    def sizes(recorded: dict[str, Any]) -> tuple[int, int]:
        control = TaskControl(replays=recorded).to_json()
        row = _control_row("task", control)
        return len(encode({}, control)), sum(2 * len(v) for v in row.values() if isinstance(v, str))

    dynamodb, azure_table = sizes(in_checkpoint(replays, 12))
    assert dynamodb < MAX_BODY_BYTES and azure_table < 1 << 20
    assert dynamodb < 1000 and azure_table < 1000, "the checkpoint does not grow with the replays"
    whole = sizes(replays.to_json())
    assert whole[0] > MAX_BODY_BYTES or whole[1] > 1 << 20, "held whole, they outgrow a store's limit"
    assert from_checkpoint("counts-0", in_checkpoint(replays, 12), directory) == replays
    few = Replays()
    few.add([replay_key("local.out", 0, "ab")])
    assert in_checkpoint(few, 12) == few.to_json(), "a few are held in the checkpoint itself"
    (directory / "12.json").unlink()
    with pytest.raises(MalformedDocumentError, match=r"task counts-0: .*40000 replayed results.*batch 12"):
        from_checkpoint("counts-0", in_checkpoint(replays, 12), directory)


def _ends(systems: Systems) -> dict[str, int]:
    return {
        f"local.{s}.{p}": int(m.upcoming)
        for s in ("mid", "out")
        for p, m in systems.admin("local").partition_metadata(s).items()
    }


def test_a_batch_that_wrote_no_results_keeps_its_attempt_s_tails_without_asking_the_streams(
    tmp_path: Path,
) -> None:
    """Most batches of a windowed task close no window: their ledger keeps the tails the same attempt noted at
    its previous batch (nothing of the task lies past them); a batch that wrote results, and a new attempt's
    first batch, note them anew."""
    config, systems = _systems(tmp_path)
    results_dir = tmp_path / "results"
    try:
        writer = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=[TASK], results_dir=str(results_dir))
        writer.commit([_write(writer, 0, 0, [[("/a", 1)]])], 0)
        other = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=["counts-1"])
        other.commit([_write(other, 0, 0, [[("/bb", 2)]])], 0)  # another task moves the streams' ends on
        writer.commit([_write(writer, 1, 0, [])], 1)
        first, kept = ResultsLedger.load(results_dir, 0), ResultsLedger.load(results_dir, 1)
        assert first is not None and kept is not None and kept.tails == first.tails
        writer.commit([_write(writer, 2, 0, [[("/a", 2)]])], 2)
        noted = ResultsLedger.load(results_dir, 2)
        assert noted is not None and noted.tails != first.tails, "a batch with results notes the ends anew"
        again = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=[TASK], results_dir=str(results_dir))
        again.commit([_write(again, 3, 0, [])], 3)
        fresh = ResultsLedger.load(results_dir, 3)
        assert (
            fresh is not None
            and fresh.attempt == again.attempt
            and fresh.tails
            == {
                **{key: str(n) for key, n in _ends(systems).items()},
                "lake.counts.0": str(writer_version(systems)),
            }
        ), "another attempt notes them anew"
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)


def writer_version(systems: Systems) -> int:
    table = systems.table_writer("lake")
    assert table is not None
    return table.snapshot("counts", ()).version


def test_a_copy_written_by_one_spark_partition_is_not_used_up_by_another(tmp_path: Path) -> None:
    """Two Spark partitions of one batch each produce the result; one copy was written before the kill, by
    partition 0. Only partition 0's is a replay: partition 1's is a new, equal result."""
    config, systems = _systems(tmp_path)
    try:
        first = WeirflowStreamWriter(config.snapshot(), SINKS, tasks=[TASK], results_dir=str(tmp_path / "r"))
        first.commit([_write(first, 0, 0, [[("/z", 9)]])], 0)
        tails = ResultsLedger.load(tmp_path / "r", 0).tails  # type: ignore[union-attr]
        _write(first, 1, 0, [[("/a", 1)]])  # then a kill: partition 1 had not written yet
        path = tmp_path / "replays.json"
        written_since(systems, TASK, tails).save(path)
        second = WeirflowStreamWriter(
            config.snapshot(), SINKS, tasks=[TASK], replays_file=str(path), results_dir=str(tmp_path / "r")
        )
        second.commit([_write(second, 1, 1, [[("/a", 1)]]), _write(second, 1, 0, [[("/a", 1)]])], 1)
        assert Counter((p, v) for _, p, v in _outputs(systems)) == Counter({("/z", 9): 1, ("/a", 1): 2})
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)


# --- the property: random batch cuts, kills and equal results ---------------------------------------------
@dataclass(frozen=True)
class Result:
    """A result the task emits when its input reaches ``due`` (a closed window: its value does not depend on
    how the input was cut into batches), from Spark partition ``partition`` (its grouping key's)."""

    page: str
    views: int
    partition: int
    due: int


@dataclass
class Store:
    """The checkpoint store's record of the task: its input position and control state."""

    position: int = 0
    batch: int = -1
    tails: dict[str, str] = field(default_factory=dict)
    replays: dict[str, Any] = field(default_factory=dict)
    ledgers: str = ""  # the task's ledgers (its Spark checkpoint's ``results``), which a checkpoint may name


INPUT = 24
# where a batch may be killed: in a Spark partition's write, after every write before Spark's commit, after the
# commit before the checkpoints not written yet (mostly not at all)
KILLS = st.sampled_from(["", "", "", "write", "commit", "after"])
results_strategy = st.lists(
    st.builds(
        Result,
        page=st.sampled_from(["/a", "/bb"]),
        views=st.integers(1, 2),
        partition=st.integers(0, PARTITIONS - 1),
        due=st.integers(0, INPUT - 1),
    ),
    max_size=30,
)


def _pieces(rng: random.Random, rows: list[tuple[str, int]]) -> Iterator[list[tuple[str, int]]]:
    rows = list(rows)
    rng.shuffle(rows)  # the order within a partition is Spark's business
    while rows:
        size = rng.randrange(1, 4)
        yield rows[:size]
        rows = rows[size:]


class Killed(Exception):
    """The processor died here."""


def _pieces_until(pieces: list[list[tuple[str, int]]], kill_after: int | None) -> Iterator[pa.RecordBatch]:
    for n, piece in enumerate(pieces):
        if kill_after is not None and n == kill_after:
            raise Killed
        yield _frame(piece)


IN = "local.in.0"  # the task's input partition; its offsets are the input positions


def _plan(root: Path, batch: int, end: int) -> None:
    """Batch ``batch``'s entry in Spark's offset log (written before the batch runs): its input's end."""
    source = {"s": "in", "p": {IN: {"o": str(end), "e": False}}, "w": -1}
    (root / "offsets").mkdir(exist_ok=True)
    (root / "offsets" / str(batch)).write_text(f"v1\n{json.dumps({'batchWatermarkMs': 0})}\n{json.dumps(source)}")


def _replays(systems: Systems, store: Store) -> Replays:
    """As `StageQuery._replays`: the checkpoint's replays and what was written past its tails, kept until the
    input is read to its end as of now."""
    replays = from_checkpoint(TASK, store.replays, Path(store.ledgers))
    since = written_since(systems, TASK, store.tails)
    if len(since):
        replays.merge(since)
        replays.await_input({IN: str(INPUT)})
    return replays


def _run(data: st.DataObject, root: Path) -> None:
    results = data.draw(results_strategy, label="results")
    seed = data.draw(st.integers(0, 2**32 - 1), label="seed")
    rng = random.Random(seed)
    config, systems = _systems(root)
    results_dir, replays_file = root / "results", root / "replays.json"
    store = Store()
    spark_batch, spark_position = -1, 0  # Spark's last committed batch and where it ended (its checkpoint)
    ends: dict[int, int] = {}  # batch -> where its input ended, for the checkpoints that lag behind Spark
    kills = 0
    try:
        while True:
            # a restart: on the machine of Spark's checkpoint it catches up with Spark's last committed batch;
            # elsewhere (the state mirror of the store's batch) it resumes from the store
            if spark_batch > store.batch and data.draw(st.booleans(), label="same machine"):
                ledger = ResultsLedger.load(results_dir, spark_batch)
                assert ledger is not None
                replays = in_checkpoint(ledger.replays, spark_batch)
                store = Store(spark_position, spark_batch, ledger.tails, replays, str(results_dir))
            spark_batch, spark_position = store.batch, store.position
            if not store.tails:  # as `StageQuery._first_tails`: taken and checkpointed before the first batch
                store.tails = tails_of(systems, [("local", "mid"), ("local", "out"), ("lake", "counts")])
            _replays(systems, store).save(replays_file)
            writer = WeirflowStreamWriter(
                config.snapshot(),
                SINKS,
                tasks=[TASK],
                replays_file=str(replays_file),
                results_dir=str(results_dir),
            )
            # Spark runs ahead of the checkpoints by up to 14 batches (a slow checkpoint store), and a replay may
            # read its input again in more, smaller batches than the attempt it replays
            lag = data.draw(st.integers(0, 14), label="checkpoints behind Spark")
            killed = False
            while spark_position < INPUT and not killed:
                start = spark_position
                end = min(INPUT, start + (rng.randrange(1, 9) if rng.random() < 0.5 else 1))
                batch = spark_batch + 1
                _plan(root, batch, end)
                kill = kills < 3 and data.draw(
                    st.sampled_from(["", "", "", "write", "commit", "after"]), label="kill"
                )
                messages = []
                for partition in rng.sample(range(PARTITIONS), PARTITIONS):
                    due = [(r.page, r.views) for r in results if start <= r.due < end and r.partition == partition]
                    pieces = list(_pieces(rng, due))
                    stop = rng.randrange(0, len(pieces) + 1) if kill == "write" else None
                    with mock.patch.object(sink_module, "spark_task", lambda b=batch, p=partition: (b, p, 0)):
                        try:
                            messages.append(writer.write(_pieces_until(pieces, stop)))
                        except Killed:
                            killed = True
                            break
                if killed:
                    break
                if kill == "commit":  # the batch's rows are durable, Spark did not commit it
                    killed = True
                    break
                writer.commit(messages, batch)
                spark_batch, spark_position = batch, end
                ends[batch] = end
                if kill == "after":  # Spark committed it; the checkpoints not written yet are lost
                    killed = True
                    break
                # the processor checkpoints batches as their progress reports arrive: ``lag`` behind Spark
                due_batch = spark_batch - lag if spark_position < INPUT else spark_batch
                if due_batch > store.batch:
                    ledger = ResultsLedger.load(results_dir, due_batch)
                    assert ledger is not None, f"the ledger of batch {due_batch} was not kept"
                    replays = in_checkpoint(ledger.replays, due_batch)
                    store = Store(ends[due_batch], due_batch, ledger.tails, replays, str(results_dir))
            if killed:
                kills += 1
                continue
            break
        expected = Counter((r.page, r.views) for r in results)
        assert Counter((p, v) for _, _, p, v in _intermediate(systems)) == expected
        outputs = _outputs(systems)
        assert Counter((p, v) for _, p, v in outputs) == expected
        assert len({i for i, _, _ in outputs}) == len(outputs)
        committed = _table(root)
        assert Counter((p, v) for _, p, v in committed) == expected
        assert len({i for i, _, _ in committed}) == len(committed)
    finally:
        systems.close()
        release(config.snapshot())  # the writers' clients of this job (`systems_for`)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_result_is_delivered_exactly_once_whatever_the_cuts_kills_and_equal_results(
    data: st.DataObject,
) -> None:
    with tempfile.TemporaryDirectory() as root:
        _run(data, Path(root))
