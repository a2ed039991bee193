"""The endpoint server's front (docs/endpoints.md, Security): what it refuses before any route runs — a foreign
``Host`` (DNS rebinding), a foreign ``Origin`` on WebSockets and state-changing requests, a ``POST`` that is not
JSON, a body or WebSocket message over ``endpoints.request.max.bytes`` — and what it must still let through
(curl, SDKs, peers, the server's own pages)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from weirflow.config.loader import Config
from weirflow.endpoints.server import EndpointServer, _front, create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.taps import TapService
from weirflow.interfaces.system import StreamSpec
from weirflow.job.systems import Systems

LIMIT = 1024
LOCAL = "http://127.0.0.1:8000"
JSON = {"Content-Type": "application/json"}


def settings(host: str = "127.0.0.1", port: int = 8000, **values: Any) -> EndpointSettings:
    token = values.pop("token", None)
    return EndpointSettings(True, host, port, values.pop("advertised_url", None), token, **values)


def client(base_url: str = LOCAL, **values: Any) -> TestClient:
    app = create_app(settings(**values), dict, lambda: (True, "RUNNING"), lambda: b"")
    return TestClient(app, base_url=base_url)


def denied(client: TestClient, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of a refused WebSocket handshake (to the client's base URL: `websocket_connect`
    would name ws://testserver otherwise)."""
    with pytest.raises(WebSocketDenialResponse) as refused:
        with client.websocket_connect(f"ws://{client.base_url.netloc.decode()}{path}", headers=headers):
            pass
    return refused.value.status_code, refused.value.json()


class _Echo:
    """A FastAPI app behind the front whose route records the bodies it got."""

    def __init__(self, limit: int = LIMIT) -> None:
        self.bodies: list[int] = []
        app = FastAPI()

        @app.post("/echo")
        async def echo(request: Request) -> Any:
            body = await request.body()
            self.bodies.append(len(body))
            return {"bytes": len(body)}

        self.asgi = _front(settings(request_max_bytes=limit), app, None)

    async def post(self, content: Any, headers: dict[str, str] | None = None) -> httpx.Response:
        transport = httpx.ASGITransport(app=self.asgi)
        async with httpx.AsyncClient(transport=transport, base_url=LOCAL) as http:
            return await http.post("/echo", content=content, headers={**JSON, **(headers or {})})


# --- Origin -------------------------------------------------------------------------------------------------


def test_a_websocket_handshake_from_a_foreign_origin_is_refused_403() -> None:
    with client() as http:
        status, body = denied(http, "/tap/views", {"Origin": "http://evil.example"})
        assert status == 403 and "endpoints.allowed.origins" in body["error"]
        assert "http://evil.example" in body["error"]
        status, _ = denied(http, "/tap/views", {"Origin": "null"})  # a sandboxed frame or a file:// page
        assert status == 403


def test_the_servers_own_origins_and_allowed_ones_reach_the_route() -> None:
    """Past the front, the tap route answers 404 'taps are off' (no TapService): the guard let it through."""
    with client(allowed_origins=("https://ops.example.com",), advertised_url="https://lb.example.com") as http:
        for origin in (
            "http://127.0.0.1:8000",
            "http://localhost:8000",
            "http://[::1]:8000",
            "https://ops.example.com",
            "https://lb.example.com",
            "https://LB.example.com:443",  # written differently, the same origin
            None,  # no Origin: curl, SDKs, peers
        ):
            headers = {"Origin": origin} if origin else {}
            status, body = denied(http, "/tap/views", headers)
            assert (status, body) == (404, {"error": "taps are off"}), origin
        assert denied(http, "/tap/views", {"Origin": "http://localhost:9999"})[0] == 403  # another port


def test_a_state_changing_request_from_a_foreign_origin_is_refused_but_reads_are_not() -> None:
    with client() as http:
        refused = http.post("/rpc/work", json={"limit": 1}, headers={"Origin": "http://evil.example"})
        assert refused.status_code == 403 and "POST requests" in refused.json()["error"]
        assert http.get("/healthz", headers={"Origin": "http://evil.example"}).status_code == 200
        own = http.post("/rpc/work", json={"limit": 1}, headers={"Origin": LOCAL})
        assert own.status_code == 404 and own.json() == {"error": "this job has no http streams"}


# --- Content-Type -------------------------------------------------------------------------------------------


def test_a_post_must_carry_json() -> None:
    with client() as http:
        for content_type in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
            headers = {"Content-Type": content_type} if content_type else {}
            refused = http.post("/rpc/work", content=b'{"limit": 1}', headers=headers)
            assert refused.status_code == 415, content_type
            assert "Content-Type: application/json" in refused.json()["error"]
        charset = http.post(
            "/rpc/work", content=b"{}", headers={"Content-Type": "Application/JSON; charset=utf-8"}
        )
        assert charset.status_code == 404  # the route's answer: no http streams


# --- Body size ----------------------------------------------------------------------------------------------


def test_a_body_declared_over_the_limit_is_refused_413_before_it_reaches_the_route() -> None:
    echo = _Echo()
    refused = asyncio.run(echo.post(b"x" * (LIMIT + 1)))
    assert refused.status_code == 413
    assert "endpoints.request.max.bytes" in refused.json()["error"] and str(LIMIT) in refused.json()["error"]
    assert echo.bodies == []
    at_limit = asyncio.run(echo.post(b"x" * LIMIT))
    assert at_limit.json() == {"bytes": LIMIT} and echo.bodies == [LIMIT]


