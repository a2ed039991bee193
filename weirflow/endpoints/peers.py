"""Keep-alive HTTP/1.1 connections from one processor to its peers, for proxied lookups (and, asked of all
at once by `get_json_from_peers`, the status page's histories).

A proxied key lookup is two HTTP exchanges, and with a general-purpose client (httpx, aiohttp) the client's
own bookkeeping was most of the entry processor's time: at 1,000 lookups/s through a non-owner the entry's
event loop was saturated, half of it inside aiohttp (py-spy, benchmarks/endpoints.py, docs/endpoints.md).
The peers speak one narrow dialect — ``GET`` with a handful of headers, answers with a ``Content-Length`` — so
this client is an `asyncio.Protocol` per connection with httptools (uvicorn's parser) reading the answer,
and a pool of idle connections per peer.

The bearer token travels in every request, so an ``https://`` peer URL is spoken to over TLS (the system's trusted
CAs, the certificate checked against the URL's host; ``SSL_CERT_FILE`` adds a private CA), never in plain text,
and an answer is returned as it is: a redirect is not followed (docs/endpoints.md, "Peers").
"""

from __future__ import annotations

import asyncio
import collections
import json
import ssl
from typing import Any
from urllib.parse import urlsplit

import httptools

from weirflow.base.errors import PeerError

_DEFAULT_PORTS = {"http": 80, "https": 443}


def peer_ssl_context() -> ssl.SSLContext:
    """TLS for ``https`` peers: the system's trusted CAs (``SSL_CERT_FILE``/``SSL_CERT_DIR`` name a private CA's
    certificates), certificates verified and matched to the URL's host."""
    return ssl.create_default_context()


def peer_target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path prefix) of a peer's URL; the port defaults to the scheme's (80, 443)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS:
        raise PeerError(
            f"peer URL {url!r} is neither http:// nor https://: "
            "set that processor's endpoints.advertised.url to one"
        )
    try:
        port = parts.port or _DEFAULT_PORTS[scheme]
    except ValueError as exc:
        raise PeerError(
            f"peer URL {url!r} has no valid port ({exc}): fix that processor's endpoints.advertised.url"
        ) from exc
    return scheme, parts.hostname or "127.0.0.1", port, parts.path.rstrip("/")


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
    """GET requests to peers' URLs over pooled keep-alive connections; one per event loop.

    ``ssl_context``: how ``https`` peers are verified (default `peer_ssl_context`, made on first use).
    """

    def __init__(
        self,
        headers: dict[str, str],
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._headers = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], collections.deque[_Connection]] = {}

    async def get(self, url: str, path_and_query: str) -> tuple[int, bytes]:
        """(status, body) of ``GET url + path_and_query``; `PeerError` when the peer cannot answer."""
        scheme, host, port, prefix = peer_target(url)
        netloc = urlsplit(url).netloc
        raw = f"GET {prefix}{path_and_query} HTTP/1.1\r\nHost: {netloc}\r\n{self._headers}\r\n".encode()
        idle = self._idle.setdefault((scheme, host, port), collections.deque())
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
        tls = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = peer_ssl_context()
            tls = self._ssl
        try:  # with TLS the handshake (certificate checked against `host`) completes before anything is sent
            connecting = loop.create_connection(
                _Connection, host, port, ssl=tls, server_hostname=host if tls else None
            )
            _, conn = await asyncio.wait_for(connecting, self.connect_timeout_s)
        except (OSError, TimeoutError) as exc:  # ssl.SSLError is an OSError: an untrusted certificate lands here
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


def get_json_from_peers(
    urls: dict[str, str], path_and_query: str, token: str | None, timeout_s: float
) -> dict[str, Any]:
    """``GET path_and_query`` of several peers at once (processor -> URL), each answer within ``timeout_s``:
    processor -> its JSON, or ``{"error": ...}`` for a peer that did not answer 200 with JSON in time (the
    status page names it and goes on). Blocking: for a handler running on a worker thread, not on the loop."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def one(client: PeerClient, url: str) -> Any:
        try:
            status, body = await asyncio.wait_for(client.get(url, path_and_query), timeout_s)
        except (PeerError, TimeoutError) as exc:
            return {"error": f"{type(exc).__name__}: {exc or f'no answer within {timeout_s} s'}"}
        if status != 200:
            return {"error": f"HTTP {status}: {body[:200].decode(errors='replace')}"}
        try:
            return json.loads(body)
        except ValueError as exc:
            return {"error": f"not JSON: {exc}"}

    async def everyone() -> dict[str, Any]:
        client = PeerClient(headers, timeout_s=timeout_s, connect_timeout_s=min(1.0, timeout_s))
        try:
            answers = await asyncio.gather(*(one(client, url) for url in urls.values()))
        finally:
            client.close()
        return dict(zip(urls, answers, strict=True))

    return asyncio.run(everyone()) if urls else {}
