"""The processor's HTTP server: FastAPI served by uvicorn in a background thread of `weirflow run`.

Routes so far (docs/endpoints.md):

* ``GET /`` — the job's status as a small HTML page (`weirflow.endpoints.page`);
* ``GET /healthz`` — 200 with the processor's state while it runs (container health probes; no token needed,
  see `HEALTH_PATH`);
* ``GET /status`` — the job's live picture as JSON, what `weirflow status --json` prints;
* ``GET /status/history`` — this processor's throughput and lag over the last minutes
  (`weirflow.endpoints.history`; the status page charts every live processor's);
* ``GET /tasks`` — this processor's tasks: records in/out, batches, last batch duration and checkpoint, dead
  letters, lag per SSP (`weirflow.endpoints.task_report`; the status page gathers every processor's);
* ``GET /metrics`` — Prometheus text format (prometheus-client), this processor's metrics;
* ``GET /openapi.json`` — the OpenAPI document of these routes (`weirflow.endpoints.openapi`; not the WebSockets);
* ``GET /tables/<name>/<key>``, ``GET /tables/<name>?prefix=&after=&limit=`` — served tables, routed to the
  owner of the key (`weirflow.endpoints.tables`);
* ``WS /tap/<stream>?match=&field=`` — a stream's matching records while connected (`weirflow.endpoints.taps`);
* ``POST /rpc/<stream>``, ``POST /http/<stream>``, ``WS /http/<stream>`` — requests to the job through an
  ``http`` stream, and its responses (`weirflow.endpoints.conversations`).

Every route but ``GET /healthz`` requires ``Authorization: Bearer <endpoints.auth.token>`` when a token is set,
and every request passes the request guards first (`weirflow.endpoints.guards`); errors are JSON
``{"error": ...}`` with a 4xx status.
"""

from __future__ import annotations

import hmac
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from weirflow.base.errors import StartupError
from weirflow.endpoints.advertise import advertised_url, unspecified
from weirflow.endpoints.conversations import Conversations, add_conversation_routes
from weirflow.endpoints.guards import BodyLimit, Refusal, RequestGuard, too_large
from weirflow.endpoints.openapi import describe_api
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.tables import TableService, add_table_routes, send_json, table_request
from weirflow.endpoints.taps import TapService, add_tap_routes

log = logging.getLogger("weirflow.endpoints")

# Answered without the bearer token: a container platform's health probes (Kubernetes, Container Apps: infra/)
# send no Authorization header, and the answer is only the processor's state name. The Host guard still applies.
HEALTH_PATH = "/healthz"


