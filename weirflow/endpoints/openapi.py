"""The processor's OpenAPI document, ``GET /openapi.json`` (docs/endpoints.md): FastAPI's, completed with what
FastAPI cannot see.

FastAPI describes a route from its handler's signature, and some of ours read the request themselves:

* served tables are answered ahead of FastAPI (`weirflow.endpoints.tables.table_request`, for speed), so FastAPI
  knows no table route at all, or only the catch-all that says the job serves none;
* ``POST /rpc/<stream>`` and ``POST /http/<stream>`` read their JSON body and ``timeout_ms`` from the raw request,
  so that a bad one gets our own 400 sentence rather than a validation list.

Without their parameters and bodies in the document a client generator or a fuzzer (tests/integration/
test_http_fuzz.py) would only ever send empty requests. The document is built once, on its first request, and
is served behind the bearer token like every route.
"""

from __future__ import annotations

from typing import Any

from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.tables import MAX_PAGE

_ERROR = {"$ref": "#/components/schemas/Error"}
_ERROR_SCHEMA = {
    "type": "object",
    "properties": {"error": {"type": "string", "description": "what went wrong and what to do about it"}},
    "required": ["error"],
}
_ANY_JSON: dict[str, Any] = {}  # any JSON value
_RATE = {"type": ["number", "null"], "description": "per second since the previous sample; null in the first"}
_HISTORY = {
    "type": "object",
    "properties": {
        "interval_ms": {"type": "integer"},
        "window_ms": {"type": "integer"},
        "samples": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "at_ms": {"type": "integer"},
                    "records_in_per_s": _RATE,
                    "records_out_per_s": _RATE,
                    "lag": {"type": ["integer", "null"]},
                    "tasks": {"type": "integer"},
                },
                "required": ["at_ms", "records_in_per_s", "records_out_per_s", "lag", "tasks"],
            },
        },
    },
    "required": ["interval_ms", "window_ms", "samples"],
}


def describe_api(app: Any, settings: EndpointSettings) -> None:
    """Make ``app.openapi()`` (what ``GET /openapi.json`` returns) FastAPI's document completed by `complete`."""
    generated = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:  # FastAPI keeps the document it generated: complete it once
            complete(generated(), settings)
        document: dict[str, Any] = app.openapi_schema
        return document

    app.openapi = openapi


def complete(doc: dict[str, Any], settings: EndpointSettings) -> dict[str, Any]:
    """Add to FastAPI's ``doc`` the served-table routes, the JSON bodies and ``timeout_ms`` of the conversation
    routes, the media types of the routes that answer text, their JSON errors, and the 401 of a request without
    the token (when one is set; ``/healthz`` needs none)."""
    paths: dict[str, Any] = doc.setdefault("paths", {})
    doc.setdefault("components", {}).setdefault("schemas", {})["Error"] = _ERROR_SCHEMA
    paths.pop("/tables/{rest}", None)  # the catch-all of a job without tables: described as the two routes below
    paths["/tables/{name}"] = {"get": _table_scan()}
    paths["/tables/{name}/{key}"] = {"get": _table_lookup()}
    for path, ok, waits in (("/rpc/{stream}", _fan_out_answer(), False), ("/http/{stream}", _response(), True)):
        if (post := paths.get(path, {}).get("post")) is not None:
            _conversation(post, ok, settings.rpc_timeout_max_ms, waits)
    if (history := paths.get("/status/history", {}).get("get")) is not None:
        history["summary"] = "This processor's throughput and lag over the last minutes"
        history["responses"]["200"] = _json("the samples, oldest first (weirflow.endpoints.history)", _HISTORY)
    _media(paths, "/", "text/html")
    _media(paths, "/metrics", "text/plain")
    if (health := paths.get("/healthz", {}).get("get")) is not None:
        health["responses"]["503"] = _json("the processor failed or stopped", _ANY_JSON)
    if (tap := paths.get("/tap/{stream}", {}).get("get")) is not None:
        tap["responses"]["426"] = _json("a tap is a WebSocket: connect with ws://", _ERROR)
    if settings.token:
        for path, operations in paths.items():
            if path == "/healthz":  # answered without the token, for health probes (weirflow.endpoints.server)
                continue
            for operation in operations.values():
                operation["responses"]["401"] = _json("missing or wrong Authorization: Bearer <token>", _ERROR)
    return doc


