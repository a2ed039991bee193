"""Reading the example's results back: the window counts in `page-counts`, and what they should be.

Output records are keyed by page and window start; a replay after a crash writes the same key again with the
same count, so the latest record per key is the result.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from weirflow.interfaces.system import SystemStreamPartition
from weirflow.job.systems import Systems

Window = tuple[str, str]  # (page, window start "YYYY-MM-DDTHH:MM")


def read_counts(config: Any, stream_id: str = "page-counts") -> dict[Window, int]:
    systems = Systems(config)
    try:
        ref = systems.resolve(stream_id)
        counts: dict[Window, int] = {}
        consumer = systems.consumer(ref.system)
        for partition, metadata in systems.admin(ref.system).partition_metadata(ref.physical).items():
            offset = metadata.oldest
            ssp = SystemStreamPartition(ref.system, ref.physical, partition)
            while batch := consumer.read(ssp, offset, 10_000):
                for record in batch:
                    row = json.loads(record.value)
                    counts[(row["page"], row["window_start"][:16])] = int(row["views"])
                offset = batch[-1].next_offset
        return counts
    finally:
        systems.close()


def expected_counts(events: Iterable[dict[str, Any]]) -> dict[Window, int]:
    """The same counts computed with pandas over the generated events."""
    import pandas as pd

    frame = pd.DataFrame(list(events))
    minute = pd.to_datetime(frame["event_time"]).dt.floor("1min").dt.strftime("%Y-%m-%dT%H:%M")
    return {(str(p), str(w)): int(n) for (p, w), n in frame.groupby([frame["page"], minute]).size().items()}


def consumed(config: Any, stream_id: str = "page-views") -> int:
    """Events of ``stream_id`` the job has checkpointed as processed (sum of next offsets: systems whose offsets
    are dense sequence numbers, `SystemAdmin.dense_offsets`)."""
    from weirflow.interfaces.plugins import checkpoint_factory

    manager = checkpoint_factory(config).get_checkpoint_manager(config)
    manager.start()
    try:
        physical = config.get(f"streams.{stream_id}.physical.name") or stream_id
        return sum(
            int(offset)
            for checkpoint in manager.read_all().values()
            for ssp, offset in checkpoint.offsets.items()
            if ssp.stream == physical
        )
    finally:
        manager.stop()
