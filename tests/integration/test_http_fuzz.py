"""The processor's HTTP routes under a fuzzer: schemathesis generates requests from the server's own OpenAPI
document (``GET /openapi.json``, `weirflow.endpoints.openapi`) and sends them to a running `weirflow run`; no
answer may be a server error (docs/endpoints.md).

The job has what the routes serve: a served table ``last_view`` and an ``http`` stream ``work`` (the two
examples' features, examples/endpoints and examples/rpc). It is a record-task job (``task.function``) rather
than the examples' Spark pipelines because the routes are the same for both (`TableService`, `Conversations`)
while a record job starts in seconds and answers a request in milliseconds, so thousands of requests fit in a
test of about a minute, and its echo answers any body a fuzzer sends (the primes example would count primes up
to whatever ``limit`` it was sent). WebSockets (``WS /tap``, ``WS /http``) are not in an OpenAPI document.

Every operation is fuzzed with data that fits the document (positive) and, where it has a query or a body to
break, data that does not (negative), with its path free (mostly unknown tables and streams) and bound to the
job's real table and stream, so that the lookups, listings, fan-outs and requests that reach the job are fuzzed
too. What it found so far: a listing's ``tasks`` naming a task the table does not have waited
``endpoints.route.wait.ms`` and answered 503 (now 400, `TableService.scan`). The one server status a request may
get is 504 from ``POST /http/<stream>``, and only when the ``timeout_ms`` the request itself asked for passed
before the job answered (the gateway timeout the document names).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Err, Ok

from tests.conftest import unique_job_name
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

TOKEN = "fuzz-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
USERS = 20
TABLE, STREAM = "last_view", "work"
# requests generated per (operation, generation mode, path binding), by path (operations without parameters have
# one): fewer where a request costs Hypothesis most to generate (any JSON body), more where it costs least, so
# that the run fits in about a minute on two cores
EXAMPLES = {"/tables/{name}/{key}": 400, "/tables/{name}": 150, "/rpc/{stream}": 100, "/http/{stream}": 100}
EXAMPLES_ELSE = 100
AT_LEAST = 2000  # requests sent in all, or the run proves too little
THREADS = 8  # requests in flight at once: most of a request's time is the job's answer, not CPU

JOB = f"""
job.debounce.time.ms: 500
task.inputs: [views, {STREAM}]
task.function: fuzzjob:handle
task.tables: [{TABLE}]
task.commit.ms: 100
systems.http.factory: http
streams.{STREAM}.system: http
endpoints.auth.token: {TOKEN}
"""

FUNCTION = """
import json


def handle(record):
    if record["stream"] == "views":  # the served table: each user's latest view
        return [{"table": "last_view", "key": record["key"], "value": json.loads(record["value"])}]
    message = json.loads(record["value"])  # a client's record of the http stream: answer every request
    if message["kind"] != "request":
        return []
    body = {"partition": message["partition"], "tasks": message["tasks"], "echo": message["body"]}
    answer = {"connection": message["connection"], "request": message["request"], "body": body}
    return [{"stream": "work", "key": message["connection"], "value": answer}]
"""


def _get(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _post(url: str, body: Any) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={**AUTH, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class Fuzzer:
    """Generates requests from the document in this thread (Hypothesis) and sends them from ``THREADS`` others,
    so that generating the next requests overlaps the job's answers to the last ones. (Generating in several
    threads is no faster on two cores, and CPython 3.11's ``ast.parse``, which Hypothesis calls to describe its
    strategies, fails when two threads parse at once.) Counts what was sent and
    keeps every answer that was a server error, or no answer at all."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.sent = 0
        self.timeouts = 0  # 504s after the request's own timeout_ms
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._local = threading.local()
        self._pool = ThreadPoolExecutor(THREADS)
        self._pending: list[Future[None]] = []

    def fuzz(self, operation: Any, mode: GenerationMode, bound: dict[str, str]) -> None:
        """Up to ``EXAMPLES`` requests to ``operation`` (with the path parameters ``bound`` fixed)."""

        @settings(
            max_examples=EXAMPLES.get(operation.path, EXAMPLES_ELSE),
            deadline=None,
            database=None,
            phases=[Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode, path_parameters=bound or None))
        def generate(case: Any) -> None:
            self._pending.append(self._pool.submit(self._send, case))

        try:
            generate()
        except Unsatisfiable:  # no request breaks the document here (a path parameter that may be any string)
            if mode is not GenerationMode.NEGATIVE:
                raise

    def finish(self) -> None:
        for sending in self._pending:
            sending.result()
        self._pool.shutdown()

    def _session(self) -> requests.Session:
        if not hasattr(self._local, "session"):
            self._local.session = requests.Session()
            self._local.session.headers.update(AUTH)
        session: requests.Session = self._local.session
        return session

    def _send(self, case: Any) -> None:
        try:
            response = case.call(base_url=self.url, session=self._session(), timeout=30)
        except requests.RequestException as exc:
            self._count(error=f"{case.as_curl_command(headers=AUTH)}: no answer ({exc})")
            return
        if _own_timeout(case, response):
            self._count(timed_out=True)
            return
        try:
            case.validate_response(response, checks=[not_a_server_error], headers=AUTH)
        except FailureGroup:  # a BaseExceptionGroup: the checks that failed
            curl = case.as_curl_command(headers=AUTH)
            self._count(error=f"{curl} -> {response.status_code} {response.text[:300]}")
            return
        self._count()

    def _count(self, timed_out: bool = False, error: str | None = None) -> None:
        with self._lock:
            self.sent += 1
            self.timeouts += timed_out
            if error is not None:
                self.errors.append(error)