def _json(description: str, schema: dict[str, Any], **headers: str) -> dict[str, Any]:
    response: dict[str, Any] = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = {
            name: {"description": text, "schema": {"type": "string"}} for name, text in headers.items()
        }
    return response


def _errors(*statuses: tuple[int, str]) -> dict[str, Any]:
    return {str(status): _json(description, _ERROR) for status, description in statuses}


def _path(name: str, description: str, **schema: Any) -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", **schema},
    }


def _query(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema}


_MOVING = _json(
    "the task holding the rows is moving between processors (a rebalance or a failover); retry",
    _ERROR,
    **{"Retry-After": "seconds to wait before retrying"},
)


def _table_lookup() -> dict[str, Any]:
    return {
        "summary": "The latest row of a key in a served table",
        "operationId": "table_lookup",
        "parameters": [
            _path("name", "the served table (Stream.serve or task.tables)"),
            _path("key", "the key as text, percent-encoded", minLength=1),
        ],
        "responses": {
            "200": _json("the row as the job wrote it", _ANY_JSON),
            **_errors((400, "the key is empty or not UTF-8"), (404, "no such table, or no row for the key")),
            "503": _MOVING,
        },
    }


def _table_scan() -> dict[str, Any]:
    page = {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "items": {"type": "object", "properties": {"key": {"type": "string"}, "row": _ANY_JSON}},
            },
            "next": {"type": ["string", "null"], "description": "the cursor of the next page, for after="},
        },
        "required": ["rows", "next"],
    }
    return {
        "summary": "A page of a served table's rows in key order",
        "operationId": "table_scan",
        "parameters": [
            _path("name", "the served table (Stream.serve or task.tables)"),
            _query("prefix", "only keys that start with this", {"type": "string", "default": ""}),
            _query("after", "only keys after this one: the previous page's next", {"type": "string"}),
            _query(
                "limit", "rows per page", {"type": "integer", "minimum": 1, "maximum": MAX_PAGE, "default": 100}
            ),
            _query(
                "tasks",
                "the table's tasks to read, comma-separated: what a processor forwarding a listing asks of the "
                "owner of those tasks (clients leave it out and get every task's rows)",
                {"type": "string"},
            ),
        ],
        "responses": {
            "200": _json("the page", page),
            **_errors(
                (400, "limit is not an integer in range, or tasks names a task the table does not have"),
                (404, "no such table"),
            ),
            "503": _MOVING,
        },
    }


def _fan_out_answer() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "replies": {"type": "array", "items": _ANY_JSON},
            "tasks": {"type": "integer"},
            "answered": {"type": "integer"},
            "partial": {"type": "boolean"},
        },
        "required": ["replies", "tasks", "answered", "partial"],
    }


def _response() -> dict[str, Any]:
    return {"type": "object", "description": "the job's response, without its connection id"}


def _conversation(post: dict[str, Any], ok: dict[str, Any], timeout_max_ms: int, waits: bool) -> None:
    """``waits``: the route answers 504 when the job does not answer in time (a fan-out answers ``partial``)."""
    post["parameters"] = [
        *post.get("parameters", []),
        _query(
            "timeout_ms",
            "how long to wait for the job (default endpoints.rpc.timeout.ms)",
            {"type": "integer", "minimum": 1, "maximum": timeout_max_ms},
        ),
    ]
    post["requestBody"] = {
        "required": False,
        "description": "the request, any JSON value: it enters the job as the records' body",
        "content": {"application/json": {"schema": _ANY_JSON}},
    }
    post["responses"] = {
        "200": _json("the job's answer", ok),
        **_errors(
            (400, "the body is not JSON, or timeout_ms is not an integer in range"),
            (404, "no such http stream in this job"),
            (413, "the body is larger than endpoints.request.max.bytes"),
            (415, "the body is not application/json"),
            (429, "too many requests waiting on this processor (endpoints.conversations.max)"),
        ),
    }
    if waits:
        post["responses"]["504"] = _json("the job did not answer within timeout_ms", _ERROR)


def _media(paths: dict[str, Any], path: str, media_type: str) -> None:
    get = paths.get(path, {}).get("get")
    if get is not None:
        get["responses"]["200"]["content"] = {media_type: {"schema": {"type": "string"}}}
