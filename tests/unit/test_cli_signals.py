"""`weirflow run` stops on SIGTERM even when the signal arrives while the processor's main thread holds the lock of
an event that stopping sets (docs/coordination.md, "Stopping"): the handler hands the signal to a thread."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from weirflow.cli import _stop_on_signals


@pytest.fixture
def restored_handlers() -> Iterator[None]:
    saved = {number: signal.getsignal(number) for number in (signal.SIGTERM, signal.SIGINT)}
    yield
    for number, handler in saved.items():
        signal.signal(number, handler)


@pytest.mark.usefixtures("restored_handlers")
@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_caught_while_the_main_thread_holds_the_stop_event_s_lock_still_stops(number: int) -> None:
    stopped = threading.Event()
    _stop_on_signals(stopped.set)
    # The main thread inside `Event.wait` holds the event's lock between two bytecodes: a handler that set the
    # event itself would wait for that lock forever, here in the main thread that holds it.
    with stopped._cond:  # type: ignore[attr-defined]
        signal.raise_signal(number)
        assert not stopped.is_set()  # the handler returned at once; the stop waits for the lock
    assert stopped.wait(10), "stop was never called"
