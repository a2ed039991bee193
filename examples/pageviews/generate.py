"""Page-view events for the example: deterministic, skewed across pages, slightly out of order.

``events(n, seed)`` yields dicts ``{"user", "page", "event_time"}`` (ISO-8601, UTC): event time advances
about 18 ms per event from 2026-01-01T00:00:00Z with up to ±5 s of jitter, far inside the stream's 30 s
lateness, so no event is late. `write` appends them to the `page-views` stream keyed by user.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from collections.abc import Iterator
from typing import Any

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
PAGES = [f"/page/{i}" for i in range(60)]
STEP_MS = 18
JITTER_MS = 5000


def events(n: int, seed: int = 7) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    weights = [1.0 / (rank + 1) for rank in range(len(PAGES))]  # Zipf-like: a few pages get most views
    for i in range(n):
        when = START + dt.timedelta(milliseconds=i * STEP_MS + rng.randint(-JITTER_MS, JITTER_MS))
        yield {
            "user": f"u{rng.randrange(2000)}",
            "page": rng.choices(PAGES, weights)[0],
            "event_time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        }


def write(
    config: Any, n: int, seed: int = 7, *, progress: Any = None, batch: int = 10_000
) -> list[dict[str, Any]]:
    """Create `page-views` if needed and append ``n`` events; returns them (for checking the results)."""
    from weirflow.interfaces.system import OutgoingRecord, StreamSpec
    from weirflow.job.systems import Systems

    systems = Systems(config)
    try:
        ref = systems.resolve("page-views")
        admin = systems.admin(ref.system)
        admin.create_stream(StreamSpec(ref.physical, int(config.get("streams.page-views.partitions") or 4)))
        producer = systems.producer(ref.system)
        produced: list[dict[str, Any]] = []
        pending: list[OutgoingRecord] = []
        for event in events(n, seed):
            produced.append(event)
            pending.append(OutgoingRecord(ref.physical, json.dumps(event).encode(), key=event["user"].encode()))
            if len(pending) >= batch:
                producer.send(pending)
                if progress:
                    progress(len(pending))
                pending = []
        if pending:
            producer.send(pending)
            if progress:
                progress(len(pending))
        return produced
    finally:
        systems.close()
