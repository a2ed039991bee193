"""What the endpoint server refuses before any route runs (docs/endpoints.md, Security).

A processor's server is reachable by more than the clients it is meant for: any web page open in a browser on
the machine can send it requests, and a page whose DNS name is re-pointed at 127.0.0.1 (DNS rebinding) can
even read the answers. Clients that are not browsers (curl, SDKs, the processors themselves) send no
``Origin`` and name the server by the address they were given. So the front (`weirflow.endpoints.server`)
refuses, from the headers alone:

* a ``Host`` that is not an IP literal, a loopback name (when bound to loopback), the bound host, the
  advertised URL's host or one of ``endpoints.allowed.hosts`` (an ingress's name): 421 (a rebinding page names
  its own domain);
* a WebSocket handshake or a state-changing request (``POST`` ...) whose ``Origin`` is not the server's own
  nor in ``endpoints.allowed.origins``: 403 (a page elsewhere cannot tap streams or call the job);
* a state-changing request whose ``Content-Type`` is not ``application/json``: 415 (the only bodies a
  page may send cross-origin without asking first are forms and plain text);
* a body over ``endpoints.request.max.bytes``: 413, from ``Content-Length`` before anything is read, or while
  a chunked body arrives (`BodyLimit`), so nothing past the limit is buffered or written to a stream.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from weirflow.base.errors import WeirflowError
from weirflow.endpoints.settings import EndpointSettings, is_loopback

STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
DEFAULT_PORTS = {"http": 80, "https": 443}

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


@dataclass(frozen=True)
class Refusal:
    """A request refused from its headers: the status and the sentence of its ``{"error": ...}``."""

    status: int
    error: str

    def body(self) -> bytes:
        return json.dumps({"error": self.error}).encode()


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _origin(scheme: str, host: str, port: int | None) -> str:
    """``scheme://host[:port]`` as browsers write ``Origin``: lower case, the scheme's default port left out."""
    scheme, host = scheme.lower(), _bracketed(host.lower())
    return (
        f"{scheme}://{host}" if port is None or DEFAULT_PORTS.get(scheme) == port else f"{scheme}://{host}:{port}"
    )


def normalize_origin(value: str) -> str | None:
    """An ``Origin`` header or a configured origin in the form `_origin` writes; None when it is not one."""
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return _origin(parts.scheme, parts.hostname, port)


