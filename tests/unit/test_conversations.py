"""The client side of ``http`` streams (`weirflow.endpoints.conversations`) on the embedded log: each client's
records are written as requests with connect and disconnect markers, the job's responses reach the
conversation they name, a fan-out gathers one reply per task or answers partially, and time limits hold.

`FakeJob` plays the job: it reads the requests stream and writes responses through the ``http`` system's
producer, as a job's ``send_to`` does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from weirflow.config.loader import Config
from weirflow.endpoints.conversations import Conversations, add_conversation_routes
from weirflow.endpoints.http_system import HttpSystemFactory, connection_partition, responses_stream
from weirflow.interfaces.system import OutgoingRecord, StreamSpec, SystemStreamPartition
from weirflow.job.systems import Systems

PARTITIONS = 4


@pytest.fixture
def systems(tmp_path: Path) -> Iterator[Systems]:
    config = Config.from_dict(
        {
            "job.name": "conversations-test",
            "job.state.dir": str(tmp_path),
            "systems.http.factory": "http",
            "streams.work.system": "http",
        }
    )
    systems = Systems(config)
    systems.admin("http").create_stream(StreamSpec("work", PARTITIONS))
    yield systems
    systems.close()


# How long a test lets a conversation take before it fails: generous, since a busy machine (the whole suite on
# two workers) can be slow; a passing test never waits for it.
PATIENCE_S = 60.0


def conversations(systems: Systems, timeout_s: float = PATIENCE_S) -> Conversations:
    return Conversations(systems, {"work": "http"}, "p1", timeout_s)


def requests_of(systems: Systems) -> dict[int, list[dict[str, Any]]]:
    """Every request record, by partition of the requests stream."""
    consumer = systems.consumer("local")
    return {
        p: [json.loads(r.value) for r in consumer.read(SystemStreamPartition("local", "work", p), "0", 1000)]
        for p in range(PARTITIONS)
    }


def respond(systems: Systems, *responses: dict[str, Any]) -> None:
    """Responses as the job writes them: to the ``http`` system, which puts them in their connection's
    partition of the responses stream."""
    systems.producer("http").send([OutgoingRecord("work", json.dumps(r).encode()) for r in responses])


class FakeJob:
    """Answers each request record with ``answer(request)`` (a response, or None for none); keeps them all."""

    def __init__(self, systems: Systems, answer: Callable[[dict[str, Any]], dict[str, Any] | None]) -> None:
        self.systems = systems
        self.answer = answer
        self.seen: list[dict[str, Any]] = []
        self._positions = dict.fromkeys(range(PARTITIONS), "0")
        self._consumer = HttpSystemFactory().get_consumer("http", systems.config)

    async def run(self) -> None:
        try:
            while True:
                for partition, position in self._positions.items():
                    ssp = SystemStreamPartition("http", "work", partition)
                    records = await asyncio.to_thread(self._consumer.read, ssp, position, 100)
                    if not records:
                        continue
                    self._positions[partition] = records[-1].next_offset
                    for record in records:
                        request = json.loads(record.value)
                        self.seen.append(request)
                        if request["kind"] == "request" and (response := self.answer(request)) is not None:
                            await asyncio.to_thread(respond, self.systems, response)
                await asyncio.sleep(0.01)  # not synchronisation: the fake job's poll interval, as a job's own
        finally:
            self._consumer.close()


def echo(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "connection": request["connection"],
        "request": request["request"],
        "body": json.loads(request["body"]),
    }


async def with_job(systems: Systems, answer: Callable[..., Any], work: Callable[[], Any]) -> tuple[Any, FakeJob]:
    job = FakeJob(systems, answer)
    running = asyncio.create_task(job.run())
    try:
        return await work(), job
    finally:
        running.cancel()


def kinds_by_connection(systems: Systems) -> dict[str, tuple[int, list[str]]]:
    """connection -> (the one partition its requests are in, their kinds in order)."""
    found: dict[str, tuple[int, list[str]]] = {}
    for partition, records in requests_of(systems).items():
        for record in records:
            seen_in, kinds = found.setdefault(record["connection"], (partition, []))
            assert seen_in == partition, f"connection {record['connection']} spans partitions"
            kinds.append(record["kind"])
    return found


def test_a_request_is_a_connection_of_its_own_with_connect_and_disconnect_markers(systems) -> None:
    conv = conversations(systems)
    response, _ = asyncio.run(with_job(systems, echo, lambda: conv.ask("work", {"n": 7}, PATIENCE_S)))
    assert response["body"] == {"n": 7} and response["request"] == "0"
    ((connection, (partition, kinds)),) = kinds_by_connection(systems).items()
    assert response["connection"] == connection and connection.startswith("p1.")
    assert kinds == ["connect", "request", "disconnect"]
    assert partition == connection_partition(connection, PARTITIONS)


def test_responses_reach_the_conversation_they_name_and_no_other(systems) -> None:
    conv = conversations(systems)

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        # noise first: a response for a connection nobody has, and one that is not JSON
        respond(systems, {"connection": "p9.nobody", "body": "lost"})
        partition = connection_partition(request["connection"], PARTITIONS)
        systems.producer("local").send(
            [OutgoingRecord(responses_stream("work"), b"not json", partition=partition)]
        )
        return echo(request)

    async def many() -> list[Any]:
        return await asyncio.gather(*(conv.ask("work", {"client": i}, PATIENCE_S) for i in range(6)))

    responses, job = asyncio.run(with_job(systems, answer, many))
    assert [r["body"] for r in responses] == [{"client": i} for i in range(6)]
    assert len({r["connection"] for r in responses}) == 6
    assert len([r for r in job.seen if r["kind"] == "request"]) == 6


def test_a_fan_out_sends_one_copy_per_task_and_gathers_every_reply(systems) -> None:
    conv = conversations(systems)

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        return {"connection": request["connection"], "body": [request["partition"], request["tasks"]]}

    result, job = asyncio.run(with_job(systems, answer, lambda: conv.fan_out("work", {"q": 1}, PATIENCE_S)))
    assert (result["tasks"], result["answered"], result["partial"]) == (PARTITIONS, PARTITIONS, False)
    assert sorted(r["body"][0] for r in result["replies"]) == list(range(PARTITIONS))
    assert all(r["body"][1] == PARTITIONS and "connection" not in r for r in result["replies"])
    copies = requests_of(systems)
    assert [[(r["kind"], r["partition"]) for r in copies[p]] for p in range(PARTITIONS)] == [
        [("request", p)] for p in range(PARTITIONS)
    ], "one copy in each partition, naming it"
    assert {json.loads(r["body"])["q"] for r in job.seen} == {1}


def test_a_fan_out_some_tasks_never_answer_is_partial_after_its_time_limit(systems) -> None:
    conv = conversations(systems)

    def answer(request: dict[str, Any]) -> dict[str, Any] | None:
        return None if request["partition"] == 2 else {"connection": request["connection"], "body": "ok"}

    began = time.monotonic()
    result, _ = asyncio.run(with_job(systems, answer, lambda: conv.fan_out("work", None, 3.0)))
    assert (result["tasks"], result["answered"], result["partial"]) == (PARTITIONS, PARTITIONS - 1, True)
    assert time.monotonic() - began >= 3.0, "it waited for the last task until the time limit"


def test_a_request_nobody_answers_times_out_with_none_and_still_disconnects(systems) -> None:
    conv = conversations(systems)
    began = time.monotonic()
    assert asyncio.run(conv.ask("work", "hello", 0.3)) is None
    assert time.monotonic() - began >= 0.3
    ((_, (_, kinds)),) = kinds_by_connection(systems).items()
    assert kinds == ["connect", "request", "disconnect"]


def test_responses_are_read_from_the_end_as_of_the_first_waiter_and_only_while_someone_waits(systems) -> None:
    conv = conversations(systems)
    connection = "p1.early"
    respond(systems, {"connection": connection, "body": "before anyone waited"})

    async def wait_and_stop() -> tuple[Any, bool]:
        waiter = await conv.open(connection)
        await asyncio.to_thread(respond, systems, {"connection": connection, "body": "after"})
        # both responses are in the connection's one partition, the earlier one first: a reader that started
        # before it would hand it over first
        got = await asyncio.wait_for(waiter.queue.get(), PATIENCE_S)
        conv.close(connection)
        reader = conv._reader
        assert reader is not None
        await asyncio.wait({reader}, timeout=10)
        return got, reader.done()

    got, stopped = asyncio.run(wait_and_stop())
    assert got == {"connection": connection, "body": "after"}, (
        "a response written before the first waiter was handed over"
    )
    assert stopped, "the reader of responses did not stop within 10 s of the last waiter leaving"


class FakeWebSocket:
    """What `Conversations.converse` uses of a Starlette WebSocket; ``incoming`` holds the client's messages."""

    def __init__(self) -> None:
        self.incoming: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.sent: list[Any] = []
        self.accepted = False
        self.closed: tuple[int, str] | None = None

    async def accept(self) -> None:
        self.accepted = True

    async def receive(self) -> dict[str, Any]:
        return await self.incoming.get()

    async def send_text(self, text: str) -> None:
        self.sent.append(json.loads(text))

    async def close(self, code: int, reason: str) -> None:
        self.closed = (code, reason)


