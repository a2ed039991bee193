"""Every endpoint of a running job, and served tables while the processor owning them is SIGKILLed
(docs/endpoints.md).

The job is both examples at once, as two `weirflow run` processes: `examples/endpoints` (each user's latest
page view, served as table ``last_view`` by 4 tasks) and `examples/rpc` (an ``http`` stream ``work``: primes
below a limit, each of 4 tasks counting its share). Clients only ever ask the processor that owns *fewer* of
the table's tasks (the entry), so most lookups are forwarded. Checked, in order: lookups, listings and bad
requests; every task's report; fan-out, partial, single and WebSocket requests through the ``http`` system;
then, while a client thread keeps asking, the other processor is SIGKILLed: every answer must be the right row
or a 503 (never a wrong row, never another status), and after the failover every user's row is back; taps on
the survivor get exactly the matching records of an input and an intermediate stream; the moved tables follow
new views.

On the embedded default both processors share a disk. On Azure (Azurite) each has its **own state
directory**, as on two machines, so the survivor can answer only if the tables came with the tasks' Spark
state from Blob Storage; there a bearer token is required, and the processors pass it to each other.
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import connect

from tests.conftest import unique_job_name
from tests.integration.endpoints_example import get
from tests.integration.endpoints_example import views as _views
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.local.launcher import ProcessorProcess, start_processor
from weirflow.testing import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.spark]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE = EXAMPLES / "endpoints"
# the example's views.py, loaded without putting its folder on sys.path (its pipeline.py would shadow the
send, view = _views.send, _views.view

USERS = 300
VIEWS = 3000
STAGE, TASKS = "views_by_user", 4
TOKEN = "t0ken-for-tests"
# shipped lease (15 s) and liveness (8 s): four Spark processes start at once on two cores here, and a
# processor starting its queries must not be declared dead for a slow heartbeat
FAST = ["job.debounce.time.ms=1000"]


def latest(views: int) -> dict[str, dict[str, Any]]:
    return {f"u{u}": view(max(i for i in range(u, views, USERS)), USERS) for u in range(USERS)}


class Client(threading.Thread):
    """Asks the entry for users in turn until stopped; counts right rows, 503s, and anything else."""

    def __init__(self, url: str, token: str | None, expected: dict[str, dict[str, Any]]) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.expected = url, token, expected
        self.right = self.unavailable = 0
        self.wrong: list[tuple[str, int, Any]] = []
        self.first_503: float | None = None
        self.last_503: float | None = None
        self.halt = threading.Event()

    def run(self) -> None:
        users = list(self.expected)
        i = 0
        while not self.halt.is_set():
            user = users[i % len(users)]
            i += 1
            status, body = get(f"{self.url}/tables/last_view/{user}", self.token)
            if status == 200 and body == self.expected[user]:
                self.right += 1
            elif status == 503:
                self.unavailable += 1
                self.first_503 = self.first_503 or time.monotonic()
                self.last_503 = time.monotonic()
            else:
                self.wrong.append((user, status, body))


PIPELINE = """
from endpoints_pipeline import pipeline as served_table
from rpc_pipeline import answer


def pipeline(app):
    served_table(app)
    app.input("work").transform(answer).send_to("work", key="connection")
