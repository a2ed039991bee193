"""The client side of ``http`` streams (`weirflow.endpoints.http_system`): ``POST /rpc/<stream>`` (fan-out),
``POST /http/<stream>`` (one request, one response) and ``WS /http/<stream>`` (a conversation).

The processor a client reaches writes the client's records into the stream's requests and waits for the job's
responses, which it reads from the stream's responses while any of its clients waits. A waiter registers
*before* its request is written, and reading starts from the responses' end as of the first waiter, so no
response is missed and no processor reads responses while nobody waits. **One** read loop serves all of a
processor's waiters: starting it is serialised by a lock, since two loops would hand every response over twice.

**Fan-out** (distributed RPC): ``POST /rpc/<stream>`` writes the request once to *every partition*
of the stream — one copy per task of the stage reading it, each copy naming its ``partition`` and the number
of ``tasks`` and sent on a connection of its own (``<connection>.<partition>``), so that every reply names
the task it comes from — and gathers one reply per task until all *tasks* replied or the time limit
(``?timeout_ms=``, default ``endpoints.rpc.timeout.ms``) passed: ``{"replies": [...], "tasks": N,
"answered": k, "partial": k < N}``. A task that replies twice counts once (its first reply is kept).

**Bounds**, so that no client can make a processor hold more than it was configured for:

* ``?timeout_ms=`` is a whole number from 1 to ``endpoints.rpc.timeout.max.ms``; anything else is a 400;
* at most ``endpoints.conversations.max`` requests and WebSocket conversations wait at a time on one
  processor; one more is refused with 429 and ``Retry-After: 1`` (a WebSocket at its handshake);
* a conversation holds at most `QUEUE_SIZE` (1,000) responses its client has not taken yet: a WebSocket
  client that does not read them is closed with code 1008 and the reason, instead of the processor's memory
  growing (the idea of a tap's ``endpoints.tap.queue.size``); for an HTTP request, responses beyond it are
  dropped (it takes only its first, or one per task);
* every blocking call on a system (partition counts and metadata, reads, writes) runs on the endpoints' read
  pool (`weirflow.endpoints.read_pool`, ``endpoints.read.threads``), never on asyncio's default executor,
  which the rest of the server needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.websockets import WebSocket

from weirflow.base.errors import WeirflowError
from weirflow.endpoints.http_system import backing_system, connection_partition, request_record, responses_stream
from weirflow.endpoints.read_pool import ReadPool
from weirflow.interfaces.system import SystemStreamPartition

log = logging.getLogger("weirflow.endpoints")

POLL_S = 0.02
READ_BATCH = 1000
QUEUE_SIZE = 1000  # responses a conversation may hold for its client (the module docstring)
CLOSE_TOO_SLOW = 1008
CLOSE_WAIT_S = 5.0  # how long closing a client that does not read may take before the handler just returns
PRIVATE_POOL_THREADS = 2
MAX_PENDING = 1000  # `endpoints.conversations.max`'s default
TIMEOUT_MAX_S = 300.0  # `endpoints.rpc.timeout.max.ms`'s default
TIMEOUT_MAX_KEY = "endpoints.rpc.timeout.max.ms"
PENDING_MAX_KEY = "endpoints.conversations.max"


class TooManyConversationsError(WeirflowError):
    """This processor already waits on ``endpoints.conversations.max`` requests and conversations: HTTP 429."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this processor already waits on {limit} requests and conversations, its limit "
            f"({PENDING_MAX_KEY}); retry in a moment, ask another processor, or raise {PENDING_MAX_KEY}"
        )


@dataclass
class _Waiter:
    """Where a conversation's responses wait for it; at most ``limit`` of them, then ``overflowed`` is set and
    further ones are dropped."""

    limit: int = QUEUE_SIZE
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    overflowed: asyncio.Event = field(default_factory=asyncio.Event)

    def put(self, response: dict[str, Any]) -> None:
        if self.queue.qsize() >= self.limit:
            self.overflowed.set()
            return
        self.queue.put_nowait(response)


