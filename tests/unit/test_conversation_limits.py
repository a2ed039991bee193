"""What bounds the client side of ``http`` streams (`weirflow.endpoints.conversations`, docs/endpoints.md
"Request/response"): one read loop per processor however many first waiters arrive together, a fan-out that
counts the tasks that replied (not the replies), time limits within ``endpoints.rpc.timeout.max.ms``, at most
``endpoints.conversations.max`` requests and conversations waiting, a WebSocket client that does not read closed
instead of queueing without end, and every blocking system call on the endpoints' read pool.

On the embedded log, with `FakeJob` (tests/unit/test_conversations.py) playing the job."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from tests.unit.test_conversations import (
    PARTITIONS,
    PATIENCE_S,
    FakeWebSocket,
    echo,
    kinds_by_connection,
    respond,
    with_job,
)
from weirflow.config.loader import Config
from weirflow.endpoints.conversations import Conversations, TooManyConversationsError, add_conversation_routes
from weirflow.endpoints.http_system import connection_partition
from weirflow.interfaces.system import StreamSpec
from weirflow.job.systems import Systems
from weirflow.testing import wait_until


@pytest.fixture
def systems(tmp_path: Path) -> Iterator[Systems]:
    """The job's systems with an ``http`` stream ``work`` of `PARTITIONS` partitions (as in
    tests/unit/test_conversations.py)."""
    config = Config.from_dict(
        {
            "job.name": "conversation-limits-test",
            "job.state.dir": str(tmp_path),
            "systems.http.factory": "http",
            "streams.work.system": "http",
        }
    )
    systems = Systems(config)
    systems.admin("http").create_stream(StreamSpec("work", PARTITIONS))
    yield systems
    systems.close()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` on the event loop (`wait_until` would block it) for up to `PATIENCE_S`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + PATIENCE_S
    while not condition():
        assert loop.time() < deadline, f"timed out after {PATIENCE_S:.0f} s waiting for {what}"
        await asyncio.sleep(0.01)  # not synchronisation: the poll interval of this wait for a condition


def in_partition(partition: int, name: str) -> str:
    """A connection id whose records (requests and responses) go to ``partition``."""
    for i in range(1000):
        if connection_partition(connection := f"p1.{name}{i}", PARTITIONS) == partition:
            return connection
    raise AssertionError(f"no connection id in partition {partition}")


class _Client:
    """A system client whose calls are recorded (name, thread) by `Watched`, and whose reads wait at its gate."""

    def __init__(self, watched: Watched, inner: Any) -> None:
        self._watched = watched
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._watched.calls.append((name, threading.current_thread().name))
            if name == "read":
                with self._watched.lock:
                    self._watched.held.append(args[0].partition)
                self._watched.gate.wait()
            return method(*args, **kwargs)

        return call


class Watched:
    """The job's `Systems` as `Conversations` uses them: every call on an admin, consumer or producer is recorded
    with its thread, and reads wait while ``gate`` is clear (``held``: the partitions of reads that reached it)."""

    def __init__(self, systems: Systems) -> None:
        self._systems = systems
        self.calls: list[tuple[str, str]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()
        self.held: list[int] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._systems, name)

    def admin(self, system: str) -> _Client:
        return _Client(self, self._systems.admin(system))

    def consumer(self, system: str) -> _Client:
        return _Client(self, self._systems.consumer(system))

    def producer(self, system: str) -> _Client:
        return _Client(self, self._systems.producer(system))


class CountingConversations(Conversations):
    """Counts the responses handed to waiters' lookup (`Conversations._dispatch`)."""

    dispatched = 0

    def _dispatch(self, raw: bytes) -> None:
        self.dispatched += 1
        super()._dispatch(raw)


def test_two_first_waiters_at_once_start_one_read_loop_and_each_response_is_dispatched_once(systems) -> None:
    watched = Watched(systems)
    conv = CountingConversations(watched, {"work": "http"}, "p1", PATIENCE_S)
    first, second = in_partition(0, "a"), in_partition(1, "b")

    async def race() -> tuple[int, bool]:
        watched.gate.clear()  # every read loop started waits in its first read, at the position it started from
        waiter, _ = await asyncio.gather(conv.open(first), conv.open(second))
        await until(lambda: bool(watched.held), "the read loop's first read")
        assert watched.held[0] == 0, "the reads start with partition 0, where the response goes"
        await asyncio.to_thread(respond, systems, {"connection": first, "body": "once"})
        watched.gate.set()
        got = await asyncio.wait_for(waiter.queue.get(), PATIENCE_S)
        assert got["body"] == "once"
        conv.close(first)
        conv.close(second)
        others = lambda: all(t.done() for t in asyncio.all_tasks() if t is not asyncio.current_task())  # noqa: E731
        await until(others, "the read loops to stop once nobody waits")  # a loop dispatches what it read first
        return conv.dispatched, waiter.queue.empty()

    dispatched, nothing_more = asyncio.run(race())
    assert dispatched == 1, f"one response was dispatched {dispatched} times: more than one read loop ran"
    assert nothing_more, "the waiter got the response twice"


