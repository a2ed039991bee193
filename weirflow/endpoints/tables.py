"""Served tables over HTTP: any processor answers, the owner of the key's task reads it (docs/endpoints.md).

**Routing.** key → the intermediate stream's partitioner (`PipelinePlan.table_task`) → task → the processor the
current job model assigns it to → that processor's URL in the registry. A request to another processor is
proxied (`weirflow.endpoints.peers`: pooled keep-alive connections, the processor's bearer token passed on) with
the header ``X-Weirflow-Hop``; a processor receiving a hop answers only from a task it serves *now* and says 409
otherwise, so a proxy that routed with an old model, or reached a processor whose task is still restoring, tries
again. While no processor serves the task (a rebalance, a failover) the request waits, re-reading the model and
the registry, up to ``endpoints.route.wait.ms``; then it gets 503 with ``Retry-After``. It never gets an answer
from a processor that does not hold the task: an owner answers only after its task's query started, which is
after the task's lock was taken and its Spark checkpoint (with the table) restored.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from weirflow.endpoints.peers import PeerClient, PeerError
from weirflow.runtime.served_tables import ServedTable

log = logging.getLogger("weirflow.endpoints")

HOP = "x-weirflow-hop"
_REGISTRY_TTL_S = 1.0
_REREAD_AFTER_FAILURE_S = 0.5  # a peer unreachable: read the registry again soon (it may have moved), not at once
_RETRY_S = 0.05
MAX_PAGE = 1000


@dataclass
class Answer:
    """An HTTP answer: status, body (bytes of JSON) and extra headers."""

    status: int
    body: bytes
    headers: dict[str, str] | None = None

    @classmethod
    def error(cls, status: int, message: str, **headers: str) -> Answer:
        return cls(status, json.dumps({"error": message}).encode(), headers or None)


class TableService:
    """Answers ``GET /tables/...`` for one processor: locally for the tasks it serves, by proxy otherwise.

    ``plan``: the job's `PipelinePlan`; ``owner_of(task)``: the processor the current job model assigns the
    task to; ``table(task, name)``: the runner's copy of the task's table (None unless served here now);
    ``endpoints()``: processor id -> URL from the registry (a store read: called off the event loop).
    """

    def __init__(
        self,
        plan: Any,
        me: str,
        owner_of: Callable[[str], str | None],
        table: Callable[[str, str], ServedTable | None],
        endpoints: Callable[[], dict[str, str]],
        token: str | None,
        wait_s: float,
    ) -> None:
        self.plan = plan
        self.me = me
        self.owner_of = owner_of
        self.table = table
        self._endpoints = endpoints
        self.token = token
        self.wait_s = wait_s
        self._urls: dict[str, str] = {}
        self._urls_at = float("-inf")
        self._client: Any = None

    # --- local -----------------------------------------------------------------------------------------
    def reader(self, table: str, task: str) -> ServedTable | None:
        return self.table(task, table)

    # --- remote ----------------------------------------------------------------------------------------
    async def _url(self, processor: str) -> str | None:
        if processor not in self._urls or time.monotonic() - self._urls_at > _REGISTRY_TTL_S:
            try:
                self._urls = await asyncio.to_thread(self._endpoints)
            except Exception as exc:  # the registry unreachable: use what we knew
                log.warning("could not read processor endpoints from the registry: %s", exc)
            self._urls_at = time.monotonic()
        return self._urls.get(processor) or None

    async def _proxy(self, url: str, path: str, params: dict[str, str]) -> Answer | None:
        """The owner's answer, or None when it could not give one (409, unreachable): try again."""
        if self._client is None:
            headers = {HOP: self.me, **({"authorization": f"Bearer {self.token}"} if self.token else {})}
            self._client = PeerClient(headers)
        target = f"{path}?{urlencode(params)}" if params else path
        try:
            status, body = await self._client.get(url, target)
        except PeerError as exc:
            log.debug("proxy to %s failed: %s", url, exc)
            self._urls_at = min(self._urls_at, time.monotonic() - _REGISTRY_TTL_S + _REREAD_AFTER_FAILURE_S)
            return None
        if status == 409:
            return None
        return Answer(status, body)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    # --- requests --------------------------------------------------------------------------------------
    def _unknown(self, table: str) -> Answer | None:
        if table in self.plan.tables:
            return None
        known = ", ".join(sorted(self.plan.tables)) or "none"
        return Answer.error(404, f"no table '{table}' in this job (served tables: {known})")

    def _unavailable(self, what: str) -> Answer:
        return Answer.error(
            503, f"{what} is moving between processors (a rebalance or a failover); retry", **{"retry-after": "1"}
        )

    async def get(self, table: str, key: str, hop: bool) -> Answer:
        """The latest row of ``key`` in ``table`` (its JSON as written), 404 when absent."""
        unknown = self._unknown(table)
        if unknown is not None:
            return unknown
        task = self.plan.table_task(table, key)
        deadline = time.monotonic() + self.wait_s
        while True:
            owner = self.owner_of(task)
            if owner == self.me:
                reader = self.reader(table, task)
                if reader is not None:
                    row = reader.get(key)
                    if row is None:
                        return Answer.error(404, f"no row for key '{key}' in table '{table}'")
                    return Answer(200, row.encode("utf-8"), {"x-weirflow-task": task})
            if hop:  # routed here by a processor with another view: it tries again
                return Answer.error(409, f"task {task} is not served by {self.me} now")
            if owner is not None and owner != self.me:
                url = await self._url(owner)
                if url is not None:
                    answer = await self._proxy(url, f"/tables/{table}/{_quote(key)}", {})
                    if answer is not None:
                        return answer
            if time.monotonic() >= deadline:
                return self._unavailable(f"task {task}")
            await asyncio.sleep(_RETRY_S)

    async def _remote_page(
        self, owner: str, table: str, tasks: list[str], prefix: str, after: str | None, limit: int
    ) -> list[tuple[str, str]] | None:
        url = await self._url(owner)
        if url is None:
            return None
        # one row more than the page: the entry processor must know whether the owner has more
        params = {"prefix": prefix, "limit": str(limit + 1), "tasks": ",".join(tasks)}
        if after is not None:
            params["after"] = after
        answer = await self._proxy(url, f"/tables/{table}", params)
        if answer is None or answer.status != 200:
            return None
        return [(r["key"], json.dumps(r["row"])) for r in json.loads(answer.body)["rows"]]

    def _bad_page(self, table: str, limit: int, tasks: list[str] | None, hop: bool) -> Answer | None:
        """A listing's 400: ``limit`` out of range, or ``tasks`` (what a forwarding processor asks for) naming a
        task the table does not have, which no wait would ever find (a 503 after ``endpoints.route.wait.ms``)."""
        if not 1 <= limit <= MAX_PAGE + (1 if hop else 0):
            return Answer.error(400, f"limit must be 1-{MAX_PAGE}, got {limit}")
        every = self.plan.table_tasks(table)
        if tasks is not None and (stray := sorted(set(tasks) - set(every))):
            return Answer.error(
                400, f"tasks={','.join(stray)}: not tasks of table '{table}' (its tasks: {','.join(every)})"
            )
        return None

    async def scan(
        self, table: str, prefix: str, after: str | None, limit: int, tasks: list[str] | None, hop: bool
    ) -> Answer:
        """Rows whose key starts with ``prefix``, in key order after ``after``, at most ``limit``; ``next`` is
        the cursor of the next page (None on the last). Gathered from every task of the table."""
        unknown = self._unknown(table)
        if unknown is not None:
            return unknown
        refused = self._bad_page(table, limit, tasks, hop)
        if refused is not None:
            return refused
        wanted = tasks if tasks is not None else self.plan.table_tasks(table)
        pages: list[list[tuple[str, str]]] = []
        deadline = time.monotonic() + self.wait_s
        remaining = list(wanted)
        while remaining:
            by_owner: dict[str, list[str]] = {}
            for task in remaining:
                owner = self.owner_of(task)
                if owner == self.me and (reader := self.reader(table, task)) is not None:
                    pages.append(_first(reader.scan(prefix, after), limit))
                elif not hop and owner is not None and owner != self.me:
                    by_owner.setdefault(owner, []).append(task)
            served = [t for t in remaining if self.owner_of(t) == self.me and self.reader(table, t) is not None]
            if hop and len(served) < len(remaining):
                return Answer.error(409, f"not every task of {remaining} is served by {self.me} now")
            remaining = [t for t in remaining if t not in served]
            for owner, owned in by_owner.items():
                page = await self._remote_page(owner, table, owned, prefix, after, limit)
                if page is not None:
                    pages.append(page)
                    remaining = [t for t in remaining if t not in owned]
            if not remaining:
                break
            if time.monotonic() >= deadline:
                return self._unavailable(f"tasks {remaining}")
            await asyncio.sleep(_RETRY_S)
        return _page(pages, limit)


