"""`weirflow streams consume` shows each of a job's records once (docs/guarantees.md, "Reading results once"): a
record whose id it already printed is a replay and is left out, equal values with other ids are not, `--json`
prints the id and `--replays` prints the stream as it is; on the embedded log and on Event Hubs (the emulator),
for output rows, results and dead letters. The command runs in this process (typer's runner): each call costs
no interpreter start."""

from __future__ import annotations

import json
import sqlite3
import textwrap
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from tests.integration import reading_results
from weirflow.cli import app
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec
from weirflow.job.systems import Systems
from weirflow.local.factories import stream_database_path
from weirflow.results import ReplayFilter
from weirflow.results.ids import dead_letter_id, result_id, row_id

pytestmark = pytest.mark.integration


def weirflow(*args: str) -> Result:
    return CliRunner().invoke(app, list(args), catch_exceptions=False)


def words(text: str) -> str:
    """``text`` with its line wrapping undone (rich wraps stderr at the terminal's width)."""
    return " ".join(text.split())


ROWS = [  # (partition, id, value): two equal values of other rows, a result equal to a row, no id twice
    (0, row_id("views", 2, 0x1000, 0), {"page": "/a"}),
    (0, row_id("views", 2, 0x2000, 0), {"page": "/a"}),
    (0, row_id("views", 2, 0x2000, 1), {"page": "/b"}),
    (1, row_id("views", 3, 0x1000, 0), {"page": "/a"}),
    (1, result_id("counts-1", "5f0c1e2a9b3d4c6e.1.0.0.0", "9c0e4d1b22aa0f3e"), {"page": "/a"}),
    (1, None, {"page": "/a"}),
]
REPLAY = [ROWS[1], ROWS[2]]  # what an attempt after a crash sent again, from a checkpoint before row 2
LETTERS = [(1, dead_letter_id("eh.views.1", str(offset)), {"error": "not valid JSON"}) for offset in (7, 8)]


def _records(stream: str, rows: list[tuple[int, str | None, dict]]) -> list[OutgoingRecord]:
    return [OutgoingRecord(stream, json.dumps(v).encode(), partition=p, id=i) for p, i, v in rows]


def _json_lines(result: Result) -> list[dict]:
    assert result.exit_code == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def _check_reading(config: Path, output: str, dead_letters: str, every_option: bool = True) -> None:
    """The stream holds ROWS, then REPLAY, then ROWS[-1] again (no id); the dead letters twice each. Without
    ``every_option`` (Event Hubs: each call attaches a receiver per partition, seconds), two calls only."""
    once = weirflow("streams", "consume", str(config), output, "--json")
    assert [(r["partition"], r["id"], r["value"]) for r in _json_lines(once)] == [*ROWS, ROWS[-1]]
    assert "left out 2 replayed records" in words(once.stderr)

    letters = weirflow("streams", "consume", str(config), dead_letters, "--json")
    assert [(r["id"], r["value"]) for r in _json_lines(letters)] == [(i, v) for _, i, v in LETTERS]
    assert "left out 2 replayed records" in words(letters.stderr)
    if not every_option:
        return
    everything = _json_lines(weirflow("streams", "consume", str(config), output, "--json", "--replays"))
    held = sorted((r["partition"], r["offset"]) for r in everything)
    assert len(everything) == len(ROWS) + len(REPLAY) + 1 and len(set(held)) == len(held)
    assert [r["id"] for r in everything if r["partition"] == 0] == [i for _, i, _ in ROWS[:3] + REPLAY]
    limited = _json_lines(weirflow("streams", "consume", str(config), output, "--json", "--max", "4"))
    assert [r["id"] for r in limited] == [i for _, i, _ in ROWS[:4]], "--max counts printed records"
    text = weirflow("streams", "consume", str(config), output)
    assert len(text.stdout.splitlines()) == len(ROWS) + 1 and "left out 2 replayed records" in words(text.stderr)
    assert len(_json_lines(weirflow("streams", "consume", str(config), dead_letters, "--replays", "--json"))) == 4


def test_the_embedded_log_s_records_are_printed_once_with_their_ids(tmp_path: Path) -> None:
    """The embedded log drops an id it holds where it is written; the same file, its ids forgotten between the
    writes, holds replays as Event Hubs or Kinesis would, and the command leaves them out by itself."""
    config = tmp_path / "job.yaml"
    config.write_text(
        textwrap.dedent(
            """
            job: {name: consume}
            streams:
              views: {partitions: 2}
              out: {partitions: 2}
            """
        )
    )
    cfg = load_config(config)
    systems = Systems(cfg)
    try:
        admin, producer = systems.admin("local"), systems.producer("local")
        for stream in ("out", "views.dlq"):
            admin.create_stream(StreamSpec(stream, 2))
        producer.send(_records("out", ROWS) + _records("views.dlq", LETTERS))
        producer.send(_records("out", REPLAY + ROWS[-1:]) + _records("views.dlq", LETTERS))
        held = weirflow("streams", "consume", str(config), "out", "--replays")
        assert len(held.stdout.splitlines()) == len(ROWS) + 1, "the log dropped the ids it held"
        with sqlite3.connect(stream_database_path(cfg, "local")) as db:
            db.execute("DELETE FROM record_ids")  # forget them: the next send writes the replay
        producer.send(_records("out", REPLAY) + _records("views.dlq", LETTERS))
    finally:
        systems.close()
    _check_reading(config, "out", "views.dlq")


