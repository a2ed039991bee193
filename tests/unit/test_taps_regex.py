"""Taps cannot stall a processor (docs/endpoints.md, Taps and Security): expressions run in linear time (RE2),
those RE2 cannot run so are refused with 400, matching happens on the read pool rather than the event loop,
and a processor serves at most ``endpoints.tap.max`` taps."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from starlette.testclient import WebSocketDenialResponse

from weirflow.base.errors import TapError
from weirflow.config.loader import Config
from weirflow.endpoints.read_pool import ReadPool
from weirflow.endpoints.server import create_app
from weirflow.endpoints.settings import EndpointSettings
from weirflow.endpoints.taps import TapService
from weirflow.interfaces.system import OutgoingRecord, StreamSpec
from weirflow.job.systems import Systems
from weirflow.testing import wait_until

CATASTROPHIC = "(a+)+$"  # Python's re backtracks exponentially on 'aaa...ab': 36 a's froze a processor
DETECTOR_S = 10  # only a failure detector: RE2 answers in well under a millisecond


def answer_within(function: Any, *args: Any) -> Any:
    """``function(*args)`` on a thread; fail (rather than hang the suite) if it has not answered in DETECTOR_S."""
    result: list[Any] = []
    worker = threading.Thread(target=lambda: result.append(function(*args)), daemon=True)
    worker.start()
    worker.join(DETECTOR_S)
    assert result, f"{function} did not answer within {DETECTOR_S} s: backtracking?"
    return result[0]


def test_the_catastrophic_pattern_answers_on_a_10000_character_record() -> None:
    text = "a" * 10_000 + "b"
    whole = TapService.matcher(CATASTROPHIC, None)
    assert answer_within(whole, text, text) is False
    assert answer_within(TapService.matcher("(a+)+b$", None), text, text) is True
    by_field = TapService.matcher(CATASTROPHIC, "user")
    value = {"user": text, "page": "/p"}
    assert answer_within(by_field, value, json.dumps(value)) is False
    assert answer_within(TapService.matcher("^a+b$", "user"), value, json.dumps(value)) is True


@pytest.mark.parametrize("pattern", [r"(a)\1", "(?=a)b", "(?<!a)b", "(", "a{2,1}"])
def test_patterns_re2_cannot_run_are_refused_with_400_naming_the_syntax(pattern: str) -> None:
    with pytest.raises(TapError) as refused:
        TapService.matcher(pattern, None)
    assert refused.value.status == 400
    assert "RE2 syntax" in str(refused.value) and "docs/endpoints.md" in str(refused.value)


@pytest.fixture
def systems(tmp_path: Path) -> Any:
    config = Config.from_dict(
        {"job": {"name": "j", "state": {"dir": str(tmp_path)}}, "streams": {"views": {"partitions": 2}}},
        base_dir=tmp_path,
    )
    systems = Systems(config)
    systems.admin("local").create_stream(StreamSpec("views", 2))
    yield config, systems
    systems.close()


def test_records_are_read_and_matched_on_the_read_pool_not_the_event_loop(systems: Any) -> None:
    config, systems = systems
    pool = ReadPool(1)
    taps = TapService(config, systems, [], 100, read_pool=pool)
    real = TapService.matcher("^u3$", "user")
    threads: list[str] = []

    def matcher(value: Any, text: str) -> bool:
        threads.append(threading.current_thread().name)
        return bool(real(value, text))

    async def tap() -> tuple[str, str]:
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        target = taps.target("views")
        ends = await taps.ends(target)  # as a tap's handshake does: what is written from here on is tapped
        reader = asyncio.create_task(taps.run(target, matcher, queue, ends))  # type: ignore[arg-type]
        producer = systems.producer("local")
        producer.send([OutgoingRecord("views", json.dumps({"user": f"u{i}"}).encode()) for i in range(6)])
        try:
            message = await asyncio.wait_for(queue.get(), DETECTOR_S)
        except TimeoutError:
            raise AssertionError("the tap never saw the matching record") from None
        finally:
            reader.cancel()
        assert message is not None
        return message, threading.current_thread().name

    message, loop_thread = asyncio.run(tap())
    assert json.loads(message)["value"] == {"user": "u3"}
    assert threads and all(name.startswith("endpoint-read") for name in threads), threads
    assert loop_thread not in threads
    pool.close()


def test_one_tap_more_than_endpoints_tap_max_is_refused_with_429(systems: Any) -> None:
    config, systems = systems
    taps = TapService(config, systems, [], 100, max_taps=1)
    settings = EndpointSettings(True, "127.0.0.1", 8000, None, None, tap_max=1)
    app = create_app(settings, dict, lambda: (True, "RUNNING"), lambda: b"", None, taps)
    url = "ws://127.0.0.1:8000/tap/views"
    with TestClient(app, base_url="http://127.0.0.1:8000") as http:
        with http.websocket_connect(url):
            wait_until(lambda: taps.open_taps == 1, DETECTOR_S, "the first tap to open")
            with pytest.raises(WebSocketDenialResponse) as refused:
                with http.websocket_connect(url):
                    pass
            assert refused.value.status_code == 429
            assert "endpoints.tap.max" in refused.value.json()["error"]
        wait_until(lambda: taps.open_taps == 0, DETECTOR_S, "the first tap to close")
        with http.websocket_connect(url):  # the slot is free again
            wait_until(lambda: taps.open_taps == 1, DETECTOR_S, "the next tap to open")
