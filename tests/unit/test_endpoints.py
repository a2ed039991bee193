"""The processor's HTTP server (docs/endpoints.md): settings, auth, routes, and a running processor serving
its live state at the URL it registered."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.unit.test_processor_faults import FakeRunner, job_config, start
from weirflow.base.errors import ConfigError
from weirflow.config.loader import Config
from weirflow.endpoints.metrics import ProcessorSnapshot, metrics_exposition
from weirflow.endpoints.server import create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.testing import wait_until


def settings(**values: object) -> EndpointSettings:
    return EndpointSettings.from_config(Config.from_dict({"job.name": "j", **values}, source="job.yaml"))


def app(token: str | None = None) -> TestClient:
    snapshot = ProcessorSnapshot("p1", "RUNNING", 3, 2, True)
    values = {"endpoints.auth.token": token} if token else {}
    return TestClient(
        create_app(
            settings(**values),
            lambda: {"leader": "p1"},
            lambda: (True, "RUNNING"),
            metrics_exposition(lambda: snapshot),
        )
    )


def test_loopback_needs_no_token_and_any_other_address_requires_one() -> None:
    assert settings().host == "127.0.0.1" and settings().port == 0 and settings().token is None
    with pytest.raises(ConfigError, match=r"endpoints.host' in job.yaml: '0.0.0.0' is reachable.*auth.token"):
        settings(**{"endpoints.host": "0.0.0.0"})
    assert settings(**{"endpoints.host": "0.0.0.0", "endpoints.auth.token": "s3cret"}).token == "s3cret"
    with pytest.raises(ConfigError, match="endpoints.port"):
        settings(**{"endpoints.port": 70000})


def test_limits_and_origins_are_checked_where_they_are_configured() -> None:
    with pytest.raises(ConfigError, match=r"endpoints.rpc.timeout.ms' in job.yaml: 600000 ms .*timeout.max.ms"):
        settings(**{"endpoints.rpc.timeout.ms": 600_000})
    with pytest.raises(ConfigError, match=r"endpoints.tap.max' in job.yaml: 0 must be positive"):
        settings(**{"endpoints.tap.max": 0})
    for bad in ("ops.example.com", "https://ops.example.com/path", "ftp://x", "https://x:99999"):
        with pytest.raises(ConfigError, match=r"endpoints.allowed.origins' in job.yaml: .* is not an origin"):
            settings(**{"endpoints.allowed.origins": [bad]})
    allowed = settings(**{"endpoints.allowed.origins": "https://ops.example.com/, http://localhost:8080"})
    assert allowed.allowed_origins == ("https://ops.example.com", "http://localhost:8080")
    for bad in ("https://ops.example.com", "ops.example.com:443", "a b"):
        with pytest.raises(ConfigError, match=r"endpoints.allowed.hosts' in job.yaml: .* is not a host name"):
            settings(**{"endpoints.allowed.hosts": [bad]})
    hosts = settings(**{"endpoints.allowed.hosts": "CA-Pageviews.internal.example.io, ca-pageviews"})
    assert hosts.allowed_hosts == ("ca-pageviews.internal.example.io", "ca-pageviews")


def test_routes_answer_json_and_prometheus_text() -> None:
    client = app()
    assert client.get("/healthz").json() == {"state": "RUNNING"}
    assert client.get("/status").json() == {"leader": "p1"}
    text = client.get("/metrics").text
    assert 'weirflow_tasks_running{processor="p1"} 2.0' in text
    assert 'weirflow_leader{processor="p1"} 1.0' in text
    assert 'weirflow_processor_state{processor="p1",state="RUNNING"} 1.0' in text
    missing = client.get("/nothing/here")
    assert missing.status_code == 404 and "no route GET /nothing/here" in missing.json()["error"]
    no_tables = client.get("/tables/x/k")
    assert no_tables.status_code == 404 and "serves no tables" in no_tables.json()["error"]


def test_with_a_token_every_route_but_the_health_probe_requires_it() -> None:
    client = app(token="s3cret")
    for path in ("/", "/status", "/tasks", "/metrics", "/openapi.json"):
        refused = client.get(path)
        assert refused.status_code == 401 and "bearer token" in refused.json()["error"], path
        assert client.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert client.get(path, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    # container health probes send no Authorization header: /healthz answers them, with the state name only
    assert client.get("/healthz").json() == {"state": "RUNNING"}
    assert client.get("/healthz", headers={"Authorization": "Bearer wrong"}).status_code == 200
    assert client.post("/healthz", json={}).status_code == 401  # only the probe's GET is exempt
    assert client.get("/healthz/x").status_code == 401


def test_a_running_processor_registers_its_url_and_serves_its_live_state(tmp_path: Path) -> None:
    config = job_config(tmp_path)
    running = start(config, "p1", lambda ctx: FakeRunner(ctx.checkpoints))
    try:
        processor = running.processor
        wait_until(lambda: processor.ctx is not None and processor.endpoint_url != "", 30, "the endpoint server")
        assert processor.ctx is not None
        wait_until(
            lambda: any(
                r.endpoint == processor.endpoint_url
                for r in processor.ctx.coordination.processor_registry().processors()
            ),
            30,
            "the URL in the processor's row",
        )
        wait_until(lambda: processor.state.value == "RUNNING", 30, "the processor running")

        def get(path: str) -> dict:
            with urllib.request.urlopen(processor.endpoint_url + path, timeout=5) as response:
                return json.loads(response.read())

        wait_until(
            lambda: get("/status")["leader"] == "p1" and get("/status")["task_count"] > 0,
            30,
            "the status route to show the job",
        )
        status = get("/status")
        assert [p["processor_id"] for p in status["processors"]] == ["p1"]
        assert status["processors"][0]["endpoint"] == processor.endpoint_url
        assert get("/healthz") == {"state": "RUNNING"}
        with urllib.request.urlopen(processor.endpoint_url + "/metrics", timeout=5) as response:
            assert 'weirflow_leader{processor="p1"} 1.0' in response.read().decode()
        url = processor.endpoint_url
    finally:
        assert running.stop() == 0
    with pytest.raises(urllib.error.URLError):  # gone with the processor
        urllib.request.urlopen(url + "/healthz", timeout=2)