def test_event_hubs_records_are_printed_once_and_dead_letters_are_read_on_their_stream_s_system(
    tmp_path: Path, eventhubs_emulator
) -> None:
    """Event Hubs keeps every send: the records are written twice as a replay writes them, through weirflow's
    producer (the ``weirflow-id`` property). ``views.dlq`` is read on the hub system of ``views``, not on the
    job's default system."""
    emulator = eventhubs_emulator({"out": 2, "views": 2, "views.dlq": 2})
    config = tmp_path / "job.yaml"
    config.write_text(
        textwrap.dedent(
            f"""
            job: {{name: consume}}
            systems:
              eh: {{factory: eventhub, connection.string: "{emulator.connection_string()}"}}
            streams:
              views: {{partitions: 2, system: eh}}
              out: {{partitions: 2, system: eh}}
            """
        )
    )
    systems = Systems(load_config(config))
    try:
        producer = systems.producer("eh")
        producer.send(_records("out", ROWS) + _records("views.dlq", LETTERS))
        producer.send(_records("out", REPLAY + ROWS[-1:]) + _records("views.dlq", LETTERS))
    finally:
        systems.close()
    _check_reading(config, "out", "views.dlq", every_option=False)


def test_produce_sends_the_lines_before_a_bad_one_and_says_how_many(tmp_path: Path) -> None:
    """Lines are sent in writes of --batch records: at a bad line, the lines before it are sent (two writes of
    500 and the 200 pending), nothing from it on, and the error says so; the stream holds exactly that."""
    config = tmp_path / "job.yaml"
    config.write_text("job: {name: produce}\nstreams:\n  views: {partitions: 2}\n")
    assert weirflow("streams", "create", str(config), "views").exit_code == 0
    good = [json.dumps({"user": f"u{i}"}) for i in range(1200)]
    lines = "\n".join([*good[:700], "", *good[700:], "{not json", *good[:5]]) + "\n"
    result = CliRunner().invoke(app, ["streams", "produce", str(config), "views"], input=lines)
    assert result.exit_code == 1
    message = words(result.stderr)
    assert "stdin line 1202 is not JSON" in message
    assert "the lines before it were sent (1200 records to local.views), nothing from line 1202 on" in message
    assert "tail -n +1202" in message
    held = _json_lines(weirflow("streams", "consume", str(config), "views", "--json"))
    assert sorted(r["value"]["user"] for r in held) == sorted(f"u{i}" for i in range(1200))

    keyed = CliRunner().invoke(
        app, ["streams", "produce", str(config), "views", "--key-field", "user"], input='{"user": 1}\n{"u": 2}\n'
    )
    assert keyed.exit_code == 1
    assert "line 2 has no field 'user' for --key-field; the lines before it were sent (1 records" in words(
        keyed.stderr
    )
    assert len(_json_lines(weirflow("streams", "consume", str(config), "views", "--json"))) == 1201


def test_kinesis_records_are_printed_once_though_a_send_reorders_them(tmp_path: Path, kinesalite) -> None:
    """One send of rows 1, 2 (key a) and 3 (key b) reaches the shard as 1, 3, 2: Kinesis's producer sends a
    key's second record in a later round. A mark would take row 2 for a replay; the window of a send's rows
    keeps it. The replay of rows 2 and 3 is left out, by `streams consume` and by the boto3 example alike."""
    import boto3

    example = reading_results.example("kinesis")
    stream = f"out-{uuid.uuid4().hex[:8]}"
    config = tmp_path / "job.yaml"
    lines = "\n".join(f'{k}: "{v}"' for k, v in kinesalite.config("kin").items())
    config.write_text(f"job.name: consume\n{lines}\nsystems.kin.shards: 1\nstreams.{stream}.system: kin\n")
    rows = [
        (key, row_id("views", 2, place << 12, 0), {"page": "/a"}) for key, place in (("a", 1), ("a", 2), ("b", 3))
    ]
    records = [OutgoingRecord(stream, json.dumps(v).encode(), key=k.encode(), id=i) for k, i, v in rows]
    systems = Systems(load_config(config))
    try:
        systems.admin("kin").create_stream(StreamSpec(stream, 1))
        systems.producer("kin").send(records)
        systems.producer("kin").send(records[1:])  # the next attempt, from a checkpoint before row 2
    finally:
        systems.close()
    sent = [i for _, i, _ in rows]

    held = _json_lines(weirflow("streams", "consume", str(config), stream, "--json", "--replays"))
    assert [r["id"] for r in held] == [sent[0], sent[2], sent[1], sent[1], sent[2]], "the shard's order"
    mark = ReplayFilter()
    assert [r["id"] for r in held if mark.is_new(0, r["id"])] == [sent[0], sent[2]], "a mark loses row 2"
    once = weirflow("streams", "consume", str(config), stream, "--json")
    assert [r["id"] for r in _json_lines(once)] == [sent[0], sent[2], sent[1]]
    assert [r["value"]["page"] for r in _json_lines(once)] == ["/a"] * 3, "equal values, all printed"
    assert "left out 2 replayed records" in words(once.stderr)

    client = boto3.client("kinesis", endpoint_url=kinesalite.endpoint, region_name="us-east-1")
    read: list[str] = []
    replays = example.read_results(client, stream, lambda _shard, record: read.append(record["Data"]))
    assert [json.loads(data)["weirflow_id"] for data in read] == [sent[0], sent[2], sent[1]]
    assert replays.replays == 2
