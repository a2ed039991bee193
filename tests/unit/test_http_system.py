"""The ``http`` system (`weirflow.endpoints.http_system`) on the embedded log as its backing system: requests
stay on the requests stream, what the job sends goes to the responses stream in its connection's partition,
and a response without a connection becomes a dead letter."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from weirflow.config.loader import Config
from weirflow.endpoints.http_system import (
    HttpSystemFactory,
    backing_system,
    connection_partition,
    request_record,
    responses_stream,
)
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems


def job_config(tmp_path: Path, **extra: object) -> Config:
    return Config.from_dict(
        {"job.name": "http-test", "job.state.dir": str(tmp_path), "systems.http.factory": "http", **extra}
    )


@pytest.fixture
def config(tmp_path: Path) -> Config:
    return job_config(tmp_path)


@pytest.fixture
def backing(config: Config) -> Iterator[Systems]:
    """The embedded log the ``http`` system keeps its records on, read directly."""
    systems = Systems(config)
    yield systems
    systems.close()


@pytest.fixture
def http(config: Config) -> Iterator[tuple]:
    factory = HttpSystemFactory()
    admin = factory.get_admin("http", config)
    consumer = factory.get_consumer("http", config)
    producer = factory.get_producer("http", config)
    admin.create_stream(StreamSpec("work", 4))
    yield admin, consumer, producer
    for client in (producer, consumer, admin):
        client.close()


def everything(systems: Systems, stream: str, partition: int) -> list[bytes]:
    ssp = SystemStreamPartition("local", stream, partition)
    return [r.value for r in systems.consumer("local").read(ssp, "0", 1000)]


def test_the_backing_system_is_the_default_system_unless_set_and_never_the_http_system_itself(tmp_path) -> None:
    assert backing_system(job_config(tmp_path), "http") == "local"
    assert backing_system(job_config(tmp_path, **{"job.default.system": "kafka"}), "http") == "kafka"
    assert backing_system(job_config(tmp_path, **{"job.default.system": "http"}), "http") == "local"
    assert backing_system(job_config(tmp_path, **{"systems.http.backing": "eh"}), "http") == "eh"


def test_a_stream_comes_with_its_responses_stream_which_the_listing_hides(http, backing) -> None:
    admin, _, _ = http
    assert backing.admin("local").list_streams() == {"work": 4, "work.responses": 4}
    assert admin.list_streams() == {"work": 4}
    assert admin.partition_count("work") == 4
    assert admin.create_stream(StreamSpec("work", 4)) is False, "idempotent"
    admin.create_stream(StreamSpec("work.dlq", 1))
    assert "work.dlq.responses" not in backing.admin("local").list_streams(), "dead letters get no responses"


def test_every_record_of_a_connection_goes_to_its_one_partition() -> None:
    connections = [f"p1.{i:016x}" for i in range(50)]
    spread = {connection_partition(c, 4) for c in connections}
    assert spread == {0, 1, 2, 3}, "connections spread over the partitions"
    assert all(connection_partition(c, 4) == connection_partition(c, 4) for c in connections)
    record = request_record("work", "p1.abc", "request", 3, "7", {"n": 1}, share=2, tasks=4)
    assert record.stream == "work" and record.partition == 3 and record.key == b"p1.abc"
    assert json.loads(record.value) == {
        "connection": "p1.abc",
        "kind": "request",
        "request": "7",
        "body": '{"n": 1}',
        "partition": 2,
        "tasks": 4,
    }
    marker = json.loads(request_record("work", "p1.abc", "connect", 3).value)
    assert (
        marker["kind"] == "connect" and marker["body"] is None and (marker["partition"], marker["tasks"]) == (0, 1)
    )


def test_the_job_reads_requests_as_records_of_the_http_system(http, backing) -> None:
    _, consumer, _ = http
    connection = "p1.0123456789abcdef"
    partition = connection_partition(connection, 4)
    backing.producer("local").send(
        [
            request_record("work", connection, "connect", partition),
            request_record("work", connection, "request", partition, "0", {"q": 1}),
            request_record("work", connection, "disconnect", partition),
        ]
    )
    ssp = SystemStreamPartition("http", "work", partition)
    records = consumer.read(ssp, "0", 100)
    assert [json.loads(r.value)["kind"] for r in records] == ["connect", "request", "disconnect"]
    assert all(r.ssp == ssp for r in records), "records are the http system's, not the backing system's"
    assert [r.offset for r in records] == ["0", "1", "2"]
    assert consumer.read(ssp, "1", 100, end="2")[0].offset == "1"
    columns = consumer.read_columns(ssp, "0", 100)
    assert list(columns.values) == [r.value for r in records] and columns.next_offset == "3"
    other = (partition + 1) % 4
    assert consumer.read(SystemStreamPartition("http", "work", other), "0", 100) == []


def test_what_the_job_sends_is_a_response_in_its_connections_partition(http, backing) -> None:
    _, _, producer = http
    first, second = "p1.aaaaaaaaaaaaaaaa", "p2.bbbbbbbbbbbbbbbb"
    producer.send(
        [
            OutgoingRecord("work", json.dumps({"connection": first, "body": 1}).encode()),
            OutgoingRecord("work", json.dumps({"body": 2}).encode(), key=second.encode()),  # by its key
            OutgoingRecord("work", json.dumps({"connection": first, "body": 3, "close": True}).encode()),
        ]
    )
    for partition in range(4):
        assert everything(backing, "work", partition) == [], "nothing goes back to the requests"
    got = {p: [json.loads(v) for v in everything(backing, responses_stream("work"), p)] for p in range(4)}
    assert got[connection_partition(first, 4)][-2:] == [
        {"connection": first, "body": 1},
        {"connection": first, "body": 3, "close": True},
    ]
    assert {"body": 2} in got[connection_partition(second, 4)]
    assert sum(len(v) for v in got.values()) == 3


def test_a_response_without_a_connection_is_a_dead_letter_saying_why(http, backing) -> None:
    admin, _, producer = http
    admin.create_stream(StreamSpec("work.dlq", 1))
    producer.send([OutgoingRecord("work", b'{"body": "lost"}'), OutgoingRecord("work", b"not json")])
    letters = [json.loads(v) for v in everything(backing, "work.dlq", 0)]
    assert [letter["stream"] for letter in letters] == ["work", "work"]
    assert all("needs a 'connection'" in letter["error"] for letter in letters)
    assert letters[1]["head_base64"] == "bm90IGpzb24="  # b"not json"
    assert all(everything(backing, responses_stream("work"), p) == [] for p in range(4))

    producer.send([OutgoingRecord("work.dlq", b"a letter of the job's own")])
    assert everything(backing, "work.dlq", 0)[-1] == b"a letter of the job's own", "dead letters pass through"