def create_app(
    settings: EndpointSettings,
    status: Callable[[], dict[str, Any]],
    health: Callable[[], tuple[bool, str]],
    metrics: Callable[[], bytes],
    tables: TableService | None = None,
    taps: TapService | None = None,
    conversations: Conversations | None = None,
    tasks: Callable[[], dict[str, Any]] | None = None,
    history: Callable[[], dict[str, Any]] | None = None,
) -> Any:
    """The FastAPI application; the callables read the processor's live state on each request. ``tables``
    answers the served-table routes (pipeline jobs); ``history`` the processor's samples (``GET
    /status/history``)."""
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, JSONResponse, Response

    from weirflow.endpoints.page import render_status_page

    # the OpenAPI document (weirflow.endpoints.openapi), behind the bearer token like every route (`_front`)
    app = FastAPI(title="weirflow processor", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    describe_api(app, settings)

    @app.get("/")
    def page() -> Any:
        return HTMLResponse(render_status_page(status()))

    @app.get(HEALTH_PATH)
    def healthz() -> Any:
        ok, state = health()
        return JSONResponse({"state": state}, status_code=200 if ok else 503)

    @app.get("/status")
    def status_route() -> Any:
        return status()

    @app.get("/status/history")
    def history_route() -> Any:
        return history() if history is not None else {"interval_ms": 0, "window_ms": 0, "samples": []}

    @app.get("/tasks")
    def tasks_route() -> Any:
        return tasks() if tasks is not None else {}

    @app.get("/metrics")
    def metrics_route() -> Any:
        return Response(metrics(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if tables is None:
        add_table_routes(app, None)  # 404 naming the reason
    add_tap_routes(app, taps)
    add_conversation_routes(app, conversations)

    @app.exception_handler(404)
    async def not_found(request: Request, exc: Exception) -> Any:
        return JSONResponse({"error": f"no route {request.method} {request.url.path}"}, status_code=404)

    return _front(settings, app, tables)


def _front(settings: EndpointSettings, app: Any, tables: TableService | None) -> Any:
    """The ASGI application in front of FastAPI: the request guards (`weirflow.endpoints.guards`: ``Host``,
    ``Origin``, ``Content-Type``, body size) and the bearer check on every request and WebSocket, and the
    served-table lookups answered without FastAPI's per-request machinery (routing, dependency solving,
    middleware task groups), which cost most of a proxied lookup's time (benchmarks/endpoints.py)."""
    expected = f"Bearer {settings.token}".encode() if settings.token else None
    guard = RequestGuard(settings)
    limit = settings.request_max_bytes

    def admit(scope: dict[str, Any], headers: dict[bytes, bytes]) -> Refusal | None:
        refusal = guard.check_host(scope, headers)
        probe = scope["type"] == "http" and scope["path"] == HEALTH_PATH and scope["method"] == "GET"
        if refusal is None and expected is not None and not probe:
            if not hmac.compare_digest(headers.get(b"authorization", b""), expected):
                return _NO_TOKEN_WS if scope["type"] == "websocket" else _NO_TOKEN
        return refusal or guard.check_rest(scope, headers)

    async def front(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await app(scope, receive, send)
            return
        refusal = admit(scope, dict(scope["headers"]))
        if refusal is not None:
            await _refuse(scope, receive, send, refusal)
        elif tables is not None and scope["type"] == "http" and scope["path"].startswith("/tables/"):
            await table_request(tables, scope, send)
        elif scope["type"] == "websocket":  # its messages: uvicorn's ws_max_size (`EndpointServer.start`)
            await app(scope, receive, send)
        else:
            body = BodyLimit(limit, receive, send)
            try:
                await app(scope, body.receive, body.send)
            except Exception:
                if not body.refused:
                    raise
            if body.refused and not body.started:
                await _refuse(scope, receive, send, too_large(limit))

    return front


_NO_TOKEN = Refusal(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
_NO_TOKEN_WS = Refusal(403, "missing or wrong bearer token (Authorization: Bearer <token>)")


async def _refuse(scope: dict[str, Any], receive: Any, send: Any, refusal: Refusal) -> None:
    """Answer ``refusal``: a JSON response, or for a WebSocket the handshake's HTTP response (403 with a
    plain close where the server cannot send one)."""
    body = refusal.body()
    if scope["type"] == "http":
        extra = {"www-authenticate": "Bearer"} if refusal.status == 401 else None
        await send_json(send, refusal.status, body, extra)
        return
    await receive()  # websocket.connect
    if "websocket.http.response" in scope.get("extensions", {}):
        raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "websocket.http.response.start", "status": refusal.status, "headers": raw})
        await send({"type": "websocket.http.response.body", "body": body})
        return
    await send({"type": "websocket.close", "code": 1008, "reason": refusal.error[:120]})


class EndpointServer:
    """uvicorn in a daemon thread; `start` returns once it listens, with `url` the address to advertise.
    ``on_stop``: what serves beside it (the status history's sampler), stopped with it."""

    def __init__(self, settings: EndpointSettings, app: Any, on_stop: tuple[Callable[[], None], ...] = ()) -> None:
        self.settings = settings
        self._app = app
        self._on_stop = on_stop
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def start(self, timeout_s: float = 10) -> str:
        import uvicorn

        host = self.settings.host
        sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if ":" in host and unspecified(host):  # "::" takes IPv4 too, whatever the OS default: see advertised_url
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, self.settings.port))
        port = sock.getsockname()[1]
        try:  # before serving: never register an address no peer can reach (0.0.0.0, ::)
            url = advertised_url(host, port, self.settings.advertised_url)
        except StartupError:
            sock.close()
            raise
        config = uvicorn.Config(
            self._app,
            log_level="warning",
            access_log=False,
            lifespan="off",
            ws_max_size=self.settings.request_max_bytes,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="endpoints", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        pause = threading.Event()  # not time.sleep: under libfaketime (clock-skew tests) it fails with EINVAL
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise StartupError(f"the endpoint server did not start on {self.settings.host}:{port}")
            pause.wait(0.02)
        self.url = url
        log.info("endpoints at %s", self.url)
        return self.url

    def stop(self) -> None:
        for stop in self._on_stop:
            stop()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(5)