def test_a_websocket_conversation_until_the_job_closes_it(systems) -> None:
    conv = conversations(systems)

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        body = json.loads(request["body"])
        return {"connection": request["connection"], "body": body, "close": body == "bye"}

    async def talk() -> FakeWebSocket:
        ws = FakeWebSocket()
        for text in ('{"n": 1}', "plain text", "bye"):  # JSON, text that is not JSON, and a closing request
            ws.incoming.put_nowait({"type": "websocket.receive", "text": text})
        await asyncio.wait_for(conv.converse("work", ws), PATIENCE_S)  # type: ignore[arg-type]
        return ws

    ws, _ = asyncio.run(with_job(systems, answer, talk))
    assert ws.accepted and ws.closed == (1000, "closed by the job")
    assert [m["body"] for m in ws.sent] == [{"n": 1}, "plain text", "bye"]
    assert all("connection" not in m for m in ws.sent)
    ((_, (_, kinds)),) = kinds_by_connection(systems).items()
    assert kinds == ["connect", "request", "request", "request", "disconnect"]


def test_a_client_that_goes_away_ends_its_conversation_with_a_disconnect(systems) -> None:
    conv = conversations(systems)

    async def talk() -> FakeWebSocket:
        ws = FakeWebSocket()
        ws.incoming.put_nowait({"type": "websocket.receive", "text": '"hi"'})
        ws.incoming.put_nowait({"type": "websocket.disconnect"})
        await asyncio.wait_for(conv.converse("work", ws), PATIENCE_S)  # type: ignore[arg-type]
        return ws

    ws = asyncio.run(talk())
    assert ws.sent == [] and ws.closed is None
    ((_, (_, kinds)),) = kinds_by_connection(systems).items()
    assert kinds == ["connect", "request", "disconnect"]


def test_the_routes_refuse_unknown_streams_bodies_that_are_not_json_and_bad_time_limits(systems) -> None:
    app = FastAPI()
    add_conversation_routes(app, conversations(systems))
    without = FastAPI()
    add_conversation_routes(without, None)
    with TestClient(app) as client, TestClient(without) as bare:
        unknown = client.post("/http/nope", json={})
        assert unknown.status_code == 404 and "'nope' is not an http stream" in unknown.json()["error"]
        assert "work" in unknown.json()["error"], "the error names the job's http streams"
        assert client.post("/rpc/work", content=b"{not json").status_code == 400
        bad_limit = client.post("/http/work?timeout_ms=soon", json={})
        assert bad_limit.status_code == 400 and "timeout_ms" in bad_limit.json()["error"]
        assert bare.post("/rpc/work", json={}).json() == {"error": "this job has no http streams"}
        silent = client.post("/http/work?timeout_ms=200", json={"q": 1})  # no job runs: nobody answers
        assert silent.status_code == 504 and "no response" in silent.json()["error"]
