"""A running processor facing hostile clients (docs/endpoints.md, Security): a tap whose expression makes a
backtracking matcher take exponential time does not stall it — every ``/healthz`` answers and its heartbeat
stays fresh while the tap runs on records built to trigger it — a WebSocket handshake from a foreign page's
origin is refused, and a body over ``endpoints.request.max.bytes`` is refused before it is read."""

from __future__ import annotations

import http.client
import json
import textwrap
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect
from websockets.typing import Origin

from weirflow.cli import status_document
from weirflow.config import load_config
from weirflow.interfaces.system import OutgoingRecord, StreamSpec
from weirflow.job.systems import Systems
from weirflow.local.launcher import start_processor
from weirflow.testing import wait_until

pytestmark = pytest.mark.integration

WATCH_S = 10
HEARTBEAT_MAX_S = 2.0
EVIL_USER = "a" * 36 + "b"  # '(a+)+$' against this took Python's re minutes, holding the GIL


@pytest.fixture
def processor(tmp_path: Path) -> Any:
    path = tmp_path / "job.yaml"
    path.write_text(
        textwrap.dedent(
            """
            job:
              name: hostile
              coordinator.poll.interval.ms: 200
              coordinator.heartbeat.interval.ms: 500
            task:
              inputs: [orders]
              function: passthrough:copy
            streams:
              orders: {partitions: 2}
              copies: {partitions: 1}
            """
        )
    )
    (tmp_path / "passthrough.py").write_text(
        "def copy(record):\n    return [{'stream': 'copies', 'value': record['value'], 'key': record['key']}]\n"
    )
    cfg = load_config(path)
    systems = Systems(cfg)
    for stream, partitions in (("orders", 2), ("copies", 1)):
        systems.admin(systems.resolve(stream).system).create_stream(StreamSpec(stream, partitions))
    systems.close()
    proc = start_processor(path, "p1", log_dir=tmp_path / "logs")
    try:
        wait_until(
            lambda: any(p["endpoint"] and p["state"] == "RUNNING" for p in status_document(cfg)["processors"]),
            60,
            "the processor to run and register its endpoint",
        )
        (row,) = status_document(cfg)["processors"]
        yield cfg, row["endpoint"]
    finally:
        assert proc.terminate() == 0, proc.log_text()[-3000:]


def test_a_pathological_tap_does_not_stall_the_processor(processor: Any) -> None:
    cfg, url = processor
    ws_url = url.replace("http://", "ws://")
    systems = Systems(cfg)
    producer = systems.producer(systems.resolve("orders").system)
    received: list[dict[str, Any]] = []
    stop = threading.Event()

    with connect(f"{ws_url}/tap/orders?field=user&match={quote('(a+)+$')}") as tap:

        def read() -> None:
            while not stop.is_set():
                try:
                    received.append(json.loads(tap.recv(timeout=0.5)))
                except TimeoutError:
                    continue
                except Exception:
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        health: list[int] = []
        ages: list[float] = []
        deadline = time.monotonic() + WATCH_S
        n = 0
        while time.monotonic() < deadline:
            records = [
                OutgoingRecord("orders", json.dumps({"user": EVIL_USER, "n": n + i}).encode(), partition=i % 2)
                for i in range(20)
            ]
            records.append(OutgoingRecord("orders", json.dumps({"user": "aaaa", "n": -1}).encode()))  # matches
            producer.send(records)
            n += 20
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as response:
                health.append(response.status)
            ages += [p["heartbeat_age_s"] for p in status_document(cfg)["processors"]]
        stop.set()
        reader.join(5)
    systems.close()

    assert health and all(status == 200 for status in health), health
    assert ages and max(ages) < HEARTBEAT_MAX_S, f"heartbeat ages while tapping: {ages}"
    assert n >= 100, "the loop wrote the pathological records"
    assert received and all(m["value"]["user"] == "aaaa" for m in received), "the tap kept matching, right"


def test_a_foreign_origin_handshake_is_refused_and_a_large_body_is_413(processor: Any) -> None:
    _, url = processor
    ws_url = url.replace("http://", "ws://")
    with pytest.raises(InvalidStatus) as refused:
        connect(f"{ws_url}/tap/orders", origin=Origin("http://evil.example"))
    assert refused.value.response.status_code == 403
    assert "endpoints.allowed.origins" in json.loads(refused.value.response.body)["error"]

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    body = b'{"pad": "' + b"x" * 2_000_000 + b'"}'
    conn.request("POST", "/rpc/orders", body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 413
    assert "endpoints.request.max.bytes" in json.loads(response.read())["error"]
    conn.close()
