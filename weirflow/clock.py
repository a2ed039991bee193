"""The wall clock in epoch milliseconds: the one clock of heartbeats, leases, job models and record timestamps.

Liveness compares one processor's ``heartbeat_ms`` with another's "now", and the embedded backend's leases
compare the time a lease was written with the time it is read, so every one of them must read the same
clock. Callers go through this module at call time (``clock.now_ms()``, never a copy bound at import), so a
test that replaces `now_ms` or `time.time` moves every reader at once.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, by this machine's clock."""
    return int(time.time() * 1000)
