"""Where a task without a checkpoint starts reading a stream: ``streams.<id>.start``.

Shared by both task runners (record tasks and the Spark data plane) so the key means the same everywhere:
``earliest`` (the default), ``latest``, or an ISO 8601 time resolved per partition by the system itself
(`SystemAdmin.offset_for_time`: the first record stamped at or after it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from weirflow.interfaces.system import SystemAdmin, SystemStreamPartition

START_KEYWORDS = ("earliest", "latest")


def parse_start(config: Any, stream_id: str) -> str | int:
    """``streams.<id>.start`` as ``"earliest"``, ``"latest"`` or epoch milliseconds (an ISO 8601 time; a time
    without a zone is UTC). Anything else is a config error naming the key."""
    key = f"streams.{stream_id}.start"
    text = str(config.get(key) or "earliest").strip()
    if text.lower() in START_KEYWORDS:
        return text.lower()
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise config.error(
            key, f"'{text}' is neither earliest, latest nor an ISO 8601 time such as 2026-11-20T08:00:00Z"
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def start_offset(config: Any, stream_id: str, admin: SystemAdmin, ssp: SystemStreamPartition) -> str:
    """The offset ``ssp`` starts from when no checkpoint names one."""
    start = parse_start(config, stream_id)
    if isinstance(start, int):
        try:
            return admin.offset_for_time(ssp.stream, ssp.partition, start)
        except NotImplementedError:
            raise config.error(
                f"streams.{stream_id}.start",
                f"system '{ssp.system}' cannot start a stream at a time; use earliest or latest",
            ) from None
    metadata = admin.partition_metadata(ssp.stream)[ssp.partition]
    return metadata.upcoming if start == "latest" else metadata.oldest
