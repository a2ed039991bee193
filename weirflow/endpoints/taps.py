"""Taps: ``WS /tap/<stream>?match=<regex>&field=<column>`` — every record of a stream whose field matches, from
the moment of connection until the client disconnects (docs/endpoints.md).

**Where the records come from.** The processor the client connected to reads the stream's partitions itself,
through the system's consumer, from each partition's end at connection time (`SystemAdmin.partition_metadata`)
onwards. It takes those ends before it accepts the WebSocket, so a record written after the client's handshake
completed is always tapped (a stream whose ends cannot be read is refused with 503). Every processor can reach
every partition of every system its job uses, so a tap needs no fan-in from the processors owning partitions,
costs the running tasks nothing, does not break when a task moves, and works for streams no task reads (a job's
outputs, dead letters). A tap therefore sees what was *written* to the stream, after the fence
(`weirflow.spark.fence`): exactly what downstream tasks and consumers see.

**What can be tapped**: any stream declared under ``streams.<id>``, the pipeline's intermediate streams (their
rows unpacked; control messages left out) and each one's dead letters (``<id>.dlq``).

**Matching cannot stall the processor.** A tap's expression comes from whoever connects, so it is compiled
with RE2 (``google-re2``), whose matching is linear in the input: Python's backtracking ``re`` took exponential
time on ``(a+)+$`` against a few dozen characters, with the GIL held, and froze the processor's lease renewals.
RE2 refuses what it cannot match in linear time (backreferences, lookaround), and the handshake says so (400).
Reading, decoding, unpacking and matching happen together in one call on the endpoints' `ReadPool`
(``endpoints.read.threads``), off the event loop, which only forwards the messages ready to send. At most
``endpoints.tap.max`` taps run per processor; one more is refused with 429.

**Messages** are JSON text frames ``{"stream", "partition", "offset", "key", "value"}`` (``value`` the record
decoded as JSON when it is JSON, else text). A client that does not keep up — its queue holds
``endpoints.tap.queue.size`` messages — is disconnected with close code 1008 and the reason, instead of the
processor's memory growing.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import re2  # type: ignore[import-untyped]
from starlette.websockets import WebSocket

from weirflow.base.errors import TapError
from weirflow.endpoints.read_pool import ReadPool
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import IncomingRecord, SystemStreamPartition
from weirflow.job.systems import DEAD_LETTER_SUFFIX, StreamRef, dead_letter_stream, stream_ref
from weirflow.runtime.control import MalformedMessageError, MessageType, decode

log = logging.getLogger("weirflow.endpoints")

POLL_S = 0.1
READ_BATCH = 1000
CLOSE_TOO_SLOW = 1008
DEFAULT_READ_THREADS = 2  # a TapService built without the server's pool (tests, other callers) gets its own


@dataclass(frozen=True)
class TapTarget:
    ref: StreamRef
    intermediate: bool  # records carry control framing and packed rows (`weirflow.runtime.control`)


class TapService:
    """Resolves tap requests and reads their streams. ``intermediates``: the pipeline's intermediate stream
    ids (none for a record-task job). ``read_pool``: the threads reads and matching run on (the server's,
    shared with conversations; a private pool of two when None). ``max_taps``: taps served at once
    (``endpoints.tap.max``)."""

    def __init__(
        self,
        config: ConfigView,
        systems: Any,
        intermediates: list[str],
        queue_size: int,
        read_pool: ReadPool | None = None,
        max_taps: int = 16,
    ) -> None:
        self.config = config
        self.systems = systems
        self.intermediates = list(intermediates)
        self.queue_size = queue_size
        self.read_pool = read_pool if read_pool is not None else ReadPool(DEFAULT_READ_THREADS)
        self.max_taps = max_taps
        self.open_taps = 0  # changed on the server's event loop only

    def try_open(self) -> bool:
        """Count one more tap if fewer than ``max_taps`` are open; False when the limit is reached."""
        if self.open_taps >= self.max_taps:
            return False
        self.open_taps += 1
        return True

    def close_one(self) -> None:
        self.open_taps -= 1

    def streams(self) -> list[str]:
        declared = list(self.config.names("streams"))
        return sorted({*declared, *self.intermediates, *(f"{s}{DEAD_LETTER_SUFFIX}" for s in declared)})

    def target(self, stream: str) -> TapTarget:
        base = stream.removesuffix(DEAD_LETTER_SUFFIX)
        dlq = base != stream
        if base in self.intermediates:
            ref = stream_ref(self.config, base, intermediate=True)
            intermediate = not dlq
        elif base in self.config.names("streams"):
            ref, intermediate = self.systems.resolve(base), False
        else:
            raise TapError(404, f"no stream '{stream}' in this job; tap one of: {', '.join(self.streams())}")
        if dlq:
            ref = StreamRef(stream, ref.system, dead_letter_stream(ref.physical))
        return TapTarget(ref, intermediate)

    @staticmethod
    def matcher(pattern: str | None, field: str | None) -> _Matcher:
        """The tap's filter; `TapError` 400 for an expression RE2 refuses (invalid, or not matchable in linear
        time: backreferences, lookaround)."""
        options = re2.Options()
        options.log_errors = False  # the client's mistake, answered with 400: not the processor's log
        try:
            regex = re2.compile(pattern or "", options)
        except re2.error as exc:
            reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else exc
            raise TapError(
                400,
                f"match={pattern!r} is not a regular expression RE2 accepts ({reason}): taps match with RE2 "
                "syntax (docs/endpoints.md, Taps), which leaves out backreferences (\\1) and lookaround "
                "((?=...), (?<=...)) so that matching takes time linear in the input",
            ) from None
        return _Matcher(regex, field or None)

    async def ends(self, target: TapTarget) -> dict[int, Any]:
        """Each partition of ``target``'s stream and its end now: where a tap opened now starts reading."""
        admin = self.systems.admin(target.ref.system)
        metadata = await self.read_pool.run(admin.partition_metadata, target.ref.physical)
        return {p: m.upcoming for p, m in metadata.items()}

    async def run(
        self, target: TapTarget, matcher: _Matcher, queue: asyncio.Queue[str | None], positions: dict[int, Any]
    ) -> None:
        """Read ``target`` from ``positions`` (its `ends` when the tap opened) and put every matching record on
        ``queue`` until cancelled; puts None and returns when the queue is full (the client is too slow).
        Reading and matching run on the read pool; this coroutine only moves the finished messages onto the
        queue."""
        consumer = self.systems.consumer(target.ref.system)
        physical = target.ref.physical
        positions = dict(positions)
        while True:
            found = 0
            for partition, position in list(positions.items()):
                ssp = SystemStreamPartition(target.ref.system, physical, partition)
                read, upcoming, messages = await self.read_pool.run(
                    read_matching, consumer, ssp, position, target, matcher
                )
                found += read
                positions[partition] = upcoming
                for message in messages:
                    if queue.qsize() >= self.queue_size:
                        queue.put_nowait(None)
                        return
                    queue.put_nowait(message)
            if not found:
                await asyncio.sleep(POLL_S)