def test_a_chunked_body_is_cut_off_once_past_the_limit_and_nothing_after_it_is_read() -> None:
    echo = _Echo()
    pulled = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(1000):  # 100 KiB in all, ten times the limit
            pulled.append(i)
            yield b"y" * 100

    refused = asyncio.run(echo.post(chunks()))
    assert refused.status_code == 413 and "endpoints.request.max.bytes" in refused.json()["error"]
    assert echo.bodies == [], "the route never saw the body"
    assert len(pulled) <= LIMIT // 100 + 2, f"read {len(pulled)} chunks of 100 bytes past a {LIMIT}-byte limit"

    async def small() -> AsyncIterator[bytes]:
        for _ in range(5):
            yield b"z" * 100

    assert asyncio.run(echo.post(small())).json() == {"bytes": 500}


# --- Host ---------------------------------------------------------------------------------------------------


def test_a_foreign_host_is_refused_for_every_route_and_websocket() -> None:
    with client() as http:
        for path in ("/healthz", "/status", "/tables/t/k"):
            refused = http.get(path, headers={"Host": "evil.example:8000"})
            assert refused.status_code == 421, path
            assert "endpoints.advertised.url" in refused.json()["error"]
        status, body = denied(http, "/tap/views", {"Host": "evil.example"})
        assert status == 421 and "endpoints.advertised.url" in body["error"]


def test_ip_literals_loopback_names_and_the_advertised_host_pass() -> None:
    with client(advertised_url="https://lb.example.com") as http:
        for host in (
            "127.0.0.1:8000",
            "localhost:8000",
            "[::1]:8000",
            "10.0.0.7",
            "lb.example.com",
            "LB.Example.com",
        ):
            assert http.get("/healthz", headers={"Host": host}).status_code == 200, host


def test_a_host_in_endpoints_allowed_hosts_passes_as_an_ingress_forwards_it() -> None:
    """Container Apps' ingress forwards the client's ``Host`` (the app's FQDN) unchanged (docs/deploy.md)."""
    fqdn = "ca-pageviews.internal.happy-sky-1234.westeurope.azurecontainerapps.io"
    with client(
        "http://10.1.2.3:8080", host="0.0.0.0", token="s3cret", allowed_hosts=(fqdn, "ca-pageviews")
    ) as http:
        auth = {"Authorization": "Bearer s3cret"}
        for host in (fqdn, "ca-pageviews", "10.1.2.3:8080"):
            assert http.get("/status", headers={**auth, "Host": host}).status_code == 200, host
        refused = http.get("/status", headers={**auth, "Host": "other.azurecontainerapps.io"})
        assert refused.status_code == 421 and "endpoints.allowed.hosts" in refused.json()["error"]
    with client("http://10.1.2.3:8080", host="0.0.0.0", token="s3cret") as http:  # not listed: refused
        assert http.get("/status", headers={"Authorization": "Bearer s3cret", "Host": fqdn}).status_code == 421


def test_loopback_names_do_not_pass_a_server_bound_elsewhere() -> None:
    base = "http://10.1.2.3:8000"
    with client(base, host="0.0.0.0", token="s3cret") as http:
        auth = {"Authorization": "Bearer s3cret"}
        assert http.get("/healthz", headers=auth).status_code == 200
        assert http.get("/healthz", headers={**auth, "Host": "localhost:8000"}).status_code == 421
        assert http.get("/status", headers={"Host": "10.1.2.3:8000"}).status_code == 401  # the token still counts
        assert http.get("/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200  # a probe needs none
        assert (
            http.get("/healthz", headers={"Host": "localhost:8000"}).status_code == 421
        )  # but passes the Host check
        # a page served at the address the request names is the server's own origin
        own = http.post("/rpc/w", json={}, headers={**auth, "Origin": base})
        assert own.status_code == 404


def test_the_host_check_comes_before_the_tables_fast_path() -> None:
    class Tables:
        async def get(self, *args: Any) -> Any:
            raise AssertionError("a refused request reached the table service")

    app = create_app(settings(), dict, lambda: (True, "RUNNING"), lambda: b"", Tables())  # type: ignore[arg-type]
    with TestClient(app, base_url=LOCAL) as http:
        assert http.get("/tables/t/k", headers={"Host": "evil.example"}).status_code == 421
        assert http.post("/tables/t/k", content=b"x", headers={"Origin": "http://evil.example"}).status_code == 403


def test_a_websocket_message_over_the_limit_closes_the_connection_1009(tmp_path: Path) -> None:
    """uvicorn enforces the limit on WebSocket frames (`EndpointServer.start` passes it as ``ws_max_size``)."""
    config = Config.from_dict(
        {"job": {"name": "j", "state": {"dir": str(tmp_path)}}, "streams": {"views": {"partitions": 1}}},
        base_dir=tmp_path,
    )
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("views", 1))
    live = settings(request_max_bytes=LIMIT, port=0)
    taps = TapService(config, systems, [], 10)
    server = EndpointServer(live, create_app(live, dict, lambda: (True, "RUNNING"), lambda: b"", None, taps))
    url = server.start().replace("http://", "ws://")
    try:
        with connect(f"{url}/tap/views") as ws:
            ws.send("x" * (LIMIT + 1))
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
    finally:
        server.stop()
        systems.close()