def _page(pages: list[list[tuple[str, str]]], limit: int) -> Answer:
    """The first ``limit`` rows of the sorted ``pages`` merged, and the cursor of the next page."""
    merged = list(heapq.merge(*pages))[: limit + 1]
    rows = merged[:limit]
    body = {
        "rows": [{"key": k, "row": json.loads(v)} for k, v in rows],
        "next": rows[-1][0] if len(merged) > limit else None,
    }
    return Answer(200, json.dumps(body).encode())


def _first(rows: Any, limit: int) -> list[tuple[str, str]]:
    found = []
    for row in rows:
        found.append(row)
        if len(found) > limit:
            break
    return found


def _quote(key: str) -> str:
    from urllib.parse import quote

    return quote(key, safe="")


async def send_json(send: Any, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


async def table_request(tables: TableService, scope: dict[str, Any], send: Any) -> None:
    """Answer ``GET /tables/<name>[/<key>]`` straight from the ASGI scope."""
    from urllib.parse import parse_qs, unquote

    if scope["method"] not in ("GET", "HEAD"):
        await send_json(send, 405, json.dumps({"error": "served tables are read with GET"}).encode())
        return
    hop = any(k == HOP.encode() for k, _ in scope["headers"])
    raw = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1").split("?", 1)[0]
    parts = raw.split("/", 3)  # '', 'tables', name, key
    name = unquote(parts[2])
    if len(parts) == 4:
        try:  # the key as sent, percent-decoded strictly: a key that is not UTF-8 is the client's error
            key = unquote(parts[3], errors="strict")
        except UnicodeDecodeError:
            answer = Answer.error(400, "the key is not valid UTF-8 once percent-decoded")
        else:
            answer = Answer.error(400, "empty key") if not key else await tables.get(name, key, hop)
    else:
        query = {k: v[-1] for k, v in parse_qs(scope.get("query_string", b"").decode("latin-1")).items()}
        try:
            limit = int(query.get("limit", "100"))
        except ValueError:
            answer = Answer.error(400, f"limit must be an integer, got {query.get('limit')!r}")
        else:
            tasks = query.get("tasks")
            answer = await tables.scan(
                name, query.get("prefix", ""), query.get("after"), limit, tasks.split(",") if tasks else None, hop
            )
    await send_json(send, answer.status, answer.body, answer.headers)


def add_table_routes(app: Any, tables: TableService | None) -> None:
    """``GET /tables/...`` on the FastAPI ``app`` for a job that serves no table: a 404 naming the reason.
    (A job that serves tables answers them in `table_request`, ahead of FastAPI.)"""
    from fastapi.responses import JSONResponse

    @app.get("/tables/{rest:path}")
    async def no_tables(rest: str) -> Any:
        return JSONResponse({"error": "this job serves no tables (Stream.serve in its pipeline)"}, status_code=404)
