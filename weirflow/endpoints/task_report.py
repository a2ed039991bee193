"""What each task does right now, for ``GET /tasks``, ``GET /metrics`` and the status page (docs/endpoints.md).

A processor knows its own tasks: the runner's counts (`TaskRunner.task_stats`: batches, records in, last batch
duration, last checkpoint, dead letters, next offset per SSP) and, from the systems' admins, each SSP's
**lag** — the records between the task's next offset and the partition's end. The status page of any
processor shows every task of the job by asking each live processor's ``GET /tasks`` (in parallel, with a
short time limit); a processor that does not answer shows as such instead of holding the page. The request
carries the bearer token, so a redirect is refused rather than followed (the token would go to wherever it
points): the peer's 3xx is its error in the report.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from weirflow.interfaces.system import SystemStreamPartition

log = logging.getLogger("weirflow.endpoints")

_ENDS_TTL_S = 2.0
_PEER_TIMEOUT_S = 2.0


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """urllib follows a 3xx with every header of the request, ``Authorization`` included, to any host."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> None:
        raise urllib.error.HTTPError(
            req.full_url,
            code,
            f"{msg}: redirect to {newurl} not followed (peers are called with the bearer token); "
            "the processor's registered endpoint (endpoints.advertised.url) must be its own address",
            headers,
            fp,
        )


_OPENER = urllib.request.build_opener(_RefuseRedirects())


class TaskReport:
    """This processor's tasks with their lag; partition ends are cached for `_ENDS_TTL_S`."""

    def __init__(self, systems: Any, stats: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.systems = systems
        self.stats = stats
        self._ends: dict[tuple[str, str], dict[int, str]] = {}
        self._ends_at: dict[tuple[str, str], float] = {}
        self._guard = threading.Lock()

    def _upcoming(self, system: str, stream: str) -> dict[int, str]:
        key = (system, stream)
        with self._guard:
            if time.monotonic() - self._ends_at.get(key, float("-inf")) < _ENDS_TTL_S:
                return self._ends[key]
        try:
            ends = {p: m.upcoming for p, m in self.systems.admin(system).partition_metadata(stream).items()}
        except Exception as exc:  # the system unreachable: no lag rather than no report
            log.debug("partition ends of %s/%s unavailable: %s", system, stream, exc)
            ends = {}
        with self._guard:
            self._ends[key], self._ends_at[key] = ends, time.monotonic()
        return ends

    def __call__(self) -> dict[str, dict[str, Any]]:
        report = {}
        for task, stats in self.stats().items():
            lag: dict[str, int] = {}
            for key, offset in stats.get("offsets", {}).items():
                ssp = SystemStreamPartition.parse(key)
                upcoming = self._upcoming(ssp.system, ssp.stream).get(ssp.partition)
                count = None
                if upcoming is not None:
                    try:  # systems of positions count nothing without reading (`SystemAdmin.records_between`)
                        admin = self.systems.admin(ssp.system)
                        count = admin.records_between(ssp.stream, ssp.partition, offset, upcoming)
                    except ValueError:
                        count = None
                lag[key] = count if count is not None else -1
            known = [n for n in lag.values() if n >= 0]
            report[task] = {**stats, "lag": lag, "lag_total": sum(known) if known else None}
        return report


def gather(
    urls: dict[str, str], me: str, local: Callable[[], dict[str, Any]], token: str | None
) -> dict[str, Any]:
    """Every live processor's ``GET /tasks`` (this one's without HTTP): processor -> report, or an error."""

    def one(processor: str, url: str) -> tuple[str, Any]:
        if processor == me:
            return processor, local()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        request = urllib.request.Request(url + "/tasks", headers=headers)
        try:
            with _OPENER.open(request, timeout=_PEER_TIMEOUT_S) as response:
                return processor, json.loads(response.read())
        except Exception as exc:
            return processor, {"error": f"{type(exc).__name__}: {exc}"}

    targets = [(p, u) for p, u in urls.items() if u]
    if not targets:
        return {}
    with ThreadPoolExecutor(max_workers=min(8, len(targets))) as pool:
        return dict(pool.map(lambda t: one(*t), targets))
