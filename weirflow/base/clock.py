"""The wall clock in epoch milliseconds: the one clock of heartbeats, leases, job models and record timestamps.

The embedded backend's leases and registry rows carry this clock's times (one machine, one clock). Across
hosts no two clocks are compared: the Azure registry measures heartbeat ages on the Table service's clock
and returns them on this one (see docs/coordination.md, "Whose clock"). Callers go through this module at
call time (``clock.now_ms()``, never a copy bound at import), so a test that replaces `now_ms` or
`time.time` moves every reader at once.
"""

from __future__ import annotations

import time


def now_ms() -> int:
    """Milliseconds since the Unix epoch, by this machine's clock."""
    return int(time.time() * 1000)