def _own_timeout(case: Any, response: Any) -> bool:
    """A 504 of ``POST /http/<stream>`` after the time limit the request itself set (``timeout_ms``, a valid
    one: a limit out of range must be refused with 400, never waited for)."""
    limit = (case.query or {}).get("timeout_ms")
    return (
        response.status_code == 504
        and case.operation.path == "/http/{stream}"
        and isinstance(limit, int)
        and limit >= 1
        and response.elapsed >= limit / 1000 * 0.9
        and "no response from the job" in response.text
    )


def _write_job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(f"job.name: {unique_job_name('fuzz')}\n{JOB}")
    (tmp_path / "fuzzjob.py").write_text(FUNCTION)
    config = load_config(path)
    systems = Systems(config)
    try:
        systems.admin("local").create_stream(StreamSpec("views", 4))
        work = systems.resolve(STREAM)
        systems.admin(work.system).create_stream(StreamSpec(work.physical, 4))
        views = [{"user": f"u{i % USERS}", "page": f"/page/{i}"} for i in range(5 * USERS)]
        systems.producer("local").send(
            [OutgoingRecord("views", json.dumps(v).encode(), key=v["user"].encode()) for v in views]
        )
    finally:
        systems.close()
    return path


def test_no_generated_request_gets_a_server_error(tmp_path: Path) -> None:
    config_path = _write_job(tmp_path)
    config = load_config(config_path)
    begun = time.monotonic()
    processor = start_processor(config_path, "p1", log_dir=tmp_path / "logs")
    try:
        endpoint: list[str] = []

        def serving() -> bool:
            if not endpoint:
                live = [p.get("endpoint") for p in status_document(config)["processors"] if p["live"]]
                endpoint.extend(e for e in live if e)
            return bool(endpoint) and _get(f"{endpoint[0]}/tables/{TABLE}/u1", AUTH) == 200

        wait_until(serving, 60, "the processor serving its table")
        url = endpoint[0]
        print(f"serving after {time.monotonic() - begun:.1f} s")
        wait_until(lambda: _post(f"{url}/http/{STREAM}", {"hello": 1}) == 200, 30, "the job answering requests")

        # the document is behind the token like every route
        assert _get(f"{url}/openapi.json", {}) == 401
        # found by this fuzzer: a listing for a task the table does not have waited for it, then answered 503
        assert _get(f"{url}/tables/{TABLE}?tasks=nope", AUTH) == 400
        schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=AUTH)
        results = list(schema.get_all_operations())
        broken = [r.err() for r in results if isinstance(r, Err)]
        assert not broken, f"operations schemathesis cannot read: {broken}"
        operations = [r.ok() for r in results if isinstance(r, Ok)]
        paths = {op.path for op in operations}
        assert {"/tables/{name}", "/tables/{name}/{key}", "/rpc/{stream}", "/http/{stream}"} <= paths

        runs = []
        for op in operations:
            bindings: list[dict[str, str]] = [{}]
            if op.path.startswith("/tables/"):
                bindings.append({"name": TABLE})
            elif op.path in ("/rpc/{stream}", "/http/{stream}"):
                bindings.append({"stream": STREAM})
            # a request that breaks the document needs a query parameter or a body to break: a path parameter may
            # be any string
            fuzzable = bool(op.query) or bool(op.body)
            modes = list(GenerationMode) if fuzzable else [GenerationMode.POSITIVE]
            runs += [(op, mode, bound) for mode in modes for bound in bindings]

        fuzzer = Fuzzer(url)
        started = time.monotonic()
        try:
            for run in runs:
                fuzzer.fuzz(*run)
        finally:
            fuzzer.finish()
        took = time.monotonic() - started
        print(f"{fuzzer.sent} requests in {took:.1f} s; {fuzzer.timeouts} 504s after the request's own timeout_ms")
        assert processor.alive(), processor.log_text()[-3000:]
    finally:
        assert processor.terminate() == 0, processor.log_text()[-3000:]
    assert not fuzzer.errors, f"{len(fuzzer.errors)} server errors, e.g.:\n" + "\n".join(fuzzer.errors[:20])
    assert fuzzer.sent >= AT_LEAST, f"only {fuzzer.sent} requests generated; raise EXAMPLES"
