"""Where Debian's libfaketime is (``make test`` installs the ``faketime`` package): processes started with it in
``LD_PRELOAD`` see a shifted wall clock (tests/integration/test_clock_skew.py, kinesalite aging records in
tests/integration/test_kinesis.py)."""

from __future__ import annotations

import os

_CANDIDATES = (
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
    "/usr/lib/faketime/libfaketimeMT.so.1",
)


def libfaketime() -> str | None:
    """The path of libfaketime (the multi-threaded build), or None when it is not installed."""
    return next((c for c in _CANDIDATES if os.path.exists(c)), None)
