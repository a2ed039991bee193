"""How an input stream is decoded and timed: its serde, schema, event time, lateness and limits, from config.

`input_settings` checks every key it reads and names the key and file of a mistake (docs/pipelines.md,
"Input streams"); `StageBuilder` keeps the result per stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import types as T

from weirflow.interfaces.config import ConfigView
from weirflow.job.start_position import parse_start
from weirflow.job.systems import HTTP_REQUEST_SCHEMA, is_http_stream
from weirflow.pipeline.plan import PipelinePlan
from weirflow.spark.serde import SERDES, decoder_schema

DEFAULT_EVENT_TIME = "event_time"


@dataclass(frozen=True)
class InputSettings:
    """How one input stream is decoded and timed."""

    serde: str
    user_schema: T.StructType
    event_time_field: str
    event_time_from_record: bool
    delay_ms: int
    intermediate: bool
    bounded: bool
    # (name, Spark DDL type) of the system's record columns the stream asked for (`system-columns`)
    system_fields: tuple[tuple[str, str], ...] = ()
    max_records: int | None = None  # `max-events-per-trigger`; None: the task's limit


def system_fields(config: ConfigView, stream_id: str, admin: Any, taken: list[str]) -> tuple[tuple[str, str], ...]:
    """The record columns ``streams.<id>.system-columns`` selects from the system's `RecordField`s."""
    key = f"streams.{stream_id}.system-columns"
    text = str(config.get(key) or "none").strip()
    if text.lower() == "none":
        return ()
    offered = {f.name: f.type for f in admin.record_fields()}
    if text.lower() == "all":
        names = list(offered)
        if not names:
            raise config.error(key, f"the stream's system ({type(admin).__name__}) has no record columns")
    else:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in offered]
        if unknown:
            have = ", ".join(offered) or "none"
            raise config.error(key, f"{', '.join(unknown)}: not a column of the stream's system (it has: {have})")
    clash = [n for n in names if n in taken]
    if clash:
        raise config.error(
            key, f"{', '.join(clash)} would replace the stream's own column of that name; rename it in the schema"
        )
    return tuple((n, offered[n]) for n in names)


def input_settings(plan: PipelinePlan, stream_id: str) -> InputSettings:
    """How input stream ``stream_id`` (declared under ``streams.<id>``) is decoded and timed, every mistake in
    its keys named."""
    cfg = plan.config
    ddl = cfg.get(f"streams.{stream_id}.schema")
    if ddl is None and is_http_stream(cfg, stream_id):
        ddl = HTTP_REQUEST_SCHEMA  # the records clients' requests become (the ``http`` system)
    serde = cfg.get(f"streams.{stream_id}.serde") or ("json" if ddl else "string")
    if serde not in SERDES:
        raise cfg.error(f"streams.{stream_id}.serde", f"must be one of {', '.join(SERDES)}, not '{serde}'")
    schema = None
    if serde == "json":
        if not ddl:
            raise cfg.error(
                f"streams.{stream_id}.schema",
                "the json serde needs a schema: Spark DDL such as 'user string, page string, ts timestamp'",
            )
        try:
            parsed = T._parse_datatype_string(ddl)
        except Exception as exc:
            raise cfg.error(f"streams.{stream_id}.schema", f"is not valid Spark DDL: {exc}") from exc
        if not isinstance(parsed, T.StructType):
            raise cfg.error(f"streams.{stream_id}.schema", f"must name columns ('name type, ...'), not {ddl!r}")
        schema = parsed
    user_schema = decoder_schema(serde, schema)
    field = cfg.get(f"streams.{stream_id}.event-time.field")
    if field:
        match = [f for f in user_schema.fields if f.name == field]
        if not match or not isinstance(match[0].dataType, T.TimestampType):
            raise cfg.error(
                f"streams.{stream_id}.event-time.field",
                f"names '{field}', which is not a timestamp column of the stream's schema",
            )
    parse_start(cfg, stream_id)  # a bad start fails now, naming the key, not when a task first starts
    taken = user_schema.fieldNames() + ([] if field else [DEFAULT_EVENT_TIME])
    admin = plan.systems.admin(plan.ref(stream_id).system)
    limit = cfg.get(f"streams.{stream_id}.max-events-per-trigger")
    if limit is not None and int(limit) < 1:
        raise cfg.error(f"streams.{stream_id}.max-events-per-trigger", f"must be at least 1, not {limit}")
    return InputSettings(
        serde=serde,
        user_schema=user_schema,
        event_time_field=field or DEFAULT_EVENT_TIME,
        event_time_from_record=not field,
        delay_ms=int(cfg.get(f"streams.{stream_id}.lateness") or 0),
        intermediate=False,
        bounded=bool(cfg.get(f"streams.{stream_id}.bounded")),
        system_fields=system_fields(cfg, stream_id, admin, taken),
        max_records=int(limit) if limit is not None else None,
    )