def _host_name(header: str) -> str:
    """The name in a ``Host`` header, without its port, lower case (IPv6 literals keep their brackets)."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[: header.find("]") + 1] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


@dataclass
class RequestGuard:
    """The header checks of the module's docstring for one server. The bound port is read from each request's
    scope (``endpoints.port: 0`` picks it at bind time); `add_url` accepts one more address clients use."""

    settings: EndpointSettings
    _hosts: set[str] = field(default_factory=set)
    _origins: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        host = self.settings.host.lower()
        self._loopback = is_loopback(host)
        self._hosts.add(_bracketed(host))
        if self._loopback:
            self._hosts.update(LOOPBACK_NAMES)
        self._hosts.update(self.settings.allowed_hosts)  # names a proxy in front forwards unchanged (infra/)
        for origin in self.settings.allowed_origins:
            normalized = normalize_origin(origin)
            if normalized is not None:
                self._origins.add(normalized)
        if self.settings.advertised_url:
            self.add_url(self.settings.advertised_url)

    def add_url(self, url: str) -> None:
        """Accept ``url``'s host in ``Host`` and its origin in ``Origin``: an address this server is reached at."""
        parts = urlsplit(url)
        if parts.hostname:
            self._hosts.add(_bracketed(parts.hostname.lower()))
            origin = normalize_origin(url)
            if origin is not None:
                self._origins.add(origin)

    def _own_origins(self, scope: Message) -> Iterable[str]:
        """The origins of the bound address (its port known only per connection) and its loopback aliases."""
        server = scope.get("server")
        if not server:
            return ()
        bound, port = str(server[0]), server[1]
        names = {self.settings.host, bound, *(LOOPBACK_NAMES if self._loopback or is_loopback(bound) else ())}
        return (_origin("http", name.strip("[]"), port) for name in names)  # the server speaks no TLS itself

    def check_host(self, scope: Message, headers: dict[bytes, bytes]) -> Refusal | None:
        """The ``Host`` check; the caller checks the bearer token after it, then `check_rest`."""
        raw = headers.get(b"host")
        if raw is None:  # HTTP/1.0 clients; every browser sends one
            return None
        name = _host_name(raw.decode("latin-1"))
        server = scope.get("server")
        if name in self._hosts or _is_ip(name) or (server and name == _bracketed(str(server[0]).lower())):
            return None
        return Refusal(
            421,
            f"Host '{raw.decode('latin-1')}' is not an address of this server (it answers to IP addresses, "
            f"{'localhost, ' if self._loopback else ''}its bound host '{self.settings.host}', the host of "
            "endpoints.advertised.url and endpoints.allowed.hosts): use one of those, or list the name clients "
            "reach it by in endpoints.allowed.hosts (DNS rebinding guard)",
        )

    def check_rest(self, scope: Message, headers: dict[bytes, bytes]) -> Refusal | None:
        """``Origin``, ``Content-Type`` and ``Content-Length`` (one value per lower-case header name)."""
        websocket = scope["type"] == "websocket"
        changing = not websocket and scope["method"] in STATE_CHANGING
        origin = headers.get(b"origin")
        if origin is not None and (websocket or changing):
            refusal = self._check_origin(scope, origin.decode("latin-1"), headers.get(b"host"))
            if refusal is not None:
                return refusal
        if websocket:
            return None
        if changing:
            content_type = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
            if content_type != b"application/json":
                given = headers.get(b"content-type", b"none").decode("latin-1")
                return Refusal(
                    415,
                    f"{scope['method']} requests carry JSON: send 'Content-Type: application/json' "
                    f"(Content-Type was {given}; with curl use --json or -H 'Content-Type: application/json')",
                )
        length = headers.get(b"content-length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                return Refusal(400, f"Content-Length '{length.decode('latin-1')}' is not a number of bytes")
            if size > self.settings.request_max_bytes:
                return too_large(self.settings.request_max_bytes)
        return None

    def _check_origin(self, scope: Message, origin: str, host: bytes | None) -> Refusal | None:
        normalized = normalize_origin(origin)
        if normalized is not None:
            if normalized in self._origins or normalized in self._own_origins(scope):
                return None
            # a page served by this server at the address the request names (the Host was checked)
            if host is not None and normalized == f"http://{host.decode('latin-1').lower()}":
                return None
        what = "WebSocket handshakes" if scope["type"] == "websocket" else f"{scope['method']} requests"
        return Refusal(
            403,
            f"Origin '{origin}' may not send {what} here: only the server's own origin and those listed in "
            "endpoints.allowed.origins may (browser pages elsewhere must not tap streams or call the job); "
            "add it to endpoints.allowed.origins if it is yours",
        )


def too_large(limit: int) -> Refusal:
    return Refusal(
        413,
        f"the request body is over {limit} bytes (endpoints.request.max.bytes): send less, or raise "
        "endpoints.request.max.bytes",
    )


class BodyTooLarge(WeirflowError):
    """Raised into the application by `BodyLimit.receive` once a body passes the limit."""


class BodyLimit:
    """Counts a request's body as it is received and cuts it off past ``limit`` bytes: the application's
    ``receive`` raises `BodyTooLarge`, whatever it then sends is dropped, and `refused` tells the caller to
    answer 413 (`too_large`) if no response was started."""

    def __init__(self, limit: int, receive: Receive, send: Send) -> None:
        self.limit = limit
        self._receive = receive
        self._send = send
        self.received = 0
        self.refused = False
        self.started = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if self.received > self.limit:
                self.refused = True
                raise BodyTooLarge(f"request body over {self.limit} bytes")
        return message

    async def send(self, message: Message) -> None:
        if self.refused:
            return  # the application's answer to the cut-off body (an error page): the caller answers 413
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)
