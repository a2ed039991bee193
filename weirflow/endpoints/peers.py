"""Keep-alive HTTP/1.1 connections from one processor to its peers, for proxied lookups.

A proxied key lookup is two HTTP exchanges, and with a general-purpose client (httpx, aiohttp) the client's
own bookkeeping was most of the entry processor's time: at 1,000 lookups/s through a non-owner the entry's
event loop was saturated, half of it inside aiohttp (py-spy, benchmarks/endpoints.py, docs/endpoints.md).
The peers speak one narrow dialect — ``GET`` with a handful of headers, answers with a ``Content-Length`` — so
this client is an `asyncio.Protocol` per connection with httptools (uvicorn's parser) reading the answer,
and a pool of idle connections per peer.
"""

from __future__ import annotations

import asyncio
import collections
from typing import Any
from urllib.parse import urlsplit

import httptools

from weirflow.errors import PeerError


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.body: list[bytes] = []
        self.closed = False
        self.keep_alive = True

    # asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(PeerError(f"bad answer from peer: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(PeerError(f"peer closed the connection{': ' + str(exc) if exc else ''}"))

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.body = []

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result((self.parser.get_status_code(), b"".join(self.body)))

    def _fail(self, exc: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc)

    async def request(self, raw: bytes, timeout_s: float) -> tuple[int, bytes]:
        assert self.transport is not None
        try:
            if self.transport.is_closing():  # closed by the peer, its `connection_lost` not delivered yet
                raise OSError("the transport is closing")
            self.transport.write(raw)
        except (RuntimeError, OSError) as exc:  # uvloop refuses a write on a handle closed under it
            self.close()
            raise PeerError(f"peer closed the connection: {exc}") from exc
        self.waiter = asyncio.get_running_loop().create_future()
        try:
            return await asyncio.wait_for(self.waiter, timeout_s)
        except TimeoutError as exc:
            self.close()
            raise PeerError(f"no answer within {timeout_s} s") from exc

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class PeerClient:
    """GET requests to peers' URLs over pooled keep-alive connections; one per event loop."""

    def __init__(self, headers: dict[str, str], timeout_s: float = 5.0, connect_timeout_s: float = 1.0) -> None:
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._idle: dict[tuple[str, int], collections.deque[_Connection]] = {}

    async def get(self, url: str, path_and_query: str) -> tuple[int, bytes]:
        """(status, body) of ``GET url + path_and_query``; `PeerError` when the peer cannot answer."""
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        prefix = parts.path.rstrip("/")
        raw = f"GET {prefix}{path_and_query} HTTP/1.1\r\nHost: {parts.netloc}\r\n{self._headers}\r\n".encode()
        idle = self._idle.setdefault((host, port), collections.deque())
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                answer = await conn.request(raw, self.timeout_s)
            except PeerError:  # a pooled connection the peer closed meanwhile: use another
                continue
            self._release(idle, conn)
            return answer
        loop = asyncio.get_running_loop()
        try:
            connecting = loop.create_connection(_Connection, host, port)
            _, conn = await asyncio.wait_for(connecting, self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise PeerError(f"cannot connect to {url}: {exc}") from exc
        answer = await conn.request(raw, self.timeout_s)
        self._release(idle, conn)
        return answer

    @staticmethod
    def _release(idle: collections.deque[_Connection], conn: _Connection) -> None:
        if conn.keep_alive and not conn.closed:
            idle.append(conn)
        else:
            conn.close()

    def close(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
