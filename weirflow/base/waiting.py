"""`wait_until`: poll a condition until it holds, instead of sleeping for a time that is usually enough.

The one implementation, shared by the demo, the benchmarks, the contract suite and the tests (which import it
as ``from weirflow.testing import wait_until``). A shared leaf rather than a part of the test kit because the
demo and the benchmarks run without pytest.
"""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str, interval_s: float = 0.1) -> float:
    """Poll ``condition`` until true; return the seconds it took. Raise `TimeoutError` naming ``what``."""
    start = time.monotonic()
    while True:
        if condition():
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)
