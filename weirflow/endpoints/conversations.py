"""The client side of ``http`` streams (`weirflow.endpoints.http_system`): ``POST /rpc/<stream>`` (fan-out),
``POST /http/<stream>`` (one request, one response) and ``WS /http/<stream>`` (a conversation).

The processor a client reaches writes the client's records into the stream's requests and waits for the job's
responses, which it reads from the stream's responses while any of its clients waits. A waiter registers
*before* its request is written, and reading starts from the responses' end as of the first waiter, so no
response is missed and no processor reads responses while nobody waits.

**Fan-out** (distributed RPC): ``POST /rpc/<stream>`` writes the request once to *every partition*
of the stream — one copy per task of the stage reading it, each copy naming its ``partition`` and the number
of ``tasks`` — and gathers one reply per task until all replied or the time limit (``?timeout_ms=``, default
``endpoints.rpc.timeout.ms``) passed: ``{"replies": [...], "tasks": N, "answered": k, "partial": k < N}``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.websockets import WebSocket

from weirflow.endpoints.http_system import backing_system, connection_partition, request_record, responses_stream
from weirflow.interfaces.system import SystemStreamPartition

log = logging.getLogger("weirflow.endpoints")

POLL_S = 0.02
READ_BATCH = 1000


@dataclass
class _Waiter:
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class Conversations:
    """Requests in, responses out, for every ``http`` stream of the job (``streams``: stream id -> system)."""

    def __init__(self, systems: Any, streams: dict[str, str], me: str, timeout_s: float) -> None:
        self.systems = systems
        self.streams = streams
        self.me = me
        self.timeout_s = timeout_s
        self._waiters: dict[str, _Waiter] = {}
        self._positions: dict[tuple[str, int], str] = {}
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count()

    def known(self, stream: str) -> bool:
        return stream in self.streams

    def unknown(self, stream: str) -> str:
        known = ", ".join(sorted(self.streams)) or "none"
        return f"'{stream}' is not an http stream of this job (http streams: {known})"

    def _ref(self, stream: str) -> tuple[str, str]:
        """(backing system, physical name): requests and responses are written and read on the backing system
        directly (what the job writes to the ``http`` system itself are its responses)."""
        ref = self.systems.resolve(stream)
        return backing_system(self.systems.config, ref.system), ref.physical

    def new_connection(self) -> str:
        return f"{self.me}.{uuid.uuid4().hex[:16]}"

    async def partitions(self, stream: str) -> int:
        system, physical = self._ref(stream)
        return int(await asyncio.to_thread(self.systems.admin(system).partition_count, physical))

    # --- responses -------------------------------------------------------------------------------------
    async def open(self, connection: str) -> _Waiter:
        """Register a waiter for ``connection``'s responses; call before writing its first request."""
        if self._reader is None or self._reader.done():
            await self._start_reading()
        waiter = self._waiters[connection] = _Waiter()
        return waiter

    def close(self, connection: str) -> None:
        self._waiters.pop(connection, None)

    async def _start_reading(self) -> None:
        self._positions = {}
        for stream in self.streams:
            system, physical = self._ref(stream)
            metadata = await asyncio.to_thread(
                self.systems.admin(system).partition_metadata, responses_stream(physical)
            )
            for partition, m in metadata.items():
                self._positions[(stream, partition)] = m.upcoming
        self._reader = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        """Read responses while anybody waits; stop when nobody does (the next waiter starts again)."""
        while self._waiters:
            found = 0
            for (stream, partition), position in list(self._positions.items()):
                system, physical = self._ref(stream)
                ssp = SystemStreamPartition(system, responses_stream(physical), partition)
                try:
                    consumer = self.systems.consumer(system)
                    records = await asyncio.to_thread(consumer.read, ssp, position, READ_BATCH)
                except Exception as exc:
                    log.warning("reading responses of %s failed (%s); trying again", stream, exc)
                    await asyncio.sleep(1)
                    continue
                if not records:
                    continue
                found += len(records)
                self._positions[(stream, partition)] = records[-1].next_offset
                for record in records:
                    self._dispatch(record.value)
            if not found:
                await asyncio.sleep(POLL_S)

    def _dispatch(self, raw: bytes) -> None:
        try:
            response = json.loads(raw)
        except ValueError:
            return
        if isinstance(response, dict):
            waiter = self._waiters.get(str(response.get("connection")))
            if waiter is not None:
                waiter.queue.put_nowait(response)

    # --- requests --------------------------------------------------------------------------------------
    async def write(self, stream: str, records: list[Any]) -> None:
        system, _ = self._ref(stream)
        await asyncio.to_thread(self.systems.producer(system).send, records)

    def _records(self, stream: str, connection: str, partition: int, *kinds: tuple[str, str, Any]) -> list[Any]:
        _, physical = self._ref(stream)
        return [request_record(physical, connection, kind, partition, req, body) for kind, req, body in kinds]

    async def fan_out(self, stream: str, body: Any, timeout_s: float) -> dict[str, Any]:
        """The request to every task of the stage reading ``stream``; one reply per task, or a partial answer."""
        tasks = await self.partitions(stream)
        connection = self.new_connection()
        _, physical = self._ref(stream)
        waiter = await self.open(connection)
        try:
            await self.write(
                stream,
                [request_record(physical, connection, "request", p, "rpc", body, p, tasks) for p in range(tasks)],
            )
            replies: list[Any] = []
            deadline = asyncio.get_running_loop().time() + timeout_s
            while len(replies) < tasks:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    replies.append(await asyncio.wait_for(waiter.queue.get(), left))
                except TimeoutError:
                    break
        finally:
            self.close(connection)
        return {
            "replies": [_reply(r) for r in replies],
            "tasks": tasks,
            "answered": len(replies),
            "partial": len(replies) < tasks,
        }

    async def ask(self, stream: str, body: Any, timeout_s: float) -> dict[str, Any] | None:
        """One request on a connection of its own: connect, request, the first response, disconnect."""
        connection = self.new_connection()
        partition = connection_partition(connection, await self.partitions(stream))
        waiter = await self.open(connection)
        try:
            await self.write(
                stream, self._records(stream, connection, partition, ("connect", "", None), ("request", "0", body))
            )
            try:
                return await asyncio.wait_for(waiter.queue.get(), timeout_s)
            except TimeoutError:
                return None
        finally:
            self.close(connection)
            await self.write(stream, self._records(stream, connection, partition, ("disconnect", "", None)))

    async def converse(self, stream: str, websocket: WebSocket) -> None:
        """A WebSocket conversation: each text message a request, each response sent back as it comes; a
        response with ``close`` true ends the conversation."""
        connection = self.new_connection()
        partition = connection_partition(connection, await self.partitions(stream))
        waiter = await self.open(connection)
        await websocket.accept()
        await self.write(stream, self._records(stream, connection, partition, ("connect", "", None)))
        requests = itertools.count()
        incoming = asyncio.create_task(websocket.receive())
        outgoing = asyncio.create_task(waiter.queue.get())
        try:
            while True:
                done, _ = await asyncio.wait({incoming, outgoing}, return_when=asyncio.FIRST_COMPLETED)
                if incoming in done:
                    message = incoming.result()
                    if message["type"] == "websocket.disconnect":
                        return
                    text = message.get("text") or (message.get("bytes") or b"").decode("utf-8", "replace")
                    try:
                        body = json.loads(text)
                    except ValueError:
                        body = text
                    await self.write(
                        stream,
                        self._records(stream, connection, partition, ("request", str(next(requests)), body)),
                    )
                    incoming = asyncio.create_task(websocket.receive())
                if outgoing in done:
                    response = outgoing.result()
                    await websocket.send_text(json.dumps(_reply(response)))
                    if response.get("close"):
                        await websocket.close(1000, "closed by the job")
                        return
                    outgoing = asyncio.create_task(waiter.queue.get())
        finally:
            incoming.cancel()
            outgoing.cancel()
            self.close(connection)
            await self.write(stream, self._records(stream, connection, partition, ("disconnect", "", None)))


