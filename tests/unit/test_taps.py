"""Taps (``WS /tap/<stream>``, docs/endpoints.md) on a real server over the embedded log: exactly the matching
records written after the connection (from the moment the handshake completes, however slowly the system says
where its partitions end), intermediate streams unpacked without their control messages, a slow client dropped
with a reason, and bad requests refused with an HTTP status."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pyarrow as pa
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from weirflow.config.loader import Config
from weirflow.endpoints.server import EndpointServer, create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.taps import TapService
from weirflow.interfaces.system import OutgoingRecord, StreamSpec
from weirflow.job.systems import Systems
from weirflow.runtime.control import ControlMessage, MessageType, encode_rows, encode_user
from weirflow.spark.packing import pack

SLOW_ENDS_S = 0.5


class EndsAnsweredBy:
    """The job's systems, with every admin's `partition_metadata` (where each partition ends) answered by
    ``ends`` instead: a slow service, or one out of reach."""

    def __init__(self, systems: Systems, ends: Callable[[Any, str], Any]) -> None:
        self._systems = systems
        self._ends = ends

    def __getattr__(self, name: str) -> Any:
        return getattr(self._systems, name)

    def admin(self, system: str) -> Any:
        real = self._systems.admin(system)
        return SimpleNamespace(partition_metadata=lambda physical: self._ends(real, physical))


def slow_ends(admin: Any, physical: str) -> Any:
    time.sleep(SLOW_ENDS_S)  # not synchronisation: a fake of a service slow to answer, the case under test
    return admin.partition_metadata(physical)


def unreachable_ends(admin: Any, physical: str) -> Any:
    raise OSError("the stream's service is out of reach")


@contextmanager
def serve(tmp_path: Path, wrap: Callable[[Systems], Any] = lambda systems: systems) -> Iterator[Any]:
    """A server tapping a job's streams over the embedded log, its systems passed through ``wrap``: its
    WebSocket URL and a producer."""
    config = Config.from_dict(
        {"job": {"name": "j", "state": {"dir": str(tmp_path)}}, "streams": {"views": {"partitions": 2}}},
        base_dir=tmp_path,
    )
    systems = Systems(config)
    admin = systems.admin("local")
    for stream, count in (("views", 2), ("views.dlq", 2), ("j-1-by-user", 2)):
        admin.create_stream(StreamSpec(stream, count))
    settings = EndpointSettings(True, "127.0.0.1", 0, None, None, tap_queue_size=50)
    taps = TapService(config, wrap(systems), ["by-user"], settings.tap_queue_size)
    app = create_app(settings, dict, lambda: (True, "RUNNING"), lambda: b"", None, taps)
    server = EndpointServer(settings, app)
    url = server.start().replace("http://", "ws://")
    try:
        yield url, systems.producer("local")
    finally:
        server.stop()
        systems.close()


@pytest.fixture
def job(tmp_path: Path) -> Any:
    with serve(tmp_path) as served:
        yield served


def view(i: int) -> dict[str, Any]:
    return {"user": f"u{i % 7}", "page": f"/p{i}"}


def receive(ws: Any, count: int, timeout_s: float = 10) -> list[dict[str, Any]]:
    got = []
    deadline = time.monotonic() + timeout_s
    while len(got) < count:
        got.append(json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic()))))
    return got


def test_a_tap_gets_exactly_the_matching_records_written_while_connected(job: Any) -> None:
    url, producer = job
    before = [OutgoingRecord("views", json.dumps(view(i)).encode(), partition=i % 2) for i in range(10)]
    producer.send(before)  # written before the connection: not tapped
    with connect(f"{url}/tap/views?field=user&match=%5Eu3%24") as ws:  # ^u3$
        # connected: the tap took the partitions' ends before its handshake, so what follows is tapped
        producer.send(
            [
                OutgoingRecord("views", json.dumps(view(i)).encode(), key=f"u{i % 7}".encode(), partition=i % 2)
                for i in range(10, 80)
            ]
        )
        got = receive(ws, 10)
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.0)  # and nothing else
    assert sorted(m["value"]["page"] for m in got) == sorted(f"/p{i}" for i in range(10, 80) if i % 7 == 3)
    assert {(m["stream"], m["key"]) for m in got} == {("views", "u3")}
    assert all(m["partition"] == int(m["value"]["page"][2:]) % 2 for m in got)


def test_an_intermediate_stream_is_tapped_row_by_row_without_its_control_messages(job: Any) -> None:
    url, producer = job
    with connect(f"{url}/tap/by-user?match=/p4") as ws:  # no field: the regex searches the whole row
        rows = pa.RecordBatch.from_pylist([view(i) for i in range(50)])
        packed = [OutgoingRecord("j-1-by-user", record, partition=0) for record, _ in pack(rows)]
        control = ControlMessage(MessageType.WATERMARK, "stage-0", 1, 123).encode()
        producer.send(
            [
                *packed,
                OutgoingRecord("j-1-by-user", control, partition=1),
                OutgoingRecord("j-1-by-user", encode_rows(b"not arrow"), partition=1),  # corrupt: the tap goes on
                OutgoingRecord("j-1-by-user", encode_user(json.dumps(view(4000)).encode()), partition=1),
            ]
        )
        got = receive(ws, 12)
        with pytest.raises(TimeoutError):
            ws.recv(timeout=1.0)
    assert sorted(m["value"]["page"] for m in got) == sorted(["/p4", *(f"/p{i}" for i in range(40, 50)), "/p4000"])


def test_a_client_that_does_not_read_is_dropped_with_a_reason(job: Any) -> None:
    url, producer = job
    big = "x" * 20_000
    with connect(f"{url}/tap/views", max_queue=1) as ws:
        for at in range(0, 2000, 100):  # ~40 MB: more than the sockets' buffers and the 50-message queue
            producer.send(
                [
                    OutgoingRecord("views", json.dumps({"i": i, "pad": big}).encode(), partition=0)
                    for i in range(at, at + 100)
                ]
            )
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                ws.recv(timeout=20)
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == 1008 and "client too slow" in closed.value.rcvd.reason


def test_a_record_written_as_soon_as_the_tap_is_connected_is_tapped_however_slow_the_system(
    tmp_path: Path,
) -> None:
    """The server takes the partitions' ends before it completes the handshake: a client may write the moment
    it is connected, even when the system takes its time to say where the partitions end."""
    with serve(tmp_path, lambda systems: EndsAnsweredBy(systems, slow_ends)) as (url, producer):
        with connect(f"{url}/tap/views?field=user&match=%5Eu1%24", open_timeout=10) as ws:
            producer.send([OutgoingRecord("views", json.dumps(view(i)).encode(), partition=i % 2) for i in (0, 1)])
            (got,) = receive(ws, 1, timeout_s=5)
        assert (got["partition"], got["value"]) == (1, view(1))


def test_a_stream_whose_ends_cannot_be_read_is_refused_with_503(tmp_path: Path) -> None:
    with serve(tmp_path, lambda systems: EndsAnsweredBy(systems, unreachable_ends)) as (url, _):
        with pytest.raises(InvalidStatus) as refused:
            connect(f"{url}/tap/views")
        assert refused.value.response.status_code == 503
        error = json.loads(refused.value.response.body)["error"]
        assert error == "reading views failed: the stream's service is out of reach"


def test_bad_taps_are_refused_with_an_http_status_and_a_json_error(job: Any) -> None:
    url, _ = job
    for path, status, text in (
        ("/tap/views?match=(", 400, "not a regular expression"),
        ("/tap/nope", 404, "no stream 'nope'"),
    ):
        with pytest.raises(InvalidStatus) as refused:
            connect(url + path)
        assert refused.value.response.status_code == status
        assert text in json.loads(refused.value.response.body)["error"]
    with connect(f"{url}/tap/views.dlq") as ws:  # dead letters can be tapped too
        ws.close()