def read_matching(
    consumer: Any, ssp: SystemStreamPartition, position: Any, target: TapTarget, matcher: _Matcher
) -> tuple[int, Any, list[str]]:
    """One read of ``ssp`` from ``position`` and its matching messages, on a read-pool thread: returns the
    records read, the next position and the messages to send."""
    records = consumer.read(ssp, position, READ_BATCH)
    if not records:
        return 0, position, []
    return len(records), records[-1].next_offset, list(_messages(target, records, matcher))


@dataclass(frozen=True)
class _Matcher:
    regex: Any  # a compiled RE2 expression: linear-time search
    field: str | None

    def __call__(self, value: Any, text: str) -> bool:
        if self.field is None:
            return self.regex.search(text) is not None
        if not isinstance(value, dict) or value.get(self.field) is None:
            return False
        item = value[self.field]
        return self.regex.search(item if isinstance(item, str) else json.dumps(item, default=str)) is not None


def _values(target: TapTarget, record: IncomingRecord) -> Iterator[Any]:
    """The record's values: one per row of an intermediate stream's packed record, none for a control message."""
    raw = record.value
    if target.intermediate:
        try:
            kind, payload = decode(raw)
        except MalformedMessageError:
            yield raw.decode("utf-8", "replace")
            return
        if kind is MessageType.ROWS:
            from weirflow.spark.packing import unpack

            try:
                rows = unpack(raw).to_pylist()
            except MalformedMessageError:  # a corrupt rows record: shown as text, the tap goes on
                yield raw.decode("utf-8", "replace")
                return
            yield from rows
            return
        if kind is not MessageType.USER:
            return  # watermark, end-of-stream, drain: the runtime's, not the stream's records
        raw = payload  # type: ignore[assignment]
    try:
        yield json.loads(raw)
    except ValueError:
        yield raw.decode("utf-8", "replace")