"""
PRIMES_BELOW = {10: 4, 100: 25, 1000: 168, 10_000: 1229}


def job_overrides(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> tuple[list[str], str | None]:
    """Both examples in ``tmp_path`` as one job; the settings of ``backend`` and its bearer token (Azure only)."""
    shutil.copy(EXAMPLE / "job.yaml", tmp_path / "job.yaml")
    shutil.copy(EXAMPLE / "pipeline.py", tmp_path / "endpoints_pipeline.py")
    shutil.copy(EXAMPLES / "rpc" / "pipeline.py", tmp_path / "rpc_pipeline.py")
    (tmp_path / "pipeline.py").write_text(PIPELINE)
    overrides = [
        f"job.name={unique_job_name('served')}",
        *FAST,
        "systems.http.factory=http",
        "streams.work.system=http",
        "streams.work.partitions=4",
    ]
    if backend == "embedded":
        return overrides, None
    storage = request.getfixturevalue("azure_storage")
    return [
        *overrides,
        "job.coordinator.factory=azure",
        "task.checkpoint.factory=azure-table",
        f"azure.storage.connection.string={storage}",
        f"endpoints.auth.token={TOKEN}",
        f"systems.local.path={tmp_path / 'streams.db'}",
    ], TOKEN


def check_reads(url: str, token: str | None, expected: dict[str, dict[str, Any]]) -> None:
    """Key lookups, a listing page, an absent key and (with a token) a request without it."""
    for user in list(expected)[:50]:
        assert get(f"{url}/tables/last_view/{user}", token) == (200, expected[user])
    status, page = get(f"{url}/tables/last_view?prefix=u1&limit=50", token)
    assert status == 200
    assert [r["key"] for r in page["rows"]] == sorted(u for u in expected if u.startswith("u1"))[:50]
    assert page["rows"][0]["row"] == expected[page["rows"][0]["key"]] and page["next"]
    assert get(f"{url}/tables/last_view/nobody", token)[0] == 404
    if token:
        assert get(f"{url}/tables/last_view/u1", None)[0] == 401


def post(url: str, token: str | None, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def check_requests(urls: list[str], token: str | None) -> None:
    """The ``http`` stream: a fan-out gets one reply from every task through either processor, and the shares
    add up; a time limit too short gives a partial answer; a single request is answered by one task; a
    WebSocket conversation carries several requests and is ended by the job; bad requests get a JSON 4xx."""

    def answered() -> bool:  # the first answers wait for the stage's queries to start
        status, answer = post(f"{urls[0]}/rpc/work?timeout_ms=5000", token, {"limit": 100})
        return status == 200 and not answer["partial"]

    wait_until(answered, 120, "a complete fan-out answer", interval_s=1)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    ws_url = urls[0].replace("http://", "ws://")

    def fan_out(url: str) -> None:
        status, answer = post(f"{url}/rpc/work", token, {"limit": 10_000})
        assert status == 200 and answer["tasks"] == 4 and answer["answered"] == 4 and not answer["partial"]
        shares = {r["body"]["partition"]: r["body"]["primes"] for r in answer["replies"]}
        assert sorted(shares) == [0, 1, 2, 3] and sum(shares.values()) == PRIMES_BELOW[10_000]

    def partial() -> None:
        status, answer = post(f"{urls[1]}/rpc/work?timeout_ms=1", token, {"limit": 10_000})
        assert status == 200 and answer["partial"] and answer["answered"] < 4

    def single() -> None:
        status, answer = post(f"{urls[1]}/http/work", token, {"limit": 1000})
        assert status == 200 and answer["body"] == {"partition": 0, "tasks": 1, "limit": 1000, "primes": 168}

    def conversation() -> None:
        with connect(f"{ws_url}/http/work", additional_headers=headers) as ws:
            for limit in (100, 1000):
                ws.send(json.dumps({"limit": limit}))
            ws.send(json.dumps({"limit": 10, "bye": True}))
            replies = [json.loads(ws.recv(timeout=60)) for _ in range(3)]
            with pytest.raises(ConnectionClosedOK) as ended:
                ws.recv(timeout=30)
        assert [(r["request"], r["body"]["primes"], r["close"]) for r in replies] == [
            ("0", PRIMES_BELOW[100], False),
            ("1", PRIMES_BELOW[1000], False),
            ("2", PRIMES_BELOW[10], True),
        ]
        assert ended.value.rcvd is not None and ended.value.rcvd.reason == "closed by the job"

    def through_entry() -> None:
        fan_out(urls[0])
        conversation()

    def through_the_other() -> None:
        fan_out(urls[1])
        partial()
        single()

    # the two processors' requests at once, each waiting for the stage's next micro-batches; one at a time on each
    # processor: two that find its response reader stopped start two readers (weirflow.endpoints.conversations,
    # `Conversations.open`), and every response then reaches its client twice
    with ThreadPoolExecutor(max_workers=2) as pool:
        for lane in [pool.submit(through_entry), pool.submit(through_the_other)]:
            lane.result()

    assert post(f"{urls[0]}/rpc/nope", token, {}) == (
        404,
        {"error": "'nope' is not an http stream of this job (http streams: work)"},
    )
    status, bad = post(f"{urls[0]}/rpc/work", token, raw=b"{not json")
    assert status == 400 and "not JSON" in bad["error"]
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{ws_url}/http/nope", additional_headers=headers)
    assert refused.value.response.status_code == 404


def check_task_reports(url: str, token: str | None, owner_of: dict[str, str]) -> None:
    """The Spark runner's per-task report, gathered from both processors by either one's ``/status``: every
    view read (the first stage's records in add up to all the views), nothing left (lag 0), a checkpoint."""
    status, doc = get(f"{url}/status", token)
    assert status == 200 and sorted(doc["task_reports"]) == sorted(set(owner_of.values()))
    reports = {task: r for by in doc["task_reports"].values() for task, r in by.items()}
    assert sorted(reports) == sorted(owner_of)
    assert sum(reports[f"page_views-{n}"]["records_in"] for n in range(TASKS)) == VIEWS
    assert all(
        r["lag_total"] == 0 and r["last_checkpoint_ms"] > 0 and r["batches"] > 0
        for task, r in reports.items()
        if not task.startswith("work")
    )  # work-*: no request yet
    assert (
        sum(
            r["records_out"].get("views-by-user", 0)
            for task, r in reports.items()
            if task.startswith("page_views")
        )
        >= VIEWS
    )


@pytest.mark.parametrize("backend", ["embedded", "azure"])
def test_every_endpoint_of_a_running_job_and_lookups_through_the_owner_s_sigkill(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, measure
) -> None:
    overrides, token = job_overrides(backend, request, tmp_path)
    config_path = tmp_path / "job.yaml"
    config = load_config(config_path, overrides)
    send(config, 0, VIEWS, USERS)

    def start(name: str) -> ProcessorProcess:
        own_disk = [f"job.state.dir={tmp_path / name}"] if backend == "azure" else []
        return start_processor(config_path, name, [*overrides, *own_disk], log_dir=tmp_path / "logs")

    procs = {name: start(name) for name in ("p0", "p1")}
    client = None
    try:
        expected = latest(VIEWS)

        endpoints: list[str] = []

        def both_live_with_tasks() -> list[str]:
            """The live processors' endpoints when both are live and hold tasks, else []."""
            doc = status_document(config)
            found = [p.get("endpoint") for p in doc["processors"] if p["live"]]
            return found if len(doc["assignment"]) >= 2 and len(found) >= 2 and all(found) else []

        def ready() -> bool:
            # the job's status (a read of every coordination store, costly on Azure) is read until the endpoints
            # are known and again once the table is complete; in between only the table is polled
            endpoints[:] = endpoints or both_live_with_tasks()
            if not endpoints:
                return False
            first = endpoints[0]
            table = all(get(f"{first}/tables/last_view/{u}", token) == (200, r) for u, r in expected.items())
            return table and both_live_with_tasks() != []

        wait_until(ready, 240, "every user's latest view in the table", interval_s=1)
        doc = status_document(config)
        urls = {p["processor_id"]: p["endpoint"] for p in doc["processors"]}
        owner_of = {t: p for p, tasks in doc["assignment"].items() for t in tasks}
        held = {p: sum(owner_of[f"{STAGE}-{n}"] == p for n in range(TASKS)) for p in procs}
        entry = min(held, key=lambda p: held[p])
        victim = next(p for p in procs if p != entry)
        proxied = [u for u in expected if owner_of[f"{STAGE}-{zlib.crc32(u.encode()) % TASKS}"] == victim]
        assert held[victim] > 0 and proxied
        check_reads(urls[entry], token, expected)
        check_task_reports(urls[entry], token, owner_of)
        check_requests([urls[entry], urls[victim]], token)

        client = Client(urls[entry], token, expected)
        client.start()
        wait_until(lambda: client.right > 100, 30, "the client getting answers")
        killed_at = time.monotonic()
        procs[victim].kill()  # SIGKILL while the client asks

        def serves(rows: dict[str, Any]) -> bool:
            return all(get(f"{urls[entry]}/tables/last_view/{u}", token) == (200, rows[u]) for u in proxied[:20])

        wait_until(lambda: serves(expected), 120, "the survivor serving the killed one's keys")
        back_after = time.monotonic() - killed_at
        right_then = client.right
        # every user's row, read while the client goes on asking
        not_back = [
            (user, got)
            for user in expected
            if (got := get(f"{urls[entry]}/tables/last_view/{user}", token)) != (200, expected[user])
        ]
        wait_until(lambda: client.right > right_then + 200, 30, "more right answers after the failover")
        client.halt.set()
        client.join(15)
        assert client.wrong == [], client.wrong[:5]
        assert not_back == [], not_back[:5]
        if backend == "azure":
            assert "restored its Spark state as of batch" in procs[entry].log_text()

        # taps on the survivor, then one more view per user: the taps get exactly the matching ones, and the
        # moved tables keep being updated
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        ws_url = urls[entry].replace("http://", "ws://")
        page_tap = f"{ws_url}/tap/page-views?field=page&match=%5E/page/1%24"  # ^/page/1$
        user_tap = f"{ws_url}/tap/views-by-user?field=user&match=%5Eu7%24"  # an intermediate stream
        with (
            connect(page_tap, additional_headers=headers) as by_page,
            connect(user_tap, additional_headers=headers) as by_user,
        ):
            # connected: each tap took its stream's ends before its handshake, so what is sent now is tapped
            send(config, VIEWS, USERS, USERS)
            tapped = [json.loads(by_page.recv(timeout=60))["value"] for _ in range(4)]
            wanted = [view(i, USERS) for i in range(VIEWS, VIEWS + USERS) if i % 97 == 1]
            assert sorted(tapped, key=lambda v: v["event_time"]) == wanted
            row = json.loads(by_user.recv(timeout=60))
            assert row["value"]["user"] == "u7" and row["value"]["page"] == view(VIEWS + 7, USERS)["page"]
            quiet_since = time.monotonic()
            newer = latest(VIEWS + USERS)
            wait_until(lambda: serves(newer), 120, "the moved tasks applying new views")
            with pytest.raises(TimeoutError):  # no other view reached the tap in the 2 s (at least) since
                by_page.recv(timeout=max(0.0, 2 - (time.monotonic() - quiet_since)))
    except Exception:
        for proc in procs.values():
            print(proc.log_text()[-3000:])
        raise
    finally:
        if client is not None:
            client.halt.set()
        for proc in procs.values():
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
    measure(
        f"served table ({backend}): owner SIGKILLed under lookups through the other processor: "
        f"{client.right} right answers, {client.unavailable} x 503, 0 wrong; every key back "
        f"{back_after:.1f} s after the kill"
    )
