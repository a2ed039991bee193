"""The server's OpenAPI document (``GET /openapi.json``, `weirflow.endpoints.openapi`): behind the token, and
describing what FastAPI cannot see — the served-table routes answered ahead of it, the conversation routes'
JSON bodies and ``timeout_ms`` — with the server's own limits (docs/endpoints.md)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from weirflow.endpoints.server import create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.tables import MAX_PAGE, TableService

TOKEN = "t0ken"


def document(tables: TableService | None) -> tuple[int, dict[str, Any]]:
    settings = EndpointSettings(True, "127.0.0.1", 0, None, TOKEN, rpc_timeout_max_ms=60_000)
    app = create_app(settings, dict, lambda: (True, "RUNNING"), bytes, tables)
    client = TestClient(app)
    assert client.get("/openapi.json").status_code == 401  # the token, like every route
    response = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})
    return response.status_code, response.json()


def _parameters(operation: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in operation.get("parameters", [])}


@pytest.mark.parametrize("serves_tables", [False, True])
def test_the_document_describes_every_http_route_with_its_parameters(serves_tables: bool) -> None:
    tables = (
        TableService(None, "p1", lambda task: None, lambda task, name: None, dict, TOKEN, 0)
        if serves_tables
        else None
    )
    status, doc = document(tables)
    assert status == 200
    paths = doc["paths"]
    assert {
        "/",
        "/healthz",
        "/status",
        "/status/history",
        "/tasks",
        "/metrics",
        "/tap/{stream}",
        "/rpc/{stream}",
        "/http/{stream}",
    } <= set(paths)
    # the served tables, whether FastAPI answers them (a job without any: 404) or the front does
    assert "/tables/{rest}" not in paths
    scan = _parameters(paths["/tables/{name}"]["get"])
    assert scan["limit"]["schema"] == {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}
    assert {"name", "prefix", "after"} <= set(scan)
    assert set(_parameters(paths["/tables/{name}/{key}"]["get"])) == {"name", "key"}
    for path in ("/rpc/{stream}", "/http/{stream}"):
        post = paths[path]["post"]
        assert _parameters(post)["timeout_ms"]["schema"] == {"type": "integer", "minimum": 1, "maximum": 60_000}
        assert "application/json" in post["requestBody"]["content"]
    assert "504" in paths["/http/{stream}"]["post"]["responses"]
    assert "text/html" in paths["/"]["get"]["responses"]["200"]["content"]
    assert "text/plain" in paths["/metrics"]["get"]["responses"]["200"]["content"]
    history = paths["/status/history"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert history["required"] == ["interval_ms", "window_ms", "samples"]
    assert all(
        "401" in operation["responses"]
        for path, operations in paths.items()
        for operation in operations.values()
        if path != "/healthz"
    )
    assert "401" not in paths["/healthz"]["get"]["responses"]  # health probes send no token