def _messages(target: TapTarget, records: list[IncomingRecord], matcher: _Matcher) -> Iterator[str]:
    for record in records:
        key = record.key.decode("utf-8", "replace") if record.key is not None else None
        for value in _values(target, record):
            text = value if isinstance(value, str) else json.dumps(value, default=str)
            if matcher(value, text):
                yield json.dumps(
                    {
                        "stream": target.ref.stream_id,
                        "partition": record.ssp.partition,
                        "offset": record.offset,
                        "key": key,
                        "value": value,
                    },
                    default=str,
                )


def add_tap_routes(app: Any, taps: TapService | None) -> None:
    """``WS /tap/<stream>`` on the FastAPI ``app``; a plain ``GET`` of it explains itself (426)."""
    from fastapi.responses import JSONResponse

    @app.get("/tap/{stream}")
    async def tap_http(stream: str) -> Any:
        return JSONResponse(
            {
                "error": f"/tap/{stream} is a WebSocket: connect with ws://.../tap/{stream}"
                "?match=<regex>&field=<column>"
            },
            status_code=426,
        )

    @app.websocket("/tap/{stream}")
    async def tap(websocket: WebSocket, stream: str) -> None:
        if taps is None:
            await websocket.send_denial_response(JSONResponse({"error": "taps are off"}, status_code=404))
            return
        params = websocket.query_params
        try:
            target = taps.target(stream)
            matcher = taps.matcher(params.get("match"), params.get("field"))
        except TapError as exc:
            await websocket.send_denial_response(JSONResponse({"error": str(exc)}, status_code=exc.status))
            return
        if not taps.try_open():
            busy = (
                f"this processor already serves {taps.max_taps} taps (endpoints.tap.max): close one, connect "
                "to another processor, or raise endpoints.tap.max"
            )
            await websocket.send_denial_response(JSONResponse({"error": busy}, status_code=429))
            return
        try:
            await _serve(websocket, taps, stream, target, matcher)
        finally:
            taps.close_one()


async def _serve(
    websocket: WebSocket, taps: TapService, stream: str, target: TapTarget, matcher: _Matcher
) -> None:
    """Take the stream's ends, accept ``websocket``, then send it ``stream``'s matching records until either
    side closes. The ends come first, so every record written once the client's handshake completed is sent."""
    from fastapi import WebSocketDisconnect
    from fastapi.responses import JSONResponse

    params = websocket.query_params
    try:
        positions = await taps.ends(target)
    except Exception as exc:
        log.warning("tap on %s refused: its partitions' ends could not be read: %s", stream, exc)
        error = f"reading {stream} failed: {exc}"
        await websocket.send_denial_response(JSONResponse({"error": error}, status_code=503))
        return
    await websocket.accept()
    queue: asyncio.Queue[str | None] = asyncio.Queue()
    reader = asyncio.create_task(taps.run(target, matcher, queue, positions))
    closed = asyncio.create_task(websocket.receive())  # the client's close (taps take no input)
    log.info("tap on %s opened (match=%r, field=%r)", stream, params.get("match"), params.get("field"))
    try:
        while True:
            message = asyncio.create_task(queue.get())
            done, _ = await asyncio.wait({message, closed, reader}, return_when=asyncio.FIRST_COMPLETED)
            if closed in done or (reader in done and reader.exception() is not None):
                message.cancel()
                if reader in done and reader.exception() is not None:
                    await websocket.close(1011, f"reading {stream} failed: {reader.exception()}"[:120])
                return
            if message not in done:
                message.cancel()
                continue
            item = message.result()
            if item is None:
                await websocket.close(CLOSE_TOO_SLOW, f"client too slow: {taps.queue_size} messages queued")
                return
            await websocket.send_text(item)
    except WebSocketDisconnect:
        return
    finally:
        reader.cancel()
        closed.cancel()
        log.info("tap on %s closed", stream)
