"""Where a task without a checkpoint starts reading a stream: ``streams.<id>.start``.

Shared by both task runners (record tasks and the Spark data plane) so the key means the same everywhere:
``earliest`` (the default), ``latest``, an ISO 8601 time resolved per partition by the system itself
(`SystemAdmin.offset_for_time`: the first record stamped at or after it), or ``sdk-checkpoint``: where a consumer
written with the system's own client library left off (`SystemAdmin.offset_after_native_checkpoint`; Event Hubs:
the SDKs' checkpoint blobs), for moving such an app onto weirflow. A partition it never checkpointed starts at
the earliest record, so nothing is skipped.
"""

from __future__ import annotations

import datetime as dt
import logging

from weirflow.base.errors import RecordsDeletedError
from weirflow.interfaces.config import ConfigView
from weirflow.interfaces.system import SystemAdmin, SystemStreamPartition

log = logging.getLogger("weirflow.start")

START_KEYWORDS = ("earliest", "latest", "sdk-checkpoint")


def parse_start(config: ConfigView, stream_id: str) -> str | int:
    """``streams.<id>.start`` as ``"earliest"``, ``"latest"``, ``"sdk-checkpoint"`` or epoch milliseconds (an
    ISO 8601 time; a time without a zone is UTC). Anything else is a config error naming the key."""
    key = f"streams.{stream_id}.start"
    text = str(config.get(key) or "earliest").strip()
    if text.lower() in START_KEYWORDS:
        return text.lower()
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00") if text.endswith("Z") else text)
    except ValueError:
        raise config.error(
            key,
            f"'{text}' is neither earliest, latest, sdk-checkpoint nor an ISO 8601 time such as "
            "2026-11-20T08:00:00Z",
        ) from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return int(when.timestamp() * 1000)


def start_offset(config: ConfigView, stream_id: str, admin: SystemAdmin, ssp: SystemStreamPartition) -> str:
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
    if start == "sdk-checkpoint":
        try:
            offset = admin.offset_after_native_checkpoint(ssp.stream, ssp.partition)
        except NotImplementedError as exc:
            raise config.error(f"streams.{stream_id}.start", f"cannot start at an SDK checkpoint: {exc}") from None
        if offset is not None:
            log.info("%s starts after its SDK checkpoint, at %s", ssp, offset)
            return offset
        log.info("%s has no SDK checkpoint: it starts at the earliest record", ssp)
        start = "earliest"
    metadata = admin.partition_metadata(ssp.stream)[ssp.partition]
    return metadata.upcoming if start == "latest" else metadata.oldest


ON_DELETED = ("fail", "earliest")


def resume_offset(
    config: ConfigView, stream_id: str, admin: SystemAdmin, ssp: SystemStreamPartition, offset: str
) -> str:
    """Where a task resumes ``ssp`` from its checkpoint's ``offset``: that offset, unless the system deleted it
    (the embedded log's retention, `SystemAdmin.trims`). Then, per ``streams.<id>.on-deleted``, the task fails with
    `RecordsDeletedError` naming the stream, the partition and the first offset held (``fail``, the default), or
    resumes at that offset with a WARNING saying how many records it skips (``earliest``): never silently."""
    if not admin.trims:
        return offset
    oldest = admin.partition_metadata_of(ssp.stream, [ssp.partition])[ssp.partition].oldest
    if admin.compare_offsets(offset, oldest) != -1:
        return offset
    key = f"streams.{stream_id}.on-deleted"
    choice = str(config.get(key) or "fail").strip().lower()
    if choice not in ON_DELETED:
        raise config.error(key, f"'{choice}' is neither fail nor earliest")
    skipped = admin.records_between(ssp.stream, ssp.partition, offset, oldest)
    if choice == "earliest":
        log.warning(
            "%s: the checkpoint resumes at offset %s, which was deleted (retention); resuming at the first offset "
            "held, %s, skipping %s records (%s: earliest)",
            ssp,
            offset,
            oldest,
            skipped if skipped is not None else "the deleted",
            key,
        )
        return oldest
    raise RecordsDeletedError(
        f"{ssp}: the checkpoint resumes at offset {offset}, which was deleted (records below {oldest} outlived "
        f"the stream's retention); the first offset held is {oldest}. Raise streams.{stream_id}.retention past "
        f"the longest the job may be stopped or behind, or set {key}: earliest to resume there, skipping "
        f'{skipped if skipped is not None else "the deleted"} records (docs/operations.md, "Running for months")'
    )