def _reply(response: dict[str, Any]) -> dict[str, Any]:
    """What a client sees of a response: everything but the connection id."""
    return {k: v for k, v in response.items() if k != "connection"}


def _missing(conversations: Conversations | None, stream: str) -> str | None:
    if conversations is None:
        return "this job has no http streams"
    return None if conversations.known(stream) else conversations.unknown(stream)


async def _parse(conversations: Conversations | None, request: Request, stream: str) -> tuple[Any, float] | str:
    """(body, time limit) of a POST, or its error as ``"<status> <message>"`` (404 or 400)."""
    if (why := _missing(conversations, stream)) is not None:
        return f"404 {why}"
    assert conversations is not None
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except ValueError as exc:
        return f"400 the request body is not JSON: {exc}"
    limit = request.query_params.get("timeout_ms")
    try:
        timeout_s = int(limit) / 1000 if limit is not None else conversations.timeout_s
    except ValueError:
        return f"400 timeout_ms must be an integer, got {limit!r}"
    return body, timeout_s


def add_conversation_routes(app: Any, conversations: Conversations | None) -> None:
    from fastapi.responses import JSONResponse

    def error(problem: str) -> Any:
        status, _, message = problem.partition(" ")
        return JSONResponse({"error": message}, status_code=int(status))

    @app.post("/rpc/{stream}")
    async def rpc(stream: str, request: Request) -> Any:
        parsed = await _parse(conversations, request, stream)
        if isinstance(parsed, str):
            return error(parsed)
        assert conversations is not None
        return await conversations.fan_out(stream, *parsed)

    @app.post("/http/{stream}")
    async def ask(stream: str, request: Request) -> Any:
        parsed = await _parse(conversations, request, stream)
        if isinstance(parsed, str):
            return error(parsed)
        assert conversations is not None
        response = await conversations.ask(stream, *parsed)
        if response is None:
            return error(f"504 no response from the job within {parsed[1]:.1f} s")
        return _reply(response)

    @app.websocket("/http/{stream}")
    async def converse(websocket: WebSocket, stream: str) -> None:
        if (why := _missing(conversations, stream)) is not None:
            await websocket.send_denial_response(JSONResponse({"error": why}, status_code=404))
            return
        assert conversations is not None
        await conversations.converse(stream, websocket)