def test_a_fan_out_counts_the_tasks_that_replied_not_the_replies(systems) -> None:
    conv = Conversations(systems, {"work": "http"}, "p1", PATIENCE_S)

    def answer(request: dict[str, Any]) -> dict[str, Any] | None:
        reply = {"connection": request["connection"], "body": request["partition"]}
        if request["partition"] == 0:
            respond(systems, reply)  # task 0 replies twice
        return None if request["partition"] == PARTITIONS - 1 else reply  # the last task never does

    result, _ = asyncio.run(with_job(systems, answer, lambda: conv.fan_out("work", None, 1.0)))
    assert (result["tasks"], result["answered"], result["partial"]) == (PARTITIONS, PARTITIONS - 1, True)
    assert [r["body"] for r in result["replies"]] == list(range(PARTITIONS - 1)), "one reply per task that replied"


def test_time_limits_outside_1_to_the_maximum_are_refused_with_the_range_and_the_key(systems) -> None:
    app = FastAPI()
    add_conversation_routes(app, Conversations(systems, {"work": "http"}, "p1", 0.2, timeout_max_s=0.3))
    with TestClient(app) as client:
        for limit in ("0", "-5", "soon", "1.5", "1_000", " 100", "301", "9" * 400):
            for route in ("/rpc/work", "/http/work"):
                refused = client.post(f"{route}?timeout_ms={limit}", json={})
                assert refused.status_code == 400, f"{route}?timeout_ms={limit[:30]} gave {refused.status_code}"
                error = refused.json()["error"]
                assert "from 1 to 300" in error and "endpoints.rpc.timeout.max.ms" in error, error
                assert len(error) < 300, "the error quotes a long value shortened"
        at_most = client.post("/http/work?timeout_ms=300", json={})  # the maximum itself is allowed
        assert at_most.status_code == 504 and "within 0.3 s" in at_most.json()["error"]


def test_waiting_requests_and_conversations_together_are_bounded_then_429_with_retry_after(systems) -> None:
    conv = Conversations(systems, {"work": "http"}, "p1", PATIENCE_S, max_pending=1)
    app = FastAPI()
    add_conversation_routes(app, conv)
    with TestClient(app) as client:
        with client.websocket_connect("/http/work"):  # the one conversation allowed, waiting
            wait_until(lambda: conv.pending == 1, PATIENCE_S, "the conversation to be counted")
            for route in ("/rpc/work", "/http/work"):
                busy = client.post(route, json={})
                assert busy.status_code == 429 and busy.headers["Retry-After"] == "1"
                assert "endpoints.conversations.max" in busy.json()["error"]
            with pytest.raises(WebSocketDenialResponse) as denied:
                with client.websocket_connect("/http/work"):
                    pass
            assert denied.value.status_code == 429 and denied.value.headers["Retry-After"] == "1"
            assert "endpoints.conversations.max" in denied.value.json()["error"]
        wait_until(lambda: conv.pending == 0, PATIENCE_S, "the conversation's place to be given back")
        assert client.post("/http/work?timeout_ms=100", json={}).status_code == 504, "a place is free again"


def test_a_waiting_http_request_keeps_a_websocket_conversation_out_before_its_handshake(systems) -> None:
    conv = Conversations(systems, {"work": "http"}, "p1", PATIENCE_S, max_pending=1)

    async def both() -> FakeWebSocket:
        asking = asyncio.create_task(conv.ask("work", {"q": 1}, PATIENCE_S))  # nobody answers: it waits
        await until(lambda: conv.pending == 1, "the request to be counted")
        ws = FakeWebSocket()
        with pytest.raises(TooManyConversationsError, match="endpoints.conversations.max"):
            await conv.converse("work", ws)  # type: ignore[arg-type]
        asking.cancel()
        return ws

    ws = asyncio.run(both())
    assert not ws.accepted
    assert conv.pending == 0


class UnreadWebSocket(FakeWebSocket):
    """A client that sends but never reads: sending to it blocks (its TCP window is full)."""

    async def send_text(self, text: str) -> None:
        await asyncio.Event().wait()


def test_a_websocket_client_that_does_not_read_is_closed_with_1008_instead_of_queueing(systems) -> None:
    conv = Conversations(systems, {"work": "http"}, "p1", PATIENCE_S, queue_size=3)

    async def talk() -> FakeWebSocket:
        ws = UnreadWebSocket()
        for n in range(6):  # one response is being sent, three wait, the fifth overflows
            ws.incoming.put_nowait({"type": "websocket.receive", "text": json.dumps({"n": n})})
        await asyncio.wait_for(conv.converse("work", ws), PATIENCE_S)  # type: ignore[arg-type]
        return ws

    ws, _ = asyncio.run(with_job(systems, echo, talk))
    assert ws.closed == (1008, "client too slow: 3 responses queued")
    ((_, (_, kinds)),) = kinds_by_connection(systems).items()
    assert kinds[0] == "connect" and kinds[-1] == "disconnect", "the conversation ended as any other"


def test_every_blocking_system_call_runs_on_the_read_pool(systems) -> None:
    watched = Watched(systems)
    conv = Conversations(watched, {"work": "http"}, "p1", PATIENCE_S)  # its own pool: no pool passed

    async def work() -> Any:
        return await conv.ask("work", {"n": 1}, PATIENCE_S), await conv.fan_out("work", {"n": 2}, PATIENCE_S)

    (asked, fanned), _ = asyncio.run(with_job(systems, echo, work))
    assert asked is not None and fanned["answered"] == PARTITIONS
    assert {name for name, _ in watched.calls} >= {"partition_count", "partition_metadata", "read", "send"}
    elsewhere = {(name, thread) for name, thread in watched.calls if not thread.startswith("endpoint-read")}
    assert not elsewhere, f"blocking calls ran outside the read pool: {sorted(elsewhere)}"