class Conversations:
    """Requests in, responses out, for every ``http`` stream of the job (``streams``: stream id -> system).

    ``read_pool``: the threads blocking system calls run on (None: a private pool of two); ``max_pending``:
    requests and conversations waiting at a time (``endpoints.conversations.max``); ``timeout_max_s``: the
    largest ``?timeout_ms=`` a request may ask for (``endpoints.rpc.timeout.max.ms``); ``queue_size``: responses
    a conversation may hold for its client."""

    def __init__(
        self,
        systems: Any,
        streams: dict[str, str],
        me: str,
        timeout_s: float,
        *,
        read_pool: ReadPool | None = None,
        max_pending: int = MAX_PENDING,
        timeout_max_s: float = TIMEOUT_MAX_S,
        queue_size: int = QUEUE_SIZE,
    ) -> None:
        self.systems = systems
        self.streams = streams
        self.me = me
        self.timeout_s = timeout_s
        self.pool = read_pool if read_pool is not None else ReadPool(PRIVATE_POOL_THREADS)
        self._own_pool = read_pool is None
        self.max_pending = max_pending
        self.timeout_max_s = timeout_max_s
        self.queue_size = queue_size
        self.pending = 0  # requests and WebSocket conversations under way
        self._waiters: dict[str, _Waiter] = {}
        self._positions: dict[tuple[str, int], str] = {}
        self._reader: asyncio.Task[None] | None = None
        self._starting: asyncio.Lock | None = None  # made on first use: it belongs to the server's loop
        self._ids = itertools.count()

    def known(self, stream: str) -> bool:
        return stream in self.streams

    def unknown(self, stream: str) -> str:
        known = ", ".join(sorted(self.streams)) or "none"
        return f"'{stream}' is not an http stream of this job (http streams: {known})"

    def close_pool(self) -> None:
        """Stop the private read pool, if this object made one (a pool passed in belongs to the caller)."""
        if self._own_pool:
            self.pool.close()

    def _ref(self, stream: str) -> tuple[str, str]:
        """(backing system, physical name): requests and responses are written and read on the backing system
        directly (what the job writes to the ``http`` system itself are its responses)."""
        ref = self.systems.resolve(stream)
        return backing_system(self.systems.config, ref.system), ref.physical

    def new_connection(self) -> str:
        return f"{self.me}.{uuid.uuid4().hex[:16]}"

    async def partitions(self, stream: str) -> int:
        system, physical = self._ref(stream)
        return int(await self.pool.run(_partition_count, self.systems, system, physical))

    @contextlib.contextmanager
    def _slot(self) -> Iterator[None]:
        """One of ``max_pending`` places, taken without awaiting anything, so concurrent requests cannot both
        take the last one."""
        if self.pending >= self.max_pending:
            raise TooManyConversationsError(self.max_pending)
        self.pending += 1
        try:
            yield
        finally:
            self.pending -= 1

    # --- responses -------------------------------------------------------------------------------------
    async def open(self, *connections: str) -> _Waiter:
        """Register one waiter for the responses of ``connections``; call before writing their first request.

        Under a lock: two first waiters arriving together would otherwise both find no read loop and start
        one each, and every response would be handed over twice."""
        if self._starting is None:
            self._starting = asyncio.Lock()
        waiter = _Waiter(self.queue_size)
        async with self._starting:
            if self._reader is None or self._reader.done():
                await self._start_reading()
            for connection in connections:
                self._waiters[connection] = waiter
        return waiter

    def close(self, *connections: str) -> None:
        for connection in connections:
            self._waiters.pop(connection, None)

    async def _start_reading(self) -> None:
        positions: dict[tuple[str, int], str] = {}
        for stream in self.streams:
            system, physical = self._ref(stream)
            metadata = await self.pool.run(_partition_metadata, self.systems, system, responses_stream(physical))
            for partition, m in metadata.items():
                positions[(stream, partition)] = m.upcoming
        self._positions = positions
        self._reader = asyncio.create_task(self._read_loop())

    async def _read_loop(self) -> None:
        """Read responses while anybody waits; stop when nobody does (the next waiter starts again)."""
        while self._waiters:
            found = 0
            for (stream, partition), position in list(self._positions.items()):
                system, physical = self._ref(stream)
                ssp = SystemStreamPartition(system, responses_stream(physical), partition)
                try:
                    records = await self.pool.run(_read, self.systems, ssp, position)
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
                waiter.put(response)

    # --- requests --------------------------------------------------------------------------------------
    async def write(self, stream: str, records: list[Any]) -> None:
        system, _ = self._ref(stream)
        await self.pool.run(_send, self.systems, system, records)

    def _records(self, stream: str, connection: str, partition: int, *kinds: tuple[str, str, Any]) -> list[Any]:
        _, physical = self._ref(stream)
        return [request_record(physical, connection, kind, partition, req, body) for kind, req, body in kinds]

    async def fan_out(self, stream: str, body: Any, timeout_s: float) -> dict[str, Any]:
        """The request to every task of the stage reading ``stream``; one reply per task, or a partial answer.

        Each copy goes on a connection of its own, so a reply's connection says which task sent it: the tasks
        that replied are counted, not the replies (a task replying twice must not hide one that did not)."""
        with self._slot():
            tasks = await self.partitions(stream)
            connection = self.new_connection()
            copies = {f"{connection}.{p}": p for p in range(tasks)}
            _, physical = self._ref(stream)
            waiter = await self.open(*copies)
            replies: dict[int, dict[str, Any]] = {}
            try:
                await self.write(
                    stream,
                    [request_record(physical, c, "request", p, "rpc", body, p, tasks) for c, p in copies.items()],
                )
                deadline = asyncio.get_running_loop().time() + timeout_s
                while len(replies) < tasks:
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        break
                    try:
                        response = await asyncio.wait_for(waiter.queue.get(), left)
                    except TimeoutError:
                        break
                    replies.setdefault(copies[str(response.get("connection"))], response)
            finally:
                self.close(*copies)
        return {
            "replies": [_reply(replies[p]) for p in sorted(replies)],
            "tasks": tasks,
            "answered": len(replies),
            "partial": len(replies) < tasks,
        }

    async def ask(self, stream: str, body: Any, timeout_s: float) -> dict[str, Any] | None:
        """One request on a connection of its own: connect, request, the first response, disconnect."""
        with self._slot():
            connection = self.new_connection()
            partition = connection_partition(connection, await self.partitions(stream))
            waiter = await self.open(connection)
            try:
                await self.write(
                    stream,
                    self._records(stream, connection, partition, ("connect", "", None), ("request", "0", body)),
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
        response with ``close`` true ends the conversation. Raises `TooManyConversationsError` before accepting
        when the processor is at ``endpoints.conversations.max``.

        Responses are sent by a task of their own, so that a client that does not read (its sends block) is
        still noticed when its queue overflows, and closed."""
        with self._slot():
            connection = self.new_connection()
            partition = connection_partition(connection, await self.partitions(stream))
            waiter = await self.open(connection)
            try:
                await websocket.accept()
            except BaseException:
                self.close(connection)  # nothing was written yet: no disconnect either
                raise
            try:
                await self.write(stream, self._records(stream, connection, partition, ("connect", "", None)))
                await self._talk(stream, websocket, connection, partition, waiter)
            finally:
                self.close(connection)
                await self.write(stream, self._records(stream, connection, partition, ("disconnect", "", None)))

    async def _talk(
        self, stream: str, websocket: WebSocket, connection: str, partition: int, waiter: _Waiter
    ) -> None:
        requests = itertools.count()
        incoming = asyncio.create_task(websocket.receive())
        sending = asyncio.create_task(_send_responses(websocket, waiter))
        overflow = asyncio.create_task(waiter.overflowed.wait())
        try:
            while True:
                done, _ = await asyncio.wait({incoming, sending, overflow}, return_when=asyncio.FIRST_COMPLETED)
                if overflow in done:
                    sending.cancel()
                    reason = f"client too slow: {waiter.limit} responses queued"
                    log.warning("closing conversation %s on %s: %s", connection, stream, reason)
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(websocket.close(CLOSE_TOO_SLOW, reason), CLOSE_WAIT_S)
                    return
                if sending in done:
                    sending.result()  # the job closed the conversation, or sending failed: raise that
                    return
                message = incoming.result()
                if message["type"] == "websocket.disconnect":
                    return
                text = message.get("text") or (message.get("bytes") or b"").decode("utf-8", "replace")
                try:
                    body = json.loads(text)
                except ValueError:
                    body = text
                await self.write(
                    stream, self._records(stream, connection, partition, ("request", str(next(requests)), body))
                )
                incoming = asyncio.create_task(websocket.receive())
        finally:
            for task in (incoming, sending, overflow):
                task.cancel()


async def _send_responses(websocket: WebSocket, waiter: _Waiter) -> None:
    """Send each response as it comes, until one says ``close``."""
    while True:
        response = await waiter.queue.get()
        await websocket.send_text(json.dumps(_reply(response)))
        if response.get("close"):
            await websocket.close(1000, "closed by the job")
            return


# --- blocking calls, run on the read pool: getting a client may connect, and every call may wait ----------
def _partition_count(systems: Any, system: str, physical: str) -> int:
    return int(systems.admin(system).partition_count(physical))


def _partition_metadata(systems: Any, system: str, stream: str) -> Any:
    return systems.admin(system).partition_metadata(stream)


def _read(systems: Any, ssp: SystemStreamPartition, position: str) -> Any:
    return systems.consumer(ssp.system).read(ssp, position, READ_BATCH)


def _send(systems: Any, system: str, records: list[Any]) -> None:
    systems.producer(system).send(records)


def _reply(response: dict[str, Any]) -> dict[str, Any]:
    """What a client sees of a response: everything but the connection id."""
    return {k: v for k, v in response.items() if k != "connection"}


def _missing(conversations: Conversations | None, stream: str) -> str | None:
    if conversations is None:
        return "this job has no http streams"
    return None if conversations.known(stream) else conversations.unknown(stream)


def time_limit(text: str | None, default_s: float, max_s: float) -> float | str:
    """``?timeout_ms=`` in seconds (``default_s`` without one), or why it is refused: only whole milliseconds
    from 1 to ``max_s`` keep a request from waiting forever, or not at all (``int`` alone would take
    ``1_000`` or a leading space, and 400 nines, which then overflow a float)."""
    if text is None:
        return default_s
    max_ms = max(1, round(max_s * 1000))
    digits = text.lstrip("0")  # so that a long run of leading zeros is not converted either
    if text.isascii() and text.isdigit() and len(digits) <= len(str(max_ms)) and 1 <= int(digits or "0") <= max_ms:
        return int(digits) / 1000
    shown = text if len(text) <= 24 else f"{text[:20]}... ({len(text)} characters)"
    return (
        f"timeout_ms must be a whole number of milliseconds from 1 to {max_ms} ({TIMEOUT_MAX_KEY}), not "
        f"{shown!r}: give a whole number in that range, or raise {TIMEOUT_MAX_KEY} to wait longer"
    )


async def _parse(conversations: Conversations | None, request: Request, stream: str) -> tuple[Any, float] | str:
    """(body, time limit) of a POST, or its error as ``"<status> <message>"`` (404 or 400)."""
    if (why := _missing(conversations, stream)) is not None:
        return f"404 {why}"
    assert conversations is not None
    limit = time_limit(
        request.query_params.get("timeout_ms"), conversations.timeout_s, conversations.timeout_max_s
    )
    if isinstance(limit, str):
        return f"400 {limit}"
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except ValueError as exc:
        return f"400 the request body is not JSON: {exc}"
    return body, limit


def _error(problem: str) -> JSONResponse:
    status, _, message = problem.partition(" ")
    return JSONResponse({"error": message}, status_code=int(status))


def _busy(exc: TooManyConversationsError) -> JSONResponse:
    return JSONResponse({"error": str(exc)}, status_code=429, headers={"Retry-After": "1"})


async def _post(conversations: Conversations | None, request: Request, stream: str, fan_out: bool) -> Any:
    """``POST /rpc/<stream>`` (``fan_out``) or ``POST /http/<stream>``: the answer, or a JSON error."""
    parsed = await _parse(conversations, request, stream)
    if isinstance(parsed, str):
        return _error(parsed)
    assert conversations is not None
    try:
        if fan_out:
            return await conversations.fan_out(stream, *parsed)
        response = await conversations.ask(stream, *parsed)
    except TooManyConversationsError as exc:
        return _busy(exc)
    if response is None:
        return _error(f"504 no response from the job within {parsed[1]:.1f} s")
    return _reply(response)


def add_conversation_routes(app: Any, conversations: Conversations | None) -> None:
    @app.post("/rpc/{stream}")
    async def rpc(stream: str, request: Request) -> Any:
        return await _post(conversations, request, stream, fan_out=True)

    @app.post("/http/{stream}")
    async def ask(stream: str, request: Request) -> Any:
        return await _post(conversations, request, stream, fan_out=False)

    @app.websocket("/http/{stream}")
    async def converse(websocket: WebSocket, stream: str) -> None:
        if (why := _missing(conversations, stream)) is not None:
            await websocket.send_denial_response(JSONResponse({"error": why}, status_code=404))
            return
        assert conversations is not None
        try:
            await conversations.converse(stream, websocket)
        except TooManyConversationsError as exc:  # raised before the handshake is accepted
            await websocket.send_denial_response(_busy(exc))
