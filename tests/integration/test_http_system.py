"""Request/response as a system (``http``, docs/endpoints.md) on a running job: the distributed-RPC example
(`examples/rpc`: primes below a limit, each of 4 tasks counting its share) as two `weirflow run` processes on
the embedded default. A fan-out gets one reply from every task, through either processor, and the shares add up
to the right count; a time limit too short gives a partial answer; a single request is answered by one task; a
WebSocket conversation carries several requests and is ended by the job; bad requests get a JSON 4xx."""

from __future__ import annotations

import json
import shutil
import signal
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import connect

from tests.conftest import unique_job_name
from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.local.launcher import start_processor, wait_until

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rpc"
PRIMES_BELOW = {10: 4, 100: 25, 1000: 168, 100_000: 9592}


def post(url: str, body: Any, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_fan_out_single_requests_and_conversations_through_the_http_system(tmp_path: Path, measure) -> None:
    for name in ("job.yaml", "pipeline.py"):
        shutil.copy(EXAMPLE / name, tmp_path / name)
    overrides = [f"job.name={unique_job_name('rpc')}"]
    config = load_config(tmp_path / "job.yaml", overrides)
    procs = [start_processor(tmp_path / "job.yaml", f"p{i}", overrides, log_dir=tmp_path / "logs") for i in (0, 1)]
    try:
        def running() -> bool:
            doc = status_document(config)
            return len(doc["assignment"]) == 2 and all(p["state"] == "RUNNING" for p in doc["processors"])

        wait_until(running, 180, "both processors running the job's 4 tasks")
        urls = [p["endpoint"] for p in status_document(config)["processors"]]

        def answered() -> bool:  # the first answers wait for the tasks' queries to start
            status, answer = post(f"{urls[0]}/rpc/work?timeout_ms=5000", {"limit": 1000})
            return status == 200 and not answer["partial"]

        wait_until(answered, 120, "a complete fan-out answer", interval_s=1)
        for url in urls:
            status, answer = post(f"{url}/rpc/work", {"limit": 100_000})
            assert status == 200 and answer["tasks"] == 4 and answer["answered"] == 4 and not answer["partial"]
            shares = {r["body"]["partition"]: r["body"]["primes"] for r in answer["replies"]}
            assert sorted(shares) == [0, 1, 2, 3] and sum(shares.values()) == PRIMES_BELOW[100_000]
            assert {r["request"] for r in answer["replies"]} == {"rpc"}

        status, partial = post(f"{urls[1]}/rpc/work?timeout_ms=1", {"limit": 100_000})
        assert status == 200 and partial["partial"] and partial["answered"] < 4

        status, single = post(f"{urls[1]}/http/work", {"limit": 1000})
        assert status == 200 and single["body"] == {"partition": 0, "tasks": 1, "limit": 1000, "primes": 168}

        ws_url = urls[0].replace("http://", "ws://")
        with connect(f"{ws_url}/http/work") as ws:
            for limit in (100, 1000):
                ws.send(json.dumps({"limit": limit}))
            ws.send(json.dumps({"limit": 10, "bye": True}))
            replies = [json.loads(ws.recv(timeout=60)) for _ in range(3)]
            with pytest.raises(ConnectionClosedOK) as ended:
                ws.recv(timeout=30)
        assert [(r["request"], r["body"]["primes"], r["close"]) for r in replies] == [
            ("0", PRIMES_BELOW[100], False), ("1", PRIMES_BELOW[1000], False), ("2", PRIMES_BELOW[10], True)]
        assert ended.value.rcvd is not None and ended.value.rcvd.reason == "closed by the job"

        assert post(f"{urls[0]}/rpc/nope", {}) == (404, {"error": "'nope' is not an http stream of this job "
                                                                  "(http streams: work)"})  # fmt: skip
        status, bad = post(f"{urls[0]}/rpc/work", None, raw=b"{not json")
        assert status == 400 and "not JSON" in bad["error"]
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{ws_url}/http/nope")
        assert refused.value.response.status_code == 404
    except Exception:
        for proc in procs:
            print(proc.log_text()[-3000:])
        raise
    finally:
        for proc in procs:
            if proc.alive():
                proc.popen.send_signal(signal.SIGKILL)
    measure("http system: fan-out to 4 tasks through either processor, shares add up to the 9,592 primes below "
            "100,000; single request, WebSocket conversation ended by the job")  # fmt: skip
